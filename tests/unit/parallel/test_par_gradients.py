"""Gradients inside a parallel graph: a GradientOf node (what value_and_grad records) is differentiated on each
rank's graph after the pass; the update that follows runs where the parameter's slices are; inputs whose layout
an earlier plan decided keep it. Every rank's result is checked against the single device (float32 rounding)."""

from __future__ import annotations

import numpy as np
import pytest
from par_testkit import by_op, compute

from tessel.compiler import TensorSpec, apply, expand_gradients, lower_rank_program, simulate, trace
from tessel.compiler.builder import apply_all
from tessel.compiler.parallel import Layout, assemble, collective_counts, parallelize
from tessel.core.errors import ConfigurationError

rng = np.random.default_rng(5)


def sgd_step(x, y, w1, w2, lr):
    """An MLP's loss, its gradients and a plain SGD update, in one graph (a jit-compiled functional step)."""
    h = apply("ReLU", apply("MatMul", x, w1))
    out = apply("MatMul", h, w2)
    loss = ((out - y) * (out - y)).mean()
    g1, g2 = apply_all("GradientOf", loss, w1, w2)
    apply("Assign", w1, w1 - lr * g1)
    apply("Assign", w2, w2 - lr * g2)
    return loss


def _graph():
    shapes = ((8, 6), (8, 4), (6, 16), (16, 4), ())
    return trace(sgd_step, *(TensorSpec(s) for s in shapes)).graph


def _feeds():
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return {"x": f32(8, 6), "y": f32(8, 4), "w1": f32(6, 16), "w2": f32(16, 4), "lr": np.array(0.1, np.float32)}


def _single(graph, feeds):
    program = lower_rank_program(expand_gradients(graph), state=["w1", "w2"], world_size=1)
    (store,) = simulate([program], [dict(feeds)], compute(), runs=3)
    return store, program


def _parallel(plan, feeds):
    n = plan.device_num
    programs = [lower_rank_program(plan.rank_graph(r), state=["w1", "w2"], world_size=n) for r in range(n)]
    stores = simulate(programs, [plan.local_feeds(feeds, r) for r in range(n)], compute(), runs=3)
    return stores, programs


@pytest.mark.parametrize(
    ("devices", "cuts"),
    [
        (2, (((1, 1), (1, 2)), ((1, 2), (2, 1)))),  # Megatron: w1 by columns, w2 by rows
        (4, (((2, 1), (1, 2)), ((2, 2), (2, 1)))),  # Megatron with 2 data-parallel copies
        (4, None),  # no strategy: data parallel, parameters replicated
    ],
)
def test_a_train_step_with_gradients_and_updates_equals_one_device(devices, cuts):
    graph, feeds = _graph(), _feeds()
    matmuls = by_op(graph, "MatMul")
    strategies = dict(zip(matmuls, cuts)) if cuts else {}
    plan = parallelize(graph, strategies, devices, parameters=["w1", "w2"], dataset="full_batch")
    want, single = _single(graph, feeds)
    stores, programs = _parallel(plan, feeds)
    for name in ("w1", "w2"):
        got = assemble([s[name] for s in stores], plan.input_layout(name), feeds[name].shape)
        np.testing.assert_allclose(got, want[name], rtol=1e-5, atol=1e-6, err_msg=name)
        assert stores[0][name].shape == plan.input_layout(name).local_shape(feeds[name].shape)
    for store, program in zip(stores, programs):
        np.testing.assert_allclose(store[program.outputs[0]], want[single.outputs[0]], rtol=1e-5)


def test_the_update_runs_where_the_slices_are():
    """Without strategies of their own, the optimizer's ops follow the parameter's layout: no collective moves
    a weight or a gradient for the update."""
    graph = _graph()
    matmuls = by_op(graph, "MatMul")
    plan = parallelize(graph, {matmuls[0]: ((1, 1), (1, 2)), matmuls[1]: ((1, 2), (2, 1))}, 2, ["w1", "w2"])
    for node in by_op(graph, "Sub"):
        placement = plan.placements[node]
        if node.inputs[0].name in ("w1", "w2"):
            assert placement.origin == "follows its input"
            assert placement.outputs[0].same_as(plan.input_layout(node.inputs[0].name))
    update = set(by_op(graph, "Sub")[-2:]) | set(by_op(graph, "Mul")[-2:]) | set(by_op(graph, "Assign"))
    assert not [key for key in plan.redistributions if key[0] in update]


