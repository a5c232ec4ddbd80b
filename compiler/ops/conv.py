"""Convolution and pooling over NCHW: Conv2D with its two backprop ops, MaxPool(+WithArgmax), AvgPool.

Geometry follows MindSpore: `pad_mode` is "valid", "same" (output = ceil(in / stride), the odd extra pad at the
bottom/right) or "pad" (explicit `pad` = int or (top, bottom, left, right)). Gradients pass explicit pads on, so
the backprop ops never recompute "same". Spatial dims must be static; the batch dim may be symbolic.
"""

from __future__ import annotations

import math

import numpy as np

from tessel.compiler.builder import apply as op
from tessel.compiler.dtypes import DType
from tessel.compiler.ir import Node, TensorType
from tessel.compiler.ops.common import Cost, io_bytes, require, require_float
from tessel.compiler.registry import REQUIRED, register
from tessel.compiler.shapes import format_shape, numel
from tessel.compiler.sharding import Rule, ShardingSpec, einsum

_CONV_ATTRS = {"stride": 1, "dilation": 1, "pad_mode": "valid", "pad": 0, "group": 1}
_POOL_ATTRS = {"kernel_size": REQUIRED, "strides": 1, "pad_mode": "valid", "pad": 0}


def _pair(v) -> tuple[int, int]:
    """An (h, w) pair from an int, a pair, or MindSpore's four-element (1, 1, h, w) form of stride/dilation."""
    if isinstance(v, int):
        return int(v), int(v)
    values = tuple(int(i) for i in v)
    if len(values) == 4:
        require(values[:2] == (1, 1), f"a four-element stride/dilation {values} must be (1, 1, h, w)")
        values = values[2:]
    require(len(values) == 2, f"expected an int or an (h, w) pair, got {values}")
    return values


