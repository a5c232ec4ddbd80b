"""The cost model prices what the parallel pass lowers: the AllReduce that sums a row-parallel MatMul's partial
results into a last op (nothing reads its outputs but the graph's) whose cotangent is the same on every rank of the
group (ParallelPlan.uniform_cotangent) has no backward collective, so predict_step_time and the search's edge term
price it forward only; every other move, a sum whose downstream is cut per rank included, forward and backward. The
search objective still equals the prediction exactly, and the cheaper price can turn the search to the Megatron plan."""

from __future__ import annotations

import math
import random

import pytest
from par_testkit import by_op, traced

from tessel.compiler.autodiff import grad_graph
from tessel.compiler.builder import apply
from tessel.compiler.parallel import parallelize
from tessel.compiler.parallel.partition import sums_partials
from tessel.compiler.parallel.search import CostModel, plan_strategies, predict_step_time
from tessel.compiler.parallel.search.problem import Problem
from tessel.compiler.tracer import TensorSpec, trace

PARAMS = ["w1", "w2"]


def megatron(batch=8, hidden=16, inner=32, out=8, pairs=1):
    """MatMul, ReLU, MatMul (`pairs` times), then the mean: column-parallel then row-parallel, the loss reads the
    last sum replicated."""

    def net(x, *weights):
        h = x
        for w1, w2 in zip(weights[0::2], weights[1::2]):
            h = apply("MatMul", apply("ReLU", apply("MatMul", h, w1)), w2)
        return h.mean()

    shapes = [(batch, hidden)] + [(hidden, inner), (inner, hidden)] * (pairs - 1) + [(hidden, inner), (inner, out)]
    specs = [TensorSpec(shapes[0], name="x")] + [TensorSpec(s, name=f"w{i + 1}") for i, s in enumerate(shapes[1:])]
    return trace(net, *specs).graph


def megatron_head():
    """The same MLP, then a head MatMul that is the last op: its output (not a scalar) leaves the graph."""

    def net(x, w1, w2, w3):
        return apply("MatMul", apply("MatMul", apply("ReLU", apply("MatMul", x, w1)), w2), w3)

    return traced(net, (8, 16), (16, 32), (32, 8), (8, 4))


def megatron_then_cut():
    """The row-parallel sum read by a replicated ReLU, then a loss computed on rows cut per rank
    (test_par_uniform_cotangent.py's case)."""

    def net(x, y, w1, w2):
        d = apply("ReLU", apply("MatMul", apply("ReLU", apply("MatMul", x, w1)), w2)) - y
        return (d * d).mean()

    return traced(net, (8, 16), (8, 8), (16, 32), (32, 8))


def megatron_cuts(graph, n: int) -> dict:
    """Columns for the first MatMul of each pair (and its ReLU), rows for the second; the rest replicated."""
    matmuls, relus = by_op(graph, "MatMul"), by_op(graph, "ReLU")
    strategies = {}
    for first, relu, second in zip(matmuls[0::2], relus, matmuls[1::2]):
        strategies.update({first: ((1, 1), (1, n)), relu: ((1, n),), second: ((1, n), (n, 1))})
    for node in graph.nodes:
        strategies.setdefault(node, tuple((1,) * v.ndim for v in node.inputs))
    return strategies


def choice_of(problem: Problem, strategies: dict) -> list[int]:
    """The options of `problem` that take `strategies`."""
    choice = []
    for var in problem.variables:
        want = strategies[var.node]
        choice.append(next(a for a, o in enumerate(var.options) if o.placement.strategy == want))
    return choice


def sums(plan) -> dict:
    """The routes of the plan's AllReduces of partial sums (into ops) -> their moves."""
    return {k: m for k, m in plan.redistributions.items() if k[0] != "output" and sums_partials(m, m.target)}


def the_sum(plan):
    """The route of the plan's one AllReduce of partial sums, and its move."""
    ((key, move),) = sums(plan).items()
    return key, move


