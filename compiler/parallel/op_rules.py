"""The sharding rule of every op in the registry, as one table (`RULES`) built from the generators in rules.py.

Most entries are one line: element-wise ops share `pointwise`, the matrix products one einsum equation per
transpose case, convolution and pooling an equation with their windowed dims fixed. The few ops that need more
than labels bring a local emitter: ReduceMean rescales its partial means, Gather splits its table by rows (the
vocabulary of an Embedding) with masked, shifted indices and partial sums.
"""

from __future__ import annotations

import math

from tessel.compiler import registry
from tessel.compiler.builder import SymbolicTensor, apply
from tessel.compiler.ir import Node
from tessel.compiler.ops.index import slice_specs
from tessel.compiler.parallel import virtual_ops  # noqa: F401 - registers VirtualDiv, which RULES names
from tessel.compiler.parallel.rules import (
    Rule,
    ShardingSpec,
    along_axis,
    broadcast_to,
    depend,
    einsum,
    pointwise,
    reduction,
    replicated,
    reshape,
    transpose,
)
from tessel.compiler.shapes import normalize_axis

# fmt: off
POINTWISE = (
    "Abs", "Add", "Assign", "Cast", "Ceil", "Cos", "Div", "Dropout", "Equal", "Erf", "Exp", "Floor", "GELU",
    "Greater", "GreaterEqual", "Identity", "LeakyReLU", "Less", "LessEqual", "Log", "LogicalAnd", "LogicalNot",
    "LogicalOr", "Maximum", "Minimum", "Mul", "Neg", "NotEqual", "OnesLike", "Pow", "ReLU", "Reciprocal", "Round",
    "Rsqrt", "Select", "Sigmoid", "Sign", "Sin", "Sqrt", "Square", "StopGradient", "Sub", "Tanh", "VirtualDiv",
    "ZerosLike",
)
# fmt: on
REPLICATED = ("Constant", "Fill", "Zeros", "Ones", "DimSize")
SPATIAL = "the spatial dims of a window op (rows near a split would need their neighbours' halo)"

_MATMUL = {
    (False, False): "mk,kn->mn",
    (False, True): "mk,nk->mn",
    (True, False): "km,kn->mn",
    (True, True): "km,nk->mn",
}


def matmul(node: Node) -> ShardingSpec:
    """MatMul and BatchMatMul (and so Dense): one einsum per transpose case; a split k gives partial sums."""
    equation = _MATMUL[(node.attrs["transpose_a"], node.attrs["transpose_b"])]
    if node.op != "MatMul":
        lhs, out = equation.split("->")
        a, b = lhs.split(",")
        equation = f"...{a},...{b}->...{out}"
    return einsum(equation)(node)


def layer_norm(node: Node) -> ShardingSpec:
    x = node.inputs[0]
    norm = normalize_axis(node.attrs["begin_norm_axis"], x.ndim)
    params = normalize_axis(node.attrs["begin_params_axis"], x.ndim)
    names = tuple(f"d{i}" for i in range(x.ndim))
    stats = names[:norm] + tuple(f"s{i}" for i in range(norm, x.ndim))
    locked = frozenset(names[norm:] + stats[norm:])
    why = "LayerNorm normalises over it"
    return ShardingSpec((names, names[params:], names[params:]), (names, stats, stats), locked, why, None)


def batch_norm(node: Node) -> ShardingSpec:
    if node.attrs["is_training"]:
        return einsum("nc...,c,c,c,c->nc...,c,c,c,c", fixed="n.", why="batch statistics are taken over it")(node)
    return einsum("nc...,c,c,c,c->nc...")(node)


def conv(equation: str, fixed: str, shape_attr: str | None = None) -> Rule:
    """Convolutions: batch and output channels split; input channels give partial sums (group=1 only)."""

    def rule(node: Node) -> ShardingSpec:
        grouped = "co" if node.attrs["group"] != 1 else ""
        return einsum(equation, fixed + grouped, SPATIAL, shape_attr=shape_attr)(node)

    return rule


def cross_entropy(sparse: bool) -> Rule:
    return einsum("...c,...->..." if sparse else "...c,...c->...", fixed="c", why="the class axis", reduce=None)


def segment_sum(node: Node) -> ShardingSpec:
    """UnsortedSegmentSum: splitting the summed rows gives partial sums; the segment dim may not split."""
    data, ids = node.inputs
    lead = tuple(f"i{k}" for k in range(ids.ndim))
    rest = tuple(f"r{k}" for k in range(data.ndim - ids.ndim))
    return ShardingSpec((lead + rest, lead), (("seg", *rest),), frozenset({"seg"}), "the segment dim", "sum")


def _shared_where_equal(x, other, axis: int, prefix: str) -> tuple[str, ...]:
    """Labels for `other`: x's label where the sizes agree, else its own (fixed)."""
    return tuple(
        f"d{i}" if i != axis and i < x.ndim and d == x.shape[i] else f"{prefix}{i}" for i, d in enumerate(other.shape)
    )


def gather_elements(node: Node) -> ShardingSpec:
    x, idx = node.inputs
    axis = normalize_axis(node.attrs["axis"], x.ndim)
    names = tuple(f"d{i}" for i in range(x.ndim))
    labels = _shared_where_equal(x, idx, axis, "g")
    locked = frozenset({names[axis], *(lab for lab in labels if lab.startswith("g"))})
    return ShardingSpec((names, labels), (labels,), locked, "the gathered axis", None)


