"""The three search modes as a user meets them: user strategies kept, propagation choosing the least
redistribution, recursive programming's rounds, memory budgets, and the errors."""

from __future__ import annotations

import logging

import pytest
from par_testkit import by_op, traced
from search_testkit import MODES, brute_force, cheap_links, mlp_graph, shared_graph

from tessel.compiler.builder import apply
from tessel.compiler.parallel import StrategyError, parallelize
from tessel.compiler.parallel.search import CostModel, MemoryBudgetError, plan_strategies, search
from tessel.compiler.parallel.search.planner import minimum_memory
from tessel.compiler.parallel.search.problem import Problem
from tessel.core.errors import ConfigurationError


def column_net():
    def net(x, w, b):
        return apply("ReLU", apply("BiasAdd", apply("MatMul", x, w), b)).mean()

    return traced(net, (16, 8), (8, 8), (8,)), ["w", "b"]


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_keeps_the_users_strategies(mode):
    graph, params = mlp_graph()
    first, second = by_op(graph, "MatMul")
    (relu,) = by_op(graph, "ReLU")
    fixed = {first: ((1, 1), (1, 4)), relu: "data_parallel"}
    strategies = plan_strategies(graph, mode=mode, device_num=4, fixed=fixed, parameters=params)
    assert strategies[first] == ((1, 1), (1, 4)) and strategies[relu] == "data_parallel"
    assert set(strategies) == set(graph.nodes)
    plan = parallelize(graph, strategies, 4, params)
    assert plan.placements[first].origin == "shard()" and plan.placements[relu].origin == "data parallel"
    assert plan.placements[second].strategy == strategies[second]


def test_propagation_gives_the_ops_after_a_column_split_matmul_the_column_split():
    """MatMul configured ((1, 1), (1, 4)) gives columns; BiasAdd and ReLU taking them as they come need no
    redistribution, so they take the column split: ((1, 4), (4,)) and ((1, 4),)."""
    graph, params = column_net()
    matmul, bias, relu, _ = graph.nodes
    strategies = plan_strategies(
        graph, mode="sharding_propagation", device_num=4, fixed={matmul: ((1, 1), (1, 4))}, parameters=params
    )
    assert strategies[bias] == ((1, 4), (4,)) and strategies[relu] == ((1, 4),)
    plan = parallelize(graph, strategies, 4, params)
    assert (bias, 0) not in plan.redistributions and (relu, 0) not in plan.redistributions


def test_propagation_with_nothing_configured_starts_from_the_dataset_and_says_so(caplog):
    graph, params = column_net()
    with caplog.at_level(logging.INFO, logger="tessel.parallel"):
        strategies = plan_strategies(graph, mode="sharding_propagation", device_num=4, parameters=params)
    assert "no operator has a configured strategy; propagating from the dataset's layout" in caplog.text
    assert strategies[graph.nodes[0]] == ((4, 1), (1, 1))  # rows, as the data-parallel dataset gives them
    columns = plan_strategies(
        graph, mode="sharding_propagation", device_num=4, parameters=params, dataset=[(1, 4)]
    )  # a dataset cut along dim 1 propagates too: the MatMul contracts its columns
    assert columns[graph.nodes[0]] == ((1, 4), (4, 1))


def test_a_search_mode_that_does_not_exist_lists_the_valid_ones():
    graph, params = mlp_graph()
    with pytest.raises(ConfigurationError, match=r"'dp' is not .* 'sharding_propagation', 'recursive_programming'"):
        plan_strategies(graph, mode="dp", device_num=2, parameters=params)


@pytest.mark.parametrize("mode", MODES)
def test_configured_ops_that_cut_one_parameter_two_ways_are_an_error_naming_both(mode):
    graph, params = shared_graph()
    first, second = by_op(graph, "MatMul")
    fixed = {first: ((1, 1), (1, 2)), second: ((1, 2), (2, 1))}
    with pytest.raises(StrategyError) as caught:
        plan_strategies(graph, mode=mode, device_num=2, fixed=fixed, parameters=params)
    message = str(caught.value)
    assert "parameter 'w'" in message and "MatMul #0" in message and "MatMul #3" in message
    assert "[S(1)] on 2" in message and "[S(0)] on 2" in message and "Fix:" in message


