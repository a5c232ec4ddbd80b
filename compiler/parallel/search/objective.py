"""What a plan costs: the terms of one training step's time and of each device's memory, and `predict_step_time`,
which adds them up for a ParallelPlan. The search (problem.py) splits the very same terms over nodes and edges, so
the plan it finds minimises exactly what `predict_step_time` predicts for it.

A training step is modelled as
- compute: forward + backward ≈ 3× the forward (the backward of an op costs about twice its forward), each op on
  the local shapes its placement gives, bound by flops or by memory traffic (CostModel.compute_time);
- redistribution: every move the parallel pass inserts, priced forward and, where the moved value has a gradient,
  again backward (the gradient of a collective is a collective of the same size: AllGather' = ReduceScatter,
  AllReduce' = AllReduce). Forward only, as the pass lowers them: a graph output's move, a loss's partial sums (its
  gradient starts from them), and an AllReduce summing partial results into a last op (one whose outputs only leave
  the graph: the mean after a Megatron MLP's row-parallel MatMul) whose cotangent is the same on every rank of its
  group (one_way_sum, a case of ParallelPlan.uniform_cotangent): its transpose is local. That case depends on the
  op's placement and the sum's layout only, so the search prices it per edge, exactly. The pass proves sums further
  from the loss uniform too (through a Sub and a Mul to a replicated loss); whether one is depends on the placement
  of every op down to the loss, which no edge of the search sees, so the model prices those both ways: there the
  prediction is an upper bound;
- gradient reduction: each parameter replicated over some device-matrix axes has its gradient all-reduced over
  exactly them; gradients travel in buckets, so a parameter pays the bandwidth of its bytes and the latency share
  of the bucket it fills (its bytes / bucket bytes, at most one whole latency);
- update: the optimizer reads and writes each parameter's local slice (and its gradient and state);
- launches: the runtime call of every segment; a step runs one segment, and one more after each collective (a
  redistribution forward and, where priced so, backward; a gradient bucket: its share of the bucket).
Each op's compute is multiplied by its measured factor (CostModel.op_factors: how much slower the runtime runs its
forward + backward than the flop/byte model prices). Communication is not assumed to overlap compute: the
prediction is an upper bound of a well-overlapped step.

Memory per device: every node output kept for the backward, each parameter's local slice times
`parameter_bytes_factor` (gradient and optimizer state), and the data inputs' local slices.

    >>> plan = parallelize(graph, strategies, 8, parameters=["w"])
    >>> step = predict_step_time(plan, CostModel.default_cpu(8))
    >>> step.total, step.memory_bytes                # seconds per step, bytes per device
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache

from tessel.compiler import registry
from tessel.compiler.ir import Graph, Node, Value
from tessel.compiler.parallel.cost import local_cost
from tessel.compiler.parallel.layout import Layout
from tessel.compiler.parallel.partition import (
    ParallelPlan,
    partial_group_ids,
    sums_into,
    sums_partials,
    uniform_into_last_op,
)
from tessel.compiler.parallel.search import cost_model
from tessel.compiler.parallel.search.cost_model import CostModel
from tessel.compiler.parallel.strategy import Placement
from tessel.compiler.sharding import ShardingSpec

TRAIN_COMPUTE = 3.0  # forward + backward ≈ 3 forwards
MOVE_BOTH_WAYS = 2.0  # a redistribution forward, its transpose backward


def local_bytes(value: Value, layout: Layout) -> int:
    return math.prod(layout.local_shape(value.shape)) * itemsize(value)


def produced(placement: Placement) -> tuple[Layout, ...]:
    """The layouts a node's outputs have once its out_strategy (if any) is applied."""
    return placement.out_targets or placement.outputs


def node_time(model: CostModel, node: Node, spec: ShardingSpec, placement: Placement) -> float:
    """The node's forward and backward compute on its local shapes, plus any move its out_strategy asks for."""
    seconds = TRAIN_COMPUTE * model.compute_time(local_cost(node, spec, placement), node.op)
    if placement.out_targets is not None:
        for out, have, want in zip(node.outputs, placement.outputs, placement.out_targets):
            seconds += move_time(model, have, want, out)
    return seconds


def node_memory(node: Node, placement: Placement) -> int:
    """Bytes of the node's outputs on one device (kept for the backward pass)."""
    return sum(local_bytes(v, layout) for v, layout in zip(node.outputs, produced(placement)))


