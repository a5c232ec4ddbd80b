"""The fused train step: every optimizer matches a float64 numpy reference step to float32 rounding, training
reduces the loss, state stays in double-buffered numpy arrays, and BatchNorm's running statistics are written."""

from __future__ import annotations

import numpy as np
import pytest
from compiler_testkit import compute

from tessel.compiler.builder import apply
from tessel.compiler.optimizers import SGD, Adam, AdamWeightDecay, Momentum
from tessel.compiler.tracer import TensorSpec, trace
from tessel.compiler.train_step import TrainStep as Step
from tessel.compiler.train_step import build_train_step
from tessel.core.errors import ConfigurationError

IN, HIDDEN, OUT = 6, 8, 3
PARAMS = ["w1", "b1", "w2", "b2"]


def mlp(x, y, w1, b1, w2, b2):
    h = apply("ReLU", apply("MatMul", x, w1, transpose_b=True) + b1)  # Dense stores weight as (out, in)
    logits = apply("MatMul", h, w2, transpose_b=True) + b2
    return apply("SparseSoftmaxCrossEntropy", logits, y).mean()


SPECS = [
    TensorSpec(("N", IN)),
    TensorSpec(("N",), "int32"),
    TensorSpec((HIDDEN, IN)),
    TensorSpec((HIDDEN,)),
    TensorSpec((OUT, HIDDEN)),
    TensorSpec((OUT,)),
]


def init_params(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"w1": (HIDDEN, IN), "b1": (HIDDEN,), "w2": (OUT, HIDDEN), "b2": (OUT,)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def batch(seed, n=16):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, IN)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5).astype(np.int32)  # learnable labels in 0..2
    return x, y


def reference_loss_and_grads(p, x, y):
    """Forward and backward of the MLP by hand, float64."""
    z1 = x @ p["w1"].T + p["b1"]
    h = np.maximum(z1, 0)
    logits = h @ p["w2"].T + p["b2"]
    e = np.exp(logits - logits.max(1, keepdims=True))
    prob = e / e.sum(1, keepdims=True)
    n = len(y)
    loss = -np.log(prob[np.arange(n), y]).mean()
    dlogits = (prob - np.eye(OUT)[y]) / n
    dh = dlogits @ p["w2"] * (z1 > 0)
    return loss, {"w2": dlogits.T @ h, "b2": dlogits.sum(0), "w1": dh.T @ x, "b1": dh.sum(0)}


class Reference:
    """MindSpore's optimizer formulas, written independently of tessel, in float64."""

    def __init__(self, opt, params):
        self.opt, self.p = opt, {k: v.astype(np.float64) for k, v in params.items()}
        self.slot = {k: [np.zeros_like(v), np.zeros_like(v)] for k, v in self.p.items()}
        self.t = 0

    def step(self, x, y):
        o = self.opt
        loss, grads = reference_loss_and_grads(self.p, x.astype(np.float64), y)
        self.t += 1
        for k, g in grads.items():
            p, (a, b) = self.p[k], self.slot[k]
            if isinstance(o, AdamWeightDecay):
                a[...] = o.beta1 * a + (1 - o.beta1) * g
                b[...] = o.beta2 * b + (1 - o.beta2) * g * g
                p -= o.learning_rate * (a / (np.sqrt(b) + o.eps) + o.weight_decay * p)
                continue
            g = g + o.weight_decay * p
            if isinstance(o, SGD):
                if not o.momentum:
                    p -= o.learning_rate * g
                    continue
                a[...] = g if self.t == 1 else o.momentum * a + (1 - o.dampening) * g
                p -= o.learning_rate * (g + o.momentum * a if o.nesterov else a)
            elif isinstance(o, Momentum):
                a[...] = o.momentum * a + g
                p -= o.learning_rate * (g + o.momentum * a if o.use_nesterov else a)
            elif isinstance(o, Adam):
                a[...] = o.beta1 * a + (1 - o.beta1) * g
                b[...] = o.beta2 * b + (1 - o.beta2) * g * g
                lr_t = o.learning_rate * np.sqrt(1 - o.beta2**self.t) / (1 - o.beta1**self.t)
                direction = o.beta1 * a + (1 - o.beta1) * g if o.use_nesterov else a
                p -= lr_t * direction / (np.sqrt(b) + o.eps)
        return loss


OPTIMIZERS = [
    SGD(learning_rate=0.1),
    SGD(learning_rate=0.1, weight_decay=0.05),
    SGD(learning_rate=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    SGD(learning_rate=0.1, momentum=0.8, nesterov=True),
    Momentum(learning_rate=0.05, momentum=0.9),
    Momentum(learning_rate=0.05, momentum=0.9, use_nesterov=True, weight_decay=0.001),
    Adam(learning_rate=0.01),
    Adam(learning_rate=0.01, use_nesterov=True, weight_decay=0.01),
    AdamWeightDecay(learning_rate=0.01, weight_decay=0.1),
]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=repr)
def test_step_matches_float64_reference(optimizer):
    params = init_params()
    program = build_train_step(trace(mlp, *SPECS).graph, PARAMS, optimizer)
    step = Step(program, compute(), params)
    reference = Reference(optimizer, params)
    for s in range(4):
        x, y = batch(s)
        loss = step(x=x, y=y)
        np.testing.assert_allclose(loss, reference.step(x, y), rtol=1e-5)
        for k in PARAMS:
            np.testing.assert_allclose(step.state[k], reference.p[k], rtol=2e-5, atol=2e-6, err_msg=f"{k} step {s}")