def test_configured_neighbours_that_disagree_on_a_tensor_are_reported_not_hidden(caplog):
    """The seed's fc ((1, 1), (1, 2)) then fc2 ((8, 1), (1, 1)): legal, a redistribution goes between them, and
    the log names both ops and layouts (MindSpore warns "Inconsistency occurred at edge")."""
    graph, params = mlp_graph()
    first, second = by_op(graph, "MatMul")
    fixed = {first: ((1, 1), (1, 2)), second: ((2, 1), (1, 1))}
    (bias,) = by_op(graph, "BiasAdd")
    (relu,) = by_op(graph, "ReLU")
    fixed.update({bias: ((1, 2), (2,)), relu: ((1, 2),)})
    with caplog.at_level(logging.WARNING, logger="tessel.parallel"):
        plan_strategies(graph, mode="sharding_propagation", device_num=2, fixed=fixed, parameters=params)
    assert "ReLU #2" in caplog.text and "MatMul #3" in caplog.text and "[S(1)] on 2" in caplog.text
    assert "[S(0)] on 2" in caplog.text and "redistribution" in caplog.text


@pytest.mark.parametrize("mode", MODES)
def test_a_parameter_used_by_two_ops_gets_one_layout(mode):
    graph, params = shared_graph()
    first, second = by_op(graph, "MatMul")
    for model in (CostModel.default_cpu(4), cheap_links()):
        strategies = plan_strategies(graph, mode=mode, device_num=4, parameters=params, cost_model=model)
        plan = parallelize(graph, strategies, 4, params)  # raises if the two MatMuls disagree on w
        assert plan.placements[first].inputs[1].same_as(plan.placements[second].inputs[1])
    fixed = {first: ((1, 1), (1, 4))}
    strategies = plan_strategies(graph, mode=mode, device_num=4, fixed=fixed, parameters=params)
    assert strategies[second][1] == (1, 4)  # the unconfigured user follows the configured one


@pytest.mark.parametrize("mode", MODES)
def test_memory_too_small_for_any_plan_is_an_error_naming_the_least_memory_needed(mode):
    graph, params = mlp_graph()
    problem = Problem(graph, 4, {}, params, "data_parallel", CostModel.default_cpu(4))
    least = minimum_memory(problem)
    every = brute_force(problem, budget=least)
    assert every is not None and every[1] == least  # some plan needs exactly that much
    assert brute_force(problem, budget=least - 1) is None  # and none needs less
    with pytest.raises(MemoryBudgetError, match=rf"smallest memory any plan needs is .* \({least:.0f} bytes") as e:
        plan_strategies(graph, mode=mode, device_num=4, parameters=params, memory_budget=least - 1)
    assert e.value.minimum_bytes == least and e.value.budget_bytes == least - 1
    found = search(graph, mode="dynamic_programming", device_num=4, parameters=params, memory_budget=least)
    assert found.memory_bytes == least  # the plan that needs the least is found under the tightest budget


@pytest.mark.parametrize("mode", ["sharding_propagation", "recursive_programming"])
def test_a_heuristic_plan_over_the_budget_is_an_error_pointing_to_dynamic_programming(mode):
    graph, params = mlp_graph()
    free = search(graph, mode=mode, device_num=4, parameters=params)
    problem = Problem(graph, 4, {}, params, "data_parallel", CostModel.default_cpu(4))
    least = minimum_memory(problem)
    budget = (free.memory_bytes + least) / 2
    with pytest.raises(MemoryBudgetError, match=r"over the memory budget.*search_mode='dynamic_programming'") as e:
        search(graph, mode=mode, device_num=4, parameters=params, memory_budget=budget)
    assert e.value.minimum_bytes == least
    bounded = search(graph, mode="dynamic_programming", device_num=4, parameters=params, memory_budget=budget)
    assert bounded.memory_bytes <= budget < free.memory_bytes
    assert bounded.step_time == pytest.approx(brute_force(problem, budget)[0])


