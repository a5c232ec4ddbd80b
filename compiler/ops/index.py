"""Indexing ops: StridedSlice, Pad, Gather, GatherElements, ScatterAdd, UnsortedSegmentSum, OneHot.

They come in adjoint pairs, each the other's gradient: StridedSlice/Pad, Gather/UnsortedSegmentSum,
GatherElements/ScatterAdd.
"""

from __future__ import annotations

from tessel.compiler.builder import apply
from tessel.compiler.builder import apply as op
from tessel.compiler.dtypes import DType, as_dtype
from tessel.compiler.ir import Node, TensorType
from tessel.compiler.ops.common import ZERO_GRAD, moves_data, require
from tessel.compiler.registry import REQUIRED, register
from tessel.compiler.shapes import format_shape, normalize_axis
from tessel.compiler.sharding import ShardingSpec, pointwise_like

_INT64_MAX, _INT64_MIN = 2**63 - 1, -(2**63)


def slice_specs(x: TensorType, attrs) -> list[tuple[int, int, int, int] | None]:
    """Per dim: None for a full slice, else (start, stop, step, length) in Python's slice semantics."""
    begin, end, strides = attrs["begin"], attrs["end"], attrs["strides"]
    require(
        len(begin) == len(end) == len(strides) == x.ndim,
        f"begin/end/strides need one entry per dim of {format_shape(x.shape)}",
    )
    specs = []
    for axis, (b, e, s, d) in enumerate(zip(begin, end, strides, x.shape)):
        require(s != 0, f"stride of dim {axis} is 0")
        if s == 1 and b in (None, 0) and e is None:
            specs.append(None)
            continue
        require(isinstance(d, int), f"cannot slice symbolic dim {axis} ({d!r}) other than in full")
        start, stop, step = slice(b, e, s).indices(d)
        specs.append((start, stop, step, len(range(start, stop, step))))
    return specs


def _infer_strided_slice(types, attrs):
    (x,) = types
    specs = slice_specs(x, attrs)
    return (TensorType(tuple(d if s is None else s[3] for d, s in zip(x.shape, specs)), x.dtype),)


def _lower_strided_slice(ctx, node, inputs, outputs):
    specs = slice_specs(node.inputs[0].type, node.attrs)
    axes = [i for i, s in enumerate(specs) if s is not None]
    if not axes:
        ctx.add("Identity", inputs, outputs)
        return
    starts = [specs[i][0] for i in axes]
    # Python's normalised stop of -1 with a negative step means "past index 0"; ONNX reads -1 as the last index.
    ends = [_INT64_MIN if specs[i][1] < 0 else specs[i][1] for i in axes]
    steps = [specs[i][2] for i in axes]
    ctx.add("Slice", [inputs[0], ctx.ints(starts), ctx.ints(ends), ctx.ints(axes), ctx.ints(steps)], outputs)


def _strided_slice_grad(c):
    """Place the cotangent back where the slice took it: reverse, spread by the stride with zeros, then pad."""
    g, x = c.g, c.x
    for axis, spec in enumerate(slice_specs(x.value.type, c.attrs)):
        if spec is None:
            continue
        start, _, step, length = spec
        if length == 0:
            return (op("ZerosLike", x),)
        first = start if step > 0 else start + (length - 1) * step
        if step < 0:
            g = _slice_axis(g, axis, None, None, -1)
        stride = abs(step)
        if stride > 1:
            pads = [(0, 0)] * (g.ndim + 1)
            pads[axis + 1] = (0, stride - 1)
            spread = op("Pad", op("ExpandDims", g, axis=axis + 1), paddings=tuple(pads))
            merged = list(g.shape)
            merged[axis] = length * stride
            g = _slice_axis(op("Reshape", spread, shape=tuple(merged)), axis, 0, (length - 1) * stride + 1, 1)
        pads = [(0, 0)] * g.ndim
        pads[axis] = (first, x.shape[axis] - first - g.shape[axis])
        g = op("Pad", g, paddings=tuple(pads))
    return (g,)


def _slice_axis(x, axis, begin, end, stride):
    n = x.ndim
    b, e, s = [None] * n, [None] * n, [1] * n
    b[axis], e[axis], s[axis] = begin, end, stride
    return op("StridedSlice", x, begin=tuple(b), end=tuple(e), strides=tuple(s))