def test_training_reduces_the_loss_and_keeps_state_in_place():
    program = build_train_step(trace(mlp, *SPECS).graph, PARAMS, Momentum(learning_rate=0.1, momentum=0.9))
    step = Step(program, compute(), init_params(1))
    x, y = batch(100, n=64)
    first = float(step(x=x, y=y))
    buffers = {id(v) for v in step.state.values()}
    for _ in range(60):
        last = float(step(x=x, y=y))
    assert last < 0.3 * first
    # Two buffers per state entry, flipped every step: the same memory is reused, never reallocated.
    assert {id(v) for v in step.state.values()} == buffers  # after an even number of further steps
    assert set(step.state) == {*PARAMS, *(f"{p}/moments" for p in PARAMS)}


def test_plain_sgd_folds_the_learning_rate_into_the_backward_pass():
    # The loss seed is lr, so no multiply by lr runs over a parameter-sized gradient: each update is one Sub.
    graph = build_train_step(trace(mlp, *SPECS).graph, PARAMS, SGD(learning_rate=0.1)).graph
    big = [n for n in graph.nodes if n.op == "Mul" and any(v.shape == SPECS[2].shape for v in n.outputs)]
    assert not big
    assert len([n for n in graph.nodes if n.op == "Sub" and n.inputs[0].name in PARAMS]) == len(PARAMS)
    with_momentum = build_train_step(trace(mlp, *SPECS).graph, PARAMS, SGD(learning_rate=0.1, momentum=0.9)).graph
    assert any(n.op == "Mul" and any(v.shape == SPECS[2].shape for v in n.outputs) for n in with_momentum.nodes)

    def half_mlp(x, y, w1, b1, w2, b2):  # a float16 hidden layer: lr-scaled gradients could underflow in it
        h = apply("ReLU", apply("MatMul", x, w1, transpose_b=True) + b1).astype("float16").astype("float32")
        return apply("SparseSoftmaxCrossEntropy", apply("MatMul", h, w2, transpose_b=True) + b2, y).mean()

    half = build_train_step(trace(half_mlp, *SPECS).graph, PARAMS, SGD(learning_rate=0.1)).graph
    assert any(n.op == "Mul" and any(v.shape == SPECS[2].shape for v in n.outputs) for n in half.nodes)


def test_learning_rate_changes_without_recompiling():
    program = build_train_step(trace(mlp, *SPECS).graph, PARAMS, SGD(learning_rate=0.1))
    step = Step(program, compute(), init_params())
    exe = step.executable
    step.learning_rate = 0.0
    before = {k: v.copy() for k, v in step.state.items()}
    x, y = batch(0)
    step(x=x, y=y)
    for k in PARAMS:
        np.testing.assert_array_equal(step.state[k], before[k])
    step.learning_rate = 0.5
    step(x=x, y=y)
    assert not np.array_equal(step.state["w1"], before["w1"]) and step.executable is exe


def test_batch_norm_running_statistics_are_written_back():
    def net(x, y, w, gamma, beta, mean, var):
        h = apply("MatMul", x, w, transpose_b=True)
        h, new_mean, new_var, _, _ = apply("BatchNorm", h, gamma, beta, mean, var, is_training=True, momentum=0.1)
        apply("Assign", mean, new_mean)  # how nn.BatchNorm updates its moving statistics
        apply("Assign", var, new_var)
        return apply("SparseSoftmaxCrossEntropy", h, y).mean()

    specs = [TensorSpec(("N", IN)), TensorSpec(("N",), "int32"), TensorSpec((OUT, IN))] + [TensorSpec((OUT,))] * 4
    program = build_train_step(trace(net, *specs).graph, ["w", "gamma", "beta"], SGD(learning_rate=0.1))
    assert [s.name for s in program.state] == ["w", "gamma", "beta", "mean", "var"] and program.data == ("x", "y")
    params = {
        "w": init_params()["w2"][:, :IN].copy(),
        "gamma": np.ones(OUT, np.float32),
        "beta": np.zeros(OUT, np.float32),
        "mean": np.zeros(OUT, np.float32),
        "var": np.ones(OUT, np.float32),
    }
    step = Step(program, compute(), params)
    mean, var = params["mean"].astype(np.float64), params["var"].astype(np.float64)
    for s in range(3):
        x, y = batch(s)
        w = step.state["w"].astype(np.float64)
        h = x @ w.T
        step(x=x, y=y)
        mean = 0.9 * mean + 0.1 * h.mean(0)
        var = 0.9 * var + 0.1 * h.var(0, ddof=1)  # unbiased batch variance, as MindSpore's moving variance
        np.testing.assert_allclose(step.state["mean"], mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(step.state["var"], var, rtol=1e-5, atol=1e-6)


def test_constructor_and_call_errors():
    program = build_train_step(trace(mlp, *SPECS).graph, PARAMS, SGD())
    params = init_params()
    with pytest.raises(ConfigurationError, match="no initial value for parameter 'b2'"):
        Step(program, compute(), {k: v for k, v in params.items() if k != "b2"})
    with pytest.raises(ConfigurationError, match=r"parameter 'w1' must be float32\(8, 6\), got float64\(8, 6\)"):
        Step(program, compute(), {**params, "w1": params["w1"].astype(np.float64)})
    step = Step(program, compute(), params)
    with pytest.raises(ConfigurationError, match=r"missing data input\(s\) \['y'\]"):
        step(x=batch(0)[0])
    with pytest.raises(ConfigurationError, match="input 'y' must be int32, got int64"):
        step(x=batch(0)[0], y=batch(0)[1].astype(np.int64))
