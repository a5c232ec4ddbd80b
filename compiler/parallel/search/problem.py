"""The problem every search mode solves: one variable per node (its candidate strategies) and per parameter that
several ops use (its candidate layouts), what each choice costs on its own, and what each edge costs for a pair of
choices.

- A node's options are every legal cut of its rule's labels (cost.candidates), or the one strategy the user fixed
  (shard() or set_data_parallel(); never changed). An option's own cost: its compute forward and backward, the
  moves from the data inputs' dataset layouts, the gradient reduction, update and memory of a parameter only it
  uses (the parameter takes the layout the op asks for), the AllReduce that a partial graph output needs, and its
  outputs' memory.
- A parameter used by several ops is a variable of its own: its options are the layouts its users may ask for,
  and an edge to each user allows only the same layout (a parameter has one layout; partition._input_layouts).
- An edge from a producer's output to a consumer's input costs the redistribution between the layout the one
  gives and the one the other wants, forward and, where the value has a gradient, backward; but an AllReduce of
  partial sums into a last op whose cotangent is uniform on the sum's group, forward only (objective.one_way_sum:
  it depends on the pair of options alone).

`evaluate(assignment)` adds these up; it equals `predict_step_time(parallelize(graph, strategies(assignment)))`
(objective.py), which the tests check, so every mode searches the same objective the predictor reports.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessel.compiler import registry
from tessel.compiler.ir import Graph, Node, Value
from tessel.compiler.parallel.cost import candidates
from tessel.compiler.parallel.layout import Layout
from tessel.compiler.parallel.partition import by_node, check_static, dataset_layouts
from tessel.compiler.parallel.search import objective
from tessel.compiler.parallel.search.cost_model import CostModel, is_local_slice
from tessel.compiler.parallel.strategy import DATA_PARALLEL, Placement, StrategyError, place, resolve
from tessel.compiler.sharding import ShardingSpec
from tessel.core.errors import ConfigurationError

INFEASIBLE = math.inf


@dataclass(frozen=True, eq=False)
class Option:
    """One choice for a variable: a node's placement (with its label cuts) or a shared parameter's layout, and
    the seconds and bytes it costs on its own. `communication`: the part of `time` spent communicating (moves from
    the dataset, the gradient reduction of parameters it decides, partial outputs made whole, its out_strategy)."""

    time: float
    memory: float
    placement: Placement | None = None
    cuts: tuple[tuple[str, int], ...] = ()
    layout: Layout | None = None
    communication: float = 0.0


@dataclass(eq=False)
class Variable:
    """A node or a shared parameter, its options and whether the user fixed it (a single option then)."""

    index: int
    name: str
    options: list[Option]
    node: Node | None = None
    parameter: Value | None = None
    fixed: bool = False
    edges: list[int] = field(default_factory=list)  # indices into Problem.edges

    def __repr__(self) -> str:
        return f"Variable({self.name}, {len(self.options)} options{', fixed' if self.fixed else ''})"


@dataclass(frozen=True, eq=False)
class Edge:
    """`source` (a node, output `output`; or a shared parameter, output -1) feeds input `input` of `target`."""

    source: int
    target: int
    value: Value
    output: int
    input: int


def layout_key(layout: Layout) -> tuple:
    """Equal keys = the same data on every rank (Layout.same_as), hashable."""
    refined = layout.refined
    return refined.device_matrix, refined.tensor_map, refined.partial, refined.partial_op if refined.partial else ""


def describe(node: Node, index: int) -> str:
    return f"{node.op} #{index}" + (f" (at {node.source})" if node.source else "")


class Problem:
    """Variables, edges and the constant part of the objective for one graph on `device_num` devices."""

    def __init__(
        self,
        graph: Graph,
        device_num: int,
        fixed: Mapping[Node | int, Any] | None,
        parameters: Collection[str],
        dataset: Any,
        model: CostModel,
    ):
        if device_num < 1:
            raise ConfigurationError(f"device_num must be >= 1, got {device_num}")
        check_static(graph)
        self.graph, self.device_num, self.model = graph, device_num, model
        self.fixed = by_node(graph, fixed or {})
        names = set(parameters)
        unknown = sorted(names - {v.name for v in graph.inputs})
        if unknown:
            raise ConfigurationError(f"parameters {unknown} are not inputs of graph {graph.name!r}")
        self.parameters = tuple(v for v in graph.inputs if v.name in names)
        data = [v for v in graph.inputs if v.name not in names]
        self.dataset: dict[Value, Layout] = dict(zip(data, dataset_layouts(data, device_num, dataset)))
        self.differentiable = objective.differentiable(graph, names)
        self.index = {node: i for i, node in enumerate(graph.nodes)}
        self.specs = {n: registry.get(n.op).sharding_spec(n) for n in graph.nodes if registry.written(n) is None}
        self.variables: list[Variable] = []
        self.edges: list[Edge] = []
        self.node_var: dict[Node, int] = {}
        self.param_var: dict[Value, int] = {}
        self.constant_time = self.constant_memory = 0.0
        self._edge_cache: dict[tuple[int, int, int], float] = {}
        self._edge_backward: list[bool] = []  # per edge: whether its value has a gradient (a move back)
        # per edge into a last op (objective.last_ops) whose move back may be local: how many times each output of
        # that op is a graph output (objective.one_way_sum); None elsewhere
        self._edge_last: list[tuple[int, ...] | None] = []
        self._last = objective.last_ops(graph)
        self._one_way: dict[tuple, bool] = {}
        # Keyed by the identity of layouts the options hold (alive as long as the problem): hashing layouts and
        # the model on every lookup would cost more than the search itself on large graphs.
        self._moves: dict[tuple, float] = {}
        self._parameter_costs: dict[tuple, tuple[float, float]] = {}
        _Builder(self).build()

    # --- the objective ----------------------------------------------------------------------------------------------
    def edge_time(self, edge_index: int, a: int, b: int) -> float:
        """Seconds edge `edge_index` costs when its source takes option a and its target option b."""
        key = (edge_index, a, b)
        seconds = self._edge_cache.get(key)
        if seconds is None:
            edge = self.edges[edge_index]
            source, target = self.variables[edge.source], self.variables[edge.target]
            want = target.options[b].placement.inputs[edge.input]
            if edge.output < 0:
                same = layout_key(source.options[a].layout) == layout_key(want)
                seconds = 0.0 if same else INFEASIBLE
            else:
                have = objective.produced(source.options[a].placement)[edge.output]
                backward = self._edge_backward[edge_index]
                counts = self._edge_last[edge_index]
                if counts is not None:
                    backward = not self.one_way_sum(target.node, target.options[b].placement, have, want, counts)
                seconds = self.move(have, want, edge.value, backward)
            self._edge_cache[key] = seconds
        return seconds

    def move(self, have: Layout, want: Layout, value: Value, backward: bool = True) -> float:
        """objective.move_time, remembered per (layout, layout, shape, backward)."""
        key = (id(have), id(want), value.shape, objective.itemsize(value), backward)
        seconds = self._moves.get(key)
        if seconds is None:
            seconds = self._moves[key] = objective.move_time(self.model, have, want, value, backward)
        return seconds

    def one_way_sum(self, node: Node, placement: Placement, have: Layout, want: Layout, counts: tuple) -> bool:
        """objective.one_way_sum of a move into last op `node`, whose output j is `counts[j]` graph outputs (each
        leaving as the op gives it, partial sums combined: partition._route); remembered per (layouts, placement,
        counts)."""
        key = (id(have), id(want), id(placement), counts)
        found = self._one_way.get(key)
        if found is None:
            gives = objective.produced(placement)
            finals = [[layout.without_partial()] * count for layout, count in zip(gives, counts)]
            found = objective.one_way_sum(node, placement, have, want, finals, self.device_num)
            self._one_way[key] = found
        return found

    def parameter_cost(self, value: Value, layout: Layout) -> tuple[float, float]:
        """objective.parameter_cost, remembered per (layout, shape)."""
        key = (id(layout), value.shape, objective.itemsize(value))
        cost = self._parameter_costs.get(key)
        if cost is None:
            cost = self._parameter_costs[key] = objective.parameter_cost(self.model, value, layout)
        return cost

    def reduction(self, layout: Layout, value: Value) -> float:
        """objective.reduction_time of a node's output, forward only, remembered per (layout, shape)."""
        key = ("reduce", id(layout), value.shape, objective.itemsize(value))
        seconds = self._moves.get(key)
        if seconds is None:
            seconds = self._moves[key] = objective.reduction_time(self.model, layout, value, backward=False)
        return seconds

    def gradient_time(self, value: Value, layout: Layout) -> float:
        """The gradient reduction of parameter `value` held in `layout` (part of `parameter_cost`)."""
        return objective.gradient_time(self.model, layout, objective.local_bytes(value, layout))

    def evaluate(self, assignment: Sequence[int]) -> tuple[float, float]:
        """(seconds per training step, bytes per device) of one option per variable."""
        time, memory = self.constant_time, self.constant_memory
        for var, a in zip(self.variables, assignment):
            time += var.options[a].time
            memory += var.options[a].memory
        for k, edge in enumerate(self.edges):
            time += self.edge_time(k, assignment[edge.source], assignment[edge.target])
        return time, memory

    def strategies(self, assignment: Sequence[int]) -> dict[Node, Any]:
        """The strategy of every node in the form `parallelize` takes: the user's own where fixed, a tuple of cuts
        per input elsewhere, and "data_parallel" for in-place writes (Assign), whose layout is their parameter's."""
        out: dict[Node, Any] = {}
        for node in self.graph.nodes:
            if node in self.fixed:
                out[node] = self.fixed[node]
            elif node in self.node_var:
                var = self.node_var[node]
                out[node] = self.variables[var].options[assignment[var]].placement.strategy
            else:
                out[node] = DATA_PARALLEL
        return out

    def neighbours(self, var: int) -> list[tuple[int, int]]:
        """(edge index, the variable at its other end) for every edge of `var`."""
        out = []
        for k in self.variables[var].edges:
            edge = self.edges[k]
            out.append((k, edge.target if edge.source == var else edge.source))
        return out

    def name(self, node: Node) -> str:
        return describe(node, self.index[node])


