"""Strategy files: a plan saved as JSON loads back into the same plan; a file saved for another net is an error
naming the first op that differs and the fix."""

from __future__ import annotations

import json

import pytest
from par_testkit import by_op, traced
from search_testkit import mlp_graph, shared_graph

from tessel.compiler.builder import apply
from tessel.compiler.parallel import Strategy, parallelize
from tessel.compiler.parallel.search import load_strategy_file, save_strategy_file, search
from tessel.core.errors import ConfigurationError


def placements(plan):
    return [(p.strategy, p.device_matrix, p.inputs, p.outputs, p.out_targets) for p in plan.placements.values()]


@pytest.mark.parametrize("mode", ["sharding_propagation", "dynamic_programming"])
def test_a_saved_plan_loads_back_into_the_same_plan(tmp_path, mode):
    graph, params = shared_graph()
    first, second = by_op(graph, "MatMul")
    fixed = {first: Strategy(((1, 2), (2, 1)), ((2, 1),)), by_op(graph, "ReLU")[0]: "data_parallel"}
    found = search(graph, mode=mode, device_num=2, fixed=fixed, parameters=params)
    plan = parallelize(graph, found.strategies, 2, params)
    path = tmp_path / "strategy.json"
    save_strategy_file(plan, path)
    again = parallelize(graph, load_strategy_file(path, graph), 2, params)
    assert placements(again) == placements(plan)
    document = json.loads(path.read_text())
    assert document["graph"]["hash"] == graph.hash and document["device_num"] == 2
    entry = document["ops"][0]
    assert entry["op"] == "MatMul" and entry["index"] == 0 and entry["source"] == first.source
    assert entry["strategy"] == [[1, 2], [2, 1]] and entry["out_strategy"] == [[2, 1]] and entry["origin"] == "shard()"
    assert entry["node"].startswith("%0: f32[8,8] = MatMul(%x, %w)")
    # Strategies (not a plan) save too, given the graph; they load back as given.
    save_strategy_file(found, tmp_path / "found.json", graph=graph, device_num=2)
    loaded = load_strategy_file(tmp_path / "found.json", graph)
    assert loaded[second] == found.strategies[second] and loaded[by_op(graph, "ReLU")[0]] == "data_parallel"
    with pytest.raises(ConfigurationError, match="needs graph="):
        save_strategy_file(found.strategies, tmp_path / "x.json")


def test_a_file_saved_for_another_net_names_the_first_op_that_differs(tmp_path):
    graph, params = mlp_graph()
    path = tmp_path / "mlp.json"
    save_strategy_file(parallelize(graph, {}, 2, params), path)

    def other(x, w1, b1, w2):  # Sigmoid where the MLP has ReLU
        h = apply("Sigmoid", apply("BiasAdd", apply("MatMul", x, w1), b1))
        return apply("MatMul", h, w2).mean()

    changed = traced(other, (8, 16), (16, 16), (16,), (16, 8))
    with pytest.raises(ConfigurationError) as caught:
        load_strategy_file(path, changed)
    message = str(caught.value)
    assert "was saved for another net" in message and "first op that differs is #2" in message
    assert "`%2: f32[8,16] = ReLU(%1)` in the file but `%2: f32[8,16] = Sigmoid(%1)` in this net" in message
    assert "Fix: plan the strategies for this net again" in message

    def longer(x, w1, b1, w2):  # the MLP, then one more op
        h = apply("ReLU", apply("BiasAdd", apply("MatMul", x, w1), b1))
        return apply("Neg", apply("MatMul", h, w2).mean())

    with pytest.raises(ConfigurationError, match=r"the file has 5 ops and this net 6; op #5 `%5: f32\[\] = Neg"):
        load_strategy_file(path, traced(longer, (8, 16), (16, 16), (16,), (16, 8)))
    with pytest.raises(
        ConfigurationError, match=r"its inputs are \['x: f32\[8,16\]'.* this net's are \['x: f32\[4,16\]'"
    ):
        load_strategy_file(path, traced(longer, (4, 16), (16, 16), (16,), (16, 8)))
    (tmp_path / "bad.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ConfigurationError, match="is not a tessel strategy file"):
        load_strategy_file(tmp_path / "bad.json", graph)


def test_a_file_loads_where_the_parameters_serials_differ(tmp_path):
    # parameter inputs are named "<name>#<serial>", and the serial counts Parameters made in the process: another
    # run or script numbers the same net's parameters otherwise
    from tessel.common.compiled import rename_inputs

    graph, params = mlp_graph()
    numbered = {name: f"{name}#0" for name in params}
    first = rename_inputs(graph, numbered)
    path = tmp_path / "mlp.json"
    save_strategy_file(parallelize(first, {}, 2, list(numbered.values())), path)
    later = rename_inputs(graph, {name: f"{name}#7" for name in params})
    assert later.hash != first.hash
    assert len(load_strategy_file(path, later)) == len(load_strategy_file(path, first))
