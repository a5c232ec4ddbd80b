"""A last pass of local moves against the cost model, for a plan a heuristic proposed: each variable in turn takes
its cheapest option given its neighbours' current ones (iterated conditional modes), and the neighbours of one
that changed are visited again, until no move improves the plan or each variable was visited `MAX_VISITS` times.

recursive_programming decides each op from symbolic, per-round costs that see one op and one two-way cut at a time;
this pass prices the whole strategies with the measured model the plan is judged by (Problem.edge_time and the
options' own costs), so a cut that looked cheap to the symbolic costs but leaves a collective to a neighbour is
undone. A single variable cannot leave a plan where an op and the element-wise ops after it (BiasAdd, ReLU: they
pass their input's layout through) agree on a cut that costs more than another they would agree on just as well:
moving the op alone costs a redistribution to its followers. So once single moves are exhausted, each op is also
tried with its chain of followers moved along (each taking the option that reads the layout the one before gives,
as propagation would), and single moves run again after any such move is taken (at most `MAX_CHAIN_PASSES`
times). A move never breaks the plan (an edge to a shared parameter allows only its layout), never leaves the
memory budget and never touches a fixed (user) variable. Each visit costs the variable's options times its edges;
a chain move the op's options times the chain's edges.

    >>> assignment = refine(problem, recursive_programming(problem, decided), budget=8 << 30)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from tessel.compiler.parallel.search.objective import produced
from tessel.compiler.parallel.search.problem import INFEASIBLE, Problem, layout_key

MAX_VISITS = 3
MAX_CHAIN_PASSES = 3
IMPROVEMENT = 1e-12  # seconds: a move must gain more than rounding


def refine(problem: Problem, assignment: Sequence[int], budget: float = INFEASIBLE) -> list[int]:
    """`assignment` improved by local moves (see the module docstring), within `budget` bytes per device."""
    out = list(assignment)
    movable = [v for v, variable in enumerate(problem.variables) if not variable.fixed and len(variable.options) > 1]
    chains = _Chains(problem, set(movable))
    for _ in range(MAX_CHAIN_PASSES):
        _single_moves(problem, out, movable, budget)
        if not chains.moves(out, movable, budget):
            break
    return out


def _single_moves(problem: Problem, out: list[int], movable: list[int], budget: float) -> None:
    memory = problem.evaluate(out)[1]
    queue, queued = deque(movable), set(movable)
    visits = dict.fromkeys(movable, 0)
    while queue:
        var = queue.popleft()
        queued.discard(var)
        visits[var] += 1
        options = problem.variables[var].options
        near = [(k, other, problem.edges[k].source == var) for k, other in problem.neighbours(var)]
        current = _cost(problem, out, var, out[var], near, INFEASIBLE)
        best, best_cost = out[var], current
        for a in range(len(options)):
            if a == out[var] or memory - options[out[var]].memory + options[a].memory > budget:
                continue
            cost = _cost(problem, out, var, a, near, best_cost)
            if cost < best_cost:
                best, best_cost = a, cost
        if best == out[var] or best_cost >= current - IMPROVEMENT:
            continue
        memory += options[best].memory - options[out[var]].memory
        out[var] = best
        for _, other, _ in near:
            if other in visits and other not in queued and visits[other] < MAX_VISITS:
                queue.append(other)
                queued.add(other)


def _cost(problem: Problem, assignment: list[int], var: int, a: int, near: list, bound: float) -> float:
    """Option a's own cost plus its edges to the neighbours' current options (stops once past `bound`)."""
    cost = problem.variables[var].options[a].time
    if cost >= bound:
        return INFEASIBLE
    for k, other, outgoing in near:
        cost += problem.edge_time(k, a, assignment[other]) if outgoing else problem.edge_time(k, assignment[other], a)
        if cost >= bound:
            return INFEASIBLE
    return cost


class _Chains:
    """Each movable op's chain of followers: the ops that take its output as the one input they pass through
    (labels equal to their output's), then theirs, as long as every link is a movable op of that kind."""

    def __init__(self, problem: Problem, movable: set[int]):
        self.p = problem
        self.follow: dict[int, tuple[int, int, dict]] = {}  # follower var -> (edge, producer var, {layout: option})
        self.chain: dict[int, list[int]] = {}
        self.gives: dict[tuple[int, int, int], tuple] = {}  # (var, option, output) -> the layout key it gives
        for var in movable:
            node = problem.variables[var].node
            if node is None:
                continue
            spec = problem.specs[node]
            carried = [i for i, labels in enumerate(spec.inputs) if labels == spec.outputs[0]]
            if len(spec.outputs) != 1 or len(carried) != 1:
                continue
            edge = next(
                (k for k in problem.variables[var].edges if problem.edges[k].target == var and problem.edges[k].input
                 == carried[0] and problem.edges[k].output >= 0),
                None,
            )  # fmt: skip
            if edge is None:
                continue
            options = problem.variables[var].options
            reads: dict[tuple, int] = {}
            for a, option in enumerate(options):
                key = layout_key(option.placement.inputs[carried[0]])
                if key not in reads or option.time < options[reads[key]].time:
                    reads[key] = a
            self.follow[var] = (edge, problem.edges[edge].source, reads)
        followers: dict[int, list[int]] = {}
        for follower, (_, producer, _) in self.follow.items():
            followers.setdefault(producer, []).append(follower)
        for var in movable:
            chain, current = [], var
            while len(followers.get(current, ())) == 1:
                current = followers[current][0]
                if current == var or current in chain:
                    break
                chain.append(current)
            if chain:
                self.chain[var] = chain

    def moves(self, out: list[int], movable: list[int], budget: float) -> bool:
        """One pass of chain moves over the ops that have a chain; whether any was taken."""
        p, moved = self.p, False
        memory = p.evaluate(out)[1]
        for var in movable:
            chain = self.chain.get(var)
            if chain is None:
                continue
            group = [var, *chain]
            current = self._cost(out, group, {}, INFEASIBLE)
            best, best_cost = None, current - IMPROVEMENT
            options = p.variables[var].options
            for a in range(len(options)):
                if a == out[var] or options[a].time >= best_cost:  # its own time alone already costs more
                    continue
                tried = self._carried(out, var, a, chain)
                if tried is None:
                    continue
                extra = sum(p.variables[v].options[b].memory - p.variables[v].options[out[v]].memory
                            for v, b in tried.items())  # fmt: skip
                if memory + extra > budget:
                    continue
                cost = self._cost(out, group, tried, best_cost)
                if cost < best_cost:
                    best, best_cost = (tried, extra), cost
            if best is not None:
                for v, b in best[0].items():
                    out[v] = b
                memory += best[1]
                moved = True
        return moved

    def _carried(self, out: list[int], var: int, a: int, chain: list[int]) -> dict[int, int] | None:
        """{var: a, each follower: the option that reads what the one before now gives}; None where one cannot."""
        p, tried = self.p, {var: a}
        for follower in chain:
            edge, producer, reads = self.follow[follower]
            option = p.variables[producer].options[tried[producer]]
            key = (producer, tried[producer], p.edges[edge].output)
            given = self.gives.get(key)
            if given is None:
                given = self.gives[key] = layout_key(produced(option.placement)[key[2]])
            b = reads.get(given)
            if b is None:
                return None
            tried[follower] = b
        return tried

    def _cost(self, out: list[int], group: list[int], tried: dict[int, int], bound: float) -> float:
        """The group's own costs and every edge touching it, with `tried` in place of the current options (stops
        once past `bound`)."""
        p, seen = self.p, set()
        cost = sum(p.variables[v].options[tried.get(v, out[v])].time for v in group)
        if cost >= bound:  # edges cost >= 0
            return INFEASIBLE
        for v in group:
            for k in p.variables[v].edges:
                if k in seen:
                    continue
                seen.add(k)
                edge = p.edges[k]
                cost += p.edge_time(
                    k, tried.get(edge.source, out[edge.source]), tried.get(edge.target, out[edge.target])
                )
                if cost >= bound:
                    return INFEASIBLE
        return cost
