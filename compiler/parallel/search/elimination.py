"""dynamic_programming: MindSpore's graph elimination and back-substitution (dp_algo_costmodel.cc,
graph_costmodel.cc), exact for the cost model on any graph.

The problem (problem.py) is a cost graph: a cost per option of each variable and a cost per pair of options of
each edge. Eliminating a variable folds its costs into its neighbours, keeping for every choice of theirs the best
choice of its own (remembered for back-substitution):
- edge elimination: two edges between the same variables become one (costs added);
- merge / contract elimination: a variable with one neighbour folds into that neighbour's own costs;
- op elimination: a variable between two others becomes an edge between them (u -> v -> w gives u -> w);
- triangle elimination: the same where its two neighbours are already joined (the new edge then merges with the
  old one);
- star elimination: a variable with three or more neighbours becomes a cost over all of them (MindSpore merges a
  star's centre into one neighbour; a cost over the whole star keeps the search exact).
The variable with the fewest neighbours goes first, so chains and trees never build costs over more than two
variables. When one variable is left per component, its best option is picked and back-substitution walks the
recorded choices back to every variable.

A memory budget makes the costs Pareto fronts of (seconds, bytes): a choice survives unless another is both faster
and smaller, and any choice over the budget is dropped (memory only grows as costs add up), so the result is the
fastest plan that fits. Without a budget (or when the fastest plan fits anyway) a front is a single point. On long
graphs fronts could grow without end: past 64 points one is thinned to the fastest and the smallest point of each
1/64 of the budget, which keeps the result exact on small graphs (every test against brute force) and within about
1/64 of the budget of the exact front on large ones, and never loses a plan that fits.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tessel.compiler.parallel.search.problem import INFEASIBLE, Problem

MAX_FRONT = 64  # longer Pareto fronts are thinned (see _Solver._thin)
Trace = tuple | None  # (variable, option, child traces...): the choices behind a point
Point = tuple[float, float, Trace]  # (seconds, bytes, trace)
Front = tuple[Point, ...]


@dataclass
class _Factor:
    scope: tuple[int, ...]  # variables, ascending
    table: dict[tuple[int, ...], Front]  # one entry per feasible choice of the scope's options


@dataclass
class Elimination:
    """The outcome: an option per variable, its cost, and how many eliminations of each kind ran."""

    assignment: list[int]
    time: float
    memory: float
    counts: Counter = field(default_factory=Counter)


class _Solver:
    def __init__(self, sizes: list[int], budget: float | None):
        self.sizes = sizes
        self.budget = budget  # bytes left for the variables (None: unconstrained)
        self.factors: dict[int, _Factor] = {}
        self.of_var: dict[int, set[int]] = {v: set() for v in range(len(sizes))}
        self.counts: Counter = Counter()
        self._ids = itertools.count()

    # --- fronts -----------------------------------------------------------------------------------------------------
    def prune(self, points: list[Point]) -> Front:
        if self.budget is None:
            return (min(points, key=lambda p: p[0]),)
        kept: list[Point] = []
        for point in sorted(points, key=lambda p: (p[0], p[1])):
            if point[1] <= self.budget and (not kept or point[1] < kept[-1][1]):
                kept.append(point)
        if len(kept) > MAX_FRONT:
            kept = self._thin(kept)
        return tuple(kept)

    def _thin(self, front: list[Point]) -> list[Point]:
        """The fastest and the smallest point of each 1/MAX_FRONT of the budget: fronts stay short on long graphs,
        and the smallest point, hence any plan that fits, survives."""
        width = max(self.budget, 1.0) / MAX_FRONT
        bins: dict[int, list[Point]] = {}
        for point in front:  # fastest first, so the first of a bin is its fastest and the last its smallest
            bins.setdefault(int(point[1] // width), []).append(point)
        kept = {id(p): p for group in bins.values() for p in (group[0], group[-1])}
        return sorted(kept.values(), key=lambda p: p[0])

    def cross(self, a: Front, b: Front) -> Front:
        """The front of the sums of a point of `a` and a point of `b` (independent parts of one plan)."""
        if self.budget is None:
            (ta, ma, ra), (tb, mb, rb) = a[0], b[0]
            return ((ta + tb, ma + mb, _pair(ra, rb)),)
        budget = self.budget
        sums = [(ta + tb, ma + mb, ra, rb) for ta, ma, ra in a for tb, mb, rb in b if ma + mb <= budget]
        kept: list[Point] = []
        for t, m, ra, rb in sorted(sums, key=lambda p: (p[0], p[1])):
            if not kept or m < kept[-1][1]:
                kept.append((t, m, _pair(ra, rb)))
        return tuple(self._thin(kept)) if len(kept) > MAX_FRONT else tuple(kept)

    def add(self, scope: tuple[int, ...], table: dict[tuple[int, ...], Front]) -> None:
        """Add a factor, merging it with one over the same variables (edge elimination)."""
        for fid in self.of_var[scope[0]] if scope else ():
            old = self.factors[fid]
            if old.scope == scope:
                self.counts["edge"] += 1
                merged = {}
                for key, front in old.table.items():
                    other = table.get(key)
                    if other is not None:
                        kept = self.cross(front, other)
                        if kept:
                            merged[key] = kept
                old.table = merged
                return
        fid = next(self._ids)
        self.factors[fid] = _Factor(scope, table)
        for v in scope:
            self.of_var[v].add(fid)

    # --- elimination ------------------------------------------------------------------------------------------------
    def neighbours(self, var: int) -> tuple[int, ...]:
        return tuple(sorted({u for fid in self.of_var[var] for u in self.factors[fid].scope} - {var}))

    def pick(self, alive: set[int]) -> int:
        def weight(v: int) -> tuple:
            near = self.neighbours(v)
            return len(near), math.prod(self.sizes[u] for u in near), v

        return min(alive, key=weight)

    def eliminate(self, x: int) -> None:
        factors = []
        for fid in sorted(self.of_var[x]):
            factors.append(self.factors.pop(fid))
            for v in factors[-1].scope:
                self.of_var[v].discard(fid)
        near = tuple(sorted({u for f in factors for u in f.scope} - {x}))
        self.counts[_kind(near, self)] += 1
        # For each factor, where each of its scope's options comes from: the neighbours' choice or x's option.
        picks = [tuple(near.index(v) if v != x else -1 for v in f.scope) for f in factors]
        table: dict[tuple[int, ...], Front] = {}
        for choice in itertools.product(*(range(self.sizes[u]) for u in near)):
            points = self._choices(x, choice, factors, picks)
            if points:
                table[choice] = self.prune(points)
        self.add(near, table)

    def _choices(self, x: int, choice: tuple[int, ...], factors: list[_Factor], picks: list[tuple]) -> list[Point]:
        points: list[Point] = []
        scalar = self.budget is None
        best, best_parts, best_option = math.inf, None, -1
        for option in range(self.sizes[x]):
            parts = []
            for factor, pick in zip(factors, picks):
                front = factor.table.get(tuple(option if i < 0 else choice[i] for i in pick))
                if front is None:
                    break
                parts.append(front)
            else:
                if scalar:  # single points: add the seconds, build the trace only for the winner
                    seconds = sum(front[0][0] for front in parts)
                    if seconds < best:
                        best, best_parts, best_option = seconds, parts, option
                    continue
                front = parts[0]
                for other in parts[1:]:
                    front = self.cross(front, other)
                points.extend((t, m, (x, option, trace)) for t, m, trace in front)
        if scalar and best_parts is not None:
            front = best_parts[0]
            for other in best_parts[1:]:
                front = self.cross(front, other)
            t, m, trace = front[0]
            points.append((t, m, (x, best_option, trace)))
        return points

    def finish(self) -> Point | None:
        fronts = [f.table.get(()) for f in self.factors.values()]
        if any(front is None for front in fronts):
            return None
        front: Front = ((0.0, 0.0, None),)
        for other in fronts:
            front = self.cross(front, other)
            if not front:
                return None
        return min(front, key=lambda p: (p[0], p[1]))


def _pair(a: Trace, b: Trace) -> Trace:
    """The choices behind two independent parts."""
    if a is None or b is None:
        return a if b is None else b
    return (None, None, a, b)


def _kind(near: tuple[int, ...], solver: _Solver) -> str:
    if not near:
        return "final"
    if len(near) == 1:
        return "merge/contract"
    if len(near) == 2:
        joined = any(set(near) <= set(f.scope) for f in solver.factors.values())
        return "triangle" if joined else "op"
    return "star"


def _assignment(trace: Trace, count: int) -> list[int]:
    """Back-substitution: every variable's option, read from the choices behind the final point."""
    out = [-1] * count
    stack = [trace]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        var, option, *children = node
        if var is not None:
            out[var] = option
        stack.extend(children)
    return out


