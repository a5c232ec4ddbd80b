"""Shape ops: Reshape, Flatten, Transpose, ExpandDims, Squeeze, BroadcastTo, Concat, Split, DimSize.

The layout-only ops share one gradient (reshape the cotangent back); Concat and Split are each other's gradient.
"""

from __future__ import annotations

import math

from tessel.compiler.builder import apply as op
from tessel.compiler.builder import apply_all
from tessel.compiler.dtypes import as_dtype
from tessel.compiler.ir import Node, TensorType
from tessel.compiler.ops.common import ZERO_GRAD, infer_same, lower_as, moves_data, operand_dtype, require
from tessel.compiler.registry import REQUIRED, register
from tessel.compiler.shapes import broadcast, format_shape, infer_reshape, normalize_axes, normalize_axis
from tessel.compiler.sharding import (
    ShardingSpec,
    broadcast_to,
    pointwise,
    pointwise_like,
    replicated,
    reshape,
    transpose,
)


def _reshape_back(c):
    return (op("Reshape", c.g, shape=c.x.shape),)


def _register_view(name: str, infer, lower, attrs: dict, doc: str) -> None:
    register(
        name,
        infer=infer,
        sharding=reshape,
        lower=lower,
        grad=_reshape_back,
        cost=moves_data,
        attrs=attrs,
        num_inputs=1,
        selects=True,
        doc=doc,
    )


def _infer_reshape(types, attrs):
    (x,) = types
    return (TensorType(infer_reshape(x.shape, attrs["shape"]), x.dtype),)


def _lower_reshape(ctx, node, inputs, outputs):
    src, dst = node.inputs[0].shape, node.outputs[0].shape
    # ONNX Reshape copies a 0 from the input's dim: use it for symbols in place, so the shape stays constant.
    dims = [0 if isinstance(d, str) and i < len(src) and src[i] == d else d for i, d in enumerate(dst)]
    ctx.add("Reshape", [inputs[0], ctx.shape(dims)], outputs)


_register_view("Reshape", _infer_reshape, _lower_reshape, {"shape": REQUIRED}, "Reshape(x, shape); one dim may be -1.")


def _infer_flatten(types, attrs):
    (x,) = types
    require(x.ndim >= 1, "Flatten needs at least 1 dim")
    rest = x.shape[1:]
    require(all(isinstance(d, int) for d in rest), f"cannot flatten symbolic dims {format_shape(rest)}")
    return (TensorType((x.shape[0], math.prod(rest)), x.dtype),)


_register_view("Flatten", _infer_flatten, lower_as("Flatten", axis=1), {}, "Flatten(x): keep dim 0, merge the rest.")


def _infer_expand_dims(types, attrs):
    (x,) = types
    axis = attrs["axis"]
    axes = normalize_axes(axis, x.ndim + (1 if isinstance(axis, int) else len(axis)))
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return (TensorType(tuple(shape), x.dtype),)


def _lower_expand_dims(ctx, node, inputs, outputs):
    axis = node.attrs["axis"]
    axes = normalize_axes(axis, node.outputs[0].ndim)
    ctx.add("Unsqueeze", [inputs[0], ctx.ints(axes)], outputs)


_register_view("ExpandDims", _infer_expand_dims, _lower_expand_dims, {"axis": REQUIRED}, "Insert size-1 dim(s).")


def _squeezed(x: TensorType, axis) -> tuple[int, ...]:
    if axis in (None, ()):
        return tuple(i for i, d in enumerate(x.shape) if d == 1)
    axes = normalize_axes(axis, x.ndim)
    for a in axes:
        require(x.shape[a] == 1, f"cannot squeeze dim {a} of size {x.shape[a]} in {format_shape(x.shape)}")
    return axes


def _infer_squeeze(types, attrs):
    (x,) = types
    axes = _squeezed(x, attrs["axis"])
    return (TensorType(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype),)