def test_a_fixed_layout_is_kept_and_redistributed_where_a_consumer_wants_another():
    """A parameter sliced by an earlier plan (rows over 2 devices) read by a MatMul that wants it whole: the
    rank graph gathers it, and the result still equals one device."""
    graph = trace(lambda x, w: apply("MatMul", x, w), TensorSpec((4, 6)), TensorSpec((6, 3))).graph
    rows = Layout.from_strategy((2, 1), 2)
    plan = parallelize(graph, {}, 2, parameters=["w"], dataset="full_batch", fixed={"w": rows})
    assert plan.input_layout("w").same_as(rows)
    assert collective_counts(plan.rank_graph(0))["AllGather"] == 1
    feeds = {"x": rng.standard_normal((4, 6)).astype(np.float32), "w": rng.standard_normal((6, 3)).astype(np.float32)}
    programs = [lower_rank_program(plan.rank_graph(r), world_size=2) for r in range(2)]
    stores = simulate(programs, [plan.local_feeds(feeds, r) for r in range(2)], compute())
    got = assemble([s[p.outputs[0]] for s, p in zip(stores, programs)], plan.output_layouts[0], (4, 3))
    np.testing.assert_allclose(got, feeds["x"] @ feeds["w"], rtol=1e-5, atol=1e-6)


def test_an_output_layout_can_be_asked_for():
    graph = trace(lambda x, w: apply("MatMul", x, w), TensorSpec((4, 6)), TensorSpec((6, 8))).graph
    (matmul,) = by_op(graph, "MatMul")
    rows = Layout.from_strategy((2, 1), 2)
    plan = parallelize(graph, {matmul: ((1, 1), (1, 2))}, 2, ["w"], "full_batch", output_layouts=[rows])
    assert plan.output_layouts[0].same_as(rows)
    assert plan.rank_graph(1).outputs[0].shape == (2, 8)


def test_fixed_layouts_are_checked():
    graph = trace(lambda x, w: apply("MatMul", x, w), TensorSpec((4, 6)), TensorSpec((6, 3))).graph
    with pytest.raises(ConfigurationError, match=r"laid out over 4 devices .* the plan over 2"):
        parallelize(graph, {}, 2, ["w"], fixed={"w": Layout.from_strategy((2, 1), 4)})
    with pytest.raises(ConfigurationError, match=r"fixed layouts \['v'\] are not inputs"):
        parallelize(graph, {}, 2, ["w"], fixed={"v": Layout.replicated(2, 2)})
    with pytest.raises(ConfigurationError, match="cannot be split"):
        parallelize(graph, {}, 2, ["w"], fixed={"w": Layout.from_strategy((1, 2), 2)})


def test_a_loss_of_partial_sums_is_all_reduced_once():
    """Data parallel: the loss is a partial sum on every rank; its AllReduce runs forward only (the gradient starts
    from the partial sums, so no collective carries the seed back), and the step still equals one device."""
    graph, feeds = _graph(), _feeds()
    plan = parallelize(graph, {}, 4, parameters=["w1", "w2"])
    want, single = _single(graph, feeds)
    stores, programs = _parallel(plan, feeds)
    for name in ("w1", "w2"):
        np.testing.assert_allclose(stores[0][name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(stores[0][programs[0].outputs[0]], want[single.outputs[0]], rtol=1e-5)
    expanded = expand_gradients(plan.rank_graph(0))
    scalars = [n for n in expanded.nodes if n.op == "AllReduce" and n.inputs[0].shape == ()]
    assert len(scalars) == 1, scalars  # the loss, forward; before: a second one, the seed's, backward
    assert collective_counts(expanded)["AllReduce"] == 3  # plus w1's and w2's gradient
