"""The parallel pass: a forward graph + strategies -> one graph per rank, with collectives inserted and
parameters sliced (MindSpore's step_parallel).

    plan = parallelize(graph, {matmul_node: ((1, 1), (1, 2))}, device_num=8, parameters=["w"])
    rank_graph = plan.rank_graph(3)                         # rank 3's forward graph (local shapes)
    w_piece = plan.local_value("w", full_w, rank=3)         # the slice of w's initial value rank 3 holds
    train = grad_graph(rank_graph, ["w"])                   # gradients of rank 3's slice, already reduced

It works in two stages. `parallelize` decides, once for the whole world: every node's placement (its strategy,
checked, or data parallel), every parameter's layout (its consumers must agree), every value's layout, and the
redistribution (redistribution.py) wherever a consumer needs another layout than its producer gives.
`rank_graph(rank)` then writes rank `rank`'s program: parameters and inputs at their local shapes, each op on
local shapes (attributes that hold shapes rewritten), the collectives and slices of each redistribution, a
`Mirror` on every parameter replicated over some axes (its gradient is all-reduced over exactly them) and a
`VirtualDiv` on every output held by several ranks (see compiler/ops/collective.py), so that autodiff of the rank
graph is exact. Every local op's output shape is checked against its layout: a wrong rule fails here, never silently.

Inputs that are not parameters arrive as the dataset gives them: `dataset="data_parallel"` (each rank reads its
own slice of the batch, dim 0; MindSpore's full_batch=False), "full_batch" (every rank the whole batch) or one
strategy per data input (dataset_strategy). The graph's shapes are the *global* ones. Inputs whose layout an
earlier plan decided (a parameter already sliced on the daemons, a gradient held there) come `fixed`: a consumer
that wants another layout gets a redistribution.

Gradients: a GradientOf node (what `value_and_grad` records) is differentiated on each rank's graph, after the
pass: the rank's loss is divided by its replicas (VirtualDiv) and autodiff runs through the Mirrors and the
collectives, so each rank gets the exact gradient of its own slice of every parameter, in the parameter's layout. An
AllReduce that sums partial results whose result reaches the loss only through values held alike on the ranks of
its group (a row-parallel MatMul before a replicated loss) gets the same cotangent on each of them, so its transpose
needs no collective: the pass proves it on the dataflow (ParallelPlan.uniform_cotangent) and marks it.
Ops without a strategy that compute on the weight side (parameters, gradients, scalars and what is computed from
them only: an optimizer's update) take the layout of their inputs, so an update runs where its slices are; ops on
the data side run data parallel, as MindSpore's do.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessel.compiler import registry
from tessel.compiler.autodiff import gradients
from tessel.compiler.builder import GraphBuilder, SymbolicTensor
from tessel.compiler.dtypes import DType
from tessel.compiler.ir import Attrs, ConstArray, Graph, Node, TensorType, Value
from tessel.compiler.parallel import redistribution
from tessel.compiler.parallel.layout import Layout, piece
from tessel.compiler.parallel.redistribution import ALL_STEPS, Redistribution
from tessel.compiler.parallel.strategy import Placement, StrategyError, check_devices, follow, resolve
from tessel.compiler.shapes import format_shape, is_static
from tessel.compiler.sharding import ShardingSpec
from tessel.core.errors import ConfigurationError

Key = tuple  # (node, input index) | (node, "out", output index) | ("output", graph output index)


@dataclass(frozen=True, eq=False)
class LocalOp:
    """What a rule's custom emitter sees: the rank's builder, the logical node, its local inputs and attributes,
    the node's spec and placement, and the rank."""

    builder: GraphBuilder
    node: Node
    inputs: tuple[Value, ...]
    attrs: Attrs
    spec: ShardingSpec
    placement: Placement
    rank: int

    def tensor(self, index: int) -> SymbolicTensor:
        return SymbolicTensor(self.builder, self.inputs[index])

    def default(self) -> tuple[Value, ...]:
        """The node's own op on the local inputs."""
        return self.builder.emit(self.node.op, self.inputs, self.attrs)

    def block(self, label: str) -> tuple[int, int]:
        """(this rank's block, number of blocks) along a label of the spec."""
        return self.placement.block(self.rank, label)

    def rank_constant(self, value: Any, dtype: DType) -> SymbolicTensor:
        """A constant whose value depends on the rank. It gets a node of its own: the builder would merge it with
        an equal constant on some ranks only, and the ranks' graphs must keep one structure."""
        (out,) = self.builder.emit("Constant", (), {"value": ConstArray.of(value, dtype)})
        return SymbolicTensor(self.builder, out)