def geometry(hw, kernel, stride, dilation, pad_mode: str, pad) -> tuple[tuple[int, int, int, int], tuple[int, int]]:
    """(pads (top, bottom, left, right), output (h, w)) of a window op over static spatial dims `hw`."""
    require(all(isinstance(d, int) for d in hw), f"spatial dims {format_shape(tuple(hw))} must be static")
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
    if pad_mode == "same":
        out = [math.ceil(h / s) for h, s in zip(hw, stride)]
        total = [max((o - 1) * s + k - h, 0) for o, s, k, h in zip(out, stride, span, hw)]
        pads = (total[0] // 2, total[0] - total[0] // 2, total[1] // 2, total[1] - total[1] // 2)
    elif pad_mode == "valid":
        pads = (0, 0, 0, 0)
    else:
        require(pad_mode == "pad", f"pad_mode must be 'valid', 'same' or 'pad', got {pad_mode!r}")
        pads = (pad,) * 4 if isinstance(pad, int) else tuple(pad)
        require(len(pads) == 4, f"pad must be an int or (top, bottom, left, right), got {pad}")
    padded = (hw[0] + pads[0] + pads[1], hw[1] + pads[2] + pads[3])
    require(all(p >= k for p, k in zip(padded, span)), f"window {tuple(span)} is larger than the input {padded}")
    out = tuple((p - k) // s + 1 for p, k, s in zip(padded, span, stride))
    return pads, out


def _onnx_pads(pads) -> list[int]:
    top, bottom, left, right = pads
    return [top, left, bottom, right]


def _conv_geometry(x, w, attrs):
    return geometry(
        x.shape[2:], w.shape[2:], _pair(attrs["stride"]), _pair(attrs["dilation"]), attrs["pad_mode"], attrs["pad"]
    )


def _check_conv(x: TensorType, w: TensorType, group: int) -> None:
    require_float(x)
    require(x.ndim == 4 and w.ndim == 4, f"x {format_shape(x.shape)} and weight {format_shape(w.shape)} must be 4-D")
    require(
        x.shape[1] == w.shape[1] * group and w.shape[0] % group == 0,
        f"x has {x.shape[1]} channels but weight {format_shape(w.shape)} with group={group} expects "
        f"{w.shape[1] * group}; the rule: weight is (out_channels, in_channels / group, kh, kw)",
    )


def _infer_conv(types, attrs):
    x, w = types
    _check_conv(x, w, attrs["group"])
    _, (oh, ow) = _conv_geometry(x, w, attrs)
    return (TensorType((x.shape[0], w.shape[0], oh, ow), x.dtype),)


def _conv_onnx_attrs(node_attrs, pads, w_shape) -> dict:
    return {
        "strides": list(_pair(node_attrs["stride"])),
        "dilations": list(_pair(node_attrs["dilation"])),
        "pads": _onnx_pads(pads),
        "group": int(node_attrs["group"]),
        "kernel_shape": list(w_shape[2:]),
    }


def _lower_conv(ctx, node, inputs, outputs):
    x, w = node.inputs
    pads, _ = _conv_geometry(x, w, node.attrs)
    ctx.add("Conv", inputs, outputs, **_conv_onnx_attrs(node.attrs, pads, w.shape))


def _explicit(attrs, pads) -> dict:
    keep = {k: attrs[k] for k in ("stride", "dilation", "group")}
    return {**keep, "pad_mode": "pad", "pad": pads}


def _conv_grad(c):
    x, w = c.inputs
    pads, _ = _conv_geometry(x.value, w.value, c.attrs)
    attrs = _explicit(c.attrs, pads)
    dx = op("Conv2DBackpropInput", c.g, w, input_shape=x.shape, **attrs)
    dw = op("Conv2DBackpropFilter", c.g, x, filter_shape=w.shape, **attrs)
    return dx, dw


def _conv_cost(node, sizes) -> Cost:
    w = node.inputs[1] if node.op == "Conv2D" else node.inputs[-1]
    out = node.outputs[0] if node.op != "Conv2DBackpropFilter" else node.inputs[0]
    per_output = 2 * numel(w.shape[1:], sizes)
    return Cost(per_output * numel(out.shape, sizes), io_bytes(node, sizes))


SPATIAL = "the spatial dims of a window op (rows near a split would need their neighbours' halo)"


def _conv_sharding(equation: str, fixed: str, shape_attr: str | None = None) -> Rule:
    """Convolutions: batch and output channels split; input channels give partial sums (group=1 only)."""

    def rule(node: Node) -> ShardingSpec:
        grouped = "co" if node.attrs["group"] != 1 else ""
        return einsum(equation, fixed + grouped, SPATIAL, shape_attr=shape_attr)(node)

    return rule


register(
    "Conv2D",
    infer=_infer_conv,
    sharding=_conv_sharding("nchw,ocyx->noHW", "hwyxHW"),
    lower=_lower_conv,
    grad=_conv_grad,
    cost=_conv_cost,
    attrs=_CONV_ATTRS,
    num_inputs=2,
    doc="Conv2D(x, weight, stride=1, dilation=1, pad_mode='valid', pad=0, group=1), NCHW.",
)


def _infer_backprop_input(types, attrs):
    dy, w = types
    shape = tuple(attrs["input_shape"])
    _check_conv(TensorType(shape, dy.dtype), w, attrs["group"])
    return (TensorType(shape, dy.dtype),)


def _lower_backprop_input(ctx, node, inputs, outputs):
    w = node.inputs[1]
    out = node.outputs[0]
    pads, (oh, ow) = _conv_geometry(out, w, node.attrs)
    attrs = _conv_onnx_attrs(node.attrs, pads, w.shape)
    # ConvTranspose's output size is ambiguous by up to stride-1 rows/cols; output_padding picks the input's.
    spans = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], attrs["dilations"])]
    produced = [
        (o - 1) * s + k - p0 - p1 for o, s, k, p0, p1 in zip((oh, ow), attrs["strides"], spans, pads[0::2], pads[1::2])
    ]
    attrs["output_padding"] = [h - p for h, p in zip(out.shape[2:], produced)]
    ctx.add("ConvTranspose", inputs, outputs, **attrs)


def _backprop_input_grad(c):
    """Conv2DBackpropInput is Conv2D's transpose: <g, convT(dy, w)> = <conv(g, w), dy>, so d(dy) = Conv2D(g, w) and
    dw = Conv2DBackpropFilter(dy, g), with the output's pads made explicit (as Conv2D's own gradient passes them)."""
    dy, w = c.inputs
    pads, _ = _conv_geometry(c.outputs[0].value, w.value, c.attrs)
    attrs = _explicit(c.attrs, pads)
    return op("Conv2D", c.g, w, **attrs), op("Conv2DBackpropFilter", dy, c.g, filter_shape=w.shape, **attrs)