class _Builder:
    """Fills a Problem: node options (shared by nodes of the same signature), parameters, edges, constants."""

    def __init__(self, problem: Problem):
        self.p = problem
        self.base: dict[tuple, list[tuple[tuple, Placement, float, float]]] = {}
        self.options: dict[tuple, list[Option]] = {}

    def build(self) -> None:
        p = self.p
        uses = self._parameter_uses()
        shared = {v for v, users in uses.items() if len(users) > 1}
        single = set(uses) - shared
        for node, spec in p.specs.items():
            p.node_var[node] = len(p.variables)
            p.variables.append(self._node_variable(node, spec, single))
        for v in p.parameters:
            if v in shared:
                p.param_var[v] = len(p.variables)
                p.variables.append(self._parameter_variable(v, uses[v]))
            elif not uses.get(v):  # unused (or only by ops that take it as it comes): replicated
                time, memory = objective.parameter_cost(p.model, v, Layout.replicated(v.ndim, p.device_num))
                p.constant_time += time
                p.constant_memory += memory
        for v, layout in p.dataset.items():
            p.constant_memory += objective.local_bytes(v, layout)
        p.constant_time += objective.step_launch_time(p.model)
        self._edges()

    def _parameter_uses(self) -> dict[Value, list[tuple[Node, int]]]:
        params = set(self.p.parameters)
        uses: dict[Value, list[tuple[Node, int]]] = {}
        for node, spec in self.p.specs.items():
            for i, v in enumerate(node.inputs):
                if v in params and spec.inputs[i] is not None:
                    uses.setdefault(v, []).append((node, i))
        return uses

    def _base(self, node: Node, spec: ShardingSpec) -> list[tuple[tuple, Placement, float, float]]:
        """(cuts, placement, compute seconds, output bytes) of every candidate, shared by same-signature nodes."""
        key = (node.op, node.attrs, tuple(v.type for v in node.inputs), tuple(v.type for v in node.outputs))
        if key not in self.base:
            p = self.p
            rows = []
            for cuts in candidates(node, spec, p.device_num):
                placement = place(node, spec, cuts, p.device_num, "auto_parallel")
                seconds = objective.node_time(p.model, node, spec, placement)
                rows.append((tuple(sorted(cuts.items())), placement, seconds, objective.node_memory(node, placement)))
            self.base[key] = rows
        return self.base[key]

    def _node_variable(self, node: Node, spec: ShardingSpec, single: set[Value]) -> Variable:
        p = self.p
        if node in p.fixed:
            params = set(p.parameters)
            held = {i for i, v in enumerate(node.inputs) if v in params}
            placement = resolve(node, spec, p.fixed[node], p.device_num, held)
            seconds = objective.node_time(p.model, node, spec, placement)
            rows = [((), placement, seconds, objective.node_memory(node, placement))]
        else:
            rows = self._base(node, spec)
        outputs = [(j, v) for j, v in enumerate(node.outputs) for w in p.graph.outputs if w is v]
        if node in p.fixed:  # its own rows: an id() of a list that dies here could name another node's later
            options = [self._option(node, row, single, outputs) for row in rows]
        else:
            # Nodes of one signature whose inputs come from the same kinds of places share their options (the rows
            # of a signature live in self.base as long as the problem, so their id() names them).
            sources = tuple(_source(p, v, single) for v in node.inputs)
            context = (id(rows), sources, tuple((j, v in p.differentiable) for j, v in outputs))
            options = self.options.get(context)
            if options is None:
                options = self.options[context] = [self._option(node, row, single, outputs) for row in rows]
        return Variable(len(p.variables), p.name(node), options, node=node, fixed=node in p.fixed)

    def _option(self, node: Node, row: tuple, single: set[Value], outputs: list[tuple[int, Value]]) -> Option:
        """A candidate's own cost: its compute, moves from the dataset, parameters only it uses, partial outputs."""
        p = self.p
        cuts, placement, seconds, memory = row
        communication = 0.0
        if placement.out_targets is not None:
            for v, have, want in zip(node.outputs, placement.outputs, placement.out_targets):
                communication += p.move(have, want, v)
        for i, v in enumerate(node.inputs):
            want = placement.inputs[i]
            if want is None:
                continue
            if v in p.dataset:
                move = p.move(p.dataset[v], want, v, backward=False)  # data has no gradient
                seconds += move
                if not is_local_slice(p.dataset[v], want):  # a whole (full_batch) input is sliced in place
                    communication += move
            elif v in single:
                extra_time, extra_memory = p.parameter_cost(v, want)
                seconds += extra_time
                memory += extra_memory
                communication += p.gradient_time(v, want)
        for j, v in outputs:
            move = objective.output_time(p.model, v, objective.produced(placement)[j])
            seconds += move
            communication += move
        return Option(seconds, memory, placement, cuts, communication=communication)

    def _parameter_variable(self, value: Value, users: list[tuple[Node, int]]) -> Variable:
        """The layouts a shared parameter may take: the one its fixed users agree on, else any a user may ask."""
        p = self.p
        fixed_users = [(node, i) for node, i in users if node in p.fixed]
        layouts: dict[tuple, Layout] = {}
        first: tuple[Node, Layout] | None = None
        for node, i in fixed_users:
            want = p.variables[p.node_var[node]].options[0].placement.inputs[i]
            if first is not None and layout_key(first[1]) != layout_key(want):
                raise StrategyError(_conflict(p, value, first, (node, want)))
            first = first or (node, want)
            layouts[layout_key(want)] = want
        if not fixed_users:
            for node, i in users:
                for option in p.variables[p.node_var[node]].options:
                    want = option.placement.inputs[i]
                    layouts.setdefault(layout_key(want), want)
        else:
            self._restrict_users(value, users, first)
        options = []
        for layout in layouts.values():
            time, memory = p.parameter_cost(value, layout)
            options.append(Option(time, memory, layout=layout, communication=p.gradient_time(value, layout)))
        return Variable(len(p.variables), f"parameter {value.name!r}", options, parameter=value, fixed=bool(first))

    def _restrict_users(self, value: Value, users, first: tuple[Node, Layout]) -> None:
        """Users of a parameter a fixed op cuts keep only the options that cut it alike."""
        p = self.p
        key = layout_key(first[1])
        for node, i in users:
            var = p.variables[p.node_var[node]]
            if var.fixed:
                continue
            var.options = [o for o in var.options if layout_key(o.placement.inputs[i]) == key]
            if not var.options:
                raise StrategyError(
                    f"{p.name(node)} uses parameter {value.name!r}, which {p.name(first[0])} (configured) cuts as "
                    f"{first[1].describe()}; no strategy of {node.op} cuts its input {i} that way. The rule: a "
                    "parameter has one layout. Fix: configure a strategy for both ops that cuts the parameter alike"
                )

    def _edges(self) -> None:
        p = self.p
        producers = p.graph.producers
        for node, var in p.node_var.items():
            spec = p.specs[node]
            for i, v in enumerate(node.inputs):
                if spec.inputs[i] is None:
                    continue
                if v in p.param_var:
                    self._add(Edge(p.param_var[v], var, v, -1, i))
                elif v in producers and producers[v] in p.node_var:
                    source = producers[v]
                    self._add(Edge(p.node_var[source], var, v, source.outputs.index(v), i))

    def _add(self, edge: Edge) -> None:
        p = self.p
        k = len(p.edges)
        p.edges.append(edge)
        p._edge_backward.append(edge.value in p.differentiable)
        node = p.variables[edge.target].node
        last = edge.output >= 0 and node in p._last and edge.value.dtype.is_float and p._edge_backward[-1]
        counts = tuple(sum(w is v for w in p.graph.outputs) for v in node.outputs) if last else None
        p._edge_last.append(counts)
        p.variables[edge.source].edges.append(k)
        if edge.target != edge.source:
            p.variables[edge.target].edges.append(k)


def _source(problem: Problem, value: Value, single: set[Value]) -> tuple:
    """Where an input comes from, as far as a candidate's own cost depends on it."""
    if value in problem.dataset:
        return "data", id(problem.dataset[value]), value.shape
    if value in single:
        return "parameter", value.shape, value.dtype
    return ("edge",)


def _conflict(problem: Problem, value: Value, first: tuple[Node, Layout], second: tuple[Node, Layout]) -> str:
    (a, had), (b, want) = first, second
    return (
        f"configured strategies disagree: parameter {value.name!r} is cut as {had.describe()} by "
        f"{problem.name(a)} (strategy {problem.fixed[a]}) and as {want.describe()} by {problem.name(b)} (strategy "
        f"{problem.fixed[b]}); the rule: a parameter has one layout, so every op using it must cut it alike. Fix: "
        "give both ops the same cuts for this input, or leave one unconfigured for the search to choose"
    )
