"""sharding_propagation: strategies flow from the ops whose strategy is known to their neighbours, breadth first in
both directions (MindSpore's CostGraph::StrategyPropagate / BFS in graph_costmodel.cc).

A node reached from decided neighbours takes, among its candidates, the one that communicates least: the
redistribution towards all of them (the data inputs' dataset layouts count as decided) plus the gradient reduction
of the parameters its choice lays out; ties broken by its own cost (compute, update). MindSpore weighs the edges'
redistribution alone (Edge::GetNextOpStrategyByPrevOpStrategyWithMiniComm): propagating from a data-parallel
dataset, a weight then stays replicated wherever taking the batch as it comes moves nothing, and its gradient is
all-reduced every step however large it is (a 2048 x 2048 weight at batch 16: 16 MiB all-reduced where cutting it
by columns gathers 128 KiB of activations). Counting that all-reduce as the communication it is lets propagation
from the dataset alone reach model parallelism where the weights outweigh the activations.

A parameter several ops use takes the layout of the first user decided; the others then choose among the candidates
that cut it alike, and a candidate is only taken if every undecided user can still cut it that way.

Where the propagation starts, as MindSpore does: from the configured ops (shard(), set_data_parallel()) and from
the dataset. MindSpore inserts a VirtualDataset op whose strategy is the dataset strategy (data parallel unless
full_batch or dataset_strategy) and, under sharding_propagation, adds it to the configured ops
(step_auto_parallel.cc, CreateTheOperatorInfo); with nothing configured at all it raises "There is no operator
that is configured sharding strategy" (graph_costmodel.cc, StrategyPropagate), and ops the BFS never reaches get a
default strategy. Here the data inputs play the VirtualDataset; a part of the graph that neither reaches starts
from its heaviest op's cheapest strategy, and the log says so.

A whole batch (full_batch) constrains nothing: every rank holds all of it, so any layout an op reads it in is a
local slice (priced as compute, not communication), and MindSpore's VirtualDataset strategy (all ones under
full_batch) says nothing about how to cut it. Ranked communication first, an op reading it would take a strategy that
communicates nothing (possibly one that cuts nothing, every rank computing the whole network) however much compute
another cut saves. So when no op is configured: the ops that read a whole data input choose by their whole cost
(compute, the slice and communication alike); and the largest whole input is tried as a dataset strategy in each
layout its readers can take it in (each a local slice of it, free): its readers take their cheapest option reading it
that way, the rest propagates from them communication first, as above, and the plan the cost model prices lowest is
kept (the plain propagation among them: never worse than it). With configured ops MindSpore's rule stands
unchanged: strategies flow from them.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from tessel.compiler.parallel.search import objective
from tessel.compiler.parallel.search.problem import INFEASIBLE, Problem, layout_key
from tessel.compiler.parallel.strategy import StrategyError

log = logging.getLogger("tessel.parallel")


def propagate(problem: Problem, decided: Mapping[int, int], mode: str = "sharding_propagation") -> list[int]:
    """An option for every variable: `decided` (variable -> option) kept, the rest propagated from them and from
    the dataset. `mode` names the caller in the log."""
    plain = _propagate(problem, decided, mode)
    seeds = _whole_input_seeds(problem) if not decided and problem.device_num > 1 else []
    if not seeds:
        return plain
    best, best_time, kept = plain, problem.evaluate(plain)[0], "as propagated"
    for layout, seed in seeds:
        found = _propagate(problem, seed, mode, quiet=True)
        seconds = problem.evaluate(found)[0]
        if seconds < best_time:
            best, best_time, kept = found, seconds, layout.describe()
    log.info(
        "%s: the whole batch is free to cut (full_batch, nothing configured): %d layouts of it tried as the dataset "
        "strategy, kept %s (predicted step %.3g ms)",
        mode,
        len(seeds) + 1,
        kept,
        best_time * 1e3,
    )
    return best


SEED_LAYOUTS = 8  # at most this many layouts of a whole batch tried (the cheapest for its readers)


def _whole_input_seeds(problem: Problem) -> list[tuple[Any, dict[int, int]]]:
    """For the largest data input every rank holds whole, per layout its readers can read it in (the cheapest
    SEED_LAYOUTS of them): that layout and {reader: its cheapest option reading the input so}."""
    whole = [v for v, layout in problem.dataset.items() if not layout.partial and layout.replicas == layout.device_num]
    if not whole:
        return []
    value = max(whole, key=lambda v: (math.prod(v.shape), -problem.graph.inputs.index(v)))
    readers = [(var, [i for i, v in enumerate(node.inputs) if v is value]) for node, var in problem.node_var.items()]
    readers = [(var, inputs) for var, inputs in readers if inputs and not problem.variables[var].fixed]
    by_layout: dict[tuple, tuple[Any, dict[int, int], float]] = {}
    for var, inputs in readers:
        options = problem.variables[var].options
        for a, option in enumerate(options):
            wants = {layout_key(option.placement.inputs[i]) for i in inputs}
            if len(wants) != 1:
                continue
            (key,) = wants
            layout = option.placement.inputs[inputs[0]]
            _, seed, _ = by_layout.setdefault(key, (layout, {}, 0.0))
            if var not in seed or option.time < options[seed[var]].time:
                seed[var] = a
    complete = []
    for layout, seed, _ in by_layout.values():
        if len(seed) == len(readers):
            cost = sum(problem.variables[var].options[a].time for var, a in seed.items())
            complete.append((cost, len(complete), layout, seed))
    complete.sort(key=lambda item: item[:2])
    return [(layout, seed) for _, _, layout, seed in complete[:SEED_LAYOUTS]]


def _propagate(problem: Problem, decided: Mapping[int, int], mode: str, quiet: bool = False) -> list[int]:
    search = _Propagation(problem, dict(decided), seeded=bool(decided) and quiet)
    queue: deque[int] = deque()
    for var in decided:
        queue.extend(other for _, other in problem.neighbours(var))
    if not decided and not quiet:
        log.info(
            "%s: no operator has a configured strategy; propagating from the dataset's layout (as MindSpore "
            "propagates from its VirtualDataset op, configured with the dataset strategy)",
            mode,
        )
    # Readers of a whole batch are constrained by nothing: from a seeded layout they are reached by the search (a
    # reader of the labels then follows the op before it, not a tie among its free cuts).
    queue.extend(var for var in search.data_consumers() if not (decided and var in search.free_readers))
    search.run(queue)
    while search.undecided():
        start = max(search.undecided(), key=search.weight)
        (log.debug if quiet else log.info)(
            "%s: %s is reached neither from a configured op nor from the dataset; starting from it with its "
            "cheapest strategy",
            mode,
            problem.variables[start].name,
        )
        search.run(deque([start]))
    return search.assignment


class _Propagation:
    def __init__(self, problem: Problem, decided: dict[int, int], seeded: bool = False):
        self.p = problem
        self.assignment = [-1] * len(problem.variables)
        for var, option in decided.items():
            self.assignment[var] = option
        # Nothing configured: the readers of a whole data input choose by their whole cost (module docstring).
        whole = {
            v for v, layout in problem.dataset.items() if not layout.partial and layout.replicas == layout.device_num
        }
        self.free_readers: set[int] = set()
        if (seeded or not decided) and problem.device_num > 1:
            self.free_readers = {var for node, var in problem.node_var.items() if any(v in whole for v in node.inputs)}
        # Per node: its outputs that are not graph outputs (whose partial sums a consumer must reduce), with the
        # consumers; the edges from the shared parameters it uses.
        outputs = {id(v) for v in problem.graph.outputs}
        self.consumers: dict[int, list[tuple[int, list[int]]]] = {}
        self.shared: dict[int, list[int]] = {}
        self._partial: dict[int, dict[int, float]] = {}  # id(option) -> {output: least reduction of its partial sums}
        for k, edge in enumerate(problem.edges):
            if edge.output < 0:
                self.shared.setdefault(edge.target, []).append(k)
            elif id(edge.value) not in outputs:
                found = dict(self.consumers.setdefault(edge.source, []))
                if edge.output in found:
                    found[edge.output].append(edge.target)
                else:
                    self.consumers[edge.source].append((edge.output, [edge.target]))
        # For each shared parameter, per user edge: the layouts that user's options may give it.
        self.param_keys: dict[int, dict[int, set[tuple]]] = {}
        for var in problem.param_var.values():
            self.param_keys[var] = {
                k: {layout_key(o.placement.inputs[problem.edges[k].input]) for o in self._users_options(k)}
                for k in problem.variables[var].edges
            }

    def _users_options(self, k: int):
        return self.p.variables[self.p.edges[k].target].options

    def undecided(self) -> list[int]:
        return [v for v, a in enumerate(self.assignment) if a < 0]

    def weight(self, var: int) -> float:
        return max(o.time for o in self.p.variables[var].options)

    def data_consumers(self) -> list[int]:
        return [self.p.node_var[n] for n in self.p.node_var if any(v in self.p.dataset for v in n.inputs)]

    def run(self, queue: deque) -> None:
        while queue:
            var = queue.popleft()
            if self.assignment[var] >= 0:
                continue
            self.assignment[var] = self.choose(var)
            for done in (var, *self._settle_parameters(var)):
                queue.extend(other for _, other in self.p.neighbours(done) if self.assignment[other] < 0)

    def _settle_parameters(self, var: int) -> list[int]:
        """Give the shared parameters `var` uses the layout it chose for them, so that their other users follow."""
        settled = []
        for k in self.p.variables[var].edges:
            edge = self.p.edges[k]
            if edge.target == var and edge.output < 0 and self.assignment[edge.source] < 0:
                options = range(len(self.p.variables[edge.source].options))
                match = next(a for a in options if self.p.edge_time(k, a, self.assignment[var]) == 0.0)
                self.assignment[edge.source] = match
                settled.append(edge.source)
        return settled

    def choose(self, var: int) -> int:
        """The option that communicates least, given the decided neighbours (and the dataset), then the least own
        cost, among those every shared parameter allows. What an option communicates: the redistributions towards
        its decided neighbours and from the dataset, and what it causes itself, above all the gradient reduction of
        the parameters whose layout it decides (replicating a weight over the batch costs an all-reduce of it every
        step: a redistribution in all but name)."""
        variable = self.p.variables[var]
        best, best_key = -1, (INFEASIBLE, INFEASIBLE)
        near = [(k, other) for k, other in self.p.neighbours(var) if self.assignment[other] >= 0]
        open_outputs = [
            j for j, consumers in self.consumers.get(var, ()) if all(self.assignment[c] < 0 for c in consumers)
        ]
        for a, option in enumerate(variable.options):
            moves = 0.0
            for k, other in near:
                edge = self.p.edges[k]
                if edge.source == var:
                    moves += self.p.edge_time(k, a, self.assignment[other])
                else:
                    moves += self.p.edge_time(k, self.assignment[other], a)
            if moves >= INFEASIBLE or not self._allowed(var, a):
                continue
            pending = self._parameter_gradients(var, a) if var in self.shared else 0.0
            if open_outputs:
                pending += self._pending_reductions(var, a, open_outputs)
            key = (moves + option.communication + pending, option.time)
            if var in self.free_readers:
                key = (moves + option.time + pending, option.time)
            if key < best_key:
                best, best_key = a, key
        if best < 0:
            raise StrategyError(self._stuck(var, near))
        return best

    def _pending_reductions(self, var: int, a: int, open_outputs: list[int]) -> float:
        """The least reduction of each partial output of option a that no decided consumer prices yet
        (`open_outputs`), forward only: no op takes partial sums, so leaving them costs at least an AllReduce or a
        ReduceScatter later (without this, a cut of the contracted dim looks free wherever its input arrives cut
        that way, and the collective it implies lands on the next op). Once a consumer is decided, its edge prices
        the whole move, both ways where the pass lowers it so."""
        option = self.p.variables[var].options[a]
        partial = self._partial.get(id(option))
        if partial is None:  # options are shared by nodes of one signature: price each once
            node = self.p.variables[var].node
            produced = objective.produced(option.placement)
            partial = self._partial[id(option)] = {
                j: self.p.reduction(layout, node.outputs[j]) for j, layout in enumerate(produced) if layout.is_partial
            }
        return sum(partial.get(j, 0.0) for j in open_outputs) if partial else 0.0

    def _parameter_gradients(self, var: int, a: int) -> float:
        """The gradient reduction of the undecided shared parameters that option a of `var` would lay out."""
        total = 0.0
        for k in self.shared.get(var, ()):
            edge = self.p.edges[k]
            if self.assignment[edge.source] >= 0:
                continue
            options = self.p.variables[edge.source].options
            match = next((b for b in range(len(options)) if self.p.edge_time(k, b, a) == 0.0), None)
            if match is not None:
                total += options[match].communication
        return total

    def _allowed(self, var: int, a: int) -> bool:
        """False when option a cuts a shared, undecided parameter in a way one of its other users cannot."""
        variable = self.p.variables[var]
        if variable.node is None:
            return True
        for k in variable.edges:
            edge = self.p.edges[k]
            if edge.target != var or edge.output >= 0 or self.assignment[edge.source] >= 0:
                continue
            key = layout_key(variable.options[a].placement.inputs[edge.input])
            for other, keys in self.param_keys[edge.source].items():
                user = self.p.edges[other].target
                if other != k and self.assignment[user] < 0 and key not in keys:
                    return False
        return True

    def _stuck(self, var: int, near: list[tuple[int, int]]) -> str:
        variable = self.p.variables[var]
        decided = ", ".join(self.p.variables[other].name for _, other in near) or "none"
        return (
            f"sharding_propagation: no strategy of {variable.name} agrees with its decided neighbours ({decided}): "
            "a parameter they share is cut in a way this op cannot cut it. The rule: a parameter has one layout. "
            "Fix: configure strategies (shard()) that cut the shared parameter alike for all its users"
        )