register(
    "Conv2DBackpropInput",
    infer=_infer_backprop_input,
    sharding=_conv_sharding("noHW,ocyx->nchw", "HWyxhw", "input_shape"),
    lower=_lower_backprop_input,
    grad=_backprop_input_grad,
    cost=_conv_cost,
    attrs={**_CONV_ATTRS, "input_shape": REQUIRED},
    num_inputs=2,
    doc="Conv2DBackpropInput(dy, weight, input_shape, ...): the gradient of Conv2D with respect to x.",
)


def _infer_backprop_filter(types, attrs):
    x = types[1]
    shape = tuple(attrs["filter_shape"])
    _check_conv(x, TensorType(shape, x.dtype), attrs["group"])
    return (TensorType(shape, x.dtype),)


def _lower_backprop_filter(ctx, node, inputs, outputs):
    """dW = correlate(x, dy): a Conv over the batch with x's channels as batch and dy as the kernel."""
    x = node.inputs[1]
    (oc, cg, kh, kw), group = node.outputs[0].shape, int(node.attrs["group"])
    pads, _ = _conv_geometry(x, node.outputs[0], node.attrs)
    stride, dilation = _pair(node.attrs["stride"]), _pair(node.attrs["dilation"])
    x_t = ctx.add1("Transpose", [inputs[1]], perm=[1, 0, 2, 3])
    dy_t = ctx.add1("Transpose", [inputs[0]], perm=[1, 0, 2, 3])
    ocg = oc // group
    parts = []
    for i in range(group):
        xs = ctx.add1("Slice", [x_t, ctx.ints([i * cg]), ctx.ints([(i + 1) * cg]), ctx.ints([0])]) if group > 1 else x_t
        ds = (
            ctx.add1("Slice", [dy_t, ctx.ints([i * ocg]), ctx.ints([(i + 1) * ocg]), ctx.ints([0])])
            if group > 1
            else dy_t
        )
        full = ctx.add1("Conv", [xs, ds], strides=list(dilation), dilations=list(stride), pads=_onnx_pads(pads))
        cropped = ctx.add1("Slice", [full, ctx.ints([0, 0]), ctx.ints([kh, kw]), ctx.ints([2, 3])])
        parts.append(ctx.add1("Transpose", [cropped], perm=[1, 0, 2, 3]))
    ctx.add("Concat", parts, outputs, axis=0) if group > 1 else ctx.add("Identity", parts, outputs)


register(
    "Conv2DBackpropFilter",
    infer=_infer_backprop_filter,
    sharding=_conv_sharding("noHW,nchw->ocyx", "HWhwyx", "filter_shape"),
    lower=_lower_backprop_filter,
    grad=None,
    cost=_conv_cost,
    attrs={**_CONV_ATTRS, "filter_shape": REQUIRED},
    num_inputs=2,
    doc="Conv2DBackpropFilter(dy, x, filter_shape, ...): the gradient of Conv2D with respect to the weight.",
)


# --- pooling ---


def _pool_geometry(x, attrs):
    kernel = _pair(attrs["kernel_size"])
    return kernel, geometry(x.shape[2:], kernel, _pair(attrs["strides"]), (1, 1), attrs["pad_mode"], attrs["pad"])


def _infer_pool(with_argmax: bool):
    def infer(types, attrs):
        (x,) = types
        require_float(x)
        require(x.ndim == 4, f"x {format_shape(x.shape)} must be 4-D NCHW")
        _, (_, (oh, ow)) = _pool_geometry(x, attrs)
        y = TensorType((*x.shape[:2], oh, ow), x.dtype)
        return (y, TensorType(y.shape, DType.int64)) if with_argmax else (y,)

    return infer


def _pool_onnx_attrs(node) -> dict:
    kernel, (pads, _) = _pool_geometry(node.inputs[0], node.attrs)
    return {"kernel_shape": list(kernel), "strides": list(_pair(node.attrs["strides"])), "pads": _onnx_pads(pads)}


