"""Strategies: MindSpore's defaults (data parallel, repeated calculation, Cell.set_data_parallel), out_strategy,
and every way a strategy can be wrong, each with a message naming the op, input, dim, size, cut and a fix."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from par_testkit import by_op, close, parallel_forward, single_device, traced

from tessel.compiler.builder import apply
from tessel.compiler.parallel import DATA_PARALLEL, Layout, Strategy, StrategyError, collective_counts, parallelize
from tessel.compiler.tracer import TensorSpec, trace
from tessel.core.errors import ConfigurationError

rng = np.random.default_rng(3)


def matmul_graph(m=8, k=4, n=6):
    return traced(lambda x, w: apply("MatMul", x, w), (m, k), (k, n))


def plan_matmul(strategy, devices=4, **shape):
    graph = matmul_graph(**shape)
    return parallelize(graph, {0: strategy}, devices, parameters=["w"], dataset="full_batch")


@pytest.mark.parametrize(
    ("strategy", "shape", "message"),
    [
        (((3, 1), (1, 1)), {"m": 6}, r"MatMul.*cuts the op into 3 parts.*on 4 devices.*equal device_num or divide it"),
        (((4, 1), (1, 1)), {"m": 6}, r"MatMul.*input 0 dim 0 has size 6, which cannot be split into 4 parts"),
        (((1, 1),), {}, r"MatMul.*in_strategy \(\(1, 1\),\) has 1 entries, but MatMul takes 2 inputs"),
        (((1, 1, 1), (1, 1)), {}, r"MatMul.*input 0 \(8, 4\) has 2 dims but its strategy \(1, 1, 1\) has 3"),
        (((1, 2), (4, 1)), {}, r"input 1 dim 0 and input 0 dim 1 are the same dim of MatMul.*got 4 and 2"),
    ],
)
def test_invalid_strategies_name_op_input_dim_and_a_valid_alternative(strategy, shape, message):
    with pytest.raises(StrategyError, match=message) as err:
        plan_matmul(strategy, **shape)
    assert "A valid strategy: " in str(err.value)
    valid = eval(str(err.value).split("A valid strategy: ")[1])  # the suggestion really is valid
    plan_matmul(valid, **shape)


def test_a_dim_an_op_needs_whole_cannot_be_split():
    graph = traced(lambda x: apply("Softmax", x), (8, 6))
    with pytest.raises(StrategyError, match=r"Softmax.*input 0 dim 1 \(size 6\) cannot be split \(the softmax axis\)"):
        parallelize(graph, {0: ((1, 2),)}, 2)
    graph = traced(lambda x: apply("Reshape", x, shape=(8, 24)), (8, 6, 4))
    with pytest.raises(StrategyError, match=r"Reshape.*dim 2.*merges or splits it"):
        parallelize(graph, {0: ((1, 1, 2),)}, 2)


def test_a_parameter_used_by_two_ops_must_get_one_strategy():
    def f(x, w):
        return apply("MatMul", x, w) + apply("MatMul", x, w)

    graph = traced(f, (8, 4), (4, 6))
    first, second = by_op(graph, "MatMul")
    with pytest.raises(
        StrategyError, match=r"parameter 'w' \(4, 6\) is used by MatMul.*\(\(1, 1\), \(1, 2\)\).*by MatMul"
    ):
        parallelize(graph, {first: ((1, 1), (1, 2)), second: ((1, 2), (2, 1))}, 2, parameters=["w"])
    plan = parallelize(graph, {first: ((1, 1), (1, 2)), second: ((2, 1), (1, 2))}, 4, parameters=["w"])
    assert plan.input_layout("w").same_as(Layout.from_axes((2, 2), ((), (1,))))


def test_unconfigured_ops_run_data_parallel_and_never_cut_parameters():
    def f(x, w):
        return apply("ReduceSum", apply("MatMul", x, w * 2.0), axis=-1)

    graph = traced(f, (8, 4), (4, 6))
    plan = parallelize(graph, {}, 4, parameters=["w"])
    strategies = {n.op: (plan.placements[n].origin, plan.placements[n].strategy) for n in graph.nodes}
    assert strategies["MatMul"] == ("data parallel", ((4, 1), (1, 1)))  # MindSpore: ((device_num, 1), (1, 1))
    assert strategies["ReduceSum"] == ("data parallel", ((4, 1),))
    assert strategies["Mul"] == ("replicated", ((1, 1), ()))  # w * 2 keeps w whole
    assert plan.input_layout("w").replicas == 4
    feeds = {"x": rng.standard_normal((8, 4)).astype(np.float32), "w": rng.standard_normal((4, 6)).astype(np.float32)}
    close(parallel_forward(plan, feeds)[0], single_device(graph, feeds)[0])


def test_data_parallel_falls_back_to_repeated_calculation_or_replication():
    graph = traced(lambda x: apply("ReLU", x), (6, 4))
    placement = parallelize(graph, {}, 4, dataset="full_batch").placements[graph.nodes[0]]
    assert placement.strategy == ((2, 1),) and placement.device_matrix == (2, 2)  # 6 rows: cut 2, 2 copies
    graph = traced(lambda x: apply("Softmax", x, axis=0), (8, 4))
    assert parallelize(graph, {}, 4).placements[graph.nodes[0]].origin == "replicated"


def test_repeated_calculation_puts_the_copies_on_the_leading_axis():
    placement = plan_matmul(((2, 1), (1, 1)), devices=8).placements
    (p,) = placement.values()
    assert p.device_matrix == (4, 2)
    assert p.inputs[0] == Layout((4, 2), (0, -1)) and p.inputs[1].replicas == 8


def test_set_data_parallel_and_primitive_strategies():
    graph = matmul_graph()
    assert parallelize(graph, {0: DATA_PARALLEL}, 4).placements == parallelize(graph, {}, 4).placements

    class Primitive:  # what the SDK's Primitive holds after .shard()
        in_strategy, out_strategy = ((2, 2), (2, 1)), None

    assert Strategy.of(Primitive()) == Strategy(((2, 2), (2, 1)))
    assert parallelize(graph, {0: Primitive()}, 4).placements[graph.nodes[0]].strategy == ((2, 2), (2, 1))


def test_out_strategy_turns_the_all_reduce_into_a_reduce_scatter():
    graph = matmul_graph()
    plan = parallelize(graph, {0: Strategy(((2, 2), (2, 1)), ((4, 1),))}, 4, parameters=["w"], dataset="full_batch")
    assert collective_counts(plan.rank_graph(0)) == Counter({"ReduceScatter": 1})
    assert plan.output_layouts[0].splits == (4, 1)
    feeds = {"x": rng.standard_normal((8, 4)).astype(np.float32), "w": rng.standard_normal((4, 6)).astype(np.float32)}
    close(parallel_forward(plan, feeds)[0], single_device(graph, feeds)[0])
    with pytest.raises(StrategyError, match=r"out_strategy entry \(3, 1\).*A valid out_strategy: \(\(2, 1\),\)"):
        parallelize(graph, {0: Strategy(((2, 2), (2, 1)), ((3, 1),))}, 4)


def test_dataset_strategies():
    graph = matmul_graph()
    assert parallelize(graph, {}, 4).input_layout("x").splits == (4, 1)  # data parallel: each rank its rows
    assert parallelize(graph, {}, 4, dataset="full_batch").input_layout("x").splits == (1, 1)
    assert parallelize(graph, {}, 4, dataset=[(1, 4), None]).input_layout("x").splits == (1, 4)
    with pytest.raises(ConfigurationError, match=r"input 'x' \(6, 4\): its batch dim 6 .* full_batch=True"):
        parallelize(matmul_graph(m=6), {}, 4)


def test_graphs_and_strategies_the_pass_rejects():
    with pytest.raises(ConfigurationError, match="needs static shapes"):
        parallelize(trace(lambda x: x * 2.0, TensorSpec(("N", 4))).graph, {}, 2)
    with pytest.raises(ConfigurationError, match="not a node of graph"):
        parallelize(matmul_graph(), {matmul_graph().nodes[0]: ((1, 1), (1, 1))}, 2)
    with pytest.raises(ConfigurationError, match=r"parameters \['v'\] are not inputs"):
        parallelize(matmul_graph(), {}, 2, parameters=["v"])


def test_candidate_strategies_and_their_cost_for_a_future_search():
    from tessel.compiler import registry
    from tessel.compiler.parallel.cost import candidates, local_cost, placement_cost
    from tessel.compiler.parallel.strategy import place

    graph = matmul_graph(m=8, k=4, n=6)
    node = graph.nodes[0]
    spec = registry.get("MatMul").sharding_spec(node)
    found = list(candidates(node, spec, 4))
    assert {} in found and {"m": 4} in found and {"m": 2, "k": 2} in found and {"n": 2, "k": 2} in found
    assert all(8 % c.get("m", 1) == 0 and 6 % c.get("n", 1) == 0 for c in found)
    assert {"n": 4} not in found  # 6 columns do not cut in 4
    whole, rows = place(node, spec, {}, 4, "x"), place(node, spec, {"m": 4}, 4, "x")
    assert local_cost(node, spec, rows).flops * 4 == local_cost(node, spec, whole).flops == 2 * 8 * 4 * 6
    arriving = [Layout.from_strategy((4, 1), 4), Layout.replicated(2, 4)]
    # rows cut like the input arrives: no communication; the whole op on every rank: x must be gathered first
    assert placement_cost(node, spec, rows, arriving) < placement_cost(node, spec, whole, arriving)


def test_scalar_inputs_may_be_left_out_of_a_strategy_and_one_device_changes_nothing():
    graph = traced(lambda x: x * 2.0, (8, 6))
    (mul,) = by_op(graph, "Mul")
    assert parallelize(graph, {mul: ((4, 1),)}, 4).placements[mul].strategy == ((4, 1), ())
    plan = parallelize(graph, {mul: ((1, 1),)}, 1)
    assert [n.op for n in plan.rank_graph(0).nodes] == [n.op for n in graph.nodes]
    with pytest.raises(ConfigurationError, match="rank 1 is outside the world of 1 devices"):
        plan.rank_graph(1)


def test_a_whole_input_read_only_in_slices_arrives_sliced_with_slice_whole_inputs():
    """full_batch with slice_whole_inputs=True: x, which the data-parallel MatMul reads in rows, arrives as each
    rank's rows (no slice left in the rank graph), and the outputs equal the whole-input plan's and one device's;
    an input some consumer reads whole stays whole."""
    graph = traced(lambda x, w, z: apply("Add", apply("MatMul", x, w), apply("MatMul", z, w)), (8, 4), (4, 6), (8, 4))
    first, second = by_op(graph, "MatMul")
    strategies = {first: ((4, 1), (1, 1)), second: ((1, 1), (1, 1))}
    feeds = {"x": rng.standard_normal((8, 4)), "w": rng.standard_normal((4, 6)), "z": rng.standard_normal((8, 4))}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    whole = parallelize(graph, strategies, 4, parameters=["w"], dataset="full_batch")
    sliced = parallelize(graph, strategies, 4, parameters=["w"], dataset="full_batch", slice_whole_inputs=True)
    assert whole.input_layout("x").local_shape((8, 4)) == (8, 4)
    assert sliced.input_layout("x").local_shape((8, 4)) == (2, 4)  # each rank is sent its rows
    assert sliced.input_layout("z").local_shape((8, 4)) == (8, 4)  # read whole by the second MatMul
    assert not any(key[0] != "output" and key[1] == 0 and key[0] is first for key in sliced.redistributions)
    assert tuple(sliced.rank_graph(1).input("x").shape) == (2, 4)
    np.testing.assert_array_equal(sliced.local_value("x", feeds["x"], 1), feeds["x"][2:4])
    want = single_device(graph, feeds)[0]
    close(parallel_forward(sliced, feeds)[0], want, what="sliced")
    close(parallel_forward(whole, feeds)[0], want, what="whole")


def test_a_layout_for_another_device_count_is_refused_naming_the_rule():
    from tessel.parallel import Layout as UserLayout

    graph = traced(lambda x, w: apply("MatMul", x, w), (16, 16), (16, 16))
    for matrix in ((2, 2), (4, 4)):  # 4 and 16 devices on a plan of 8: used to run wrong or fail deep inside
        user = UserLayout(matrix, ("dp", "mp"))
        strategy = (user("dp", "None").compiler_layout(), user("None", "mp").compiler_layout())
        with pytest.raises(StrategyError, match=r"multiplies to the device count .* for 8 devices"):
            parallelize(graph, {0: strategy}, 8, parameters=["x", "w"], dataset="full_batch")
    with pytest.raises(StrategyError, match="dataset_strategy's layout of input 'x'"):
        wrong = UserLayout((2, 2), ("dp", "mp"))
        parallelize(graph, {}, 8, parameters=["w"], dataset=(wrong("dp", "None").compiler_layout(),))
