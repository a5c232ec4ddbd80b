"""The strategy planner's entry point: a forward graph, the user's fixed strategies, the devices, a cost model and a
memory budget in; a strategy for every node out, in the form `parallelize` takes.

    >>> from tessel.compiler.builder import apply
    >>> from tessel.compiler.parallel import parallelize
    >>> from tessel.compiler.parallel.search import CostModel, plan_strategies, predict_step_time
    >>> from tessel.compiler.tracer import TensorSpec, trace
    >>> def mlp(x, w1, b1, w2):
    ...     h = apply("ReLU", apply("BiasAdd", apply("MatMul", x, w1), b1))
    ...     return apply("MatMul", h, w2).mean()
    >>> graph = trace(mlp, TensorSpec((64, 32)), TensorSpec((32, 32)), TensorSpec((32,)), TensorSpec((32, 16))).graph
    >>> model = CostModel.default_cpu(8)
    >>> strategies = plan_strategies(
    ...     graph, mode="dynamic_programming", device_num=8,
    ...     fixed={0: ((1, 1), (1, 8))},              # the first MatMul's shard(): kept as given
    ...     parameters=["w1", "b1", "w2"], dataset="data_parallel", cost_model=model,
    ... )
    >>> [strategies[node] for node in graph.nodes]  # Megatron: columns, then rows and one AllReduce
    [((1, 1), (1, 8)), ((1, 8), (8,)), ((1, 8),), ((1, 8), (8, 1)), ((1, 1),)]
    >>> plan = parallelize(graph, strategies, 8, parameters=["w1", "b1", "w2"])
    >>> predict_step_time(plan, model).total        # seconds per training step, as the search priced it
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from tessel.compiler.ir import Graph, Node
from tessel.compiler.parallel.search.cost_model import CostModel
from tessel.compiler.parallel.search.elimination import solve
from tessel.compiler.parallel.search.problem import INFEASIBLE, Problem
from tessel.compiler.parallel.search.propagation import propagate
from tessel.compiler.parallel.search.recursive import recursive_programming
from tessel.compiler.parallel.search.refine import refine
from tessel.core.errors import ConfigurationError

log = logging.getLogger("tessel.parallel")

SEARCH_MODES = ("sharding_propagation", "recursive_programming", "dynamic_programming")


class MemoryBudgetError(ConfigurationError):
    """No plan fits the per-device memory budget; `minimum_bytes` is the least memory any plan needs."""

    def __init__(self, message: str, minimum_bytes: float, budget_bytes: float):
        super().__init__(message)
        self.minimum_bytes, self.budget_bytes = minimum_bytes, budget_bytes


@dataclass(frozen=True)
class SearchResult:
    """What a search found: a strategy per node, the predicted step time (seconds) and memory (bytes per device)
    of the plan they give, the mode that found it."""

    strategies: dict[Node, Any]
    mode: str
    step_time: float
    memory_bytes: float


def plan_strategies(
    graph: Graph,
    *,
    mode: str,
    device_num: int,
    fixed: Mapping[Node | int, Any] | None = None,
    parameters: Collection[str] = (),
    dataset: Any = "data_parallel",
    cost_model: CostModel | None = None,
    memory_budget: float | None = None,
) -> dict[Node, Any]:
    """A strategy for every node of `graph` (global shapes) on `device_num` devices, found by `mode` (one of
    SEARCH_MODES, as MindSpore's set_auto_parallel_context(search_mode=...)).

    - `fixed`: the user's strategies (shard(), or "data_parallel" from Cell.set_data_parallel()), by node or node
      index; every mode keeps them as given;
    - `parameters`: the names of the graph inputs that are parameters; the others are data, laid out by
      `dataset` ("data_parallel", "full_batch" or a dataset_strategy, as parallelize takes it);
    - `cost_model`: the cluster's speeds (default: CostModel.default_cpu(device_num));
    - `memory_budget`: bytes per device (default: the cost model's memory size). No plan returned exceeds it:
      dynamic_programming finds the fastest plan within it; the heuristic modes raise MemoryBudgetError when
      their plan does not fit. When no plan fits, the error names the least memory any plan needs.

    The result maps every node to a strategy `parallelize(graph, result, device_num, parameters, dataset)` accepts:
    the user's own where fixed, a tuple of cuts per input elsewhere. See the module docstring for an example.
    """
    return search(
        graph,
        mode=mode,
        device_num=device_num,
        fixed=fixed,
        parameters=parameters,
        dataset=dataset,
        cost_model=cost_model,
        memory_budget=memory_budget,
    ).strategies


def search(
    graph: Graph,
    *,
    mode: str,
    device_num: int,
    fixed: Mapping[Node | int, Any] | None = None,
    parameters: Collection[str] = (),
    dataset: Any = "data_parallel",
    cost_model: CostModel | None = None,
    memory_budget: float | None = None,
) -> SearchResult:
    """plan_strategies, with the plan's predicted step time and memory."""
    if mode not in SEARCH_MODES:
        valid = ", ".join(repr(m) for m in SEARCH_MODES)
        raise ConfigurationError(f"search_mode {mode!r} is not a strategy search mode; the valid ones are {valid}")
    model = cost_model or CostModel.default_cpu(device_num)
    budget = float(model.memory_bytes if memory_budget is None else memory_budget)
    started = time.perf_counter()
    problem = Problem(graph, device_num, fixed, parameters, dataset, model)
    decided = {v.index: 0 for v in problem.variables if v.fixed}
    _report_configured_mismatches(problem)
    if mode == "sharding_propagation":
        assignment = propagate(problem, decided)
    elif mode == "recursive_programming":
        assignment = refine(problem, recursive_programming(problem, decided), budget)
    else:
        assignment = _dynamic_programming(problem, budget)
    seconds, memory = problem.evaluate(assignment)
    if memory > budget:
        raise _over_budget(problem, mode, memory, budget)
    log.info(
        "%s: %d nodes on %d devices planned in %.3f s; predicted step %.3g ms, %.1f MiB per device",
        mode,
        len(graph.nodes),
        device_num,
        time.perf_counter() - started,
        seconds * 1e3,
        memory / 2**20,
    )
    return SearchResult(problem.strategies(assignment), mode, seconds, memory)


def _report_configured_mismatches(problem: Problem) -> None:
    """Two configured ops joined by a tensor one gives in another layout than the other wants: legal (the pass
    redistributes), never hidden (MindSpore warns "Inconsistency occurred at edge")."""
    for k, edge in enumerate(problem.edges):
        source, target = problem.variables[edge.source], problem.variables[edge.target]
        if not (source.fixed and target.fixed) or edge.output < 0:
            continue
        have = source.options[0].placement.outputs[edge.output]
        want = target.options[0].placement.inputs[edge.input]
        if not have.same_as(want):
            log.warning(
                "configured strategies disagree on a tensor: %s gives it as %s, %s wants it as %s; a redistribution "
                "costing %.3g ms per step (forward and backward) is inserted between them",
                source.name,
                have.describe(),
                target.name,
                want.describe(),
                problem.edge_time(k, 0, 0) * 1e3,
            )


def _dynamic_programming(problem: Problem, budget: float) -> list[int]:
    result = solve(problem)
    if result is None:
        raise ConfigurationError(f"dynamic_programming found no consistent plan of graph {problem.graph.name!r}")
    log.info("dynamic_programming eliminations: %s", dict(result.counts))
    if result.memory + problem.constant_memory <= budget:
        return result.assignment
    bounded = solve(problem, budget=budget - problem.constant_memory)
    if bounded is None:
        raise _no_plan_fits(problem, budget)
    return bounded.assignment


def _over_budget(problem: Problem, mode: str, memory: float, budget: float) -> MemoryBudgetError:
    """The heuristic modes' plan needs more than the budget (MindSpore's recursive programming fails alike:
    "Out of memory"): the error names what it needs, the least any plan needs and the way to it."""
    minimum = minimum_memory(problem)
    if minimum > budget:
        return _no_plan_fits(problem, budget, minimum)
    return MemoryBudgetError(
        f"the plan {mode} found for graph {problem.graph.name!r} on {problem.device_num} devices needs "
        f"{_mib(memory)} per device, over the memory budget of {_mib(budget)}; the smallest memory any plan needs is "
        f"{_mib(minimum)} per device ({minimum:.0f} bytes), so plans that fit exist. Fix: "
        "search_mode='dynamic_programming' finds the fastest plan within the budget; or configure shard() "
        "strategies that cut the largest parameters and activations",
        minimum,
        budget,
    )


def minimum_memory(problem: Problem) -> float:
    """The least memory per device any plan of the problem needs (bytes)."""
    result = solve(  # memory is a sum over variables: only a shared parameter's "same layout" edges constrain it
        problem,
        unary=lambda v, a: (problem.variables[v].options[a].memory, 0.0),
        pairwise=lambda k, a, b: INFEASIBLE if problem.edge_time(k, a, b) == INFEASIBLE else 0.0,
        edges=[k for k, edge in enumerate(problem.edges) if edge.output < 0],
    )
    if result is None:
        raise ConfigurationError(f"graph {problem.graph.name!r} has no consistent plan")
    return result.time + problem.constant_memory


def _no_plan_fits(problem: Problem, budget: float, minimum: float | None = None) -> MemoryBudgetError:
    minimum = minimum_memory(problem) if minimum is None else minimum
    return MemoryBudgetError(
        f"no plan of graph {problem.graph.name!r} on {problem.device_num} devices fits the memory budget of "
        f"{_mib(budget)} per device: the smallest memory any plan needs is {_mib(minimum)} per device ({minimum:.0f} "
        "bytes: parameters with their gradients and optimizer state, activations kept for the backward, data). "
        "Fix: use more devices, a smaller batch, or a larger memory budget (ms.runtime.set_memory(max_size=...))",
        minimum,
        budget,
    )


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"
