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
reduces each element across ranks, so k AllReduces of the parts are one AllReduce of T. A Concat of the parts of a
contiguous partition, in order, is T itself. Merging changes which collectives run and in what order, the same on
every rank only where every rank's graph is a copy of this one (`RewriteContext.spmd`): elsewhere nothing merges.

Applied until nothing changes, this undoes a split of the batch into copies on one host (`RewriteContext.one_host`),
where there is no communication for the copies to hide and the copies' narrower products run at fewer FLOP/s:
MicroBatchInterleaved's k copies run as one. Across hosts the copies stay apart: one copy's work runs while another
copy's collective is in flight, which is what they are for. Never where micro-batches must run one after another to
bound memory (`RewriteContext.micro_batches_apart`: GradAccumulation).

    graph = merge_row_parts(graph, registry.RewriteContext(one_host=True, spmd=True))
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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
    """Parts of `source` that together hold each of its rows once: part i is rows[i] of it. While merging, the
    source may be output j of a node on the whole not emitted yet, (_Merged, j)."""

    source: Value | tuple[_Merged, int]
    rows: tuple[Rows, ...]
    parts: tuple[Value, ...]

    @property
    def size(self) -> int:
        return sum(len(range(*r)) for r in self.rows)

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
    """The rewrite of the module docstring, where every rank runs a copy of the graph on one host and it holds no
    sends or receives (whose order among collectives merging could change); `graph` itself where nothing merges.

    One sweep: each partition's parts are tried against their readers; a group found makes the outputs of its
    nodes the parts of a new partition, of the whole node to come, tried in turn. The graph is then rebuilt once.
    A group reads only parts (whose sources come before every part) and what its first node reads too, so its
    nodes cannot depend on one another, nor can what the whole reads depend on them."""
    if not (context.one_host and context.spmd) or context.micro_batches_apart or _has_point_to_point(graph):
        return graph
    # The copies' own seeds and scales, alike, become one (see _uniform_rows); parts that other rewrites left
    # unread (MatMul's of a sum of products over rows) go.
    graph = drop_unread(merge_duplicates(graph))
    partitions = row_partitions(graph)
    users: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for v in dict.fromkeys(node.inputs):
            users.setdefault(v, []).append(node)
    merged: list[_Merged] = []
    concats: list[tuple[Node, RowPartition]] = []
    taken: set[Node] = set()
    queue = deque(dict.fromkeys(p for p, _ in partitions.values()))
    while queue:
        partition = queue.popleft()
        for first in users.get(partition.parts[0], []):
            if first in taken:
                continue
            if first.op == "Concat" and _whole_concat(first, partition):
                concats.append((first, partition))
                taken.add(first)
                continue
            group = _group(graph, first, partition, partitions, users)
            if group is None or not taken.isdisjoint(group.nodes):
                continue
            taken.update(group.nodes)
            record = _Merged(group)
            merged.append(record)
            for j in range(len(first.outputs)):
                made = RowPartition((record, j), partition.rows, tuple(n.outputs[j] for n in group.nodes))
                _add(partitions, made)
                queue.append(made)
    if not merged and not concats:
        return graph
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        if node not in taken:
            rewriter.keep(node)
    for record in merged:  # in the order found: each reads only the graph and wholes found before it
        with rewriter.at(record.group.nodes[0].source):
            record.emit(rewriter)
    for concat, partition in concats:
        rewriter.alias(concat.outputs[0], _whole(rewriter, partition.source).value)
    return _rebuilt(rewriter)


def _has_point_to_point(graph: Graph) -> bool:
    from tessel.compiler.rank_plan import is_collective, is_point_to_point

    return any(is_collective(n) and is_point_to_point(n) for n in graph.nodes)


def _whole(rewriter, source: Value | tuple[_Merged, int]) -> SymbolicTensor:
    if isinstance(source, Value):
        return rewriter.tensor(source)
    record, j = source
    return SymbolicTensor(rewriter.builder, record.values[j])


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


