"""Work done part by part on the rows of one tensor, done once on the whole tensor (a rank-graph rewrite).

When every part of a row partition of T (a Split along dim 0, or StridedSlices of dim 0 that together take each
row of T once: MicroBatchInterleaved's copies x[i::k]) is read by its own node of one op, with the same attributes
and the same other operands, and the op computes each output row from the same rows of its inputs, the k nodes are
one node on T, whose output is partitioned in the same way:

    f(T[P_1]), …, f(T[P_k])  →  f(T)[P_1], …, f(T)[P_k]

Which ops compute rows from rows comes from their sharding rules (compiler/sharding.py): the label of output dim 0
is no fixed label, appears at dim 0 of every input that carries it, and nowhere else; an input without it (a
weight, a scalar) must be the same Value in every part's node, and so must one whose rows are all alike (a scalar
broadcast to the part's shape: a mean's gradient), which the whole reads made again as tall as T. An AllReduce
reduces each element across ranks, so k AllReduces of the parts are one AllReduce of T; that changes the
collectives every rank runs, so only where every rank's graph is a copy of this one (`RewriteContext.spmd`). A
Concat of the parts of a contiguous partition, in order, is T itself.

Applied until nothing changes, this undoes a split of the batch into copies on one host (`RewriteContext.one_host`),
where there is no communication for the copies to hide and the copies' narrower products run at fewer FLOP/s:
MicroBatchInterleaved's k copies run as one. Across hosts the copies stay apart: one copy's work runs while another
copy's collective is in flight, which is what they are for. Never where micro-batches must run one after another to
bound memory (`RewriteContext.micro_batches_apart`: GradAccumulation).

    graph = merge_row_parts(graph, registry.RewriteContext(one_host=True, spmd=True))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise

from tessel.compiler import registry
from tessel.compiler.builder import SymbolicTensor, apply, apply_all
from tessel.compiler.ir import Graph, Node, Value
from tessel.compiler.rank_rewrite import Rewriter, merge_duplicates
from tessel.compiler.shapes import is_static, normalize_axis
from tessel.v1 import collective_pb2

Rows = tuple[int, int, int]  # start, stop, step over dim 0


@dataclass(frozen=True, eq=False)
class RowPartition:
    """Parts of `source` that together hold each of its rows once: part i is rows[i] of it."""

    source: Value
    rows: tuple[Rows, ...]
    parts: tuple[Value, ...]

    @property
    def contiguous(self) -> bool:
        """The parts, in order, are the source's rows in order (a Split): their Concat is the source."""
        stops = [0, *(stop for _, stop, _ in self.rows)]
        return all(step == 1 and start == stops[i] for i, (start, _, step) in enumerate(self.rows))


def row_partitions(graph: Graph) -> dict[Value, tuple[RowPartition, int]]:
    """Every part of a row partition in `graph`: part -> (its partition, its index there)."""
    found: dict[Value, tuple[RowPartition, int]] = {}
    slices: dict[Value, list[tuple[Rows, Value]]] = {}
    for node in graph.nodes:
        if node.op == "Split" and normalize_axis(node.attrs["axis"], node.inputs[0].ndim) == 0:
            starts = [0]
            for out in node.outputs:
                starts.append(starts[-1] + out.shape[0])
            rows = tuple((a, b, 1) for a, b in pairwise(starts))
            _add(found, RowPartition(node.inputs[0], rows, node.outputs))
        elif node.op == "StridedSlice":
            rows = _dim0_slice(node)
            if rows is not None:
                slices.setdefault(node.inputs[0], []).append((rows, node.outputs[0]))
    for source, taken in slices.items():
        taken.sort(key=lambda t: t[0])
        covered = sorted(r for rows, _ in taken for r in range(*rows))
        if len(taken) > 1 and covered == list(range(source.shape[0])):
            _add(found, RowPartition(source, tuple(r for r, _ in taken), tuple(v for _, v in taken)))
    return found


def _add(found: dict, partition: RowPartition) -> None:
    for i, part in enumerate(partition.parts):
        found[part] = (partition, i)


def _dim0_slice(node: Node) -> Rows | None:
    """The rows a StridedSlice takes when it takes whole rows (every other dim in full), else None."""
    from tessel.compiler.ops.index import slice_specs

    source = node.inputs[0]
    if source.ndim == 0 or not is_static(source.shape):
        return None
    specs = slice_specs(source.type, node.attrs)
    rest = zip(specs[1:], source.shape[1:])
    if specs[0] is None or specs[0][2] < 1 or not all(s is None or s[:3] == (0, d, 1) for s, d in rest):
        return None
    return specs[0][:3]