@dataclass(frozen=True, eq=False)
class ParallelPlan:
    """The parallel pass's decisions for one graph on `device_num` devices (see the module docstring)."""

    graph: Graph
    device_num: int
    parameters: tuple[str, ...]
    specs: Mapping[Node, ShardingSpec]
    placements: Mapping[Node, Placement]
    layouts: Mapping[Value, Layout]
    redistributions: Mapping[Key, Redistribution]
    output_layouts: tuple[Layout, ...]
    loss_repeated_mean: bool = True  # False: no VirtualDiv on values several ranks compute alike (MindSpore's flag)
    _rank_graphs: dict[tuple[int, bool], tuple[Graph, dict]] = field(default_factory=dict, repr=False)
    _uniform: dict[Key, bool] = field(default_factory=dict, repr=False)

    def input_layout(self, name: str) -> Layout:
        return self.layouts[self.graph.input(name)]

    def local_value(self, name: str, full: np.ndarray, rank: int) -> np.ndarray:
        """Rank `rank`'s slice of input or parameter `name`, cut from its full (deterministic) value."""
        value = self.graph.input(name)
        full = np.asarray(full)
        if full.shape != value.shape:
            raise ConfigurationError(
                f"{name!r} is {format_shape(value.shape)} in the graph, got a value of shape {format_shape(full.shape)}"
            )
        return piece(full, self.layouts[value], rank)

    def local_feeds(self, feeds: Mapping[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
        """Every named full value sliced for `rank`."""
        return {name: self.local_value(name, full, rank) for name, full in feeds.items()}

    def rank_graph(self, rank: int, expand_gradients: bool = True) -> Graph:
        """Rank `rank`'s forward graph (built once, then cached). With `expand_gradients=False` a GradientOf
        stays a GradientOf node on the rank's values (its loss divided by its replicas, its wrt the local
        parameters, read through their Mirrors), for a later pass to differentiate (pipeline stages do)."""
        return self._built(rank, expand_gradients)[0]

    def rank_origins(self, rank: int, expand_gradients: bool = True) -> dict[Node, Node]:
        """Each node of rank_graph(rank, expand_gradients) -> the node of `graph` it implements (nodes that
        implement none, such as the redistribution of an output, are absent)."""
        return self._built(rank, expand_gradients)[1]

    def uniform_cotangent(self, key: Key) -> bool:
        """Whether the AllReduce that sums partial results on route `key` (a redistribution that does only that) gets
        the same cotangent on every rank of its group, proven on the dataflow (see `_uniform_cotangent`); decided
        once for the whole world, as every rank of the group must lower it alike."""
        if key not in self._uniform:
            self._uniform[key] = _uniform_cotangent(self, key)
        return self._uniform[key]

    def _built(self, rank: int, expand_gradients: bool) -> tuple[Graph, dict[Node, Node]]:
        if not 0 <= rank < self.device_num:
            raise ConfigurationError(f"rank {rank} is outside the world of {self.device_num} devices")
        key = (rank, expand_gradients)
        if key not in self._rank_graphs:
            self._rank_graphs[key] = _RankBuilder(self, rank, expand_gradients).build()
        return self._rank_graphs[key]


# --- stage 1: decisions for the whole world -------------------------------------------------------------------------


def parallelize(
    graph: Graph,
    strategies: Mapping[Node | int, Any] | None = None,
    device_num: int = 1,
    parameters: Collection[str] = (),
    dataset: str | Sequence | Mapping[str, Any] = "data_parallel",
    steps: frozenset[str] = ALL_STEPS,
    fixed: Mapping[str, Layout] | None = None,
    weights: Collection[str] = (),
    output_layouts: Sequence[Layout | None] | None = None,
    loss_repeated_mean: bool = True,
    slice_whole_inputs: bool = False,
) -> ParallelPlan:
    """Plan `graph` on `device_num` devices. `strategies` maps nodes (or their index in graph.nodes) to a
    strategy (a tuple of cuts per input, a Strategy, a Primitive after .shard(), or "data_parallel"); unlisted
    nodes run data parallel. `parameters` names the inputs that are parameters. `steps` limits redistribution
    to some kinds (redistribution.TABLE). `fixed` gives inputs whose layout is already decided; `weights` names
    non-parameter inputs on the weight side (gradients held from an earlier call); `output_layouts` asks for the
    layout of some outputs (None: as computed, partial sums combined). `loss_repeated_mean=False` leaves out the
    VirtualDiv of outputs (and losses) that several ranks compute alike, so their gradients are not averaged over
    those ranks (MindSpore's loss_repeated_mean). `slice_whole_inputs=True`: a data input that arrives whole on every
    rank (full_batch) and that every consumer reads in one layout cut from it (a local slice, no collective) arrives
    in that layout instead: whoever feeds the rank graph sends each rank only its slice (`local_value` cuts it), not
    the whole batch for the rank to slice (see `slice_whole_inputs`)."""
    if device_num < 1:
        raise ConfigurationError(f"device_num must be >= 1, got {device_num}")
    check_static(graph)
    given = by_node(graph, strategies or {})
    params, fixed = set(parameters), dict(fixed or {})
    names = {v.name for v in graph.inputs}
    for what, given_names in (("parameters", params), ("fixed layouts", set(fixed)), ("weights", set(weights))):
        unknown = sorted(given_names - names)
        if unknown:
            raise ConfigurationError(f"{what} {unknown} are not inputs of graph {graph.name!r}")
    specs = {node: registry.get(node.op).sharding_spec(node) for node in graph.nodes}
    param_values = {v for v in graph.inputs if v.name in params}
    layouts = _input_layouts(graph, param_values, fixed, device_num, dataset)
    placements = _place(graph, specs, given, layouts, param_values, weight_side(graph, params, weights), device_num)
    redistributions, finals = _route(graph, placements, layouts, steps, output_layouts)
    if slice_whole_inputs:
        data = [v for v in graph.inputs if v not in param_values and v.name not in fixed]
        _slice_whole_inputs(graph, data, layouts, redistributions)
    return ParallelPlan(
        graph,
        device_num,
        tuple(v.name for v in graph.inputs if v in param_values),
        specs,
        placements,
        layouts,
        redistributions,
        finals,
        loss_repeated_mean,
    )


def _slice_whole_inputs(graph: Graph, data: list[Value], layouts: dict, routes: dict) -> None:
    """Each data input held whole on every rank whose consumers all read it through a local slice to one layout:
    that layout becomes the one it arrives in and the slices go (see parallelize's slice_whole_inputs)."""
    readers: dict[Value, list[Key]] = {v: [] for v in data}
    for node in graph.nodes:
        for i, v in enumerate(node.inputs):
            if v in readers:
                readers[v].append((node, i))
    outputs = set(graph.outputs)
    for v, keys in readers.items():
        have = layouts[v]
        if not keys or v in outputs or have.partial or have.replicas != have.device_num:
            continue
        moves = [routes.get(key) for key in keys]
        if any(move is None or move.collectives for move in moves):
            continue  # a consumer reads it whole, or the move is more than a slice
        target = moves[0].target
        if target.partial or not all(move.target.same_as(target) for move in moves):
            continue
        layouts[v] = target
        for key in keys:
            del routes[key]


def weight_side(graph: Graph, params: set[str], weights: Collection[str]) -> set[Value]:
    """Values computed only from parameters, gradients, scalars and constants: not from a dataset column."""
    data = {v for v in graph.inputs if v.ndim > 0 and v.name not in params and v.name not in weights}
    side: set[Value] = {v for v in graph.inputs if v not in data}
    for node in graph.nodes:
        if registry.get(node.op).differentiates or all(v in side for v in node.inputs):
            side.update(node.outputs)
    return side


def _place(graph, specs, given, layouts, param_values, weight_side, device_num) -> dict[Node, Placement]:
    """Every node's placement, in graph order; parameters take the layout their first consumer asks for."""
    placements: dict[Node, Placement] = {}
    first_user: dict[Value, Node] = {}
    writes = []
    for node in graph.nodes:
        op = registry.get(node.op)
        if op.writes is not None:
            writes.append(node)
            continue
        if op.differentiates:
            placement = _gradient_placement(node, layouts)
        elif given.get(node) is None and all(v in weight_side for v in node.inputs):
            placement = _follow(node, specs[node], layouts, device_num)
        else:
            held = {i for i, v in enumerate(node.inputs) if v in param_values}
            placement = resolve(node, specs[node], given.get(node), device_num, held)
        placements[node] = placement
        for i, v in enumerate(node.inputs):
            want = placement.inputs[i]
            if v not in param_values or want is None:
                continue
            if v not in layouts:
                layouts[v], first_user[v] = want, node
            elif v in first_user and not layouts[v].same_as(want) and _both_given(first_user[v], node, placements):
                raise StrategyError(_conflict(v, first_user[v], layouts[v], placements, node, want))
        for j, out in enumerate(node.outputs):
            targets = placement.out_targets
            layouts[out] = targets[j] if targets is not None else placement.outputs[j]
    for v in param_values - set(layouts):
        layouts[v] = Layout.replicated(v.ndim, device_num)
    for node in writes:
        placements[node] = _write_placement(node, layouts, device_num)
    return placements


def _both_given(first: Node, node: Node, placements) -> bool:
    return placements[first].origin == placements[node].origin == "shard()"


def _follow(node: Node, spec: ShardingSpec, layouts: Mapping[Value, Layout], device_num: int) -> Placement:
    """A weight-side node without a strategy takes its inputs as they are laid out (the first input whose layout
    it can keep), else runs whole."""
    for i, v in enumerate(node.inputs):
        layout = layouts.get(v)
        if layout is not None and layout.replicas < layout.mesh.size:
            placement = follow(node, spec, i, layout.without_partial())
            if placement is not None:
                return placement
    return resolve(node, spec, None, device_num, set(range(len(node.inputs))))


def _gradient_placement(node: Node, layouts: Mapping[Value, Layout]) -> Placement:
    """GradientOf: the loss (and its seed) with partial sums combined; each gradient in its input's layout."""
    wants = []
    for v in node.inputs:
        layout = layouts.get(v)
        if layout is None:  # a parameter nothing reads before: its gradient is zero, wherever it lives
            layout = Layout.replicated(v.ndim, layouts[node.inputs[0]].mesh.size)
        wants.append(layout.without_partial())
    loss = wants[0]
    if node.attrs["seeded"]:
        wants[-1] = loss
    outputs = tuple(wants[1 : 1 + len(node.outputs)])
    return Placement(node.op, (), "gradient", loss.device_matrix, (), tuple(wants), outputs)


def check_static(graph: Graph) -> None:
    """Raise unless every tensor of `graph` has a static shape (the pass cuts global shapes)."""
    for v in (*graph.inputs, *(o for n in graph.nodes for o in n.outputs)):
        if not is_static(v.shape):
            raise ConfigurationError(
                f"graph {graph.name!r} has a tensor of shape {format_shape(v.shape)} ({v!r}); the parallel pass "
                "needs static shapes to cut them. Fix: trace with the global batch size as a number"
            )


def by_node(graph: Graph, strategies: Mapping[Node | int, Any]) -> dict[Node, Any]:
    """`strategies` keyed by Node (an int key is an index into graph.nodes); a foreign node is an error."""
    out = {}
    members = set(graph.nodes)
    for key, value in strategies.items():
        node = graph.nodes[key] if isinstance(key, int) else key
        if node not in members:
            raise ConfigurationError(f"a strategy was given for {key!r}, which is not a node of graph {graph.name!r}")
        out[node] = value
    return out


def _input_layouts(graph, param_values, fixed, device_num, dataset) -> dict[Value, Layout]:
    """Fixed inputs keep their layouts, data inputs take the dataset's; parameters are decided by their users."""
    layouts: dict[Value, Layout] = {}
    for v in graph.inputs:
        if v.name in fixed:
            layout = fixed[v.name]
            if layout.mesh.size != device_num:
                raise ConfigurationError(
                    f"input {v.name!r} is laid out over {layout.mesh.size} devices ({layout}), the plan over "
                    f"{device_num}; a layout from another world size must be redistributed first (a checkpoint "
                    "transform)"
                )
            layout.check(v.shape, f"input {v.name!r}")
            layouts[v] = layout
    data = [v for v in graph.inputs if v not in param_values and v not in layouts]
    for v, layout in zip(data, dataset_layouts(data, device_num, dataset)):
        layouts[v] = layout
    return layouts


def _conflict(value: Value, first: Node, had: Layout, placements, node: Node, want: Layout) -> str:
    def at(n: Node) -> str:
        return f"{n.op}" + (f" (at {n.source})" if n.source else "") + f" with strategy {placements[n].strategy}"

    return (
        f"parameter {value.name!r} {format_shape(value.shape)} is used by {at(first)}, which cuts it as "
        f"{had.describe()}, and by {at(node)}, which cuts it as {want.describe()}; the rule: a parameter has one "
        "layout, so every op using it must cut it alike. Fix: give both ops the same cuts for this input"
    )


def dataset_layouts(data: list[Value], device_num: int, dataset) -> list[Layout]:
    """The layout each data input arrives in: "data_parallel", "full_batch" or a dataset_strategy (a graph with
    no data input, such as an optimizer's update, takes none of its entries)."""
    if not data:
        return []
    if dataset == "full_batch":
        return [Layout.replicated(v.ndim, device_num) for v in data]
    if dataset == "data_parallel":
        out = []
        for v in data:
            if v.ndim == 0:
                out.append(Layout.replicated(0, device_num))
                continue
            if v.shape[0] % device_num:
                raise ConfigurationError(
                    f"input {v.name!r} {format_shape(v.shape)}: its batch dim {v.shape[0]} does not divide among "
                    f"{device_num} devices (full_batch=False: each rank reads its own slice of the batch). Fix: "
                    f"use a global batch that is a multiple of {device_num}, or full_batch=True"
                )
            out.append(Layout.from_strategy((device_num,) + (1,) * (v.ndim - 1), device_num))
        return out
    if isinstance(dataset, Mapping):
        entries = [dataset.get(v.name) for v in data]
    else:
        entries = list(dataset)
        if len(entries) != len(data):
            raise ConfigurationError(
                f"dataset_strategy has {len(entries)} entries for {len(data)} data inputs {[v.name for v in data]}"
            )
    out = []
    for v, entry in zip(data, entries):
        layout = Layout.replicated(v.ndim, device_num) if entry is None else entry
        layout = layout if isinstance(layout, Layout) else Layout.from_strategy(tuple(layout), device_num)
        check_devices(layout, device_num, f"dataset_strategy's layout of input {v.name!r}")
        layout.check(v.shape, f"input {v.name!r}")
        out.append(layout)
    return out


def _write_placement(node: Node, layouts: Mapping[Value, Layout], device_num: int) -> Placement:
    """An op that writes a parameter in place (Assign): the new value takes the parameter's layout."""
    target = registry.written(node)
    layout = layouts.get(target) or Layout.replicated(target.ndim, device_num)
    count = len(node.inputs)
    return Placement(node.op, ((),) * count, "parameter", layout.device_matrix, (), (layout,) * count, (layout,))


def _route(graph, placements, layouts, steps, wanted=None) -> tuple[dict[Key, Redistribution], tuple[Layout, ...]]:
    """Every value's layout in order, and a redistribution wherever a consumer wants another one."""
    routes: dict[Key, Redistribution] = {}

    def move(key: Key, value: Value, want: Layout) -> None:
        have = layouts[value]
        if not have.same_as(want):
            routes[key] = redistribution.plan(have, want, tuple(value.shape), value.dtype.itemsize, steps)

    for node in graph.nodes:
        placement = placements[node]
        for i, v in enumerate(node.inputs):
            if placement.inputs[i] is not None:
                move((node, i), v, placement.inputs[i])
        for j, out in enumerate(node.outputs):
            layouts[out] = placement.outputs[j]
            if placement.out_targets is not None:
                move((node, "out", j), out, placement.out_targets[j])
                layouts[out] = placement.out_targets[j]
    finals = []
    for k, v in enumerate(graph.outputs):
        final = wanted[k] if wanted is not None and wanted[k] is not None else layouts[v].without_partial()
        final.check(v.shape, f"output {k}")
        move(("output", k), v, final)
        finals.append(final)
    return routes, tuple(finals)


# --- stage 2: one rank's graph ---------------------------------------------------------------------------------------


class _RankBuilder:
    """Writes one rank's graph from a plan."""

    def __init__(self, plan: ParallelPlan, rank: int, expand_gradients: bool = True):
        self.plan, self.rank, self.expand_gradients = plan, rank, expand_gradients
        self.builder = GraphBuilder(f"{plan.graph.name}_rank{rank}")
        self.env: dict[Value, Value] = {}
        self.mirrored: dict[Value, Value] = {}
        self.layout_of: dict[Value, Layout] = {}
        self.params = {plan.graph.input(name) for name in plan.parameters}
        self.source_of: dict[Node, str | None] = {}  # rank node -> the user's line of the logical node it serves
        self.origin_of: dict[Node, Node] = {}  # rank node -> the logical node it implements

    def emit(self, op: str, inputs: tuple, attrs: dict, layout: Layout | None) -> Value:
        (out,) = self.builder.emit(op, inputs, attrs)
        if layout is not None:
            self.layout_of[out] = layout
        return out

    def build(self) -> tuple[Graph, dict[Node, Node]]:
        plan = self.plan
        for v in plan.graph.inputs:
            layout = plan.layouts[v]
            local = Value(TensorType(layout.local_shape(v.shape), v.dtype), v.name, layout)
            self.builder.inputs.append(local)
            self.env[v] = local
        for node in plan.graph.nodes:
            first = len(self.builder.nodes)
            self.builder.recompute = node.recompute  # a recomputed op's local ops and collectives are recomputed
            try:
                self.node(node)
            finally:
                self.builder.recompute = None
            self.source_of.update((n, node.source) for n in self.builder.nodes[first:])
            self.origin_of.update((n, node) for n in self.builder.nodes[first:])
        outputs = []
        producers = plan.graph.producers
        for k, (v, layout) in enumerate(zip(plan.graph.outputs, plan.output_layouts)):
            first = len(self.builder.nodes)
            move = plan.redistributions.get(("output", k))
            if v.dtype.is_float and sums_partials(move, layout):
                x = redistribution.emit_steps(move, self.env[v], self.rank, self._emit_output_sum)
            else:
                x = self.route(("output", k), self.env[v])
            if v.dtype.is_float and layout.replicas > 1 and plan.loss_repeated_mean:
                x = self.emit("VirtualDiv", (x,), {"divisor": layout.replicas}, layout)
            source = producers[v].source if v in producers else None
            self.source_of.update((n, source) for n in self.builder.nodes[first:])
            outputs.append(x)
        return _with_layouts(self.builder.build(outputs), self.layout_of, self.source_of, self.origin_of)

    def _emit_output_sum(self, op: str, inputs: tuple, attrs: dict, layout: Layout | None) -> Value:
        """emit, marking an AllReduce's cotangent uniform: a replicated graph output is seeded alike on every rank
        holding it (the VirtualDiv after it assumes as much), so the AllReduce summing its partial results needs
        no transpose collective. Nothing in the step reads it but the output, so it is also marked fusible: in a
        train step bucket_allreduce carries it in the gradient bucket of its group (a data-parallel loss: one
        collective a step, as under DATA_PARALLEL, not a second one that every rank waits for mid-step)."""
        if "uniform_cotangent" in registry.get(op).attrs:  # the collective that sums the partial results
            attrs = {**attrs, "uniform_cotangent": 1, "fusion": 1}
        return self.emit(op, inputs, attrs, layout)

    def _emit_uniform(self, op: str, inputs: tuple, attrs: dict, layout: Layout | None) -> Value:
        """emit, marking an AllReduce's cotangent uniform (ParallelPlan.uniform_cotangent proved it): its transpose
        is computed locally. Not fusible: the step reads its result (a bucket would hold it until the gradients)."""
        if "uniform_cotangent" in registry.get(op).attrs:
            attrs = {**attrs, "uniform_cotangent": 1}
        return self.emit(op, inputs, attrs, layout)

    def route(self, key: Key, value: Value) -> Value:
        move = self.plan.redistributions.get(key)
        if move is None:
            return value
        emit = self.emit
        if value.dtype.is_float and sums_partials(move, move.target) and self.plan.uniform_cotangent(key):
            emit = self._emit_uniform
        return redistribution.emit_steps(move, value, self.rank, emit)

    def read(self, node: Node, i: int) -> Value:
        v = node.inputs[i]
        x = self.env[v]
        if v in self.params and i != registry.get(node.op).writes:
            x = self.mirror(v, x)
        return self.route((node, i), x)

    def mirror(self, param: Value, local: Value) -> Value:
        """A parameter held by several ranks is read through a Mirror over exactly those ranks."""
        layout = self.plan.layouts[param]
        if layout.replicas == 1 or not param.dtype.is_float:
            return local
        if param not in self.mirrored:
            group = layout.mesh.group(self.rank, layout.replicated_axes)
            self.mirrored[param] = self.emit("Mirror", (local,), {"group": group}, layout)
        return self.mirrored[param]

    def gradient(self, node: Node) -> None:
        """GradientOf on this rank: autodiff of the rank's loss (divided by its replicas, as every rank's copy of a
        replicated loss counts) with respect to the local inputs, through the Mirrors and collectives."""
        placement = self.plan.placements[node]
        seeded = node.attrs["seeded"]
        layout = placement.inputs[0]
        move = self.plan.redistributions.get((node, 0))
        if self.plan.loss_repeated_mean and sums_partials(move, layout):
            # A loss of partial sums: every rank's copy of the all-reduced loss counts each rank's partial once, so
            # d(sum of the copies / their replicas)/d(partial) = seed / (the partial's own replicas). Differentiating
            # the partial itself gives that without the AllReduce's transpose, a second collective of the seed
            # (identical on every rank) each step; the loss the step returns is all-reduced on its own route.
            loss, layout = self.env[node.inputs[0]], move.source
        else:
            loss = self.route((node, 0), self.env[node.inputs[0]])
        if layout.replicas > 1 and self.plan.loss_repeated_mean:
            loss = self.emit("VirtualDiv", (loss,), {"divisor": layout.replicas}, layout)
        wrt = [self.env[v] for v in node.inputs[1 : len(node.inputs) - seeded]]
        seed = self.route((node, len(node.inputs) - 1), self.env[node.inputs[-1]]) if seeded else None
        if self.expand_gradients:
            grads = gradients(self.builder, loss, wrt, seed)
        else:
            grads = list(self.builder.emit(node.op, (loss, *wrt, *([seed] if seeded else [])), node.attrs))
        for out, grad, out_layout in zip(node.outputs, grads, placement.outputs):
            self.layout_of[grad] = out_layout
            self.env[out] = grad

    def node(self, node: Node) -> None:
        plan = self.plan
        if registry.get(node.op).differentiates:
            self.gradient(node)
            return
        spec, placement = plan.specs[node], plan.placements[node]
        inputs = tuple(self.read(node, i) for i in range(len(node.inputs)))
        attrs = node.attrs
        if spec.shape_attr is not None:
            local = placement.outputs[0].local_shape(node.outputs[0].shape)
            attrs = Attrs({**dict(attrs), spec.shape_attr: local})
        local_op = LocalOp(self.builder, node, inputs, attrs, spec, placement, self.rank)
        outputs = spec.emit(local_op) if spec.emit is not None else local_op.default()
        for j, (out, value) in enumerate(zip(node.outputs, outputs)):
            layout = placement.outputs[j]
            expected = layout.local_shape(out.shape)
            if tuple(value.shape) != expected:
                raise AssertionError(
                    f"the sharding rule of {node.op} gave output {j} the local shape {format_shape(value.shape)}, "
                    f"but its layout {layout} needs {format_shape(expected)}: the rule is wrong"
                )
            self.layout_of[value] = layout
            self.env[out] = self.route((node, "out", j), value)


def _with_layouts(
    graph: Graph, layout_of: Mapping[Value, Layout], source_of: Mapping[Node, str | None], origin_of: Mapping
) -> tuple[Graph, dict[Node, Node]]:
    """The same graph with each node output's `layout` slot filled (Values are immutable: they are replaced) and
    each node pointing at the user's line of the node it implements; and each new node's logical node."""
    renamed: dict[Value, Value] = {v: v for v in graph.inputs}
    nodes, origins = [], {}
    for node in graph.nodes:
        outs = []
        for out in node.outputs:
            layout = layout_of.get(out)
            renamed[out] = out if layout is None else dataclasses.replace(out, layout=layout)
            outs.append(renamed[out])
        source = source_of.get(node, node.source)
        inputs = tuple(renamed[v] for v in node.inputs)
        nodes.append(dataclasses.replace(node, inputs=inputs, outputs=tuple(outs), source=source))
        if node in origin_of:
            origins[nodes[-1]] = origin_of[node]
    return Graph(graph.inputs, tuple(nodes), tuple(renamed[v] for v in graph.outputs), graph.name), origins


def sums_partials(move: Redistribution | None, target: Layout) -> bool:
    """Whether `move` only sums partial results into `target` (an AllReduce over the partial axes, nothing else)."""
    return move is not None and move.target == target and sums_into(move.source, target)


def sums_into(source: Layout, target: Layout) -> bool:
    """Whether the move from `source` to `target` only sums partial results (sums_partials, before it is planned)."""
    return source.is_partial and source.partial_op == "sum" and source.without_partial() == target


# --- which AllReduce gets the same cotangent on every rank of its group ---------------------------------------------


def _uniform_cotangent(plan: ParallelPlan, key: Key) -> bool:
    """Whether the AllReduce summing partial results on route `key` gets the same cotangent on every rank of its
    group, so that its transpose (an AllReduce of the cotangents) is the group size times the rank's own cotangent,
    computed without a collective (compiler/ops/collective.py, `uniform_cotangent`).

    Each rank computes the cotangent of a value from the values between it and the loss: the inputs and outputs of
    every node on a path from the value to the loss, and the loss's seed. When every one of them is the same on every
    rank of the group (its layout gives every rank of the group the same piece and no rank a different partial sum)
    and every route on those paths is a local slice whose every state is so too, every rank of the group runs the
    same computation on the same values: the cotangent is the same. The paths are followed on the logical graph,
    forward from the AllReduce's result through every consumer; the answer is False as soon as one of them meets
    what this cannot vouch for: a collective on the way (its transpose mixes ranks), a value held differently across
    the group (a slice of it per rank, a partial sum), a write, a GradientOf reached other than by its loss, a
    gradient that is differentiated again, or a graph output not held alike (a replicated graph output is seeded
    alike on every rank: the VirtualDiv after it assumes as much). The AllReduce then keeps its transpose."""
    move = plan.redistributions[key]
    source = move.source
    n = plan.device_num
    if source.device_num != n or key[0] == "output":
        return False
    groups = [source.mesh.group(r, source.partial_axes) for r in range(n)]
    seen_layouts: dict[Layout, bool] = {}

    def alike(layout: Layout) -> bool:
        if layout not in seen_layouts:
            seen_layouts[layout] = layout.device_num == n and all(
                _piece_of(layout, member) == _piece_of(layout, r) for r in range(n) for member in groups[r]
            )
        return seen_layouts[layout]

    def local_route(route_key: Key, layout: Layout) -> bool:
        """The value arrives alike through route `route_key` (none: as `layout`), by local steps only."""
        move = plan.redistributions.get(route_key)
        if move is None:
            return alike(layout)
        states = [s for segment in move.segments for s in segment.layouts]
        return not move.collectives and all(alike(s) for s in states) and alike(move.target)

    consumers: dict[Value, list[tuple[Node, int]]] = {}
    for node in plan.graph.nodes:
        for i, v in enumerate(node.inputs):
            consumers.setdefault(v, []).append((node, i))
    output_index: dict[Value, list[int]] = {}
    for k, v in enumerate(plan.graph.outputs):
        output_index.setdefault(v, []).append(k)

    node, index = key[0], key[1]
    if registry.get(node.op).differentiates or not alike(move.target):
        return False
    edges: list[tuple[Node, int]] = []
    values: list[Value] = []
    start = None  # the AllReduce's own route: its result (move.target, checked above) is that input
    if index == "out":
        values.append(node.outputs[key[2]])
    else:
        start = (node, index)
        edges.append(start)
    losses: list[Node] = []
    done_nodes: set[Node] = set()
    done_values: set[Value] = set()
    while edges or values:
        while values:
            v = values.pop()
            if v in done_values:
                continue
            done_values.add(v)
            for k in output_index.get(v, ()):
                if not local_route(("output", k), plan.output_layouts[k]):
                    return False
            edges.extend(consumers.get(v, ()))
        if not edges:
            break
        m, i = edges.pop()
        if (m, i) != start and not local_route((m, i), _read_layout(plan, m, i)):
            return False
        op = registry.get(m.op)
        if op.differentiates:
            if i != 0 or not _loss_alike(plan, m, alike, local_route):
                return False
            losses.append(m)
            continue
        if op.writes is not None:
            return False
        if m in done_nodes:
            continue
        done_nodes.add(m)
        placement = plan.placements[m]
        if not all(alike(_read_layout(plan, m, j)) for j in range(len(m.inputs))):
            return False
        for j, out in enumerate(m.outputs):
            if not alike(placement.outputs[j]):
                return False
            if placement.out_targets is not None and not local_route((m, "out", j), placement.out_targets[j]):
                return False
            values.append(out)
    return not any(_differentiated_again(plan, loss, consumers) for loss in losses)


def uniform_into_last_op(
    node: Node, placement: Placement, source: Layout, finals: Sequence[Sequence[Layout]], device_num: int
) -> bool:
    """_uniform_cotangent for an AllReduce summing partial results `source` into an input of `node`, an op whose
    outputs no node reads: only graph outputs, output j leaving the graph in each layout of `finals[j]`. What the proof
    walks is then the op alone (its placement) and its graph outputs, so the answer depends on `node`'s placement and
    `source` only: the strategy search prices it per edge (search/objective.py). Sound, never wider than the proof: an
    input the op takes as it comes, an out_strategy, or an output that leaves in another layout than the op gives, is
    answered False here (the proof may still find the cotangent uniform)."""
    op = registry.get(node.op)
    if source.device_num != device_num or op.differentiates or op.writes is not None:
        return False
    if placement.out_targets is not None or any(want is None for want in placement.inputs):
        return False
    alike = alike_on(source)
    if not all(alike(want) for want in placement.inputs):
        return False
    for layout, leaves in zip(placement.outputs, finals):
        if not alike(layout) or not all(layout.same_as(final) and alike(final) for final in leaves):
            return False
    return True


def alike_on(source: Layout):
    """layout -> whether it gives every rank of each group of `source`'s partial axes the same piece (the `alike` of
    _uniform_cotangent, O(ranks) per layout)."""
    n, group_of = source.device_num, partial_group_ids(source)

    def alike(layout: Layout) -> bool:
        if layout.device_num != n:
            return False
        first: dict[int, tuple] = {}
        for r in range(n):
            piece = _piece_of(layout, r)
            if first.setdefault(group_of[r], piece) != piece:
                return False
        return True

    return alike


@functools.lru_cache(maxsize=1024)
def partial_group_ids(source: Layout) -> tuple[int, ...]:
    """Each rank's group over `source`'s partial axes, named by its least member."""
    mesh = source.mesh
    return tuple(min(mesh.group(r, source.partial_axes)) for r in range(source.device_num))


def _piece_of(layout: Layout, rank: int) -> tuple:
    """Which data `rank` holds under `layout`: its block along every dim and its partial sum's index."""
    mesh = layout.mesh
    return tuple(mesh.block(rank, axes) for axes in layout.dim_axes), mesh.block(rank, layout.partial_axes)


def _read_layout(plan: ParallelPlan, node: Node, i: int) -> Layout:
    """The layout in which `node` reads its input `i` (after its route)."""
    want = plan.placements[node].inputs[i]
    return want if want is not None else plan.layouts[node.inputs[i]]


def _loss_alike(plan: ParallelPlan, gradient: Node, alike, local_route) -> bool:
    """A GradientOf's loss and seed are the same on every rank of the group, as its rank graph differentiates them
    (a loss of partial sums is differentiated before its AllReduce: see _RankBuilder.gradient)."""
    placement = plan.placements[gradient]
    move = plan.redistributions.get((gradient, 0))
    if plan.loss_repeated_mean and sums_partials(move, placement.inputs[0]):
        loss_ok = alike(move.source)
    else:
        loss_ok = local_route((gradient, 0), placement.inputs[0])
    if gradient.attrs["seeded"]:
        last = len(gradient.inputs) - 1
        loss_ok = loss_ok and local_route((gradient, last), placement.inputs[last])
    return loss_ok


def _differentiated_again(plan: ParallelPlan, gradient: Node, consumers) -> bool:
    """Whether a gradient of `gradient` reaches another GradientOf (a derivative of a derivative, whose cotangents
    this analysis has not followed)."""
    todo, seen = list(gradient.outputs), set()
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        for node, _ in consumers.get(v, ()):
            if registry.get(node.op).differentiates:
                return True
            todo.extend(node.outputs)
    return False
