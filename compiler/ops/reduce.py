"""Reductions: ReduceSum / ReduceMean / ReduceMax / ReduceMin (axis, keep_dims) and Argmax / Argmin.

`axis=None` (or `()`) reduces every dim, as MindSpore does. Gradients broadcast the cotangent back over the
reduced dims; ReduceMean divides by the reduced element count, read at run time when a dim is symbolic.
"""

from __future__ import annotations

from tessel.compiler.builder import apply as op
from tessel.compiler.dtypes import DType
from tessel.compiler.ir import TensorType
from tessel.compiler.ops.common import ZERO_GRAD, require
from tessel.compiler.registry import register
from tessel.compiler.shapes import normalize_axes, normalize_axis

_REDUCE_ATTRS = {"axis": None, "keep_dims": False}


def reduced_axes(attrs, rank: int) -> tuple[int, ...]:
    axis = attrs["axis"]
    return normalize_axes(None if axis == () else axis, rank)


def _infer_reduce(types, attrs):
    (x,) = types
    axes = reduced_axes(attrs, x.ndim)
    if attrs["keep_dims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return (TensorType(shape, x.dtype),)


def _lower_reduce(onnx_op: str):
    def lower(ctx, node, inputs, outputs):
        axes = reduced_axes(node.attrs, node.inputs[0].ndim)
        if not axes:  # reducing a scalar: nothing to do
            ctx.add("Identity", inputs, outputs)
            return
        ctx.add(onnx_op, [inputs[0], ctx.ints(axes)], outputs, keepdims=int(node.attrs["keep_dims"]))

    return lower


def _kept(c, t):
    """t (shaped like the reduction's output) with the reduced dims restored as size 1."""
    axes = reduced_axes(c.attrs, c.x.ndim)
    return t if c.attrs["keep_dims"] or not axes else op("ExpandDims", t, axis=axes)


def _sum_grad(c):
    return (op("BroadcastTo", _kept(c, c.g), shape=c.x.shape),)


def _mean_grad(c):
    axes = reduced_axes(c.attrs, c.x.ndim)
    count = op("DimSize", c.x, axes=axes, dtype=c.x.dtype)
    return (op("BroadcastTo", _kept(c, c.g) / count, shape=c.x.shape),)


def _extremum_grad(c):
    """Ties share the cotangent equally (MindSpore's _min_or_max_grad)."""
    axes = reduced_axes(c.attrs, c.x.ndim)
    hit = op("Cast", c.x == _kept(c, c.out), dtype=c.x.dtype)
    share = hit / op("ReduceSum", hit, axis=axes, keep_dims=True)
    return (share * _kept(c, c.g),)


for _name, _onnx, _grad in [
    ("ReduceSum", "ReduceSum", _sum_grad),
    ("ReduceMean", "ReduceMean", _mean_grad),
    ("ReduceMax", "ReduceMax", _extremum_grad),
    ("ReduceMin", "ReduceMin", _extremum_grad),
]:
    register(
        _name,
        infer=_infer_reduce,
        lower=_lower_reduce(_onnx),
        grad=_grad,
        attrs=_REDUCE_ATTRS,
        num_inputs=1,
        doc=f"{_name}(x, axis=None, keep_dims=False).",
    )


def _infer_arg(types, attrs):
    (x,) = types
    require(x.ndim > 0, "needs at least one dim")
    axis = normalize_axis(attrs["axis"], x.ndim)
    shape = (
        tuple(1 if i == axis else d for i, d in enumerate(x.shape))
        if attrs["keep_dims"]
        else (tuple(d for i, d in enumerate(x.shape) if i != axis))
    )
    return (TensorType(shape, DType(attrs["output_type"].value)),)


def _lower_arg(onnx_op: str):
    def lower(ctx, node, inputs, outputs):
        axis = normalize_axis(node.attrs["axis"], node.inputs[0].ndim)
        index = ctx.add1(onnx_op, inputs, axis=axis, keepdims=int(node.attrs["keep_dims"]))
        ctx.add("Cast", [index], outputs, to=node.outputs[0].dtype.onnx)

    return lower


for _name, _onnx in (("Argmax", "ArgMax"), ("Argmin", "ArgMin")):
    register(
        _name,
        infer=_infer_arg,
        lower=_lower_arg(_onnx),
        grad=ZERO_GRAD,
        attrs={"axis": -1, "keep_dims": False, "output_type": DType.int32},
        num_inputs=1,
        doc=f"{_name}(x, axis=-1, keep_dims=False, output_type=int32): index of the extreme value.",
    )