def _lower_squeeze(ctx, node, inputs, outputs):
    axes = _squeezed(node.inputs[0].type, node.attrs["axis"])
    ctx.add("Squeeze", [inputs[0], ctx.ints(axes)] if axes else inputs, outputs)


_register_view("Squeeze", _infer_squeeze, _lower_squeeze, {"axis": ()}, "Remove size-1 dims (all when axis=()).")


def _infer_transpose(types, attrs):
    (x,) = types
    perm = tuple(attrs["perm"])
    require(sorted(perm) == list(range(x.ndim)), f"perm {perm} is not a permutation of {x.ndim} dims")
    return (TensorType(tuple(x.shape[p] for p in perm), x.dtype),)


def _transpose_grad(c):
    perm = c.attrs["perm"]
    inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
    return (op("Transpose", c.g, perm=inverse),)


register(
    "Transpose",
    infer=_infer_transpose,
    sharding=transpose,
    lower=lambda ctx, node, i, o: ctx.add("Transpose", i, o, perm=list(node.attrs["perm"])),
    grad=_transpose_grad,
    cost=moves_data,
    attrs={"perm": REQUIRED},
    num_inputs=1,
    selects=True,
    doc="Transpose(x, perm).",
)


def _infer_broadcast_to(types, attrs):
    (x,) = types
    target = tuple(attrs["shape"])
    require(len(target) >= x.ndim, f"cannot broadcast {format_shape(x.shape)} to fewer dims {format_shape(target)}")
    aligned = x.shape[:0] + (None,) * (len(target) - x.ndim) + x.shape
    target = tuple(a if t == -1 else t for a, t in zip(aligned, target))
    require(broadcast(x.shape, target) == target, f"cannot broadcast {format_shape(x.shape)} to {format_shape(target)}")
    return (TensorType(target, x.dtype),)


def _lower_broadcast_to(ctx, node, inputs, outputs):
    src, dst = node.inputs[0].shape, node.outputs[0].shape
    aligned = (1,) * (len(dst) - len(src)) + src
    # Expand keeps the input's dim where the shape says 1: use that for dims already right (symbols included).
    dims = [1 if a == d else d for a, d in zip(aligned, dst)]
    ctx.add("Expand", [inputs[0], ctx.shape(dims)], outputs)


register(
    "BroadcastTo",
    infer=_infer_broadcast_to,
    sharding=broadcast_to,
    lower=_lower_broadcast_to,
    grad=lambda c: (c.g,),  # autodiff sums the broadcast dims away
    cost=moves_data,
    attrs={"shape": REQUIRED},
    num_inputs=1,
    doc="BroadcastTo(x, shape); -1 keeps the input's dim.",
)


def _infer_dim_size(types, attrs):
    return (TensorType((), as_dtype(attrs["dtype"])),)


def _lower_dim_size(ctx, node, inputs, outputs):
    x = node.inputs[0]
    dims = [x.shape[a] for a in normalize_axes(node.attrs["axes"], x.ndim)]
    ctx.add("Identity", [ctx.count(dims, node.outputs[0].dtype)], outputs)


register(
    "DimSize",
    infer=_infer_dim_size,
    sharding=replicated,
    lower=_lower_dim_size,
    grad=ZERO_GRAD,
    attrs={"axes": None, "dtype": REQUIRED},
    num_inputs=1,
    doc="DimSize(x, axes, dtype): product of x's dims over `axes` as a scalar (run-time for symbolic dims).",
)


def _infer_concat(types, attrs):
    require(len(types) >= 1, "Concat needs at least one input")
    first = types[0]
    axis = normalize_axis(attrs["axis"], first.ndim)
    for t in types[1:]:
        same = t.ndim == first.ndim and all(a == b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis)
        require(
            same,
            f"shapes {format_shape(first.shape)} and {format_shape(t.shape)} differ outside axis {axis}; "
            "the rule: every dim but the concat axis must match",
        )
    parts = [t.shape[axis] for t in types]
    require(all(isinstance(p, int) for p in parts) or len(parts) == 1, f"cannot concat along symbolic dims {parts}")
    shape = list(first.shape)
    shape[axis] = parts[0] if len(parts) == 1 else sum(parts)
    return (TensorType(tuple(shape), operand_dtype(types)),)