def _strided_slice_sharding(node: Node) -> ShardingSpec:
    """A sliced dim stays whole, except a periodic one: every k-th element from an offset below k to the end of a
    dim that k divides (x[i::k], how MicroBatchInterleaved cuts its copies). Cut into blocks whose size k divides
    (the output's split says so), each block holds exactly its share of the result, taken by the same slice."""
    x = node.inputs[0]
    specs = slice_specs(x.type, node.attrs)
    sliced = tuple(i for i, s in enumerate(specs) if s is not None and not _periodic(s, x.shape[i]))
    return pointwise_like(node, sliced, "a sliced dim")


def _periodic(spec: tuple[int, int, int, int], size: int) -> bool:
    start, stop, step, _ = spec
    return 0 <= start < step and stop == size and size % step == 0


register(
    "StridedSlice",
    infer=_infer_strided_slice,
    sharding=_strided_slice_sharding,
    lower=_lower_strided_slice,
    grad=_strided_slice_grad,
    cost=moves_data,
    attrs={"begin": REQUIRED, "end": REQUIRED, "strides": REQUIRED},
    num_inputs=1,
    selects=True,
    doc="StridedSlice(x, begin, end, strides): one entry per dim, Python slice semantics; None = open end.",
)


def _infer_pad(types, attrs):
    (x,) = types
    pads = attrs["paddings"]
    require(len(pads) == x.ndim, f"paddings need one (before, after) pair per dim of {format_shape(x.shape)}")
    shape = []
    for d, (before, after) in zip(x.shape, pads):
        require(before >= 0 and after >= 0, f"paddings {pads} must be non-negative")
        require(isinstance(d, int) or before == after == 0, f"cannot pad symbolic dim {d!r}")
        shape.append(d + before + after if isinstance(d, int) else d)
    return (TensorType(tuple(shape), x.dtype),)


def _lower_pad(ctx, node, inputs, outputs):
    pads = node.attrs["paddings"]
    flat = [p[0] for p in pads] + [p[1] for p in pads]
    value = ctx.const(node.attrs["value"], node.inputs[0].dtype)
    ctx.add("Pad", [inputs[0], ctx.ints(flat), value], outputs, mode="constant")


def _pad_grad(c):
    pads = c.attrs["paddings"]
    begin = tuple(b if (b or a) else None for b, a in pads)
    end = tuple(b + d if (b or a) else None for (b, a), d in zip(pads, c.x.shape))
    return (op("StridedSlice", c.g, begin=begin, end=end, strides=(1,) * len(pads)),)


def _pad_sharding(node: Node) -> ShardingSpec:
    padded = tuple(i for i, (b, a) in enumerate(node.attrs["paddings"]) if b or a)
    return pointwise_like(node, padded, "a padded dim")


register(
    "Pad",
    infer=_infer_pad,
    sharding=_pad_sharding,
    lower=_lower_pad,
    grad=_pad_grad,
    cost=moves_data,
    attrs={"paddings": REQUIRED, "value": 0.0},
    num_inputs=1,
    doc="Pad(x, paddings=((before, after), ...), value=0.0): constant padding.",
)


def _require_int(t: TensorType, what: str) -> None:
    require(t.dtype.is_int, f"{what} must be int32 or int64, got {t.dtype.value}")


def _infer_gather(types, attrs):
    x, idx = types
    _require_int(idx, "indices")
    axis = normalize_axis(attrs["axis"], x.ndim)
    return (TensorType(x.shape[:axis] + idx.shape + x.shape[axis + 1 :], x.dtype),)


def _gather_grad(c):
    x, idx = c.inputs
    axis, k = normalize_axis(c.attrs["axis"], x.ndim), idx.ndim
    if axis == 0:
        return op("UnsortedSegmentSum", c.g, idx, num_segments=x.shape[0]), None
    # Move the gathered dims first, scatter-add along them, then move the result's dim 0 back to `axis`.
    perm = (*range(axis, axis + k), *range(axis), *range(axis + k, c.g.ndim))
    summed = op("UnsortedSegmentSum", op("Transpose", c.g, perm=perm), idx, num_segments=x.shape[axis])
    back = (*range(1, axis + 1), 0, *range(axis + 1, x.ndim))
    return op("Transpose", summed, perm=back), None


def _gather_emit(op) -> tuple:
    """Gather from a table split along the gathered axis: each rank looks up the indices that fall in its rows
    (shifted by its first row) and contributes zeros elsewhere, so the outputs are partial sums."""
    axis = normalize_axis(op.attrs["axis"], op.inputs[0].ndim)
    index, count = op.block(op.spec.inputs[0][axis])
    if count == 1:
        return op.default()
    table, idx = op.tensor(0), op.tensor(1)
    rows = table.shape[axis]
    shifted = idx - op.rank_constant(index * rows, idx.dtype)
    inside = (shifted >= 0) & (shifted < rows)
    picked = apply("Gather", table, apply("Select", inside, shifted, 0), axis=axis)
    mask_shape = (1,) * axis + tuple(idx.shape) + (1,) * (table.ndim - axis - 1)
    mask = apply("Reshape", inside, shape=mask_shape)
    return (apply("Select", mask, picked, 0.0).value,)


