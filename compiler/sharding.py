"""Sharding rules: for each op, which dims of its inputs may be split and what that makes of its outputs.

A rule maps a node to a `ShardingSpec`, einsum-style: every input and output dim carries a label; a label split
k ways is split k ways wherever it appears; a split label missing from an output makes that output a partial
result (combined with `reduce`: MatMul's contraction dim gives partial sums); `fixed` labels may not be split
(the softmax axis, a convolution's spatial dims). Each op registers its rule with the rest of its definition
(`register(..., sharding=einsum("mk,kn->mn"))`); the generators here make most rules one line: an equation
(`einsum`) or broadcasting (`pointwise`). An op registered without a rule is `replicated`: correct, never fast.

    >>> registry.get("MatMul").sharding(node)   # a MatMul node with transpose_b=True
    ShardingSpec(inputs=(('m', 'k'), ('n', 'k')), outputs=(('m', 'n'),), ...)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tessel.compiler.ir import Node
from tessel.compiler.shapes import normalize_axes

Labels = tuple[str, ...]


@dataclass(frozen=True)
class ShardingSpec:
    """The einsum-style sharding of one node (see the module docstring).

    - `inputs[i]`: labels of input i's dims, or None when the op takes that input in whatever layout it has;
    - `outputs[j]`: labels of output j's dims;
    - `fixed`: labels that may not be split, with `why` saying so in errors;
    - `reduce`: how a split label missing from an output combines ("sum", "max", "min"), None = not allowed;
    - `shape_attr`: the attribute holding output 0's shape, rewritten to the local shape on each rank;
    - `emit`: a custom local emission (vocabulary-split Gather, ReduceMean's rescale), see partition.LocalOp.
    """

    inputs: tuple[Labels | None, ...]
    outputs: tuple[Labels, ...]
    fixed: frozenset[str] = frozenset()
    why: str = ""
    reduce: str | None = "sum"
    shape_attr: str | None = None
    emit: Callable | None = field(default=None, compare=False)

    def labels(self) -> list[str]:
        """Every label in order of first appearance (inputs, then outputs)."""
        seen: dict[str, None] = {}
        for labels in (*[x for x in self.inputs if x], *self.outputs):
            seen.update(dict.fromkeys(labels))
        return list(seen)

    def contracted(self, output: int) -> set[str]:
        """Labels of the inputs that output `output` lacks (split -> partial results)."""
        present = set(self.outputs[output])
        return {lab for x in self.inputs if x for lab in x if lab not in present}


Rule = Callable[[Node], ShardingSpec]


# --- generators --------------------------------------------------------------------------------------------------


def _operand(text: str, ndim: int, name: str) -> tuple[list[str], int]:
    """Split one einsum operand into its labels, with '…k' placeholders for the dims '...' stands for."""
    if "..." not in text:
        if len(text) != ndim:
            raise ValueError(f"einsum operand {text!r} has {len(text)} labels for a {ndim}-D {name}")
        return list(text), 0
    head, tail = text.split("...")
    count = ndim - len(head) - len(tail)
    if count < 0:
        raise ValueError(f"einsum operand {text!r} needs at least {len(head) + len(tail)} dims, {name} has {ndim}")
    return [*head, *(f"…{count - i}" for i in range(count)), *tail], count


def einsum(equation: str, fixed: str = "", why: str = "", reduce: str | None = "sum", **extra) -> Rule:
    """A rule from an equation such as "...mk,...kn->...mn" (one operand per input, one per output; "..." dims
    broadcast like numpy). Labels in `fixed` (and "." for every "..." dim) may not be split."""
    lhs, rhs = equation.split("->")

    def rule(node: Node) -> ShardingSpec:
        values = (*node.inputs, *node.outputs)
        texts = lhs.split(",") + rhs.split(",")
        labelled = [
            _operand(t, v.ndim, "input" if i < len(node.inputs) else "output")
            for i, (t, v) in enumerate(zip(texts, values))
        ]
        locked = set(fixed)
        # A '...' dim of size 1 broadcast against a larger one is its own (unsplittable) label.
        sizes: dict[str, int] = {}
        for (labels, _), v in zip(labelled, values):
            for lab, d in zip(labels, v.shape):
                if lab.startswith("…"):
                    sizes[lab] = max(sizes.get(lab, 1), d)
        out = []
        for k, ((labels, _), v) in enumerate(zip(labelled, values)):
            renamed = []
            for i, (lab, d) in enumerate(zip(labels, v.shape)):
                if lab.startswith("…") and d == 1 and sizes[lab] != 1:
                    lab = f"1.{k}.{i}"
                    locked.add(lab)
                elif lab.startswith("…") and "." in fixed:
                    locked.add(lab)
                renamed.append(lab)
            out.append(tuple(renamed))
        n = len(node.inputs)
        return ShardingSpec(tuple(out[:n]), tuple(out[n:]), frozenset(locked), why, reduce, **extra)

    rule.equation = equation  # type: ignore[attr-defined]
    return rule


def pointwise(node: Node, fixed_axes: tuple[int, ...] = (), why: str = "") -> ShardingSpec:
    """Element-wise ops with numpy broadcasting: aligned dims share a label; a size-1 dim broadcast against a
    larger one gets its own label."""
    shape = node.outputs[0].shape
    rank = len(shape)
    names = [f"d{i}" for i in range(rank)]
    locked = {names[a] for a in fixed_axes}
    inputs = []
    for k, v in enumerate(node.inputs):
        offset = rank - v.ndim
        labels = []
        for i, d in enumerate(v.shape):
            if d == shape[offset + i]:
                labels.append(names[offset + i])
            else:
                labels.append(f"1.{k}.{i}")
                locked.add(labels[-1])
        inputs.append(tuple(labels))
    outputs = tuple(tuple(names[rank - o.ndim :]) for o in node.outputs)
    return ShardingSpec(tuple(inputs), outputs, frozenset(locked), why)


def along_axis(why: str, attr: str = "axis") -> Rule:
    """Element-wise along every dim but `attr` (Softmax, LogSoftmax): that dim may not be split."""

    def rule(node: Node) -> ShardingSpec:
        axes = normalize_axes(node.attrs[attr], node.inputs[0].ndim)
        return pointwise(node, axes, why)

    return rule


def replicated(node: Node) -> ShardingSpec:
    """Nothing may be split: every input is gathered and the op runs whole on every rank (the safe fallback)."""
    inputs = tuple(tuple(f"r{k}.{i}" for i in range(v.ndim)) for k, v in enumerate(node.inputs))
    outputs = tuple(tuple(f"o{k}.{i}" for i in range(v.ndim)) for k, v in enumerate(node.outputs))
    every = {lab for labels in (*inputs, *outputs) for lab in labels}
    return ShardingSpec(inputs, outputs, frozenset(every), f"{node.op} has no sharding rule", None)


def reshape(node: Node) -> ShardingSpec:
    """Reshape, Flatten, ExpandDims, Squeeze: dims are grouped into runs of equal element count; in each run the
    leading non-1 input dim and the leading non-1 output dim share a label (splitting both by k cuts the same
    contiguous blocks), every other dim of the run is fixed."""
    src, dst = node.inputs[0].shape, node.outputs[0].shape
    ins, outs, locked = [f"x{i}" for i in range(len(src))], [f"y{j}" for j in range(len(dst))], set()
    for group_in, group_out in _reshape_groups(src, dst):
        lead_in = [i for i in group_in if src[i] != 1]
        lead_out = [j for j in group_out if dst[j] != 1]
        if lead_in and lead_out:
            outs[lead_out[0]] = ins[lead_in[0]]
        locked.update(ins[i] for i in group_in if not lead_in or i != lead_in[0])
        locked.update(outs[j] for j in group_out if not lead_out or j != lead_out[0])
    why = "the reshape merges or splits it with the dims before it"
    return ShardingSpec((tuple(ins),), (tuple(outs),), frozenset(locked), why, None, shape_attr=_shape_attr(node))


def _shape_attr(node: Node) -> str | None:
    return "shape" if "shape" in node.attrs else None


def _reshape_groups(src, dst) -> list[tuple[list[int], list[int]]]:
    """Runs of input dims and output dims with equal element counts, in order."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        group_in, group_out, count_in, count_out = [], [], 1, 1
        while not (group_in and group_out and count_in == count_out):
            if (count_in <= count_out or j == len(dst)) and i < len(src):
                count_in *= src[i]
                group_in.append(i)
                i += 1
            elif j < len(dst):
                count_out *= dst[j]
                group_out.append(j)
                j += 1
            else:
                break
        groups.append((group_in, group_out))
    return groups


def transpose(node: Node) -> ShardingSpec:
    names = tuple(f"d{i}" for i in range(node.inputs[0].ndim))
    return ShardingSpec((names,), (tuple(names[p] for p in node.attrs["perm"]),))


def broadcast_to(node: Node) -> ShardingSpec:
    spec = pointwise(node)
    return ShardingSpec(spec.inputs, spec.outputs, spec.fixed, spec.why, None, shape_attr="shape")


def depend(node: Node) -> ShardingSpec:
    """Depend(x, *deps): x element-wise; the deps only order the graph, so they stay as they are."""
    names = tuple(f"d{i}" for i in range(node.inputs[0].ndim))
    return ShardingSpec((names,) + (None,) * (len(node.inputs) - 1), (names,))


def fixed_dims(base: Rule, dims: Callable[[Node], tuple[int, ...]], why: str) -> Rule:
    """`base`, with input 0's `dims(node)` (and the labels they carry) unsplittable."""

    def rule(node: Node) -> ShardingSpec:
        spec = base(node)
        extra = {spec.inputs[0][d] for d in dims(node)}
        return ShardingSpec(spec.inputs, spec.outputs, spec.fixed | extra, why, spec.reduce, spec.shape_attr, spec.emit)

    return rule


def pointwise_like(node: Node, fixed_dims: tuple[int, ...], why: str) -> ShardingSpec:
    """Same labels in and out (sizes may differ on the fixed dims, which never split)."""
    names = tuple(f"d{i}" for i in range(node.inputs[0].ndim))
    locked = frozenset(names[i] for i in fixed_dims)
    return ShardingSpec((names,), (names,) * len(node.outputs), locked, why, None)