def _lower_concat(ctx, node, inputs, outputs):
    dtype = node.outputs[0].dtype
    cast = [ctx.cast(n, v.dtype, dtype) for n, v in zip(inputs, node.inputs)]
    ctx.add("Concat", cast, outputs, axis=normalize_axis(node.attrs["axis"], node.outputs[0].ndim))


def _concat_grad(c):
    axis = c.attrs["axis"]
    sizes = tuple(x.shape[normalize_axis(axis, x.ndim)] for x in c.inputs)
    if len(sizes) == 1:
        return (c.g,)
    return apply_all("Split", c.g, axis=axis, sizes=sizes)


def _concat_sharding(node: Node) -> ShardingSpec:
    """Every dim but the concat axis splits, alike in every input."""
    axis = normalize_axis(node.attrs["axis"], node.outputs[0].ndim)
    names = [f"d{i}" for i in range(node.outputs[0].ndim)]
    inputs = tuple(tuple(f"c{k}" if i == axis else n for i, n in enumerate(names)) for k in range(len(node.inputs)))
    locked = frozenset({f"d{axis}", *(f"c{k}" for k in range(len(node.inputs)))})
    return ShardingSpec(inputs, (tuple(names),), locked, "the concat axis", None)


register(
    "Concat",
    infer=_infer_concat,
    sharding=_concat_sharding,
    lower=_lower_concat,
    grad=_concat_grad,
    cost=moves_data,
    attrs={"axis": 0},
    doc="Concat(*xs, axis=0).",
)


def split_sizes(x: TensorType, attrs) -> tuple[int, ...]:
    axis = normalize_axis(attrs["axis"], x.ndim)
    dim = x.shape[axis]
    require(isinstance(dim, int), f"cannot split symbolic dim {dim!r}")
    if attrs["sizes"] is not None:
        sizes = tuple(attrs["sizes"])
        require(sum(sizes) == dim, f"split sizes {sizes} do not add up to dim {axis} of size {dim}")
        return sizes
    count = attrs["output_num"]
    require(dim % count == 0, f"dim {axis} of size {dim} does not split into {count} equal parts")
    return (dim // count,) * count


def _infer_split(types, attrs):
    (x,) = types
    axis = normalize_axis(attrs["axis"], x.ndim)
    return tuple(TensorType((*x.shape[:axis], s, *x.shape[axis + 1 :]), x.dtype) for s in split_sizes(x, attrs))


def _lower_split(ctx, node, inputs, outputs):
    x = node.inputs[0]
    sizes = split_sizes(x.type, node.attrs)
    ctx.add("Split", [inputs[0], ctx.ints(sizes)], outputs, axis=normalize_axis(node.attrs["axis"], x.ndim))


def _split_grad(c):
    parts = [g if g is not None else op("ZerosLike", out) for g, out in zip(c.grads, c.outputs)]
    return (op("Concat", *parts, axis=c.attrs["axis"]),)


def _split_sharding(node: Node) -> ShardingSpec:
    axis = normalize_axis(node.attrs["axis"], node.inputs[0].ndim)
    return pointwise_like(node, (axis,), "the split axis")


register(
    "Split",
    infer=_infer_split,
    sharding=_split_sharding,
    lower=_lower_split,
    grad=_split_grad,
    cost=moves_data,
    attrs={"axis": 0, "output_num": 1, "sizes": None},
    num_inputs=1,
    doc="Split(x, axis=0, output_num=1) into equal parts, or into `sizes`.",
)
register(
    "Identity",
    infer=infer_same,
    sharding=pointwise,
    lower=lower_as("Identity"),
    identity=True,
    grad=lambda c: (c.g,),
    cost=moves_data,
    num_inputs=1,
    doc="Identity(x).",
)