def forward_price(model, move) -> float:
    return model.redistribution_time(move.source, move.target, move.shape, 4) + model.launch_overhead


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("pairs", [1, 2])
def test_the_sum_into_a_replicated_loss_is_priced_once_as_the_pass_lowers_it(devices, pairs):
    """A Megatron MLP, full batch: its only moves are the row-parallel sums. The last one, read by the replicated
    loss, needs no backward AllReduce; the one before it feeds the next column-parallel layer (every rank its own
    columns: its cotangent differs per rank) and keeps it. The prediction drops by exactly that one AllReduce of
    the last activation, and counts what the rank's train step runs."""
    graph = megatron(pairs=pairs)
    params = [v.name for v in graph.inputs[1:]]
    model = CostModel.default_cpu(devices)
    strategies = megatron_cuts(graph, devices)
    plan = parallelize(graph, strategies, devices, params, dataset="full_batch")
    moves = sums(plan)
    assert list(plan.redistributions) == list(moves) and len(moves) == pairs
    ways = {key: 1 if plan.uniform_cotangent(key) else 2 for key in moves}
    assert [key[0].op for key, n in ways.items() if n == 1] == ["ReduceMean"]
    step = predict_step_time(plan, model)
    want = sum(n * forward_price(model, moves[key]) for key, n in ways.items())  # before: 2 * each
    assert step.redistribution == pytest.approx(want, rel=1e-12)
    train = grad_graph(plan.rank_graph(0), params)  # what the rank runs: 2 per sum but the last one's 1
    assert [n.op for n in train.nodes].count("AllReduce") == sum(ways.values()) == 2 * pairs - 1
    problem = Problem(graph, devices, {}, params, "full_batch", model)
    time, _ = problem.evaluate(choice_of(problem, strategies))
    assert time == pytest.approx(step.total, rel=1e-12)


def test_a_head_cut_per_rank_after_the_sum_keeps_it_both_ways():
    """One graph, two plans that differ in the last op only: a replicated head reads the sum alike on every rank (its
    output is seeded alike), a column-parallel head gives each rank its own cotangent, which the AllReduce's transpose
    must sum."""
    graph, devices = megatron_head(), 4
    model = CostModel.default_cpu(devices)
    problem = Problem(graph, devices, {}, [*PARAMS, "w3"], "full_batch", model)
    head = by_op(graph, "MatMul")[2]
    prices = {}
    for cut in (1, devices):
        strategies = {**megatron_cuts(graph, devices), head: ((1, 1), (1, cut))}
        plan = parallelize(graph, strategies, devices, [*PARAMS, "w3"], dataset="full_batch")
        key, move = the_sum(plan)
        assert key[0] is head and plan.uniform_cotangent(key) == (cut == 1)
        step = predict_step_time(plan, model)
        assert problem.evaluate(choice_of(problem, strategies))[0] == pytest.approx(step.total, rel=1e-12)
        prices[cut] = step.redistribution / forward_price(model, move)
    assert prices == {1: pytest.approx(1.0), devices: pytest.approx(2.0)}


def test_a_loss_cut_per_rank_after_the_sum_keeps_it_both_ways():
    """The sum read by a replicated ReLU, the loss after it on rows per rank: each rank's cotangent differs, the pass
    keeps the backward AllReduce and the search's edge prices it; the same sum read by a replicated loss, once."""
    graph, devices = megatron_then_cut(), 2
    model = CostModel.default_cpu(devices)
    strategies = megatron_cuts(graph, devices)
    for node in by_op(graph, "Sub") + by_op(graph, "Mul") + by_op(graph, "ReduceMean"):
        strategies[node] = tuple((devices,) + (1,) * (v.ndim - 1) for v in node.inputs)  # rows per rank
    plan = parallelize(graph, strategies, devices, PARAMS, dataset="full_batch")
    key, move = the_sum(plan)
    assert key[0].op == "ReLU" and not plan.uniform_cotangent(key)
    problem = Problem(graph, devices, {}, PARAMS, "full_batch", model)
    k = next(k for k, e in enumerate(problem.edges) if e.target == problem.node_var[key[0]] and e.input == key[1])
    choice = choice_of(problem, strategies)
    edge = problem.edges[k]
    both_ways = 2 * forward_price(model, move)
    assert problem.edge_time(k, choice[edge.source], choice[edge.target]) == pytest.approx(both_ways)
    assert problem.evaluate(choice)[0] == pytest.approx(predict_step_time(plan, model).total, rel=1e-12)
    # and the same sum into a replicated loss (no cut after it) is priced once
    graph = megatron()
    strategies = megatron_cuts(graph, devices)
    _, move = the_sum(parallelize(graph, strategies, devices, PARAMS, dataset="full_batch"))
    problem = Problem(graph, devices, {}, PARAMS, "full_batch", model)
    choice = choice_of(problem, strategies)
    k = next(k for k, e in enumerate(problem.edges) if problem.variables[e.target].node.op == "ReduceMean")
    edge = problem.edges[k]
    assert problem.edge_time(k, choice[edge.source], choice[edge.target]) == pytest.approx(forward_price(model, move))


