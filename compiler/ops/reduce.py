"""Reductions: ReduceSum / ReduceMean / ReduceMax / ReduceMin (axis, keep_dims) and Argmax / Argmin.

`axis=None` (or `()`) reduces every dim, as MindSpore does. Gradients broadcast the cotangent back over the
reduced dims; ReduceMean divides by the reduced element count, read at run time when a dim is symbolic.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import numpy_helper

from tessel.compiler.builder import SymbolicTensor
from tessel.compiler.builder import apply as op
from tessel.compiler.dtypes import DType
from tessel.compiler.ir import Node, TensorType
from tessel.compiler.ops.common import ZERO_GRAD, require
from tessel.compiler.registry import register
from tessel.compiler.shapes import is_static, normalize_axes, normalize_axis
from tessel.compiler.sharding import Rule, ShardingSpec

_REDUCE_ATTRS = {"axis": None, "keep_dims": False}


def reduced_axes(attrs, rank: int) -> tuple[int, ...]:
    axis = attrs["axis"]
    return normalize_axes(None if axis == () else axis, rank)


def _infer_reduce_numbers(types, attrs):
    require(types[0].dtype != DType.bool_, "a sum or mean of a bool tensor: cast it to a number type first")
    return _infer_reduce(types, attrs)


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
        if onnx_op == "ReduceSum" and _rows_as_product(node.inputs[0], axes):
            _lower_rows_sum(ctx, node, inputs[0], outputs)
            return
        if node.inputs[0].dtype == DType.bool_:  # max is any, min is all: through uint8, ONNX has no bool kernel
            wide = ctx.cast(inputs[0], DType.bool_, DType.uint8)
            out = ctx.add1(onnx_op, [wide, ctx.ints(axes)], keepdims=int(node.attrs["keep_dims"]))
            ctx.add("Cast", [out], outputs, to=DType.bool_.onnx)
            return
        ctx.add(onnx_op, [inputs[0], ctx.ints(axes)], outputs, keepdims=int(node.attrs["keep_dims"]))

    return lower


# A float32 sum over the leading dims (a bias's gradient: the rows of a batch summed) lowers to a product with a row
# of ones, ones(1, R) @ x(R, C), where C (the dims kept) is at least this many elements and R x C at least
# ROWS_PRODUCT_MIN_SIZE when R is known. ONNX Runtime 1.32's ReduceSum over dim 0 splits its work badly over
# threads: measured (CPU, us, ReduceSum against the product with its ones made at run time) at 1 thread 256 x 512
# 20.6 / 16.6, 4096 x 2048 2272 / 1354; at 2 threads 256 x 512 150 / 13, 32 x 512 15.6 / 7.8, 4096 x 2048 2461 / 654.
# Below these sizes the product's extra shape nodes cost more than they save (1 thread, 32 x 512: 6.7 / 7.7).
ROWS_PRODUCT_MIN_COLUMNS = 128
ROWS_PRODUCT_MIN_SIZE = 1 << 14


def _rows_as_product(x, axes: tuple[int, ...]) -> bool:
    lead = len(axes)
    rows, kept = x.shape[:lead], x.shape[lead:]
    if x.dtype != DType.float32 or axes != tuple(range(lead)) or not kept or not is_static(kept):
        return False
    columns = math.prod(kept)
    known_small = is_static(rows) and math.prod(rows) * columns < ROWS_PRODUCT_MIN_SIZE
    return columns >= ROWS_PRODUCT_MIN_COLUMNS and not known_small


def _lower_rows_sum(ctx, node, x: str, outputs) -> None:
    """ReduceSum of `node` over its input's leading dims as ones(1, R) @ x(R, C), reshaped to the output."""
    value = node.inputs[0]
    lead = len(reduced_axes(node.attrs, value.ndim))
    rows = value.shape[:lead]
    flat = x if value.ndim == 2 else ctx.add1("Reshape", [x, ctx.ints([-1, math.prod(value.shape[lead:])])])
    if lead == 1 or is_static(rows):
        ones = ctx.full([1, rows[0] if lead == 1 else math.prod(rows)], 1.0, DType.float32)
    else:  # several leading dims, some symbolic: as many ones as the flattened rows
        count = ctx.add1("Shape", [flat], start=0, end=1)
        one = numpy_helper.from_array(np.ones((1,), np.float32))
        ones = ctx.add1("ConstantOfShape", [ctx.add1("Concat", [ctx.ints([1]), count], axis=0)], value=one)
    summed = ctx.add1("MatMul", [ones, flat])
    ctx.add("Reshape", [summed, ctx.ints(node.outputs[0].shape)], outputs)


def _kept(c, t):
    """t (shaped like the reduction's output) with the reduced dims restored as size 1."""
    axes = reduced_axes(c.attrs, c.x.ndim)
    return t if c.attrs["keep_dims"] or not axes else op("ExpandDims", t, axis=axes)


def _sum_grad(c):
    return (op("BroadcastTo", _kept(c, c.g), shape=c.x.shape),)


