"""Normalisation: LayerNorm and BatchNorm (training and inference forms).

Both save the statistics their gradient needs as extra outputs (mean and 1/sqrt(var + eps)), and both
gradients are the same expression over different axes (`_normalized_grad`).
"""

from __future__ import annotations

from tessel.compiler.builder import apply as op
from tessel.compiler.dtypes import DType
from tessel.compiler.ir import Node, TensorType
from tessel.compiler.ops.common import per_element_cost, require, require_float
from tessel.compiler.registry import register
from tessel.compiler.shapes import format_shape, normalize_axis
from tessel.compiler.sharding import ShardingSpec, einsum


def _normalized_grad(dy, xhat, rstd, axes):
    """d/dx of (x - mean) * rstd over `axes`, given dy = dL/dxhat (the standard fused form)."""
    mean = lambda t: op("ReduceMean", t, axis=axes, keep_dims=True)  # noqa: E731
    return rstd * (dy - mean(dy) - xhat * mean(dy * xhat))


# --- LayerNorm: normalise over dims [begin_norm_axis:], scale/shift of shape x.shape[begin_params_axis:] ---


def _layer_axes(x: TensorType, attrs) -> tuple[int, int]:
    norm = normalize_axis(attrs["begin_norm_axis"], x.ndim, "begin_norm_axis")
    params = normalize_axis(attrs["begin_params_axis"], x.ndim, "begin_params_axis")
    return norm, params


def _infer_layer_norm(types, attrs):
    x, gamma, beta = types
    require_float(x)
    norm, params = _layer_axes(x, attrs)
    require(params >= norm, f"begin_params_axis {params} must not come before begin_norm_axis {norm}")
    expected = x.shape[params:]
    for name, t in (("gamma", gamma), ("beta", beta)):
        require(
            t.shape == expected and t.dtype == x.dtype,
            f"{name} {t!r} must be {x.dtype.short}{format_shape(expected)} (x.shape[begin_params_axis:])",
        )
    stats = TensorType(x.shape[:norm] + (1,) * (x.ndim - norm), x.dtype)
    return (x, stats, stats)


def _lower_layer_norm(ctx, node, inputs, outputs):
    x = node.inputs[0]
    norm, _ = _layer_axes(x.type, node.attrs)
    eps = float(node.attrs["epsilon"])
    if x.dtype == DType.float32:  # ONNX's fused kernel keeps its statistics in float32 only
        ctx.add("LayerNormalization", inputs, outputs, axis=norm, epsilon=eps)
        return
    axes = ctx.ints(range(norm, x.ndim))
    mean = ctx.add1("ReduceMean", [inputs[0], axes], outputs[1], keepdims=1)
    centered = ctx.add1("Sub", [inputs[0], mean])
    var = ctx.add1("ReduceMean", [ctx.add1("Mul", [centered, centered]), axes], keepdims=1)
    eps_const = ctx.const(eps, x.dtype)
    rstd = ctx.add1("Reciprocal", [ctx.add1("Sqrt", [ctx.add1("Add", [var, eps_const])])], outputs[2])
    scaled = ctx.add1("Mul", [ctx.add1("Mul", [centered, rstd]), inputs[1]])
    ctx.add("Add", [scaled, inputs[2]], outputs[:1])


def _layer_norm_grad(c):
    x, gamma, _ = c.inputs
    _, mean, rstd = c.outputs
    norm, _ = _layer_axes(x.value.type, c.attrs)
    xhat = (x - mean) * rstd
    dx = _normalized_grad(c.g * gamma, xhat, rstd, tuple(range(norm, x.ndim)))
    return dx, c.g * xhat, c.g  # autodiff sums gamma's and beta's leading dims away


def _layer_norm_sharding(node: Node) -> ShardingSpec:
    """Rows split freely; the normalised dims (and the statistics over them) may not."""
    x = node.inputs[0]
    norm = normalize_axis(node.attrs["begin_norm_axis"], x.ndim)
    params = normalize_axis(node.attrs["begin_params_axis"], x.ndim)
    names = tuple(f"d{i}" for i in range(x.ndim))
    stats = names[:norm] + tuple(f"s{i}" for i in range(norm, x.ndim))
    locked = frozenset(names[norm:] + stats[norm:])
    why = "LayerNorm normalises over it"
    return ShardingSpec((names, names[params:], names[params:]), (names, stats, stats), locked, why, None)


register(
    "LayerNorm",
    infer=_infer_layer_norm,
    sharding=_layer_norm_sharding,
    lower=_lower_layer_norm,
    grad=_layer_norm_grad,
    cost=per_element_cost(8),
    attrs={"begin_norm_axis": -1, "begin_params_axis": -1, "epsilon": 1e-7},
    num_inputs=3,
    doc="LayerNorm(x, gamma, beta, begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-7) -> (y, mean, rstd).",
)


# --- BatchNorm over channel dim 1 (NCHW or NC). Training form: statistics of this batch; running statistics
# follow MindSpore's primitive: new = (1 - momentum) * running + momentum * batch (variance unbiased).