def _lower_max_pool(ctx, node, inputs, outputs):
    if len(outputs) == 1:
        ctx.add("MaxPool", inputs, outputs, **_pool_onnx_attrs(node))
        return
    # ONNX indices count over the whole NCHW tensor; keep the position inside each (n, c) plane.
    _, index = ctx.add("MaxPool", inputs, [outputs[0], ctx.fresh("index")], **_pool_onnx_attrs(node))
    h, w = node.inputs[0].shape[2:]
    ctx.add("Mod", [index, ctx.const(np.int64(h * w))], [outputs[1]])


def _max_pool_grad(c):
    """Scatter-add the cotangent onto each window's argmax position."""
    x = c.x
    argmax = c.outputs[1] if len(c.outputs) == 2 else op("MaxPoolWithArgmax", x, **dict(c.attrs))[1]
    n, ch, h, w = x.shape
    planes = (n, ch, -1)
    flat_x = op("Reshape", x, shape=(n, ch, h * w))
    flat_g = op("Reshape", c.g, shape=planes)
    index = op("Reshape", argmax, shape=planes)
    summed = op("ScatterAdd", op("ZerosLike", flat_x), index, flat_g, axis=2)
    return (op("Reshape", summed, shape=x.shape),)


def _pool_cost(node, sizes) -> Cost:
    kernel = _pair(node.attrs["kernel_size"])
    return Cost(kernel[0] * kernel[1] * numel(node.outputs[0].shape, sizes), io_bytes(node, sizes))


for _name, _argmax in (("MaxPool", False), ("MaxPoolWithArgmax", True)):
    register(
        _name,
        infer=_infer_pool(_argmax),
        sharding=einsum("nchw->ncHW,ncHW" if _argmax else "nchw->ncHW", "hwHW", SPATIAL),
        lower=_lower_max_pool,
        grad=_max_pool_grad,
        cost=_pool_cost,
        attrs=_POOL_ATTRS,
        num_inputs=1,
        doc=f"{_name}(x, kernel_size, strides=1, pad_mode='valid', pad=0)"
        + (" -> (y, argmax within each (n, c) plane)." if _argmax else "."),
    )


def _lower_avg_pool(ctx, node, inputs, outputs):
    include = int(node.attrs["count_include_pad"])
    ctx.add("AveragePool", inputs, outputs, count_include_pad=include, **_pool_onnx_attrs(node))


def _window_counts(hw, kernel, stride, pads, include_pad: bool, out_hw) -> np.ndarray:
    """How many input elements each output window averages over (an (oh, ow) table)."""
    counts = []
    for size, k, s, before, after, out in zip(hw, kernel, stride, pads[0::2], pads[1::2], out_hw):
        lo, hi = (-before, size + after) if include_pad else (0, size)
        starts = np.arange(out) * s - before
        counts.append(np.minimum(starts + k, hi) - np.maximum(starts, lo))
    return np.outer(counts[0], counts[1])


def _avg_pool_grad(c):
    x = c.x
    kernel, (pads, out_hw) = _pool_geometry(x.value, c.attrs)
    stride = _pair(c.attrs["strides"])
    counts = _window_counts(x.shape[2:], kernel, stride, pads, c.attrs["count_include_pad"], out_hw)
    channels = x.shape[1]
    ones = np.ones((channels, 1, *kernel), dtype=x.dtype.numpy)
    spread = c.g * (1.0 / counts).astype(x.dtype.numpy)
    attrs = {"stride": stride, "dilation": 1, "group": channels, "pad_mode": "pad", "pad": pads}
    return (op("Conv2DBackpropInput", spread, ones, input_shape=x.shape, **attrs),)


register(
    "AvgPool",
    infer=_infer_pool(False),
    sharding=einsum("nchw->ncHW", "hwHW", SPATIAL),
    lower=_lower_avg_pool,
    grad=_avg_pool_grad,
    cost=_pool_cost,
    attrs={**_POOL_ATTRS, "count_include_pad": False},
    num_inputs=1,
    doc="AvgPool(x, kernel_size, strides=1, pad_mode='valid', pad=0, count_include_pad=False).",
)