def scatter_add(node: Node) -> ShardingSpec:
    data, idx, _ = node.inputs
    axis = normalize_axis(node.attrs["axis"], data.ndim)
    names = tuple(f"d{i}" for i in range(data.ndim))
    labels = _shared_where_equal(data, idx, axis, "u")
    locked = frozenset({names[axis], *(lab for lab in labels if lab.startswith("u"))})
    return ShardingSpec((names, labels, labels), (names,), locked, "the scattered axis", None)


def one_hot(node: Node) -> ShardingSpec:
    idx = node.inputs[0]
    names = tuple(f"d{i}" for i in range(idx.ndim))
    axis = normalize_axis(node.attrs["axis"], idx.ndim + 1)
    out = (*names[:axis], "depth", *names[axis:])
    return ShardingSpec((names,), (out,), frozenset({"depth"}), "the one-hot depth", None)


def concat(node: Node) -> ShardingSpec:
    axis = normalize_axis(node.attrs["axis"], node.outputs[0].ndim)
    names = [f"d{i}" for i in range(node.outputs[0].ndim)]
    inputs = tuple(tuple(f"c{k}" if i == axis else n for i, n in enumerate(names)) for k in range(len(node.inputs)))
    locked = frozenset({f"d{axis}", *(f"c{k}" for k in range(len(node.inputs)))})
    return ShardingSpec(inputs, (tuple(names),), locked, "the concat axis", None)


def split(node: Node) -> ShardingSpec:
    axis = normalize_axis(node.attrs["axis"], node.inputs[0].ndim)
    return pointwise_like(node, (axis,), "the split axis")


def strided_slice(node: Node) -> ShardingSpec:
    sliced = tuple(i for i, s in enumerate(slice_specs(node.inputs[0].type, node.attrs)) if s is not None)
    return pointwise_like(node, sliced, "a sliced dim")


def pad(node: Node) -> ShardingSpec:
    padded = tuple(i for i, (b, a) in enumerate(node.attrs["paddings"]) if b or a)
    return pointwise_like(node, padded, "a padded dim")


def pointwise_like(node: Node, fixed_dims: tuple[int, ...], why: str) -> ShardingSpec:
    """Same labels in and out (sizes may differ on the fixed dims, which never split)."""
    names = tuple(f"d{i}" for i in range(node.inputs[0].ndim))
    locked = frozenset(names[i] for i in fixed_dims)
    return ShardingSpec((names,), (names,) * len(node.outputs), locked, why, None)


# --- local emitters ------------------------------------------------------------------------------------------------


def _mean_emit(op) -> tuple:
    """ReduceMean over a split dim: each rank's mean of its part, scaled so that the parts add up to the mean."""
    (out,) = op.default()
    parts = math.prod(op.block(label)[1] for label in op.spec.contracted(0))
    if parts == 1:
        return (out,)
    return ((SymbolicTensor(op.builder, out) * (1.0 / parts)).value,)


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


def gather(node: Node) -> ShardingSpec:
    x, idx = node.inputs
    axis = normalize_axis(node.attrs["axis"], x.ndim)
    names = tuple(f"x{i}" for i in range(x.ndim))
    ids = tuple(f"i{i}" for i in range(idx.ndim))
    return ShardingSpec((names, ids), (names[:axis] + ids + names[axis + 1 :],), emit=_gather_emit)


RULES: dict[str, Rule] = {
    **dict.fromkeys(POINTWISE, pointwise),
    **dict.fromkeys(REPLICATED, replicated),
    **dict.fromkeys(("MatMul", "BatchMatMul"), matmul),
    "BiasAdd": einsum("nc...,c->nc..."),
    "Softmax": along_axis("the softmax axis"),
    "LogSoftmax": along_axis("the log-softmax axis"),
    "ReduceSum": reduction("sum"),
    "ReduceMean": reduction("sum", emit=_mean_emit),
    "ReduceMax": reduction("max"),
    "ReduceMin": reduction("min"),
    "Argmax": reduction(None, "the arg-reduced axis"),
    "Argmin": reduction(None, "the arg-reduced axis"),
    "SoftmaxCrossEntropy": cross_entropy(sparse=False),
    "SparseSoftmaxCrossEntropy": cross_entropy(sparse=True),
    "LayerNorm": layer_norm,
    "BatchNorm": batch_norm,
    "Conv2D": conv("nchw,ocyx->noHW", "hwyxHW"),
    "Conv2DBackpropInput": conv("noHW,ocyx->nchw", "HWyxhw", "input_shape"),
    "Conv2DBackpropFilter": conv("noHW,nchw->ocyx", "HWhwyx", "filter_shape"),
    "MaxPool": einsum("nchw->ncHW", "hwHW", SPATIAL),
    "MaxPoolWithArgmax": einsum("nchw->ncHW,ncHW", "hwHW", SPATIAL),
    "AvgPool": einsum("nchw->ncHW", "hwHW", SPATIAL),
    **dict.fromkeys(("Reshape", "Flatten", "ExpandDims", "Squeeze"), reshape),
    "Transpose": transpose,
    "BroadcastTo": broadcast_to,
    "Depend": depend,
    "Gather": gather,
    "UnsortedSegmentSum": segment_sum,
    "GatherElements": gather_elements,
    "ScatterAdd": scatter_add,
    "OneHot": one_hot,
    "Concat": concat,
    "Split": split,
    "StridedSlice": strided_slice,
    "Pad": pad,
}


def rule_for(op: str) -> Rule:
    """The sharding rule of `op`: its OpDef's own `sharding` slot if it defines one, else this table's entry,
    else `replicated` (the op runs whole on every rank, after its inputs are gathered)."""
    return registry.get(op).sharding or RULES.get(op, replicated)