def _mean_grad(c):
    axes = reduced_axes(c.attrs, c.x.ndim)
    if c.x.dtype.itemsize < 4:  # float16 holds counts up to 65504 (beyond: inf, a gradient of 0): 1/count is finer
        count = op("DimSize", c.x, axes=axes, dtype=DType.float32)
        return (op("BroadcastTo", _kept(c, c.g) * op("Cast", 1.0 / count, dtype=c.x.dtype), shape=c.x.shape),)
    count = op("DimSize", c.x, axes=axes, dtype=c.x.dtype)
    return (op("BroadcastTo", _kept(c, c.g) / count, shape=c.x.shape),)


def _extremum_grad(c):
    """Ties share the cotangent equally (MindSpore's _min_or_max_grad)."""
    axes = reduced_axes(c.attrs, c.x.ndim)
    hit = op("Cast", c.x == _kept(c, c.out), dtype=c.x.dtype)
    share = hit / op("ReduceSum", hit, axis=axes, keep_dims=True)
    return (share * _kept(c, c.g),)


def _reduction(combine: str | None, why: str = "", emit=None) -> Rule:
    """A split reduced dim gives partial results, combined with `combine` (None: the reduced dims may not split)."""

    def rule(node: Node) -> ShardingSpec:
        x = node.inputs[0]
        if "output_type" in node.attrs:  # Argmax / Argmin reduce one axis
            axes = (normalize_axis(node.attrs["axis"], x.ndim),)
        else:
            axes = reduced_axes(node.attrs, x.ndim)
        names = tuple(f"d{i}" for i in range(x.ndim))
        keep = node.attrs["keep_dims"]
        out = tuple(f"k{i}" if i in axes else n for i, n in enumerate(names) if keep or i not in axes)
        locked = {f"k{i}" for i in axes} | ({names[a] for a in axes} if combine is None else set())
        return ShardingSpec((names,), (out,), frozenset(locked), why, combine, emit=emit)

    return rule


def _mean_emit(op) -> tuple:
    """ReduceMean over a split dim: each rank's mean of its part, scaled so that the parts add up to the mean."""
    (out,) = op.default()
    parts = math.prod(op.block(label)[1] for label in op.spec.contracted(0))
    if parts == 1:
        return (out,)
    return ((SymbolicTensor(op.builder, out) * (1.0 / parts)).value,)


for _name, _onnx, _grad, _sharding in [
    ("ReduceSum", "ReduceSum", _sum_grad, _reduction("sum")),
    ("ReduceMean", "ReduceMean", _mean_grad, _reduction("sum", emit=_mean_emit)),
    ("ReduceMax", "ReduceMax", _extremum_grad, _reduction("max")),
    ("ReduceMin", "ReduceMin", _extremum_grad, _reduction("min")),
]:
    register(
        _name,
        infer=_infer_reduce if _name in ("ReduceMax", "ReduceMin") else _infer_reduce_numbers,
        sharding=_sharding,
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
        sharding=_reduction(None, "the arg-reduced axis"),
        lower=_lower_arg(_onnx),
        grad=ZERO_GRAD,
        attrs={"axis": -1, "keep_dims": False, "output_type": DType.int32},
        num_inputs=1,
        doc=f"{_name}(x, axis=-1, keep_dims=False, output_type=int32): index of the extreme value.",
    )


# TopK: the indices of the k largest (or smallest) elements along an axis, in order, ties lower index first (ONNX
# TopK's rule, which MindSpore's TopK and Sort follow too). Values are the input gathered at them (GatherElements,
# whose gradient scatters back), so this op itself has no gradient. k=None sorts the whole axis.
def _infer_topk(types, attrs):
    (x,) = types
    require(x.ndim > 0, "needs at least one dim")
    axis = normalize_axis(attrs["axis"], x.ndim)
    size, k = x.shape[axis], attrs["k"]
    if k is None:
        k = size
    else:
        require(isinstance(k, int) and k >= 0, f"k must be an int >= 0, got {k!r}")
        require(not isinstance(size, int) or k <= size, f"k={k} exceeds the {size} elements of axis {axis}")
    return (TensorType(tuple(k if i == axis else d for i, d in enumerate(x.shape)), DType.int64),)


def _lower_topk(ctx, node, inputs, outputs):
    x = node.inputs[0]
    axis = normalize_axis(node.attrs["axis"], x.ndim)
    k = ctx.dim(x.shape[axis]) if node.attrs["k"] is None else ctx.ints([node.attrs["k"]])
    values = ctx.fresh("topk_values")
    ctx.add("TopK", [inputs[0], k], [values, outputs[0]], axis=axis, largest=int(node.attrs["largest"]), sorted=1)


def _topk_sharding(node: Node) -> ShardingSpec:
    x = node.inputs[0]
    axis = normalize_axis(node.attrs["axis"], x.ndim)
    names = tuple(f"d{i}" for i in range(x.ndim))
    out = tuple("k" if i == axis else n for i, n in enumerate(names))
    return ShardingSpec((names,), (out,), frozenset({"k", names[axis]}), "the sorted axis", None)


register(
    "TopK",
    infer=_infer_topk,
    sharding=_topk_sharding,
    lower=_lower_topk,
    grad=ZERO_GRAD,
    attrs={"k": None, "axis": -1, "largest": True},
    num_inputs=1,
    doc="TopK(x, k=None, axis=-1, largest=True): int64 indices of the k largest (smallest) along axis, sorted, "
    "ties lower index first; k=None sorts the whole axis.",
)
