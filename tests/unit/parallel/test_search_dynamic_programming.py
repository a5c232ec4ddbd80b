"""dynamic_programming is exact for the cost model: on small random DAGs and MLPs it finds what trying every
combination of candidate strategies finds (2-4 devices, with and without a memory budget), and it scales to
stacked layers by eliminations that keep at most two variables per cost."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from search_testkit import (
    OPS,
    brute_force,
    cheap_links,
    combinations,
    mlp_graph,
    random_graph,
    shared_graph,
    stacked_layers,
)

from tessel.compiler.parallel import parallelize
from tessel.compiler.parallel.search import CostModel, predict_step_time, search
from tessel.compiler.parallel.search.elimination import solve
from tessel.compiler.parallel.search.planner import minimum_memory
from tessel.compiler.parallel.search.problem import Problem

STEPS = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 7), st.integers(0, 7)), min_size=1, max_size=6)
MODELS = st.sampled_from(["default", "two hosts", "cheap links"])


def model_for(name: str, devices: int) -> CostModel:
    if name == "cheap links":
        return cheap_links()
    return CostModel.default_cpu(devices, devices_per_host=max(1, devices // 2) if name == "two hosts" else None)


def check_against_brute_force(problem: Problem) -> None:
    best = solve(problem)
    exhaustive = brute_force(problem)
    assert best is not None and exhaustive is not None
    time, memory = problem.evaluate(best.assignment)
    assert time == pytest.approx(best.time + problem.constant_time, rel=1e-9)
    assert time == pytest.approx(exhaustive[0], rel=1e-9)
    # Under a budget between the least and the unconstrained plan's memory: the fastest plan that fits.
    fits = brute_force(problem, budget=(memory + problem.constant_memory + exhaustive[1]) / 2 - 1)
    if fits is not None:
        budget = (memory + problem.constant_memory + exhaustive[1]) / 2 - 1
        bounded = solve(problem, budget=budget - problem.constant_memory)
        assert bounded is not None
        assert problem.evaluate(bounded.assignment)[0] == pytest.approx(fits[0], rel=1e-9)
        assert problem.evaluate(bounded.assignment)[1] <= budget


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, devices=st.sampled_from([2, 3, 4]), model=MODELS)
def test_dynamic_programming_equals_trying_every_combination_on_random_dags(steps, devices, model):
    graph, params = random_graph(steps)
    problem = Problem(graph, devices, {}, params, "data_parallel", model_for(model, devices))
    assume(combinations(problem) <= 20000)
    check_against_brute_force(problem)


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("net", [mlp_graph, shared_graph])
def test_dynamic_programming_equals_trying_every_combination_on_mlps(net, devices):
    graph, params = net()
    for model in ("default", "two hosts", "cheap links"):
        problem = Problem(graph, devices, {}, params, "data_parallel", model_for(model, devices))
        if combinations(problem) <= 200000:
            check_against_brute_force(problem)


def test_the_plan_dynamic_programming_finds_is_as_fast_as_predicted():
    graph, params = shared_graph()
    model = cheap_links()
    found = search(graph, mode="dynamic_programming", device_num=4, parameters=params, cost_model=model)
    plan = parallelize(graph, found.strategies, 4, params)
    assert predict_step_time(plan, model).total == pytest.approx(found.step_time, rel=1e-12)


def test_a_stack_of_layers_needs_only_small_eliminations():
    graph, params = stacked_layers(layers=8, batch=64, hidden=32)
    problem = Problem(graph, 8, {}, params, "data_parallel", CostModel.default_cpu(8))
    result = solve(problem)
    eliminated = sum(result.counts.values()) - result.counts["edge"]
    assert "star" not in result.counts and eliminated == len(problem.variables)


@pytest.mark.parametrize("model", ["default", "cheap links"])
def test_star_and_triangle_eliminations_stay_exact(model):
    """A random DAG whose elimination needs a star (a variable left with three neighbours) and triangles."""
    steps = [("bias", 4, 4), ("sum_rows", 1, 1), ("relu", 7, 4), ("add", 5, 3), ("matmul_act", 2, 4)]
    graph, params = random_graph(steps)
    problem = Problem(graph, 2, {}, params, "data_parallel", model_for(model, 2))
    result = solve(problem)
    assert {"star", "triangle", "op", "edge"} <= set(result.counts)
    check_against_brute_force(problem)


def test_long_graphs_under_a_tight_budget_still_find_the_plan_that_fits():
    """On a stack of layers the Pareto fronts outgrow MAX_FRONT and are thinned; the smallest point survives, so
    a budget at the least memory any plan needs still gets a plan, and a looser one a faster plan."""
    graph, params = stacked_layers(layers=20, batch=256, hidden=256)  # fronts are thinned some 45 times
    model = CostModel.default_cpu(8, devices_per_host=4)
    problem = Problem(graph, 8, {}, params, "data_parallel", model)
    least = minimum_memory(problem)
    tight = search(
        graph, mode="dynamic_programming", device_num=8, parameters=params, cost_model=model, memory_budget=least
    )
    assert tight.memory_bytes == pytest.approx(least)
    free = search(graph, mode="dynamic_programming", device_num=8, parameters=params, cost_model=model)
    loose = search(
        graph,
        mode="dynamic_programming",
        device_num=8,
        parameters=params,
        cost_model=model,
        memory_budget=(least + free.memory_bytes) / 2,
    )
    assert free.step_time <= loose.step_time <= tight.step_time
    assert loose.memory_bytes <= (least + free.memory_bytes) / 2