def _infer_batch_norm(types, attrs):
    x, scale, bias, mean, var = types
    require_float(x)
    require(x.ndim >= 2, f"x {format_shape(x.shape)} needs a channel dim 1 (NC or NCHW)")
    channels = (x.shape[1],)
    for name, t in (("scale", scale), ("bias", bias), ("mean", mean), ("variance", var)):
        require(t.shape == channels and t.dtype == x.dtype, f"{name} {t!r} must be {x.dtype.short}{channels}")
    if not attrs["is_training"]:
        return (x,)
    stat = TensorType(channels, x.dtype)
    return (x, stat, stat, stat, stat)


def _channel_shape(x) -> tuple:
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _stat_axes(x) -> list[int]:
    return [0, *range(2, x.ndim)]


def _lower_batch_norm(ctx, node, inputs, outputs):
    x, a = node.inputs[0], node.attrs
    if not a["is_training"]:
        ctx.add("BatchNormalization", inputs, outputs, epsilon=float(a["epsilon"]))
        return
    dtype, axes = x.dtype, ctx.ints(_stat_axes(x))
    c = lambda v: ctx.const(v, dtype)  # noqa: E731
    per_channel = lambda name: ctx.add1("Reshape", [name, ctx.ints(_channel_shape(x))])  # noqa: E731
    mean = ctx.add1("ReduceMean", [inputs[0], axes], keepdims=1)
    centered = ctx.add1("Sub", [inputs[0], mean])
    var = ctx.add1("ReduceMean", [ctx.add1("Mul", [centered, centered]), axes], keepdims=1)
    rstd = ctx.add1("Reciprocal", [ctx.add1("Sqrt", [ctx.add1("Add", [var, c(a["epsilon"])])])])
    scaled = ctx.add1("Mul", [ctx.add1("Mul", [centered, rstd]), per_channel(inputs[1])])
    ctx.add("Add", [scaled, per_channel(inputs[2])], outputs[:1])
    flat = lambda name: ctx.add1("Reshape", [name, ctx.ints([-1])])  # noqa: E731
    # n / (n - 1), in float32 for 16-bit inputs: a float16 count beyond 65504 is inf, and the running variance NaN
    wide = DType.float32 if dtype.itemsize < 4 else dtype
    count = ctx.count([x.shape[i] for i in _stat_axes(x)], wide)
    ratio = ctx.add1("Div", [count, ctx.add1("Sub", [count, ctx.const(1.0, wide)])])
    unbiased = ctx.add1("Mul", [flat(var), ctx.cast(ratio, wide, dtype)])
    m = float(a["momentum"])
    for running, batch, out in ((inputs[3], flat(mean), outputs[1]), (inputs[4], unbiased, outputs[2])):
        ctx.add("Add", [ctx.add1("Mul", [running, c(1.0 - m)]), ctx.add1("Mul", [batch, c(m)])], [out])
    ctx.add("Identity", [flat(mean)], [outputs[3]])
    ctx.add("Identity", [flat(rstd)], [outputs[4]])


def _batch_norm_grad(c):
    x, scale, _, running_mean, running_var = c.inputs
    axes, shape = tuple(_stat_axes(x)), _channel_shape(x)
    per_channel = lambda t: op("Reshape", t, shape=shape)  # noqa: E731
    if c.attrs["is_training"]:
        mean, rstd = per_channel(c.outputs[3]), per_channel(c.outputs[4])
    else:
        mean, rstd = per_channel(running_mean), per_channel(op("Rsqrt", running_var + c.attrs["epsilon"]))
    xhat = (x - mean) * rstd
    dy = c.g * per_channel(scale)
    dx = _normalized_grad(dy, xhat, rstd, axes) if c.attrs["is_training"] else dy * rstd
    dscale = op("ReduceSum", c.g * xhat, axis=axes)
    dbias = op("ReduceSum", c.g, axis=axes)
    return dx, dscale, dbias, None, None


def _batch_norm_sharding(node: Node) -> ShardingSpec:
    """Channels split; in training the batch statistics are taken over the batch and spatial dims, so those may not."""
    if node.attrs["is_training"]:
        return einsum("nc...,c,c,c,c->nc...,c,c,c,c", fixed="n.", why="batch statistics are taken over it")(node)
    return einsum("nc...,c,c,c,c->nc...")(node)


register(
    "BatchNorm",
    infer=_infer_batch_norm,
    sharding=_batch_norm_sharding,
    lower=_lower_batch_norm,
    grad=_batch_norm_grad,
    cost=per_element_cost(10),
    attrs={"is_training": False, "epsilon": 1e-5, "momentum": 0.1},
    num_inputs=5,
    doc="BatchNorm(x, scale, bias, mean, variance, is_training=False, epsilon=1e-5, momentum=0.1): "
    "(y,) in inference; (y, new_mean, new_variance, batch_mean, batch_rstd) in training.",
)
