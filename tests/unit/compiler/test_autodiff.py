"""Reverse-mode autodiff on whole graphs: fan-out, broadcasting, unused and non-differentiable inputs, sens,
and a composite network against float64 central differences."""

from __future__ import annotations

import numpy as np
import pytest
from compiler_testkit import numeric_grad, run_graph

from tessel.compiler.autodiff import grad_graph
from tessel.compiler.builder import apply
from tessel.compiler.errors import GradientError
from tessel.compiler.tracer import TensorSpec, trace

rng = np.random.default_rng(5)
F64 = "float64"


def test_fan_out_gradients_add_up():
    # y = x*x + 3x used twice: d/dx sum(y * y) = sum(2 y (2x + 3))
    def f(x):
        y = x * x + 3.0 * x
        return (y * y).sum()

    graph = grad_graph(trace(f, TensorSpec((4,), F64)).graph, ["x"])
    x = rng.standard_normal(4)
    loss, dx = run_graph(graph, {"x": x})
    y = x * x + 3 * x
    np.testing.assert_allclose(loss, (y * y).sum(), rtol=1e-12)
    np.testing.assert_allclose(dx, 2 * y * (2 * x + 3), rtol=1e-12)


def test_broadcast_inputs_get_summed_gradients_with_a_symbolic_batch():
    def f(x, bias, scale):
        return ((x + bias) * scale).sum()

    graph = grad_graph(
        trace(f, TensorSpec(("N", 3, 4), F64), TensorSpec((4,), F64), TensorSpec((3, 1), F64)).graph, ["bias", "scale"]
    )
    for batch in (2, 5):
        x, bias, scale = rng.standard_normal((batch, 3, 4)), rng.standard_normal(4), rng.standard_normal((3, 1))
        _, dbias, dscale = run_graph(graph, {"x": x, "bias": bias, "scale": scale})
        np.testing.assert_allclose(dbias, np.broadcast_to(scale, (batch, 3, 4)).sum((0, 1)), rtol=1e-12)
        np.testing.assert_allclose(dscale, (x + bias).sum((0, 2))[:, None], rtol=1e-12)


def test_unused_parameters_get_zeros_and_int_inputs_are_skipped():
    def f(x, labels, unused):
        return apply("SparseSoftmaxCrossEntropy", x, labels).mean()

    graph = grad_graph(
        trace(f, TensorSpec((2, 3), F64), TensorSpec((2,), "int32"), TensorSpec((5,), F64)).graph, ["x", "unused"]
    )
    x = rng.standard_normal((2, 3))
    _, dx, dunused = run_graph(graph, {"x": x, "labels": np.array([0, 2], np.int32), "unused": np.ones(5)})
    np.testing.assert_array_equal(dunused, np.zeros(5))
    p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    np.testing.assert_allclose(dx, (p - np.eye(3)[[0, 2]]) / 2, rtol=1e-12)
    with pytest.raises(GradientError, match="only float tensors have gradients"):
        grad_graph(trace(f, TensorSpec((2, 3)), TensorSpec((2,), "int32"), TensorSpec((5,))).graph, ["labels"])


def test_multi_output_op_with_one_output_used():
    def f(x):
        first, _, third = apply("Split", x, axis=1, output_num=3)
        return (first * third).sum()

    graph = grad_graph(trace(f, TensorSpec((2, 6), F64)).graph, ["x"])
    x = rng.standard_normal((2, 6))
    _, dx = run_graph(graph, {"x": x})
    np.testing.assert_allclose(dx, np.concatenate([x[:, 4:], np.zeros((2, 2)), x[:, :2]], axis=1), rtol=1e-12)


def test_sens_seeds_the_loss_cotangent():
    graph = grad_graph(trace(lambda x: x * x, TensorSpec((3,), F64)).graph, ["x"], sens=True)
    assert graph.inputs[-1].name == "sens"
    x, sens = rng.standard_normal(3), rng.standard_normal(3)
    _, dx = run_graph(graph, {"x": x, "sens": sens})
    np.testing.assert_allclose(dx, 2 * x * sens, rtol=1e-12)


def test_an_op_without_gradient_is_a_clear_error_and_stop_gradient_is_not():
    def f(dy, x):
        return apply("Conv2DBackpropFilter", dy, x, filter_shape=(1, 1, 3, 3)).sum()

    graph = trace(f, TensorSpec((1, 1, 2, 2)), TensorSpec((1, 1, 4, 4))).graph
    with pytest.raises(
        GradientError, match=r"op Conv2DBackpropFilter \(created at .*test_autodiff.py:\d+\) has no gradient"
    ):
        grad_graph(graph, ["x"])
    stopped = trace(
        lambda dy, x: f(dy, apply("StopGradient", x)) + (x * x).sum(),
        TensorSpec((1, 1, 2, 2)),
        TensorSpec((1, 1, 4, 4)),
    ).graph
    grad_graph(stopped, ["x"])  # the gradient path avoids the op: no error


def test_composite_network_matches_central_differences():
    def net(x, labels, w1, gamma, beta, w2):
        h = apply("MatMul", x, w1, transpose_b=True)
        h, _, _ = apply("LayerNorm", h, gamma, beta, epsilon=1e-5)
        h = apply("GELU", h)
        logits = apply("MatMul", h, w2)
        return apply("SparseSoftmaxCrossEntropy", logits, labels).mean() + 0.01 * (w1 * w1).sum()

    shapes = {"x": (4, 3), "w1": (5, 3), "gamma": (5,), "beta": (5,), "w2": (5, 2)}
    values = {k: rng.standard_normal(s) for k, s in shapes.items()}
    labels = np.array([0, 1, 1, 0], np.int32)
    specs = [TensorSpec(shapes["x"], F64), TensorSpec((4,), "int32")] + [
        TensorSpec(shapes[k], F64) for k in list(shapes)[1:]
    ]
    wrt = ["x", "w1", "gamma", "beta", "w2"]
    graph = grad_graph(trace(net, *specs).graph, wrt)
    feeds = {**values, "labels": labels}
    results = run_graph(graph, feeds)
    forward = trace(net, *specs).graph

    def loss(args):
        return float(run_graph(forward, dict(zip(wrt, args)) | {"labels": labels})[0])

    base = [values[k] for k in wrt]
    for i, name in enumerate(wrt):
        np.testing.assert_allclose(results[1 + i], numeric_grad(loss, base, i), rtol=1e-6, atol=1e-8, err_msg=name)