def _gather_sharding(node: Node) -> ShardingSpec:
    """A table split by rows (an Embedding's vocabulary) gives partial sums; see _gather_emit."""
    x, idx = node.inputs
    axis = normalize_axis(node.attrs["axis"], x.ndim)
    names = tuple(f"x{i}" for i in range(x.ndim))
    ids = tuple(f"i{i}" for i in range(idx.ndim))
    return ShardingSpec((names, ids), (names[:axis] + ids + names[axis + 1 :],), emit=_gather_emit)


register(
    "Gather",
    infer=_infer_gather,
    sharding=_gather_sharding,
    lower=lambda ctx, node, i, o: ctx.add("Gather", i, o, axis=normalize_axis(node.attrs["axis"], node.inputs[0].ndim)),
    grad=_gather_grad,
    cost=moves_data,
    attrs={"axis": 0},
    num_inputs=2,
    doc="Gather(x, indices, axis=0): x's slices at `indices` along `axis` (MindSpore Gather).",
)


def _infer_segment_sum(types, attrs):
    data, ids = types
    _require_int(ids, "segment_ids")
    require(
        data.shape[: ids.ndim] == ids.shape,
        f"segment_ids {format_shape(ids.shape)} must match the leading dims of data {format_shape(data.shape)}",
    )
    return (TensorType((attrs["num_segments"], *data.shape[ids.ndim :]), data.dtype),)


def _lower_segment_sum(ctx, node, inputs, outputs):
    out = node.outputs[0]
    zeros = ctx.full(out.shape, 0, out.dtype)
    ids = ctx.add1("Unsqueeze", [ctx.cast(inputs[1], node.inputs[1].dtype, DType.int64), ctx.ints([-1])])
    _scatter_add(ctx, "ScatterND", [zeros, ids, inputs[0]], outputs, out.dtype)


def _scatter_add(ctx, onnx_op: str, inputs: list[str], outputs: list[str], dtype: DType, **attrs) -> None:
    """ONNX `onnx_op` with reduction add over (data, indices, updates); in float32 for float16 data, which ONNX
    Runtime's CPU kernels do not add (a float16 gradient of Gather, cross-entropy or max pooling)."""
    if dtype != DType.float16:
        ctx.add(onnx_op, inputs, outputs, reduction="add", **attrs)
        return
    data, indices, updates = inputs
    wide = [ctx.cast(data, dtype, DType.float32), indices, ctx.cast(updates, dtype, DType.float32)]
    summed = ctx.add1(onnx_op, wide, reduction="add", **attrs)
    ctx.add("Cast", [summed], outputs, to=dtype.onnx)


def _segment_sum_sharding(node: Node) -> ShardingSpec:
    """Splitting the summed rows gives partial sums; the segment dim may not split."""
    data, ids = node.inputs
    lead = tuple(f"i{k}" for k in range(ids.ndim))
    rest = tuple(f"r{k}" for k in range(data.ndim - ids.ndim))
    return ShardingSpec((lead + rest, lead), (("seg", *rest),), frozenset({"seg"}), "the segment dim", "sum")


register(
    "UnsortedSegmentSum",
    infer=_infer_segment_sum,
    sharding=_segment_sum_sharding,
    lower=_lower_segment_sum,
    grad=lambda c: (op("Gather", c.g, c.inputs[1], axis=0), None),
    attrs={"num_segments": REQUIRED},
    num_inputs=2,
    doc="UnsortedSegmentSum(data, segment_ids, num_segments): out[i] = sum of data[j] where segment_ids[j] == i.",
)


def _infer_gather_elements(types, attrs):
    x, idx = types
    _require_int(idx, "indices")
    require(idx.ndim == x.ndim, f"indices {format_shape(idx.shape)} need the rank of x {format_shape(x.shape)}")
    normalize_axis(attrs["axis"], x.ndim)
    return (TensorType(idx.shape, x.dtype),)


def _infer_scatter_add(types, attrs):
    data, idx, updates = types
    _require_int(idx, "indices")
    require(idx.shape == updates.shape, f"indices {format_shape(idx.shape)} and updates must have one shape")
    require(updates.dtype == data.dtype, f"updates dtype {updates.dtype.value} differs from {data.dtype.value}")
    normalize_axis(attrs["axis"], data.ndim)
    return (data,)


