"""Gradient reduction for data parallelism, bucketed and overlapped with the backward pass.

Every parameter replicated over a group is read through a `Mirror` (identity forward; its gradient is the
AllReduce(sum) over the group, times 1/size with gradients_mean), so autodiff of the local graph yields reduced
gradients, as MindSpore's _MirrorOperator does. `bucket_allreduce` then fuses those AllReduces (fusion > 0)
into buckets of about `bucket_bytes` (DDP's default: 25 MiB): one AllReduceBucket per bucket (the daemon
reduces its tensors as one flat array, which the backward segment writes its gradients into directly), placed
right after the bucket's last gradient is computed, while everything that reads a reduced gradient (the
optimizer update) moves after the backward. Lowered by `lower_rank_program`, each bucket's reduction starts
asynchronously, the rest of the backward runs in the next segment while it is in flight, and the wait comes
just before the update.

    train = data_parallel_train_step(forward, ["w1", "b1"], Momentum(0.1, 0.9), group=(0, 1, 2, 3))
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=4)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessel.compiler import registry
from tessel.compiler.builder import GraphBuilder, SymbolicTensor, apply, apply_all
from tessel.compiler.dtypes import DType
from tessel.compiler.ir import Graph, Node, Value
from tessel.compiler.optimizers import UNGROUPED, Optimizer, ParameterGroups
from tessel.compiler.rank_rewrite import Rewriter, fold_value_free
from tessel.compiler.shapes import is_static, numel
from tessel.compiler.train_step import TrainProgram, build_train_step
from tessel.core.errors import ConfigurationError
from tessel.v1 import collective_pb2

DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True, eq=False)
class Bucket:
    """AllReduce nodes fused into one, in the order their inputs become ready."""

    reductions: tuple[Node, ...]

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(n) for n in self.reductions)

    @property
    def group(self) -> tuple[int, ...]:
        return self.reductions[0].attrs["group"]

    @property
    def dtype(self) -> DType:
        return self.reductions[0].inputs[0].dtype

    def __repr__(self) -> str:
        return f"Bucket({len(self.reductions)} tensors, {self.nbytes} bytes, group={self.group})"


def _nbytes(node: Node) -> int:
    return numel(node.inputs[0].shape) * node.inputs[0].dtype.itemsize


def _fusible(node: Node) -> bool:
    spec = registry.get(node.op).collective
    return (
        spec is not None
        and spec.kind == collective_pb2.ALL_REDUCE
        and node.attrs["fusion"] > 0
        and is_static(node.inputs[0].shape)
    )


def weigh_gradients(forward: Graph, weight: float) -> Graph:
    """`forward` with its loss (output 0) read through VirtualDiv(1 / weight): the same value, every gradient of it
    times `weight`."""
    if not weight > 0:
        raise ConfigurationError(f"a gradient weight must be positive, got {weight!r}")
    builder = GraphBuilder.extend(forward)
    loss = apply("VirtualDiv", SymbolicTensor(builder, forward.outputs[0]), divisor=1.0 / weight)
    return builder.build([loss.value, *forward.outputs[1:]], forward.name)


def mirror_parameters(
    forward: Graph, params: Sequence[str], group: tuple[int, ...], *, mean: bool = True, fusion: int = 1
) -> Graph:
    """`forward` with each parameter in `params` read through Mirror(group, mean), placed before its first
    reader. Writes to a parameter (Assign) still target the parameter itself."""
    targets = {forward.input(name) for name in params}
    rewriter = Rewriter(forward)
    mirrored: dict[Value, Value] = {}
    for node in forward.nodes:
        write = registry.get(node.op).side_effect
        inputs = []
        for position, value in enumerate(node.inputs):
            if value in targets and not (write and position == 0):
                if value not in mirrored:
                    with rewriter.at(node.source):
                        mirror = apply("Mirror", rewriter.tensor(value), group=tuple(group), mean=mean, fusion=fusion)
                    mirrored[value] = mirror.value
                value = mirrored[value]
            inputs.append(rewriter.get(value))
        rewriter.keep(node, inputs)
    return rewriter.build()


def set_fusion(graph: Graph, fusion: Mapping[str, int]) -> Graph:
    """`graph` with the Mirror of each parameter named in `fusion` given that fusion index (Parameter.comm_fusion,
    Cell.set_comm_fusion): bucket_allreduce fuses only gradients of one index (buckets still close at their byte
    size), and index 0 reduces a gradient on its own, as MindSpore's fusion attribute does. `graph` itself when no
    Mirror changes."""
    names = {v: fusion[v.name] for v in graph.inputs if v.name in fusion}
    changes = [n for n in graph.nodes if n.op == "Mirror" and n.inputs[0] in names]
    changes = [n for n in changes if n.attrs["fusion"] != names[n.inputs[0]]]
    if not changes:
        return graph
    for index in set(names.values()):
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ConfigurationError(f"a fusion index must be an int >= 0, got {index!r}")
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        if node in changes:
            attrs = registry.get("Mirror").bind({**dict(node.attrs), "fusion": names[node.inputs[0]]})
            rewriter.builder.nodes.append(
                dataclasses.replace(node, inputs=(rewriter.get(node.inputs[0]),), attrs=attrs)
            )
        else:
            rewriter.keep(node)
    return rewriter.build()


def sync_in_fp32(graph: Graph) -> Graph:
    """`graph` with every Mirror of a float16 value marked fp32_sync: its gradient is all-reduced in float32
    (MindSpore's gradient_fp32_sync); `graph` itself when it mirrors no float16 value."""
    if not any(n.op == "Mirror" and n.inputs[0].dtype == DType.float16 for n in graph.nodes):
        return graph
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        if node.op == "Mirror" and node.inputs[0].dtype == DType.float16 and not node.attrs["fp32_sync"]:
            attrs = registry.get("Mirror").bind({**dict(node.attrs), "fp32_sync": True})
            rewriter.builder.nodes.append(
                dataclasses.replace(node, inputs=(rewriter.get(node.inputs[0]),), attrs=attrs)
            )
        else:
            rewriter.keep(node)
    return rewriter.build()


_REDUCTIONS = ("AllReduce", "AllReduceBucket", "ReduceScatter")


def _reduces_float16(node: Node) -> bool:
    return node.op in _REDUCTIONS and any(v.dtype == DType.float16 for v in node.inputs)


def reduces_float16(graph: Graph) -> bool:
    """Whether `graph` has an AllReduce, AllReduceBucket or ReduceScatter of float16 values."""
    return any(map(_reduces_float16, graph.nodes))


def communicate_in_fp32(graph: Graph) -> Graph:
    """`graph` with every reduction of float16 values (AllReduce, AllReduceBucket, ReduceScatter) run in float32:
    Cast to float32 before it, back to float16 after (MindSpore's force_fp32_communication); `graph` itself when it
    reduces no float16 value. Run it on a differentiated graph: the reductions of gradients are in it then."""
    if not reduces_float16(graph):
        return graph
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        if not _reduces_float16(node):
            rewriter.keep(node)
            continue
        with rewriter.at(node.source):
            wide = [apply("Cast", rewriter.tensor(v), dtype=DType.float32) for v in node.inputs]
            reduced = apply_all(node.op, *wide, **dict(node.attrs))
            for old, new in zip(node.outputs, reduced):
                rewriter.alias(old, apply("Cast", new, dtype=old.dtype).value)
    return rewriter.build()


def plan_buckets(graph: Graph, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """The buckets bucket_allreduce would make, ordered by when their last gradient is ready.

    AllReduces with fusion > 0 and a static shape are taken in the order their inputs are computed; a bucket
    holds one (group, reduce op, dtype, fusion) and closes before it would exceed `bucket_bytes` (a tensor
    larger than that gets a bucket of its own) or take a reduction that depends on one already in it.
    """
    if bucket_bytes <= 0:
        raise ConfigurationError(f"bucket_bytes must be positive, got {bucket_bytes}; DDP's default is 25 MiB")
    ready: dict[Value, int] = {}
    upstream: dict[Value, frozenset[Node]] = {}
    candidates: list[tuple[int, int, Node, frozenset[Node]]] = []
    for index, node in enumerate(graph.nodes):
        above = frozenset().union(*(upstream.get(v, frozenset()) for v in node.inputs))
        if _fusible(node):
            candidates.append((ready.get(node.inputs[0], -1), index, node, above))
            above = above | {node}
        for out in node.outputs:
            ready[out], upstream[out] = index, above
    open_buckets: dict[tuple, list[Node]] = {}
    closed: list[tuple[int, Bucket]] = []
    last_ready: dict[Node, int] = {}
    for when, _, node, above in sorted(candidates, key=lambda c: c[:2]):
        key = (node.attrs["group"], node.attrs["reduce_op"], node.inputs[0].dtype, node.attrs["fusion"])
        current = open_buckets.setdefault(key, [])
        size = sum(map(_nbytes, current))
        if current and (size + _nbytes(node) > bucket_bytes or above.intersection(current)):
            closed.append((last_ready[current[-1]], Bucket(tuple(current))))
            current = open_buckets[key] = []
        current.append(node)
        last_ready[node] = when
    closed += [(last_ready[nodes[-1]], Bucket(tuple(nodes))) for nodes in open_buckets.values() if nodes]
    return [bucket for _, bucket in sorted(closed, key=lambda item: item[0])]


def bucket_allreduce(graph: Graph, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Graph:
    """Fuse the gradient AllReduces of `graph` into buckets (see plan_buckets) and order the graph for overlap:
    each bucket's AllReduceBucket right after its last input is computed, and every node that reads a reduced
    gradient after all nodes that do not.

    Nodes that read only a shape (autodiff's OnesLike seed) are folded to constants first (as lowering would): a
    reduction the loss flows into, such as a data-parallel plan's loss AllReduce, then shares the gradients'
    bucket instead of appearing to be upstream of every gradient."""
    if not any(_fusible(node) for node in graph.nodes):
        return graph
    graph = fold_value_free(graph)
    buckets = plan_buckets(graph, bucket_bytes)
    member = {node: bucket for bucket in buckets for node in bucket.reductions}
    producer = {out: node for node in graph.nodes for out in node.outputs}
    positions = {node: i for i, node in enumerate(graph.nodes)}
    start_after: dict[Node | None, list[Bucket]] = {}
    for bucket in buckets:
        sources = [producer.get(n.inputs[0]) for n in bucket.reductions]
        if any(source in member for source in sources):
            raise ConfigurationError(
                "a fused AllReduce (fusion > 0) reads the result of another one; mark the inner one fusion=0"
            )
        last = max(sources, key=lambda s: -1 if s is None else positions[s])
        start_after.setdefault(last, []).append(bucket)
    early, late, reduced = [], [], {n.outputs[0] for n in member}
    for node in graph.nodes:
        if node in member:
            continue
        if any(v in reduced for v in node.inputs):
            reduced.update(node.outputs)
            late.append(node)
        else:
            early.append(node)
    try:
        return _Fuser(graph, start_after).run(early + late)
    except _Cycle:  # fusing would make two buckets wait on each other: the reductions run one by one, as written
        return graph


class _Cycle(Exception):
    pass


class _Fuser:
    def __init__(self, graph: Graph, start_after: dict[Node | None, list[Bucket]]):
        self.graph, self.start_after = graph, start_after
        self.rewriter = Rewriter(graph)

    def run(self, order: list[Node]) -> Graph:
        """The nodes in `order`, each bucket started after its last input; a node that reads a reduced value of a
        bucket not started yet waits until it is (a late node can come before the last input of the bucket it
        reads, where one bucket's inputs are computed from another's results)."""
        self.available = set(self.graph.inputs)
        for bucket in self.start_after.get(None, []):
            self._start(bucket)
        pending: list[Node] = []
        for node in order:
            pending.append(node)
            progress = True
            while progress:
                progress = False
                for i, waiting in enumerate(pending):
                    if all(v in self.available for v in waiting.inputs):
                        del pending[i]
                        self._keep(waiting)
                        progress = True
                        break
        if pending:  # buckets that wait on each other's results (a cycle across reduce ops or dtypes)
            raise _Cycle()
        return self.rewriter.build()

    def _keep(self, node: Node) -> None:
        self.rewriter.keep(node)
        self.available.update(node.outputs)
        for bucket in self.start_after.get(node, []):
            self._start(bucket)

    def _start(self, bucket: Bucket) -> None:
        self.available.update(n.outputs[0] for n in bucket.reductions)
        first = bucket.reductions[0]
        if len(bucket.reductions) == 1:
            self.rewriter.keep(first)
            return
        inputs = [self.rewriter.tensor(n.inputs[0]) for n in bucket.reductions]
        with self.rewriter.at(first.source):
            reduced = apply_all("AllReduceBucket", *inputs, reduce_op=first.attrs["reduce_op"], group=bucket.group)
        for node, out in zip(bucket.reductions, reduced):
            self.rewriter.alias(node.outputs[0], out.value)


def data_parallel_train_step(
    forward: Graph,
    params: Sequence[str],
    optimizer: Optimizer,
    group: tuple[int, ...],
    *,
    mean: bool = True,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    groups: ParameterGroups = UNGROUPED,
    gradient_weight: float = 1.0,
) -> TrainProgram:
    """build_train_step with the gradients of `params` all-reduced over `group` (mean: divided by its size,
    MindSpore's gradients_mean), bucketed and overlapped. Lower the result with lower_rank_program.

    `gradient_weight` multiplies this rank's gradients before the reduction (the loss it reports is unchanged): a
    rank that computes its mean loss over `share` rows of a global batch of `B` split over `n` ranks unevenly
    (speed-aware data parallelism) weighs n * share / B, so the mean over the ranks is the one device's gradient of
    the mean loss over the global batch."""
    if gradient_weight != 1.0:
        forward = weigh_gradients(forward, gradient_weight)
    mirrored = mirror_parameters(forward, params, group, mean=mean)
    program = build_train_step(mirrored, params, optimizer, groups)
    return dataclasses.replace(program, graph=bucket_allreduce(program.graph, bucket_bytes))