def test_recursive_programming_cuts_in_rounds_for_any_device_count():
    for devices in (2, 4, 8, 6, 12):
        model = CostModel.default_cpu(devices)
        graph, params = traced_for(devices)
        strategies = plan_strategies(graph, mode="recursive_programming", device_num=devices, parameters=params)
        plan = parallelize(graph, strategies, devices, params)
        matmul = plan.placements[graph.nodes[0]]
        assert _product(matmul.strategy) == devices, (devices, matmul.strategy)  # every device used
        best = search(graph, mode="dynamic_programming", device_num=devices, parameters=params, cost_model=model)
        found = search(graph, mode="recursive_programming", device_num=devices, parameters=params, cost_model=model)
        assert found.step_time <= 1.5 * best.step_time


def traced_for(devices: int):
    def mlp(x, w1, b1, w2):
        h = apply("ReLU", apply("BiasAdd", apply("MatMul", x, w1), b1))
        return apply("MatMul", h, w2).mean()

    batch = 12 * devices
    return traced(mlp, (batch, 24), (24, 24), (24,), (24, 12)), ["w1", "b1", "w2"]


def _product(strategy) -> int:
    """The number of parts a MatMul strategy ((m, k), (k, n)) cuts into."""
    (m, k), (_, n) = strategy
    return m * k * n


def test_every_option_of_a_node_is_a_placement_of_that_node():
    """A user-fixed node's single option is its own and never another node's (options were once shared by the id()
    of a freed list; tests/integration/test_multi_copy.py's AUTO case met it)."""

    def net(x, w):
        a, b = apply("Sign", x), apply("Sign", w)
        h = apply("MatMul", a, b)
        for op in ("Add", "Mul", "Sub", "Maximum", "Minimum"):  # each right after the last: two inputs from nodes
            h = apply(op, h, a)
        return h.mean()

    graph = traced(net, (8, 8), (8, 8))
    (matmul,) = by_op(graph, "MatMul")
    for _ in range(3):
        problem = Problem(graph, 2, {matmul: ((1, 1), (1, 2))}, ["w"], "data_parallel", CostModel.default_cpu(2))
        for var in problem.variables:
            if var.node is not None:
                assert all(o.placement.op == var.node.op for o in var.options), (var, var.options[:1])


def _data_moves(plan, model) -> tuple[list, float]:
    """The redistributions of the plan's data inputs (not its parameters) and their predicted forward seconds."""
    from tessel.compiler.parallel.search import objective

    data = {v for v in plan.graph.inputs if v.name not in set(plan.parameters)}
    moves, seconds = [], 0.0
    for key, move in plan.redistributions.items():
        if key[0] != "output" and key[1] != "out" and key[0].inputs[key[1]] in data:
            moves.append(move)
            seconds += objective.move_time(model, move.source, move.target, key[0].inputs[key[1]], backward=False)
    return moves, seconds


