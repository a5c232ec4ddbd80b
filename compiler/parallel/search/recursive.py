"""recursive_programming: MindSpore's double recursion (rec_core/rec_partition.cc, rec_cost.cc), generic over the
ops' sharding rules.

The outer recursion cuts the devices in two log2(P) times; in each round the inner loop visits the ops in
descending weight (their cost on the shapes they have so far) and cuts each one in two along the label that costs
least, symbolically, in bytes of the op's current local tensors (plus, per collective a cut implies, the bytes the
slower link could move while waiting out its latency: α·β):
- an input the cut does not split must stay whole on both halves: a parameter's gradient is then all-reduced
  (2× its bytes; bucketed, so no latency of its own), an activation gathered (1× and one latency, and a second
  for its gradient's reduce-scatter where it has one);
- a contracted label leaves partial sums to all-reduce (2× the output's bytes and latency);
- a neighbour already cut in this round (or fixed by the user, or the dataset) along another dim of the tensor
  they share needs a redistribution (2×: forward and backward; 1× for data and what has no gradient). An
  element-wise op between two heavy ones is looked through: its producer's cut counts.
On a tie, a label that leaves no partial sums wins.
A parameter several ops use is cut alike by all of them: its first user in a round decides, the others follow
(an op only takes a cut its co-users can follow). Cost and work are linear in the graph per round.

The ops it models are those that compute (flops > 0) with a splittable label, and every user of a shared
parameter; the others (Reshape, Transpose, Constant, ...) and any user of a shared parameter whose final layout
came out different are then decided by sharding propagation from the modelled ones. User strategies are kept.

MindSpore requires a power-of-two device count (step_auto_parallel.cc raises "The recursive auto parallel strategy
searching mode requires the device num be the power of 2"); here a round cuts in p for each prime factor p of P
(12 devices: rounds of 2, 2 and 3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tessel.compiler import registry
from tessel.compiler.parallel.layout import Layout
from tessel.compiler.parallel.mesh import prime_factors
from tessel.compiler.parallel.search.objective import itemsize, produced
from tessel.compiler.parallel.search.problem import Problem, layout_key
from tessel.compiler.parallel.search.propagation import propagate
from tessel.compiler.parallel.strategy import label_sizes, uncombinable

PARAMETER_COEF = 2.0  # a replicated parameter: its gradient all-reduced
ACTIVATION_COEF = 1.0  # a replicated activation: gathered
PARTIAL_COEF = 2.0  # partial sums all-reduced
REDISTRIBUTION_COEF = 2.0  # a mismatched neighbour: moved forward and backward
UNKNOWN = -2  # a neighbour's cut in a round that cannot be told (a mesh whose primes come in another order)


def recursive_programming(problem: Problem, decided: Mapping[int, int]) -> list[int]:
    """An option per variable: `decided` (the user's) kept, the modelled ops cut round by round, the rest
    propagated from them."""
    search = _Recursive(problem, decided)
    for r in range(len(search.primes)):
        search.round(r)
    return search.finish()


def _dims_of(layout: Layout, primes: tuple[int, ...]) -> list[int | None]:
    """Per round, the tensor dim a layout splits on the refined mesh axis of that round (None: not split)."""
    refined = layout.refined
    if tuple(refined.device_matrix) != primes and not (primes == () and refined.device_matrix == (1,)):
        return [UNKNOWN] * len(primes)
    dims: list[int | None] = [None] * len(primes)
    for d, axes in enumerate(refined.dim_axes):
        for axis in axes:
            dims[axis] = d
    return dims


class _Recursive:
    def __init__(self, problem: Problem, decided: Mapping[int, int]):
        self.p = problem
        self.decided = dict(decided)
        self.primes = prime_factors(problem.device_num)
        self.index = [{o.cuts: a for a, o in enumerate(v.options)} for v in problem.variables]
        # Vars with the same option cuts (every MatMul of one shape) share one table of them and one memo of which
        # cuts they can reach: an op's labels are asked for by it and by each co-user of its parameters, each round.
        tables: dict[tuple, int] = {}
        self.table = [tables.setdefault(tuple(index), len(tables)) for index in self.index]
        self.option_cuts = {t: [dict(cuts) for cuts in key] for key, t in tables.items()}
        self.reachable: dict[tuple[int, tuple], bool] = {}
        self.labels: dict[tuple[int, int], list[str]] = {}
        self.cuts: dict[int, dict[str, int]] = {}
        self.choice: dict[int, list[str | None]] = {}
        self.params = {var for var in problem.param_var.values()}
        self.modeled = [v for v in problem.node_var.values() if v not in self.decided and self._models(v)]
        self.parameters = set(problem.parameters)
        # A collective's fixed cost in bytes: what the slower link moves while it waits out its latency.
        links = (
            (problem.model.shared_memory, problem.model.tcp) if problem.model.hosts else (problem.model.shared_memory,)
        )
        self.latency = max(max(link.latency, problem.model.collective_latency) * link.bandwidth for link in links)
        self.sizes, self.contracted = {}, {}
        for var in self.modeled:
            node = problem.variables[var].node
            spec = problem.specs[node]
            self.sizes[var] = label_sizes(node, spec)
            self.contracted[var] = [spec.contracted(j) for j in range(len(spec.outputs))]
            self.cuts[var] = {}
            self.choice[var] = [None] * len(self.primes)
        self.fixed_dims: dict[tuple[int, int, str], list] = {}  # (var, index, "in"/"out") -> per-round dims
        for var, a in self.decided.items():
            option = problem.variables[var].options[a]
            if option.placement is not None:
                for j, layout in enumerate(produced(option.placement)):
                    self.fixed_dims[var, j, "out"] = _dims_of(layout, self.primes)
                for i, layout in enumerate(option.placement.inputs):
                    if layout is not None:
                        self.fixed_dims[var, i, "in"] = _dims_of(layout, self.primes)
            else:
                self.fixed_dims[var, 0, "out"] = _dims_of(option.layout, self.primes)
        self.data_dims = {v: _dims_of(layout, self.primes) for v, layout in problem.dataset.items()}
        self.param_round: dict[int, int | None] = {}

    def _models(self, var: int) -> bool:
        node = self.p.variables[var].node
        spec = self.p.specs[node]
        blocked = spec.fixed | uncombinable(spec)
        splittable = any(label not in blocked for labels in spec.inputs if labels for label in labels)
        shared = any(self.p.edges[k].output < 0 for k in self.p.variables[var].edges)
        return splittable and (shared or registry.get(node.op).cost(node, {}).flops > 0)

    # --- one round ----------------------------------------------------------------------------------------------------
    def round(self, r: int) -> None:
        self.param_round = {
            var: self.fixed_dims[var, 0, "out"][r] for var in self.params if (var, 0, "out") in self.fixed_dims
        }
        self.done: set[int] = set()
        order = sorted(self.modeled, key=lambda v: (-self._weight(v), v))
        for var in order:
            label = self._best(var, r)
            self.choice[var][r] = label
            if label is not None:
                self.cuts[var][label] = self.cuts[var].get(label, 1) * self.primes[r]
            self.done.add(var)
            for k, param in self._parameter_edges(var):
                self.param_round.setdefault(param, self._dim(var, "in", self.p.edges[k].input, label))

    def _weight(self, var: int) -> float:
        a = self.index[var].get(tuple(sorted(self.cuts[var].items())))
        return self.p.variables[var].options[a].time if a is not None else 0.0

    def _labels(self, var: int, r: int) -> list[str]:
        """The labels the var can cut in round r (asked only before the var's own cut of the round: cached)."""
        found = self.labels.get((var, r))
        if found is None:
            found = self.labels[var, r] = self._find_labels(var, r)
        return found

    def _find_labels(self, var: int, r: int) -> list[str]:
        node = self.p.variables[var].node
        spec = self.p.specs[node]
        blocked = spec.fixed | uncombinable(spec)
        prime, cuts = self.primes[r], self.cuts[var]
        out = []
        for labels in spec.inputs:
            for label in labels or ():
                if label in blocked or label in out:
                    continue
                if not all((size // cuts.get(label, 1)) % prime == 0 for size in self.sizes[var][label]):
                    continue
                if self._reachable(var, {**cuts, label: cuts.get(label, 1) * prime}):
                    out.append(label)
        return out

    def _reachable(self, var: int, cuts: dict[str, int]) -> bool:
        """Some option of the var cuts each label a multiple of `cuts` (a sharding rule may not offer every cut, a
        periodic slice for one; a shared parameter's users only the cuts it takes)."""
        key = (self.table[var], tuple(sorted(cuts.items())))
        found = self.reachable.get(key)
        if found is None:
            options = self.option_cuts[self.table[var]]
            found = any(all(option.get(label, 1) % n == 0 for label, n in cuts.items()) for option in options)
            self.reachable[key] = found
        return found

    def _option_of(self, var: int) -> int:
        """The option of the cuts the rounds gave the var, else the fastest option that extends them."""
        cuts = self.cuts[var]
        found = self.index[var].get(tuple(sorted(cuts.items())))
        if found is not None:
            return found
        options = self.p.variables[var].options
        extending = [a for c, a in self.index[var].items() if all(dict(c).get(k, 1) % n == 0 for k, n in cuts.items())]
        return min(extending or range(len(options)), key=lambda a: (options[a].time, a))

    def _best(self, var: int, r: int) -> str | None:
        """The cheapest label to cut; on a tie, one that leaves no partial sums (they always cost a collective,
        where a whole input may already be whole)."""
        contracted = set().union(*self.contracted[var])
        best, best_key = None, (math.inf, True)
        self.nbytes: dict[tuple[int, int], float] = {}  # the var's local tensor bytes: its cuts hold while it chooses
        for label in self._labels(var, r):
            if not self._consistent(var, label, r):
                continue
            key = (self._cost(var, label, r), label in contracted)
            if key < best_key:
                best, best_key = label, key
        return best

    def _parameter_edges(self, var: int) -> list[tuple[int, int]]:
        return [(k, self.p.edges[k].source) for k in self.p.variables[var].edges if self.p.edges[k].output < 0]

    def _consistent(self, var: int, label: str, r: int) -> bool:
        """The cut keeps every shared parameter cut alike this round: as decided, or followable by its other
        users still to come."""
        for k, param in self._parameter_edges(var):
            dim = self._dim(var, "in", self.p.edges[k].input, label)
            if param in self.param_round:
                if self.param_round[param] != dim:
                    return False
                continue
            for other in self.p.variables[param].edges:
                user, i = self.p.edges[other].target, self.p.edges[other].input
                if user == var or user in self.done or user not in self.cuts:
                    continue
                if dim is not None and not any(self._dim(user, "in", i, x) == dim for x in self._labels(user, r)):
                    return False
        return True

    def _dim(self, var: int, side: str, index: int, label: str | None) -> int | None:
        """The dim of the var's input/output `index` that carries `label` (None: the label does not cut it)."""
        if label is None:
            return None
        spec = self.p.specs[self.p.variables[var].node]
        labels = spec.inputs[index] if side == "in" else spec.outputs[index]
        return labels.index(label) if labels and label in labels else None

    def _cost(self, var: int, label: str, r: int) -> float:
        node = self.p.variables[var].node
        spec = self.p.specs[node]
        cuts = self.cuts[var]
        params = self.parameters
        cost = 0.0
        for i, (v, labels) in enumerate(zip(node.inputs, spec.inputs)):
            if labels is None:
                continue
            nbytes = self._bytes(v, labels, cuts)
            if v in self.data_dims:  # data: moved once (no gradient), where the dataset cuts it otherwise
                theirs = self.data_dims[v][r]
                if theirs != UNKNOWN and theirs != self._dim(var, "in", i, label):
                    cost += nbytes + self.latency
            elif label not in labels:  # a parameter's gradient reduction is bucketed: no latency of its own
                cost += nbytes * PARAMETER_COEF if v in params else self._gathered(v, nbytes)
        for j, v in enumerate(node.outputs):
            if label in self.contracted[var][j]:
                cost += PARTIAL_COEF * (self._bytes(v, spec.outputs[j], cuts) + self.latency)
        for k in self.p.variables[var].edges:
            edge = self.p.edges[k]
            if edge.output < 0:
                continue
            mine_side, theirs_side = ("out", "in") if edge.source == var else ("in", "out")
            mine_index = edge.output if edge.source == var else edge.input
            other = edge.target if edge.source == var else edge.source
            theirs = self._their_dim(other, theirs_side, edge.input if theirs_side == "in" else edge.output, r)
            if theirs == UNKNOWN:
                continue
            if theirs != self._dim(var, mine_side, mine_index, label):
                labels = spec.outputs[mine_index] if mine_side == "out" else spec.inputs[mine_index]
                ways = REDISTRIBUTION_COEF if edge.value in self.p.differentiable else 1.0
                cost += ways * (self._bytes(edge.value, labels, cuts) + self.latency)
        return cost

    def _bytes(self, value, labels, cuts: Mapping[str, int]) -> float:
        """_local_bytes, remembered while one var chooses its label (its cuts do not change meanwhile)."""
        key = (id(value), id(labels))
        found = self.nbytes.get(key)
        if found is None:
            found = self.nbytes[key] = _local_bytes(value, labels, cuts)
        return found

    def _gathered(self, value, nbytes: float) -> float:
        """An activation kept whole on both halves: gathered forward and, where it has a gradient, its gradient
        reduce-scattered backward (a collective each way)."""
        return nbytes * ACTIVATION_COEF + (2 if value in self.p.differentiable else 1) * self.latency

    def _their_dim(self, var: int, side: str, index: int, r: int, depth: int = 8):
        if (var, index, side) in self.fixed_dims:
            return self.fixed_dims[var, index, side][r]
        if var in self.done:
            return self._dim(var, side, index, self.choice[var][r])
        if side == "out" and depth > 0:
            return self._through(var, r, depth - 1)
        return UNKNOWN

    def _through(self, var: int, r: int, depth: int):
        """The dim an undecided op will give its output this round when it passes its one input's dims through
        (ReLU, BiasAdd with its bias, a cast): the dim its input's producer gives, looked up through such ops. A
        light element-wise op between two heavy ones is visited after both (descending weight), so without this
        a MatMul could not see that the MatMul before it already cut their tensor (MindSpore's rec_core removes
        such ops from its graph before partitioning, for the same reason)."""
        spec = self.p.specs[self.p.variables[var].node]
        carried = [i for i, labels in enumerate(spec.inputs) if labels == spec.outputs[0]]
        if len(spec.outputs) != 1 or len(carried) != 1:
            return UNKNOWN
        for k in self.p.variables[var].edges:
            edge = self.p.edges[k]
            if edge.target == var and edge.input == carried[0] and edge.output >= 0:
                return self._their_dim(edge.source, "out", edge.output, r, depth)
        return UNKNOWN

    # --- the outcome --------------------------------------------------------------------------------------------------
    def finish(self) -> list[int]:
        p = self.p
        assignment = dict(self.decided)
        for var in self.modeled:
            assignment[var] = self._option_of(var)
        for param in self.params:
            if param in assignment:
                continue
            users = [(self.p.edges[k].target, self.p.edges[k].input) for k in p.variables[param].edges]
            first = next(((u, i) for u, i in users if u in assignment), None)
            if first is None:
                continue
            want = layout_key(p.variables[first[0]].options[assignment[first[0]]].placement.inputs[first[1]])
            options = p.variables[param].options
            assignment[param] = next(a for a, o in enumerate(options) if layout_key(o.layout) == want)
            for user, i in users:  # users whose rounds came out in another order: propagation decides them
                mine = user in assignment and user not in self.decided
                if mine and layout_key(p.variables[user].options[assignment[user]].placement.inputs[i]) != want:
                    del assignment[user]
        return propagate(p, assignment, mode="recursive_programming")


def _local_bytes(value, labels, cuts: Mapping[str, int]) -> float:
    shape = [size // cuts.get(label, 1) for size, label in zip(value.shape, labels or ())]
    return math.prod(shape) * itemsize(value)