@pytest.mark.parametrize("devices, dataset", [(2, "data_parallel"), (4, "full_batch"), (4, "data_parallel")])
def test_the_search_objective_is_the_prediction_on_plans_with_and_without_a_uniform_sum(devices, dataset):
    """problem.evaluate(choice) == predict_step_time(parallelize(strategies(choice))) on the Megatron plan and random
    plans of these nets, each sum's edge priced once where the pass lowers it one way (a sum into the last op with a
    uniform cotangent: the sample holds some where the net has one), else twice."""
    model = CostModel.default_cpu(devices, devices_per_host=2)
    for build in (megatron, megatron_head, megatron_then_cut):
        graph = build()
        params = [v.name for v in graph.inputs if v.name.startswith("w")]
        problem = Problem(graph, devices, {}, params, dataset, model)
        rng = random.Random(devices)
        one_way = 0
        choices = [choice_of(problem, megatron_cuts(graph, devices))]
        choices += [[rng.randrange(len(v.options)) for v in problem.variables] for _ in range(20)]
        for choice in choices:
            time, memory = problem.evaluate(choice)
            if math.isinf(time):
                continue
            plan = parallelize(graph, problem.strategies(choice), devices, params, dataset=dataset)
            step = predict_step_time(plan, model)
            assert step.total == pytest.approx(time, rel=1e-12) and step.memory_bytes == pytest.approx(memory)
            moves = sums(plan)
            for k, edge in enumerate(problem.edges):
                key = (problem.variables[edge.target].node, edge.input)
                if edge.output < 0 or key not in moves:
                    continue
                seconds = problem.edge_time(k, choice[edge.source], choice[edge.target])
                ways = 1 if plan.uniform_cotangent(key) and key[0] is graph.nodes[-1] else 2
                assert seconds == pytest.approx(ways * forward_price(model, moves[key]), rel=1e-12), (key, ways)
                one_way += ways == 1
        assert (one_way > 0) == (build is not megatron_then_cut), build.__name__


def test_pricing_the_sum_once_turns_the_search_from_data_parallel_to_megatron():
    """A batch of 128 on 4 devices, weights 64 x 256 and 256 x 64: data parallel all-reduces the weights' gradients,
    Megatron gathers nothing (the activations stay put) and all-reduces the (128, 64) output once. Priced both ways,
    that AllReduce made Megatron the dearer plan; priced as the pass lowers it, Megatron is the cheaper one."""
    graph, devices = megatron(batch=128, hidden=64, inner=256, out=64), 4
    model = CostModel.default_cpu(devices)
    found = plan_strategies(graph, mode="dynamic_programming", device_num=devices, parameters=PARAMS, cost_model=model)
    assert [found[n] for n in graph.nodes] == [((1, 1), (1, 4)), ((1, 4),), ((1, 4), (4, 1)), ((1, 1),)]
    megatron_plan = parallelize(graph, found, devices, PARAMS)
    data_parallel = parallelize(graph, {}, devices, PARAMS)
    saving = predict_step_time(data_parallel, model).total - predict_step_time(megatron_plan, model).total
    _, move = the_sum(megatron_plan)
    assert 0 < saving < forward_price(model, move)  # a second AllReduce would have made data parallel win
