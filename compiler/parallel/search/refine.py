"""A last pass of local moves against the cost model, for a plan a heuristic proposed: each variable in turn takes
its cheapest option given its neighbours' current ones (iterated conditional modes), and the neighbours of one
that changed are visited again, until no move improves the plan or each variable was visited `MAX_VISITS` times.

recursive_programming decides each op from symbolic, per-round costs that see one op and one two-way cut at a time;
this pass prices the whole strategies with the measured model the plan is judged by (Problem.edge_time and the
options' own costs), so a cut that looked cheap to the symbolic costs but leaves a collective to a neighbour is
undone. A move never breaks the plan (an edge to a shared parameter allows only its layout), never leaves the
memory budget and never touches a fixed (user) variable. Each visit costs the variable's options times its edges.

    >>> assignment = refine(problem, recursive_programming(problem, decided), budget=8 << 30)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from tessel.compiler.parallel.search.problem import INFEASIBLE, Problem

MAX_VISITS = 3
IMPROVEMENT = 1e-12  # seconds: a move must gain more than rounding


def refine(problem: Problem, assignment: Sequence[int], budget: float = INFEASIBLE) -> list[int]:
    """`assignment` improved by local moves (see the module docstring), within `budget` bytes per device."""
    out = list(assignment)
    memory = problem.evaluate(out)[1]
    movable = [v for v, variable in enumerate(problem.variables) if not variable.fixed and len(variable.options) > 1]
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
    return out


def _cost(problem: Problem, assignment: list[int], var: int, a: int, near: list, bound: float) -> float:
    """Option a's own cost plus its edges to the neighbours' current options (stops once past `bound`)."""
    cost = problem.variables[var].options[a].time
    for k, other, outgoing in near:
        cost += problem.edge_time(k, a, assignment[other]) if outgoing else problem.edge_time(k, assignment[other], a)
        if cost >= bound:
            return INFEASIBLE
    return cost