def merge_row_parts(graph: Graph, context: registry.RewriteContext = registry.NOTHING_KNOWN) -> Graph:
    """The rewrite of the module docstring, applied until nothing changes."""
    if not context.one_host or context.micro_batches_apart:
        return graph
    # The copies' own seeds and scales, alike, become one (see _uniform_rows); parts that other rewrites left
    # unread (MatMul's of a sum of products over rows) go.
    graph = drop_unread(merge_duplicates(graph))
    for _ in range(len(graph.nodes)):  # each change removes at least one node
        merged = _merge_once(graph, context)
        if merged is graph:
            return graph
        graph = merged
    return graph


def _merge_once(graph: Graph, context: registry.RewriteContext) -> Graph:
    partitions = row_partitions(graph)
    if not partitions:
        return graph
    users: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for v in dict.fromkeys(node.inputs):
            users.setdefault(v, []).append(node)
    seen: set[int] = set()
    for partition, _ in partitions.values():
        if id(partition) in seen:
            continue
        seen.add(id(partition))
        for first in users.get(partition.parts[0], []):
            if first.op == "Concat" and _whole_concat(first, partition):
                return replace_nodes(graph, [first], partial(_alias_whole, first.outputs[0], partition.source))
            # The nodes of a group cannot depend on one another, nor can what the whole reads depend on them: each
            # reads only parts (whose sources come before every part) and what the first node reads too.
            group = _group(graph, first, partition, partitions, users, context)
            if group is not None:
                return replace_nodes(graph, group.nodes, group.emit)
    return graph


def _alias_whole(concatenated: Value, source: Value, rewriter) -> None:
    rewriter.alias(concatenated, rewriter.get(source))


def _whole_concat(node: Node, partition: RowPartition) -> bool:
    return (
        partition.contiguous
        and normalize_axis(node.attrs["axis"], node.outputs[0].ndim) == 0
        and tuple(node.inputs) == partition.parts
    )


@dataclass(frozen=True, eq=False)
class _Uniform:
    """An operand whose rows are all alike, and the nodes that make it (`_uniform_rows`)."""

    chain: tuple[Node, ...]

    def emit(self, rewriter, value: Value, rows: int):
        """`value` again, `rows` tall."""
        again: dict[Value, Value] = {}
        for node in self.chain:
            attrs = dict(node.attrs)
            attr = registry.get(node.op).sharding_spec(node).shape_attr
            if attr is not None:
                attrs[attr] = (rows, *attrs[attr][1:])
            inputs = [SymbolicTensor(rewriter.builder, again[v]) if v in again else rewriter.tensor(v)
                      for v in node.inputs]  # fmt: skip
            for old, new in zip(node.outputs, apply_all(node.op, *inputs, **attrs)):
                again[old] = new.value
        return SymbolicTensor(rewriter.builder, again[value])


@dataclass(frozen=True, eq=False)
class _Group:
    """Nodes, one per part of `partition`, and what the one node on the whole reads: per input, the partition
    whose source it reads, rows all alike (made again with the whole's rows), or None (the input itself, shared by
    every part's node)."""

    nodes: list[Node]
    partition: RowPartition
    operands: list[RowPartition | _Uniform | None]

    def emit(self, rewriter) -> None:
        first, rows = self.nodes[0], self.partition.source.shape[0]
        inputs = []
        for v, operand in zip(first.inputs, self.operands):
            if isinstance(operand, _Uniform):
                inputs.append(operand.emit(rewriter, v, rows))
            else:
                inputs.append(rewriter.tensor(v if operand is None else operand.source))
        whole = apply_all(first.op, *inputs, **dict(first.attrs))
        for j, out in enumerate(whole):
            for node, part in zip(self.nodes, _parts(out, self.partition)):
                rewriter.alias(node.outputs[j], part.value)


def _group(graph: Graph, first: Node, partition: RowPartition, partitions, users, context) -> _Group | None:
    """The nodes, one per part of `partition` in order, that together are `first`'s op on the whole, or None."""
    rowwise = _row_operands(first, context)
    if rowwise is None or not any(rowwise[j] and v is partition.parts[0] for j, v in enumerate(first.inputs)):
        return None
    operands: list[RowPartition | _Uniform | None] = []
    for j, v in enumerate(first.inputs):
        owner = partitions.get(v)
        if not rowwise[j]:
            operands.append(None)
        elif owner is not None and owner[1] == 0 and owner[0].rows == partition.rows:
            operands.append(owner[0])
        elif (chain := _uniform_rows(graph, v, context)) is not None:
            operands.append(_Uniform(tuple(chain)))
        else:
            return None
    nodes = [first]
    for i in range(1, len(partition.parts)):
        want = tuple(o.parts[i] if isinstance(o, RowPartition) else v for v, o in zip(first.inputs, operands))
        match = [n for n in users.get(partition.parts[i], []) if n.inputs == want and n.op == first.op]
        match = [n for n in match if n.attrs == first.attrs and n not in nodes]
        if not match:
            return None
        nodes.append(match[0])
    return _Group(nodes, partition, operands)