def move_time(model: CostModel, have: Layout, want: Layout, value: Value, backward: bool = True) -> float:
    """A redistribution of `value` from `have` to `want`, forward and, where `value` has a gradient (`backward`),
    backward (with the segment launch after each collective it takes)."""
    seconds = model.redistribution_time(have, want, tuple(value.shape), itemsize(value))
    ways = MOVE_BOTH_WAYS if backward else 1.0
    return ways * (seconds + model.launch_overhead) if seconds else 0.0


def last_ops(graph: Graph) -> set[Node]:
    """The nodes whose outputs no node reads (only graph outputs, or nothing): where a partial sum is summed into one
    of them, whether its AllReduce needs a backward collective depends on that op's placement alone (one_way_sum)."""
    read = {v for node in graph.nodes for v in node.inputs}
    return {node for node in graph.nodes if not any(v in read for v in node.outputs)}


def one_way_sum(node: Node, placement: Placement, have: Layout, want: Layout, finals, device_num: int) -> bool:
    """Whether the move of a float value from `have` into `node`, a last op (last_ops) placed as `placement` that
    reads it as `want`, is an AllReduce of partial sums whose cotangent is the same on every rank of its group
    (partition.uniform_into_last_op, a case of ParallelPlan.uniform_cotangent): its transpose is then local and the
    move is priced forward only. `finals[j]`: the layouts output j of the node leaves the graph in."""
    return sums_into(have, want) and uniform_into_last_op(node, placement, have, finals, device_num)


def differentiable(graph: Graph, parameters: Collection[str]) -> set[Value]:
    """The values of `graph` that depend on a parameter: only their redistributions have a transpose in the
    backward pass (autodiff differentiates towards the parameters; a data input's gather happens once)."""
    found = {v for v in graph.inputs if v.name in parameters}
    for node in graph.nodes:
        if any(v in found for v in node.inputs):
            found.update(node.outputs)
    return found


def itemsize(value: Value) -> int:
    """Bytes per element (looked up once per dtype: the search asks for it tens of thousands of times)."""
    dtype = value.type.dtype
    size = _ITEMSIZE.get(id(dtype))
    if size is None:
        size = _ITEMSIZE[id(dtype)] = dtype.itemsize
    return size


_ITEMSIZE: dict[int, int] = {}  # id(DType member) -> bytes: members are singletons, and enums hash slowly


def reduction_time(model: CostModel, layout: Layout, value: Value, backward: bool = True) -> float:
    """The least it costs to resolve a partial layout (no op takes partial sums as its input): an AllReduce to the
    same layout without them, or a ReduceScatter of the partial axes onto a dim they divide."""
    if not layout.is_partial:
        return 0.0
    best = move_time(model, layout, layout.without_partial(), value, backward)
    for d in range(layout.ndim):
        dims = [list(axes) for axes in layout.dim_axes]
        dims[d].extend(layout.partial_axes)
        target = Layout.from_axes(layout.device_matrix, dims)
        if value.shape[d] % target.splits[d] == 0:
            best = min(best, move_time(model, layout, target, value, backward))
    return best


def output_time(model: CostModel, value: Value, layout: Layout) -> float:
    """A graph output leaves the pass without partial results (partition._route): the AllReduce that takes, forward
    only (nothing differentiates an output but the loss, and the loss's gradient starts from its partial sums)."""
    return move_time(model, layout, layout.without_partial(), value, backward=False) if layout.is_partial else 0.0


def parameter_cost(model: CostModel, value: Value, layout: Layout) -> tuple[float, float]:
    """(seconds of gradient reduction and update, bytes per device) of a parameter held in `layout`."""
    return _parameter_cost(model, layout, tuple(value.shape), itemsize(value))


@lru_cache(maxsize=1 << 14)
def _parameter_cost(model: CostModel, layout: Layout, shape: tuple, itemsize: int) -> tuple[float, float]:
    nbytes = math.prod(layout.local_shape(shape)) * itemsize
    seconds = gradient_time(model, layout, nbytes)
    seconds += (model.parameter_bytes_factor + 1) * nbytes / model.memory_bandwidth
    return seconds, nbytes * model.parameter_bytes_factor


def gradient_time(model: CostModel, layout: Layout, nbytes: float) -> float:
    """The all-reduce of a gradient over the axes its parameter is replicated on, in a shared bucket."""
    axes = layout.replicated_axes
    if not axes or nbytes <= 0:
        return 0.0
    latency, bandwidth = model.group_cost("all_reduce", layout.device_matrix, axes, nbytes)
    return bandwidth + min(1.0, nbytes / model.bucket_bytes) * (latency + model.launch_overhead)


