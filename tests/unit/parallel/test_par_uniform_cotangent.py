"""The AllReduce that sums a row-parallel MatMul's partial results needs no collective in its transpose when every
rank of its group gets the same cotangent: the parallel pass proves it on the dataflow (every value between the
AllReduce's result and the loss held alike on the group's ranks, ParallelPlan.uniform_cotangent), not by name.
Where the downstream is cut per rank, the transpose keeps its AllReduce. Either way the gradients equal the numpy
float64 reference and the one-device run."""

from __future__ import annotations

import numpy as np
import pytest
from par_testkit import by_op, compute, on_ranks, parallel_grads

from tessel.compiler import TensorSpec, apply, expand_gradients, lower_rank_program, simulate, trace
from tessel.compiler.autodiff import grad_graph
from tessel.compiler.builder import apply_all
from tessel.compiler.parallel import assemble, parallelize

rng = np.random.default_rng(14)
SHAPES = {"x": (8, 6), "y": (8, 4), "w1": (6, 16), "w2": (16, 4)}


def megatron(x, y, w1, w2):
    """Column-parallel then row-parallel MatMul, a replicated mean-square loss, its gradients."""
    out = apply("MatMul", apply("ReLU", apply("MatMul", x, w1)), w2)
    d = out - y
    loss = (d * d).mean()
    g1, g2 = apply_all("GradientOf", loss, w1, w2)
    return loss, g1, g2


def megatron_then_cut(x, y, w1, w2):
    """The same, but the row-parallel output (all-reduced for a replicated ReLU) is then cut per rank by rows."""
    out = apply("ReLU", apply("MatMul", apply("ReLU", apply("MatMul", x, w1)), w2))
    d = out - y
    loss = (d * d).mean()
    g1, g2 = apply_all("GradientOf", loss, w1, w2)
    return loss, g1, g2


def megatron_forward(x, y, w1, w2):
    """The forward alone: the SDK's train step differentiates the rank graph from its loss output."""
    d = apply("MatMul", apply("ReLU", apply("MatMul", x, w1)), w2) - y
    return (d * d).mean()


def _plan(fn, devices: int, cut: bool):
    graph = trace(fn, *(TensorSpec(s) for s in SHAPES.values())).graph
    first, second = by_op(graph, "MatMul")
    strategies = {first: ((1, 1), (1, devices)), second: ((1, devices), (devices, 1))}
    relus = by_op(graph, "ReLU")
    strategies[relus[0]] = ((1, devices),)
    if cut:
        strategies[relus[1]] = ((1, 1),)  # replicated: the row-parallel output is all-reduced for it
    for node in graph.nodes:
        if node not in strategies and node.op != "GradientOf":  # the loss: rows per rank when cut, else replicated
            rows = devices if cut else 1
            strategies[node] = tuple((rows,) + (1,) * (v.ndim - 1) if v.ndim else () for v in node.inputs)
    return graph, parallelize(graph, strategies, devices, parameters=["w1", "w2"], dataset="full_batch")


def _feeds():
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}


def _reference(feeds, cut: bool):
    """loss, d loss/d w1, d loss/d w2 in float64."""
    x, y, w1, w2 = (feeds[k].astype(np.float64) for k in ("x", "y", "w1", "w2"))
    a = x @ w1
    h = np.maximum(a, 0)
    out = h @ w2
    r = np.maximum(out, 0) if cut else out
    d = r - y
    dr = 2 * d / d.size
    dout = dr * (out > 0) if cut else dr
    dh = dout @ w2.T * (a > 0)
    return (d * d).mean(), x.T @ dh, h.T @ dout


def _backward_all_reduces(plan) -> list:
    """The AllReduce nodes of rank 0's graph that its GradientOf expands to (the transposes of the forward's)."""
    origins = plan.rank_origins(0)
    gradient = lambda n: getattr(origins.get(n), "op", None) == "GradientOf"  # noqa: E731
    return [n for n in plan.rank_graph(0).nodes if n.op == "AllReduce" and gradient(n)]


def _check_gradients(graph, plan, feeds, want):
    n = plan.device_num
    outs = on_ranks(plan, [plan.rank_graph(r) for r in range(n)], feeds)
    single = lower_rank_program(expand_gradients(graph), world_size=1)
    (store,) = simulate([single], [dict(feeds)], compute())
    for k, (name, ref) in enumerate(zip(("loss", "dw1", "dw2"), want)):
        got = assemble([o[k] for o in outs], plan.output_layouts[k], np.shape(ref))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=f"{name} vs float64")
        np.testing.assert_allclose(got, store[single.outputs[k]], rtol=1e-5, atol=1e-6, err_msg=f"{name} vs 1 device")


@pytest.mark.parametrize("devices", [2, 4])
def test_a_replicated_loss_after_a_row_parallel_matmul_needs_no_backward_all_reduce(devices):
    graph, plan = _plan(megatron, devices, cut=False)
    (forward,) = [n for n in plan.rank_graph(0, expand_gradients=False).nodes if n.op == "AllReduce"]
    assert forward.attrs["uniform_cotangent"] == 1 and forward.attrs["fusion"] == 0
    assert _backward_all_reduces(plan) == []  # before: AllReduce of the cotangent of the row-parallel output
    feeds = _feeds()
    _check_gradients(graph, plan, feeds, _reference(feeds, cut=False))


def test_a_downstream_cut_per_rank_keeps_the_backward_all_reduce():
    graph, plan = _plan(megatron_then_cut, 2, cut=True)
    key = (by_op(graph, "ReLU")[1], 0)
    assert plan.redistributions[key].collectives == ("AllReduce",)
    assert not plan.uniform_cotangent(key)  # the Sub after the ReLU reads its own rows: the cotangents differ
    backward = _backward_all_reduces(plan)
    assert [n.inputs[0].shape for n in backward] == [(8, 4)], backward
    feeds = _feeds()
    _check_gradients(graph, plan, feeds, _reference(feeds, cut=True))


def test_a_rank_graph_differentiated_from_its_replicated_loss_output_needs_no_backward_all_reduce():
    """build_train_step's way (the SDK's): autodiff of the rank forward graph from output 0, seeded alike on every
    rank of a replicated loss."""
    _, plan = _plan(megatron_forward, 2, cut=False)
    (forward,) = [n for n in plan.rank_graph(0).nodes if n.op == "AllReduce"]
    assert forward.attrs["uniform_cotangent"] == 1
    train = grad_graph(plan.rank_graph(0), ["w1", "w2"])
    assert len([n for n in train.nodes if n.op == "AllReduce"]) == 1  # the forward one only
    feeds = _feeds()
    want = _reference(feeds, cut=False)
    losses, _, full = parallel_grads(plan, feeds, ["w1", "w2"])
    for loss in losses:
        np.testing.assert_allclose(loss, want[0], rtol=1e-5)
    np.testing.assert_allclose(full["w1"], want[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(full["w2"], want[2], rtol=1e-5, atol=1e-6)
