"""Optimizer parallel: MindSpore's `enable_parallel_optimizer` / `AutoParallel.hsdp()`, ZeRO's three stages.

A parameter replicated over some ranks (every parameter under data parallelism; under SEMI_AUTO/AUTO the ones a
strategy leaves whole over some mesh axes) is read through a `Mirror` over exactly those ranks, its *replica
group*. Optimizer parallel cuts dim 0 of the parameter's local value into one block per member of a *shard group*
(the replica group, or consecutive runs of `shard_size` of its members) and gives each member one block of the
work and of the memory:

- level1: each rank keeps the optimizer state of its block only and updates only that block: the gradient is
  reduce-scattered over the shard group (mean or sum as the Mirror says; an AllReduce over the ranks holding the
  same block follows when the shard group is smaller than the replica group), the block is updated, and the new
  blocks are all-gathered into the whole parameter;
- level2: as level1, and the whole local gradient lives only until its reduce-scatter (no gradient bucket keeps
  it; with micro-batches each micro-batch's gradient is reduce-scattered and the blocks accumulate);
- level3: the parameter itself is stored as its block: it is all-gathered right before the forward pass uses it,
  and again before the backward pass does (the forward's copy is freed after its last use), and the update
  writes the block.

Parameters smaller than the threshold (MindSpore: 64 KB), with a dim 0 that the shard group does not divide, not
replicated, or not floating point keep the plain all-reduce, as in MindSpore.

    shards = plan_shards(forward, ["w1", "b1"], ShardConfig("level1", threshold_kb=0), rank=1)
    forward = shard_forward(forward, shards)               # level3 only: parameters become their blocks
    program = build_train_step(forward, ["w1", "b1"], Adam(), shards=shards)

`shard_layout` gives the checkpoint layout of a block (the parameter's layout with dim 0 further cut over the
shard group's mesh axes), so checkpoints gather the blocks back into whole tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessel.compiler.builder import SymbolicTensor, apply
from tessel.compiler.dtypes import DType
from tessel.compiler.ir import Graph, Node, TensorType, Value
from tessel.compiler.rank_rewrite import Rewriter
from tessel.compiler.shapes import numel
from tessel.core.errors import ConfigurationError
from tessel.core.options import log_once

LEVELS = ("level1", "level2", "level3")


@dataclass(frozen=True)
class ShardConfig:
    """Optimizer-parallel settings: MindSpore's optimizer_level, parallel_optimizer_threshold (KB) and
    optimizer_weight_shard_size (-1: the whole replica group)."""

    level: str = "level1"
    threshold_kb: int = 64
    shard_size: int = -1

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ConfigurationError(f"optimizer_level must be one of {list(LEVELS)}, got {self.level!r}")
        if isinstance(self.threshold_kb, bool) or not isinstance(self.threshold_kb, int) or self.threshold_kb < 0:
            raise ConfigurationError(
                f"the optimizer-parallel threshold must be an int >= 0 (KB), got {self.threshold_kb!r}"
            )
        size = self.shard_size
        if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
            raise ConfigurationError(f"optimizer_weight_shard_size must be a positive int or -1, got {size!r}")


@dataclass(frozen=True)
class ParamShard:
    """How one parameter is sharded on this rank.

    `shape` is the parameter's local shape (what the rank computes with); this rank holds rows `rows` of dim 0
    (block `index` of `len(group)`). `replicas` are the ranks holding the same block (this rank included),
    `mean` whether the gradient reduction averages over the whole replica group, `fusion` the Mirror's."""

    name: str
    level: str
    shape: tuple[int, ...]
    group: tuple[int, ...]
    index: int
    replicas: tuple[int, ...]
    mean: bool
    fusion: int = 1
    fp32_sync: bool = False  # a float16 gradient is reduced in float32 (MindSpore's gradient_fp32_sync)

    @property
    def block_shape(self) -> tuple[int, ...]:
        return (self.shape[0] // len(self.group), *self.shape[1:])

    @property
    def rows(self) -> tuple[int, int]:
        size = self.shape[0] // len(self.group)
        return self.index * size, (self.index + 1) * size

    @property
    def weights_sharded(self) -> bool:
        return self.level == "level3"


def split_group(replicas: Sequence[int], shard_size: int, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(shard group, ranks holding the same block) of `rank` in a replica group: runs of `shard_size` consecutive
    members (MindSpore's optimizer_weight_shard_size; -1 or more than the group: the whole group). None where
    `shard_size` does not divide the group: as MindSpore ("can not be applied"), the parameter stays whole, and a
    warning says so once."""
    replicas = tuple(replicas)
    size = len(replicas) if shard_size == -1 or shard_size >= len(replicas) else shard_size
    if len(replicas) % size:
        log_once(
            f"optimizer-shard-size-{shard_size}-{len(replicas)}",
            f"optimizer_weight_shard_size={shard_size} does not divide the {len(replicas)} ranks {list(replicas)} "
            "that hold a parameter whole: such parameters are not sharded (shard groups tile the replica group). "
            f"Use a divisor of {len(replicas)}, or -1 for the whole group",
        )
        return None
    position = replicas.index(rank)
    start = position // size * size
    return replicas[start : start + size], replicas[position % size :: size]


def mirror_of(graph: Graph, name: str) -> Node | None:
    """The Mirror reading parameter `name` (a replicated parameter's one reader), or None."""
    value = graph.input(name)
    return next((n for n in graph.nodes if n.op == "Mirror" and n.inputs[0] is value), None)


def plan_shards(
    forward: Graph,
    params: Sequence[str],
    config: ShardConfig,
    rank: int,
    exclude: frozenset[str] = frozenset(),
) -> dict[str, ParamShard]:
    """Which of `params` this rank shards, and how (see the module docstring). `exclude`: parameters whose user
    turned optimizer parallel off (MindSpore's Parameter(parallel_optimizer=False))."""
    shards = {}
    for name in params:
        mirror = mirror_of(forward, name)
        if mirror is None or name in exclude:
            continue
        value, replicas = forward.input(name), tuple(mirror.attrs["group"])
        if len(replicas) < 2 or not value.dtype.is_float or value.ndim == 0 or rank not in replicas:
            continue
        if numel(value.shape) * value.dtype.itemsize < config.threshold_kb * 1024:
            continue
        found = split_group(replicas, config.shard_size, rank)
        if found is None:
            continue
        group, same = found
        if value.shape[0] % len(group):
            continue  # MindSpore leaves a parameter whose dim 0 the group does not divide whole
        shards[name] = ParamShard(
            name,
            config.level,
            tuple(value.shape),
            group,
            group.index(rank),
            same,
            bool(mirror.attrs["mean"]),
            int(mirror.attrs["fusion"]),
            bool(mirror.attrs["fp32_sync"]),
        )
    return shards


def shard_forward(forward: Graph, shards: Mapping[str, ParamShard]) -> Graph:
    """Level3: every sharded parameter becomes an input of its block's shape, all-gathered over the shard group
    where its Mirror was (the gathered value replaces the Mirror's output). Other levels: `forward` unchanged."""
    stored = {name: s for name, s in shards.items() if s.weights_sharded}
    if not stored:
        return forward
    rewriter = Rewriter(forward)
    blocks: dict[Value, Value] = {}
    for i, value in enumerate(forward.inputs):
        if value.name in stored:
            block = Value(TensorType(stored[value.name].block_shape, value.dtype), value.name)
            rewriter.builder.inputs[i] = blocks[value] = block
            rewriter.alias(value, block)
    for node in forward.nodes:
        source = node.inputs[0] if node.inputs else None
        if node.op == "Mirror" and source in blocks:
            shard = stored[source.name]
            with rewriter.at(node.source):
                gathered = apply("AllGather", rewriter.tensor(source), group=shard.group, axis=0)
            rewriter.alias(node.outputs[0], gathered.value)
        else:
            rewriter.keep(node)
    return rewriter.build()


def read_value(graph: Graph, name: str, shard: ParamShard | None = None) -> Value:
    """What the computation reads of parameter `name`: its Mirror's output, the AllGather of its block (a level3
    shard), or the parameter itself. Gradients are taken with respect to it and reduced explicitly."""
    value = graph.input(name)
    reader = "AllGather" if shard is not None and shard.weights_sharded else "Mirror"
    for node in graph.nodes:
        if node.op == reader and node.inputs and node.inputs[0] is value:
            return node.outputs[0]
    return value


def reduce_gradient(grad: SymbolicTensor, shard: ParamShard, made: set[Value] | None = None) -> SymbolicTensor:
    """The block of the gradient this rank updates: reduce-scattered over the shard group, then all-reduced over
    the ranks holding the same block; averaged over every replica when the Mirror averages. The collectives'
    outputs are added to `made`."""
    op, dtype = "mean" if shard.mean else "sum", grad.dtype
    if shard.fp32_sync and dtype == DType.float16:
        grad = grad.astype(DType.float32)
    block = apply("ReduceScatter", grad, reduce_op=op, group=shard.group, axis=0)
    made = set() if made is None else made
    made.add(block.value)
    if len(shard.replicas) > 1:
        block = apply("AllReduce", block, reduce_op=op, group=shard.replicas)
        made.add(block.value)
    return block.astype(dtype) if block.dtype != dtype else block


def local_block(param: SymbolicTensor, shard: ParamShard) -> SymbolicTensor:
    """This rank's rows of a whole (levels 1-2) parameter."""
    lo, hi = shard.rows
    rest = (None,) * (param.ndim - 1)
    return apply("StridedSlice", param, begin=(lo, *rest), end=(hi, *rest), strides=(1,) * param.ndim)


def gather_block(block: SymbolicTensor, shard: ParamShard) -> SymbolicTensor:
    return apply("AllGather", block, group=shard.group, axis=0)


def regather_for_backward(graph: Graph, forward_nodes: int, shards: Mapping[str, ParamShard]) -> Graph:
    """Level3: readers of a gathered parameter in the backward pass (nodes from index `forward_nodes` on) read a
    second AllGather issued right before the first of them, so that the forward's gathered copy dies with the
    forward pass (ZeRO-3: gathered before use and freed after, forward and backward)."""
    stored = {s.name for s in shards.values() if s.weights_sharded}
    gathers = {
        n.outputs[0]: n for n in graph.nodes[:forward_nodes] if n.op == "AllGather" and n.inputs[0].name in stored
    }
    if not gathers:
        return graph
    rewriter = Rewriter(graph)
    again: dict[Value, Value] = {}
    for index, node in enumerate(graph.nodes):
        if index >= forward_nodes and any(v in gathers for v in node.inputs):
            inputs = []
            for v in node.inputs:
                if v in gathers and v not in again:
                    gather = gathers[v]
                    with rewriter.at(gather.source):
                        again[v] = apply(
                            "AllGather", rewriter.tensor(gather.inputs[0]), group=gather.attrs["group"], axis=0
                        ).value
                inputs.append(again.get(v, rewriter.get(v)))
            rewriter.keep(node, inputs)
        else:
            rewriter.keep(node)
    return rewriter.build()


def shard_layout(layout, shard: ParamShard, rank: int):
    """The layout of this rank's block: `layout` (the parameter's, a compiler Layout) with dim 0 further split over
    the mesh axes that its shard group spans. A shard group that is not a product of whole mesh axes is refined
    (an axis of 4 split into 2 x 2) first; None when it cannot be expressed that way."""
    from tessel.compiler.parallel.layout import Layout

    sizes = list(layout.device_matrix)
    dim_axes = [list(axes) for axes in layout.dim_axes]
    replicated = list(layout.replicated_axes)
    need, chosen = len(shard.group), []
    # The shard group is the minor part of the replica group: take replicated axes from the last one up.
    for axis in reversed(replicated):
        if need == 1:
            break
        size = sizes[axis]
        if need % size == 0:
            chosen.insert(0, axis)
            need //= size
            continue
        if size % need:
            return None
        # Split `axis` into (size // need, need) and take the minor part.
        sizes[axis : axis + 1] = [size // need, need]
        dim_axes = [[a + 1 if a > axis else a for a in axes] for axes in dim_axes]
        chosen = [a + 1 if a > axis else a for a in chosen]
        chosen.insert(0, axis + 1)
        need = 1
    if need != 1:
        return None
    dim_axes[0] = dim_axes[0] + chosen
    candidate = Layout.from_axes(tuple(sizes), [tuple(a) for a in dim_axes])
    block = candidate.local_slices(tuple(_global_shape(layout, shard)), rank)[0]
    lo, hi = shard.rows
    base = layout.local_slices(tuple(_global_shape(layout, shard)), rank)[0]
    if (block.start - base.start, block.stop - base.start) != (lo, hi):
        return None  # the mesh orders this rank's block elsewhere than the shard group does
    return candidate


def _global_shape(layout, shard: ParamShard) -> tuple[int, ...]:
    return tuple(d * s for d, s in zip(shard.shape, layout.splits))


def bytes_of(shape: Sequence[int], itemsize: int) -> int:
    return math.prod(shape) * itemsize


def start_reductions_early(graph: Graph, reductions: set[Value], lag: int = 1) -> Graph:
    """`graph` reordered for overlap: each node producing one of `reductions` (the gradients' reduce-scatters and
    the all-reduces after them) right after the node computing its input, so it starts while the backward pass
    goes on; a node that reads a reduced value (a block's update, the all-gather of the new block) as soon as
    `lag` more reductions have started after the ones it reads, so each parameter's update runs (and its block's
    gather starts) while the backward goes on, in a step of its own: its temporaries are never alive together
    with the other parameters' (with every update at the end, ONNX Runtime interleaves them all)."""
    members = [n for n in graph.nodes if any(o in reductions for o in n.outputs)]
    if not members:
        return graph
    producers = graph.producers
    after: dict[Node | None, list[Node]] = {}
    for node in members:
        after.setdefault(producers.get(node.inputs[0]), []).append(node)
    member_set = set(members)
    heads: dict[Value, frozenset[Node]] = {}  # reduced value -> the reductions (reduce-scatters) it waits for
    for node in members:  # in graph order: each all-reduce right after its reduce-scatter
        source = producers.get(node.inputs[0])
        heads.update((o, heads[source.outputs[0]] if source in member_set else frozenset({node})) for o in node.outputs)
    late: list[Node] = []
    for node in graph.nodes:
        if node not in member_set and any(v in heads for v in node.inputs):
            waits = frozenset().union(*(heads[v] for v in node.inputs if v in heads))
            heads.update((o, waits) for o in node.outputs)
            late.append(node)
    late_set = set(late)
    order: list[Node] = []
    done: set[Node] = set()
    started: dict[Node, int] = {}  # reduce-scatter -> its place in the order the reductions start

    def emit(node: Node) -> None:
        order.append(node)
        done.add(node)
        if node in member_set and producers.get(node.inputs[0]) not in member_set:
            started[node] = len(started)
        for follower in after.get(node, ()):
            emit(follower)

    def ready(node: Node, final: bool, seen: set[Node]) -> bool:
        """Emit `node` after whatever it still needs, if that needs no reduction not yet started (nor, for a
        reader of reduced values, one started less than `lag` reductions ago)."""
        if node in done:
            return True
        if node in member_set or node in seen:
            return False
        if node in late_set and not final:
            waits = heads[node.outputs[0]]
            if any(started.get(r, len(started)) > len(started) - 1 - lag for r in waits):
                return False
        seen.add(node)
        if not all(ready(producers[v], final, seen) for v in node.inputs if v in producers):
            return False
        emit(node)
        return True

    for node in after.get(None, ()):
        emit(node)
    pending = list(late)
    for node in graph.nodes:
        if node in member_set or node in late_set or node in done:
            continue
        emit(node)
        if pending:
            pending = [n for n in pending if not ready(n, False, set())]
    # The rest, readers of the latest reductions last: in the order their reductions started.
    last = sorted(pending, key=lambda n: max(started.get(r, len(started)) for r in heads[n.outputs[0]]))
    for node in [*last, *graph.nodes]:
        if node not in done and node not in member_set:
            ready(node, True, set())
    return Graph(graph.inputs, tuple(order), graph.outputs, graph.name)


def gather_blocks(graph: Graph, blocks: Mapping[str, ParamShard]) -> Graph:
    """`graph` reading the level3 parameters in `blocks` (named by input) as the blocks their daemons store:
    each such input becomes its block, all-gathered over its shard group before use (an eval or predict graph of
    a network whose train step shards the weights)."""
    wanted = {v: blocks[v.name] for v in graph.inputs if v.name in blocks and tuple(v.shape) == blocks[v.name].shape}
    if not wanted:
        return graph
    rewriter = Rewriter(graph)
    for i, value in enumerate(graph.inputs):
        if value in wanted:
            block = Value(TensorType(wanted[value].block_shape, value.dtype), value.name)
            rewriter.builder.inputs[i] = block
            gathered = apply("AllGather", SymbolicTensor(rewriter.builder, block), group=wanted[value].group, axis=0)
            rewriter.alias(value, gathered.value)
    for node in graph.nodes:
        rewriter.keep(node)
    return rewriter.build()


def block_of(layout, shape: Sequence[int], itemsize: int, config: ShardConfig, rank: int, name: str = ""):
    """(ParamShard, block layout) of a parameter of global `shape` laid out as `layout` (a compiler Layout) on
    `rank`, or None when optimizer parallel leaves it whole: not replicated, under the threshold, a dim 0 its
    shard group does not divide, or blocks no layout can describe. The same rules as plan_shards, from a layout
    instead of a Mirror (the optimizer's state in a graph the parallel pass plans)."""
    local = layout.local_shape(tuple(shape))
    if layout.replicas == 1 or not local or math.prod(local) * itemsize < config.threshold_kb * 1024:
        return None
    found = split_group(layout.mesh.group(rank, layout.replicated_axes), config.shard_size, rank)
    if found is None:
        return None
    group, same = found
    if local[0] % len(group):
        return None
    shard = ParamShard(name, config.level, tuple(local), group, group.index(rank), same, False)
    block = shard_layout(layout, shard, rank)
    return None if block is None else (shard, block)