def step_launch_time(model: CostModel) -> float:
    """The one segment launch every step makes whatever the plan (the rest come with collectives)."""
    return model.launch_overhead


def clear_caches() -> None:
    """Forget every remembered price (collective groups, redistributions, parameters): a cold start, as the first
    plan of a process sees it (benchmarks time searches from here)."""
    _parameter_cost.cache_clear()
    partial_group_ids.cache_clear()
    cost_model.clear_caches()


# --- the prediction ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTime:
    """A predicted training step on one device: seconds per part and bytes of memory."""

    compute: float
    redistribution: float
    gradients: float
    update: float
    memory_bytes: float
    launches: float = 0.0  # the step's own segment launch (those after collectives count in their terms)

    @property
    def total(self) -> float:
        return self.compute + self.redistribution + self.gradients + self.update + self.launches

    def __repr__(self) -> str:
        ms = lambda s: f"{s * 1e3:.3g} ms"  # noqa: E731
        return (
            f"StepTime(total={ms(self.total)}: compute {ms(self.compute)}, redistribution "
            f"{ms(self.redistribution)}, gradients {ms(self.gradients)}, update {ms(self.update)}, launch "
            f"{ms(self.launches)}; {self.memory_bytes / 2**20:.1f} MiB/device)"
        )


def predict_step_time(plan: ParallelPlan, model: CostModel) -> StepTime:
    """The step time and memory the cost model predicts for `plan` (forward + backward + gradient all-reduce +
    update). In-place writes (Assign) are not priced."""
    graph = plan.graph
    compute = redistribution = gradients = update = 0.0
    memory = 0.0
    writes = {node for node in graph.nodes if registry.written(node) is not None}
    for node in graph.nodes:
        if node in writes:
            continue
        placement = plan.placements[node]
        compute += TRAIN_COMPUTE * model.compute_time(local_cost(node, plan.specs[node], placement), node.op)
        memory += node_memory(node, placement)
    grads = differentiable(graph, plan.parameters)
    last = last_ops(graph)
    for key, move in plan.redistributions.items():
        if key[0] in writes:
            continue
        value = _moved_value(graph, key)
        # An out_strategy move is priced as its node's (node_time); an output's, or a loss's summed into the
        # gradient, has no transpose (partition._RankBuilder.gradient differentiates the partial sums); nor has a
        # sum of partials into a last op whose cotangent is uniform (one_way_sum).
        backward = (value in grads or key[1] == "out") and not _one_way(key, move)
        if backward and key[0] != "output" and key[1] != "out" and key[0] in last:
            backward = not _uniform_sum(plan, key, move, value)
        redistribution += move_time(model, move.source, move.target, value, backward)
    params = set(plan.parameters)
    for v in graph.inputs:
        layout = plan.layouts[v]
        if v.name not in params:
            memory += local_bytes(v, layout)
            continue
        nbytes = local_bytes(v, layout)
        gradients += gradient_time(model, layout, nbytes)
        update += (model.parameter_bytes_factor + 1) * nbytes / model.memory_bandwidth
        memory += nbytes * model.parameter_bytes_factor
    return StepTime(compute, redistribution, gradients, update, memory, step_launch_time(model))


def _one_way(key, move) -> bool:
    if key[0] == "output":
        return True
    return registry.get(key[0].op).differentiates and key[1] == 0 and sums_partials(move, move.target)


def _uniform_sum(plan: ParallelPlan, key, move, value: Value) -> bool:
    """one_way_sum for route `key` of `plan`, and the pass lowers it so (ParallelPlan.uniform_cotangent)."""
    node = key[0]
    finals = [[plan.output_layouts[k] for k, v in enumerate(plan.graph.outputs) if v is out] for out in node.outputs]
    placement = plan.placements[node]
    if not value.dtype.is_float or not one_way_sum(node, placement, move.source, move.target, finals, plan.device_num):
        return False
    return sums_partials(move, move.target) and plan.uniform_cotangent(key)


def _moved_value(graph, key) -> Value:
    if key[0] == "output":
        return graph.outputs[key[1]]
    node = key[0]
    return node.outputs[key[2]] if key[1] == "out" else node.inputs[key[1]]