def _uniform_rows(graph: Graph, value: Value, context, depth: int = 0) -> list[Node] | None:
    """The nodes that compute `value` with every row alike, when they do: a node that broadcasts inputs without
    rows to a shape it is given (BroadcastTo of a scalar: a mean's gradient), then row-wise ops of such values and
    operands without rows (the seed scaled). Emitted again with more rows (`_Group.emit`), they make the whole's
    operand. Else None."""
    node = graph.producers.get(value)
    if node is None or depth > _UNIFORM_DEPTH or registry.get(node.op).sharding is None:
        return None
    opdef = registry.get(node.op)
    if opdef.random or opdef.side_effect or opdef.collective is not None:
        return None
    spec = opdef.sharding_spec(node)
    label = spec.outputs[node.outputs.index(value)][0]
    if spec.shape_attr is not None:
        shape = node.attrs[spec.shape_attr]
        from_rows = any(labels is None or label in labels for labels in spec.inputs)
        rows_given = bool(shape) and shape[0] == value.shape[0]
        return [node] if rows_given and not from_rows and label not in spec.fixed else None
    rowwise = _row_operands(node, context)
    if rowwise is None:
        return None
    chain: list[Node] = []
    for v, rows in zip(node.inputs, rowwise):
        if rows:
            inner = _uniform_rows(graph, v, context, depth + 1)
            if inner is None:
                return None
            chain += [n for n in inner if n not in chain]
    return [*chain, node]


_UNIFORM_DEPTH = 8


def _row_operands(node: Node, context) -> list[bool] | None:
    """Per input, whether it is a row operand (output row r reads its row r), when `node` computes its output rows
    from its inputs' same rows; None when it does not."""
    opdef = registry.get(node.op)
    if opdef.side_effect or opdef.random or not node.outputs:
        return None
    if not all(is_static(v.shape) and v.ndim for v in node.outputs):
        return None
    rows = node.outputs[0].shape[0]
    if opdef.collective is not None:
        single = len(node.inputs) == len(node.outputs) == 1
        if not context.spmd or opdef.collective.kind != collective_pb2.ALL_REDUCE or not single:
            return None
        return [True]
    if opdef.sharding is None:
        return None
    spec = opdef.sharding_spec(node)
    label = spec.outputs[0][0]
    if label in spec.fixed or spec.emit is not None or spec.shape_attr is not None:
        return None
    if not all(labels and labels[0] == label and label not in labels[1:] for labels in spec.outputs):
        return None
    if any(v.shape[0] != rows for v in node.outputs):
        return None
    rowwise = []
    for labels, v in zip(spec.inputs, node.inputs):
        if labels is None or (label in labels and (labels[0] != label or label in labels[1:] or v.shape[0] != rows)):
            return None
        rowwise.append(label in labels)
    return rowwise


def _parts(whole, partition: RowPartition) -> Sequence:
    """`whole` cut into the rows of `partition`: one Split where they are its rows in order, else StridedSlices."""
    if partition.contiguous:
        return apply_all("Split", whole, axis=0, sizes=tuple(len(range(*r)) for r in partition.rows))
    rest = whole.ndim - 1
    return [
        apply("StridedSlice", whole, begin=(a, *(0,) * rest), end=(b, *(None,) * rest), strides=(s, *(1,) * rest))
        for a, b, s in partition.rows
    ]


def replace_nodes(graph: Graph, members: list[Node], emit: Callable) -> Graph:
    """`members` (independent nodes) replaced by what `emit(rewriter)` adds at the last one's place; the nodes
    between that read an earlier member's result (directly or not) move after it; nodes left without a reader
    (the parts nothing reads any more) are dropped."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    ordered = sorted(members, key=position.__getitem__)
    first, last = position[ordered[0]], position[ordered[-1]]
    chosen = set(members)
    moved, late = [], {out for node in ordered[:-1] for out in node.outputs}
    for node in graph.nodes[first + 1 : last]:
        if node not in chosen and any(v in late for v in node.inputs):
            moved.append(node)
            late.update(node.outputs)
    moving = set(moved)
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        if node is ordered[-1]:
            with rewriter.at(node.source):
                emit(rewriter)
            for later in moved:
                rewriter.keep(later)
        elif node not in chosen and node not in moving:
            rewriter.keep(node)
    return drop_unread(rewriter.build())


def drop_unread(graph: Graph) -> Graph:
    """`graph` without the nodes whose results nothing reads (state writes, collectives, ordering nodes and graph
    outputs are read)."""
    read = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        opdef = registry.get(node.op)
        keep = opdef.side_effect or opdef.orders or opdef.collective is not None
        if keep or any(v in read for v in node.outputs):
            kept.append(node)
            read.update(node.inputs)
    if len(kept) == len(graph.nodes):
        return graph
    return Graph(graph.inputs, tuple(reversed(kept)), graph.outputs, graph.name)