def solve(
    problem: Problem,
    budget: float | None = None,
    unary: Callable[[int, int], tuple[float, float]] | None = None,
    pairwise: Callable[[int, int, int], float] | None = None,
    edges: Iterable[int] | None = None,
) -> Elimination | None:
    """The assignment minimising `problem`'s objective with memory (beyond the constant part) <= budget, or None
    when none fits. `unary(var, option)` -> (seconds, bytes) and `pairwise(edge, a, b)` -> seconds replace the
    problem's own costs, and `edges` limits the edges counted (the smallest-memory search uses them)."""
    unary = unary or (lambda v, a: (problem.variables[v].options[a].time, problem.variables[v].options[a].memory))
    pairwise = pairwise or problem.edge_time
    sizes = [len(v.options) for v in problem.variables]
    solver = _Solver(sizes, budget)
    for v in range(len(sizes)):
        table = {}
        for a in range(sizes[v]):
            seconds, nbytes = unary(v, a)
            if seconds < INFEASIBLE and (budget is None or nbytes <= budget):
                table[(a,)] = ((seconds, nbytes, None),)
        solver.add((v,), table)
    for k in range(len(problem.edges)) if edges is None else edges:
        u, w = problem.edges[k].source, problem.edges[k].target
        table = {}
        for a in range(sizes[u]):
            for b in range(sizes[w]):
                seconds = pairwise(k, a, b)
                if seconds < INFEASIBLE:
                    table[(a, b) if u < w else (b, a)] = ((seconds, 0.0, None),)
        solver.add((min(u, w), max(u, w)), table)
    alive = set(range(len(sizes)))
    while alive:
        x = solver.pick(alive)
        solver.eliminate(x)
        alive.discard(x)
    best = solver.finish()
    if best is None:
        return None
    assignment = _assignment(best[2], len(sizes))
    missing = [problem.variables[v].name for v, a in enumerate(assignment) if a < 0]
    if missing:
        raise AssertionError(f"back-substitution left {missing} without a choice")
    return Elimination(assignment, best[0], best[1], solver.counts)