@dataclass(eq=False)
class _Merged:
    """The one node on the whole that a group becomes; `values`, its outputs, once emitted."""

    group: _Group
    values: list[Value] | None = None

    def emit(self, rewriter) -> None:
        """The node on the whole, and each group node's outputs aliased to their rows of it."""
        group = self.group
        first, rows = group.nodes[0], group.partition.size
        inputs = []
        for v, operand in zip(first.inputs, group.operands):
            if isinstance(operand, _Uniform):
                inputs.append(operand.emit(rewriter, v, rows))
            elif isinstance(operand, RowPartition):
                inputs.append(_whole(rewriter, operand.source))
            else:
                inputs.append(rewriter.tensor(v))
        whole = apply_all(first.op, *inputs, **dict(first.attrs))
        self.values = [out.value for out in whole]
        for j, out in enumerate(whole):
            for node, part in zip(group.nodes, _parts(out, group.partition)):
                rewriter.alias(node.outputs[j], part.value)


def _group(graph: Graph, first: Node, partition: RowPartition, partitions, users) -> _Group | None:
    """The nodes, one per part of `partition` in order, that together are `first`'s op on the whole, or None."""
    rowwise = _row_operands(first)
    if rowwise is None or not any(rowwise[j] and v is partition.parts[0] for j, v in enumerate(first.inputs)):
        return None
    operands: list[RowPartition | _Uniform | None] = []
    for j, v in enumerate(first.inputs):
        owner = partitions.get(v)
        if not rowwise[j]:
            operands.append(None)
        elif owner is not None and owner[1] == 0 and owner[0].rows == partition.rows:
            operands.append(owner[0])
        elif (chain := _uniform_rows(graph, v)) is not None:
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


def _uniform_rows(graph: Graph, value: Value, depth: int = 0) -> list[Node] | None:
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
    rowwise = _row_operands(node)
    if rowwise is None:
        return None
    chain: list[Node] = []
    for v, rows in zip(node.inputs, rowwise):
        if rows:
            inner = _uniform_rows(graph, v, depth + 1)
            if inner is None:
                return None
            chain += [n for n in inner if n not in chain]
    return [*chain, node]


_UNIFORM_DEPTH = 8


def _row_operands(node: Node) -> list[bool] | None:
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
        if opdef.collective.kind != collective_pb2.ALL_REDUCE or not single:
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


def replace_nodes(graph: Graph, jobs: Sequence[tuple[Sequence[Node], Callable]]) -> Graph:
    """Each job's nodes (independent of one another) replaced by what its `emit(rewriter)` adds, which aliases their
    outputs; then `_rebuilt`."""
    chosen = {node for members, _ in jobs for node in members}
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        if node not in chosen:
            rewriter.keep(node)
    for members, emit in jobs:
        with rewriter.at(members[-1].source):
            emit(rewriter)
    return _rebuilt(rewriter)


def _rebuilt(rewriter) -> Graph:
    """The rewriter's graph with every node reading the Values its inputs were aliased to (a node kept before the
    aliases were made still reads the old ones), in an order its dependencies allow (otherwise the order kept),
    without the nodes nothing reads any more (the parts left unread)."""
    built = rewriter.build()
    nodes = [replace(n, inputs=tuple(map(rewriter.get, n.inputs))) for n in built.nodes]
    return drop_unread(Graph(built.inputs, _in_dependency_order(nodes), built.outputs, built.name))


def _in_dependency_order(nodes: list[Node]) -> tuple[Node, ...]:
    """`nodes` ordered so that each comes after the producers of its inputs, otherwise in the order given."""
    producer = {v: i for i, node in enumerate(nodes) for v in node.outputs}
    waiting = [len({producer[v] for v in node.inputs if v in producer}) for node in nodes]
    readers: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        for j in {producer[v] for v in node.inputs if v in producer}:
            readers.setdefault(j, []).append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in readers.get(i, ()):
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise RuntimeError(f"row_parts: merging made a cycle of {len(nodes) - len(order)} nodes (a tessel bug)")
    return tuple(order)


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