@pytest.mark.parametrize("mode", MODES)
def test_a_full_batch_input_is_sliced_where_the_plan_wants_it_without_communication(mode):
    """full_batch=True under AUTO_PARALLEL: every rank holds the whole batch, so whatever layout the plan's first op
    reads it in is a local slice (priced as a copy, no collective). On large weights and a small batch (Megatron's
    case) the plan cuts the first MatMul's weight by columns; from a data-parallel dataset that needs an all-gather
    of the input, from the whole batch nothing: the full_batch plan is predicted no slower and moves no data over
    the links."""
    from search_testkit import stacked_layers

    from tessel.compiler.parallel.search import predict_step_time

    graph, params = stacked_layers(3, 16, 2048)
    model = CostModel.default_cpu(4)
    predicted, data_seconds = {}, {}
    for dataset in ("data_parallel", "full_batch"):
        strategies = plan_strategies(
            graph, mode=mode, device_num=4, parameters=params, dataset=dataset, cost_model=model
        )
        plan = parallelize(graph, strategies, 4, params, dataset)
        moves, data_seconds[dataset] = _data_moves(plan, model)
        predicted[dataset] = predict_step_time(plan, model).total
        first = by_op(graph, "MatMul")[0]
        assert strategies[first] == ((1, 1), (1, 4)), (dataset, strategies[first])  # Megatron's column split
        if dataset == "full_batch":
            assert all(move.source.replicas == 4 and not move.collectives for move in moves), moves
    assert data_seconds["data_parallel"] > 0  # the data-parallel import gathers the batch for the column split
    assert data_seconds["full_batch"] < data_seconds["data_parallel"] / 2, data_seconds
    assert predicted["full_batch"] <= predicted["data_parallel"] * (1 + 1e-9), predicted


def test_refine_moves_an_op_with_the_element_wise_ops_that_follow_it():
    """recursive_programming on 6 small layers over 16 devices (two hosts) cuts some MatMuls by k, m and n; a
    MatMul whose BiasAdd and ReLU follow its cut cannot leave that cut alone (each single move costs a
    redistribution to the followers). The chain move takes the three along: the plan then ends within 10 % of
    dynamic_programming's optimum (it was 1.146x with single moves only)."""
    from search_testkit import stacked_layers

    from tessel.compiler.parallel.search.recursive import recursive_programming
    from tessel.compiler.parallel.search.refine import _single_moves, refine

    graph, params = stacked_layers(6, 64, 256)
    model = CostModel.default_cpu(16, devices_per_host=8)
    best = search(graph, mode="dynamic_programming", device_num=16, parameters=params, cost_model=model)
    found = search(graph, mode="recursive_programming", device_num=16, parameters=params, cost_model=model)
    assert found.step_time <= 1.10 * best.step_time, (found.step_time, best.step_time)
    problem = Problem(graph, 16, None, params, "data_parallel", model)
    start = recursive_programming(problem, {})
    single = list(start)
    movable = [v for v, var in enumerate(problem.variables) if not var.fixed and len(var.options) > 1]
    _single_moves(problem, single, movable, float("inf"))
    chained = refine(problem, start)
    assert problem.evaluate(chained)[0] < problem.evaluate(single)[0]  # the chain move is what got it there


def test_propagation_from_a_whole_batch_tries_its_layouts_as_the_dataset_strategy(caplog):
    """full_batch, nothing configured: every layout of the batch is a free local slice, so ranking communication
    first would leave the first MatMul whichever cut communicates nothing (here its weight's columns, then an
    all-to-all to the data-parallel rest). Propagation tries the batch's layouts as dataset strategies and keeps the
    cheapest plan: on small weights and a large batch, data parallelism, dynamic_programming's optimum."""
    from search_testkit import stacked_layers

    from tessel.compiler.parallel.search.cost_model import Link

    graph, params = stacked_layers(4, 2048, 256)
    model = CostModel(3e10, 2.5e10, 8 << 30, Link(20e-6, 1.2e10), Link(20e-6, 3e9), ())
    best = search(graph, mode="dynamic_programming", device_num=4, parameters=params, dataset="full_batch",
                  cost_model=model)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="tessel.parallel"):
        found = search(graph, mode="sharding_propagation", device_num=4, parameters=params, dataset="full_batch",
                       cost_model=model)  # fmt: skip
    assert "layouts of it tried as the dataset strategy" in caplog.text
    assert found.step_time <= best.step_time * (1 + 1e-9), (found.step_time, best.step_time)
    assert all(found.strategies[n] == ((4, 1), (1, 1)) for n in by_op(graph, "MatMul"))