def _axis_of(node):
    return normalize_axis(node.attrs["axis"], node.inputs[0].ndim)


def _shared_where_equal(x, other, axis: int, prefix: str) -> tuple[str, ...]:
    """Labels for `other`: x's label where the sizes agree, else its own (fixed)."""
    return tuple(
        f"d{i}" if i != axis and i < x.ndim and d == x.shape[i] else f"{prefix}{i}" for i, d in enumerate(other.shape)
    )


def _gather_elements_sharding(node: Node) -> ShardingSpec:
    x, idx = node.inputs
    axis = normalize_axis(node.attrs["axis"], x.ndim)
    names = tuple(f"d{i}" for i in range(x.ndim))
    labels = _shared_where_equal(x, idx, axis, "g")
    locked = frozenset({names[axis], *(lab for lab in labels if lab.startswith("g"))})
    return ShardingSpec((names, labels), (labels,), locked, "the gathered axis", None)


def _scatter_add_sharding(node: Node) -> ShardingSpec:
    data, idx, _ = node.inputs
    axis = normalize_axis(node.attrs["axis"], data.ndim)
    names = tuple(f"d{i}" for i in range(data.ndim))
    labels = _shared_where_equal(data, idx, axis, "u")
    locked = frozenset({names[axis], *(lab for lab in labels if lab.startswith("u"))})
    return ShardingSpec((names, labels, labels), (names,), locked, "the scattered axis", None)


register(
    "GatherElements",
    infer=_infer_gather_elements,
    sharding=_gather_elements_sharding,
    lower=lambda ctx, node, i, o: ctx.add("GatherElements", i, o, axis=_axis_of(node)),
    grad=lambda c: (op("ScatterAdd", op("ZerosLike", c.x), c.inputs[1], c.g, axis=c.attrs["axis"]), None),
    cost=moves_data,
    attrs={"axis": 0},
    num_inputs=2,
    doc="GatherElements(x, indices, axis): out[..i..] = x[..indices[..i..]..] along `axis`.",
)
register(
    "ScatterAdd",
    infer=_infer_scatter_add,
    sharding=_scatter_add_sharding,
    lower=lambda ctx, node, i, o: _scatter_add(
        ctx, "ScatterElements", i, o, node.outputs[0].dtype, axis=_axis_of(node)
    ),
    grad=lambda c: (c.g, None, op("GatherElements", c.g, c.inputs[1], axis=c.attrs["axis"])),
    attrs={"axis": 0},
    num_inputs=3,
    doc="ScatterAdd(data, indices, updates, axis): data with updates added at indices along `axis`.",
)


def _infer_one_hot(types, attrs):
    (idx,) = types
    _require_int(idx, "indices")
    axis = normalize_axis(attrs["axis"], idx.ndim + 1)
    shape = list(idx.shape)
    shape.insert(axis, attrs["depth"])
    return (TensorType(tuple(shape), as_dtype(attrs["dtype"])),)


def _lower_one_hot(ctx, node, inputs, outputs):
    a = node.attrs
    values = ctx.const([a["off_value"], a["on_value"]], DType.float32)
    index = ctx.cast(inputs[0], node.inputs[0].dtype, DType.int64)
    depth = ctx.const(a["depth"], DType.int64)
    # ONNX counts a negative index from the end; MindSpore gives it all off_value (its CPU kernel), as ONNX does an
    # index outside [-depth, depth): a negative one becomes depth.
    index = ctx.add1("Where", [ctx.add1("Less", [index, ctx.const(0, DType.int64)]), depth, index])
    axis = normalize_axis(a["axis"], node.outputs[0].ndim)
    hot = ctx.add1("OneHot", [index, depth, values], axis=axis)
    ctx.add("Cast", [hot], outputs, to=node.outputs[0].dtype.onnx)


def _one_hot_sharding(node: Node) -> ShardingSpec:
    idx = node.inputs[0]
    names = tuple(f"d{i}" for i in range(idx.ndim))
    axis = normalize_axis(node.attrs["axis"], idx.ndim + 1)
    out = (*names[:axis], "depth", *names[axis:])
    return ShardingSpec((names,), (out,), frozenset({"depth"}), "the one-hot depth", None)


register(
    "OneHot",
    infer=_infer_one_hot,
    sharding=_one_hot_sharding,
    lower=_lower_one_hot,
    grad=ZERO_GRAD,
    attrs={"depth": REQUIRED, "on_value": 1.0, "off_value": 0.0, "axis": -1, "dtype": DType.float32},
    num_inputs=1,
    doc="OneHot(indices, depth, on_value=1, off_value=0, axis=-1, dtype=float32).",
)
