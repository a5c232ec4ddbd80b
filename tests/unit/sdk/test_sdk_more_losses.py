"""nn.SmoothL1Loss, nn.HuberLoss, nn.BCELoss, nn.KLDivLoss and their ops forms: MindSpore 2.7.0's own outputs
(measured on its CPU backend for these inputs), float64 numpy references in both modes, gradients against the
closed forms, and the errors."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import nn, ops
from tessel.core.errors import ConfigurationError

MODES = pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
X = np.array([[0.1, 0.9, -2.0], [3.0, 0.5, 0.25]], np.float32)
Y = np.array([[0.0, 1.5, -0.5], [0.2, 0.4, 2.0]], np.float32)
P = np.array([[0.1, 0.9, 0.5], [0.999, 0.01, 0.3]], np.float32)
T = np.array([[0.0, 1.0, 0.3], [1.0, 0.0, 1.0]], np.float32)
LOG_P = np.log(np.array([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]], np.float32))
Q = np.array([[0.0, 0.6, 0.4], [0.3, 0.3, 0.4]], np.float32)

# Printed by MindSpore 2.7.0 (CPU, PYNATIVE) for the inputs above.
MINDSPORE = {
    ("SmoothL1Loss(beta=0.7)", "none"): [[0.00714286, 0.25714287, 1.15], [2.45, 0.00714286, 1.4]],
    ("SmoothL1Loss(beta=0.7)", "mean"): 0.87857145,
    ("SmoothL1Loss(beta=0.7)", "sum"): 5.2714286,
    ("HuberLoss(delta=0.8)", "none"): [[0.005, 0.18, 0.88000005], [1.92, 0.005, 1.08]],
    ("HuberLoss(delta=0.8)", "mean"): 0.67833334,
    ("HuberLoss(delta=0.8)", "sum"): 4.07,
    ("BCELoss()", "mean"): 0.3531486,
    ("BCELoss()", "sum"): 2.1188917,
    ("KLDivLoss()", "none"): [[0.0, 0.10939297, 0.11507285], [0.3295837, 0.3295837, -0.27725887]],
    ("KLDivLoss()", "mean"): 0.101062395,
    ("KLDivLoss()", "sum"): 0.6063744,
    ("KLDivLoss()", "batchmean"): 0.3031872,
}


def cell(name: str, reduction: str) -> nn.Cell:
    if name.startswith("SmoothL1"):
        return nn.SmoothL1Loss(beta=0.7, reduction=reduction)
    if name.startswith("Huber"):
        return nn.HuberLoss(reduction=reduction, delta=0.8)
    if name.startswith("BCE"):
        return nn.BCELoss(reduction=reduction)
    return nn.KLDivLoss(reduction=reduction)


def inputs(name: str) -> tuple[np.ndarray, np.ndarray]:
    return {"S": (X, Y), "H": (X, Y), "B": (P, T), "K": (LOG_P, Q)}[name[0]]


def reference(name: str, reduction: str) -> np.ndarray:
    a, b = (v.astype(np.float64) for v in inputs(name))
    d = np.abs(a - b)
    if name.startswith("SmoothL1"):
        per = np.where(d < 0.7, 0.5 * d**2 / 0.7, d - 0.35)
    elif name.startswith("Huber"):
        per = np.where(d < 0.8, 0.5 * d**2, 0.8 * (d - 0.4))
    elif name.startswith("BCE"):
        per = -(b * np.log(a) + (1 - b) * np.log(1 - a))
    else:
        per = np.where(b > 0, b * (np.log(np.where(b > 0, b, 1)) - a), 0.0)
    if reduction == "batchmean":
        return per.sum() / len(per)
    return {"none": per, "mean": per.mean(), "sum": per.sum()}[reduction]


@MODES
@pytest.mark.parametrize(("name", "reduction"), list(MINDSPORE))
def test_losses_give_mindsporess_values_and_the_float64_reference(mode, name, reduction):
    ms.set_context(mode=getattr(ms, mode))
    loss = cell(name, reduction)
    a, b = (ms.Tensor(v) for v in inputs(name))
    out = (ms.jit(loss.construct)(a, b) if mode == "GRAPH_MODE" else loss(a, b)).asnumpy()
    np.testing.assert_allclose(out, np.array(MINDSPORE[name, reduction]), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(out, reference(name, reduction), rtol=2e-6, atol=1e-7)


def test_defaults_are_mindsporess():
    assert nn.SmoothL1Loss().reduction == "none" and nn.SmoothL1Loss().beta == 1.0
    assert nn.HuberLoss().reduction == "mean" and nn.HuberLoss().delta == 1.0
    assert nn.BCELoss().reduction == "mean" and nn.BCELoss().weight is None and nn.KLDivLoss().reduction == "mean"


def test_bce_clamps_the_logarithms_as_mindspore_and_takes_an_elementwise_weight():
    # MindSpore 2.7.0 CPU: [27.631021, 27.631021, -0., -0.] (log of at least 1e-12)
    certain = nn.BCELoss(reduction="none")(ms.Tensor(np.float32([0, 1, 0, 1])), ms.Tensor(np.float32([1, 0, 0, 1])))
    np.testing.assert_allclose(certain.asnumpy(), [27.631021, 27.631021, 0, 0], rtol=1e-6)
    # MindSpore 2.7.0 CPU at x = [1, 0, 1e-13, 0], y = [0, 1, 1, 0]: [27.631021, 27.631021, 27.535711, 0] (it adds 1e-12
    # to the logarithms' arguments), and the gradient of the sum [1e12, -1e12, -1e12, 0]: (x - y) / max(x(1 - x), 1e-12)
    x, y = ms.Tensor(np.float32([1, 0, 1e-13, 0])), ms.Tensor(np.float32([0, 1, 1, 0]))
    np.testing.assert_allclose(
        ops.binary_cross_entropy(x, y, reduction="none").asnumpy(), [27.631021, 27.631021, 27.535711, 0], rtol=1e-6
    )
    slope = ms.grad(lambda a: ops.binary_cross_entropy(a, y, reduction="sum"))(x)
    np.testing.assert_allclose(slope.asnumpy(), [1e12, -1e12, -1e12, 0], rtol=1e-6)
    weight = np.array([[1.0, 2.0, 0.5], [0.0, 3.0, 1.0]], np.float32)
    out = nn.BCELoss(ms.Tensor(weight), "sum")(ms.Tensor(P), ms.Tensor(T)).asnumpy()
    np.testing.assert_allclose(out, (reference("BCELoss()", "none") * weight).sum(), rtol=1e-6)


@MODES
def test_gradients_match_the_closed_forms(mode):
    ms.set_context(mode=getattr(ms, mode))
    x64, y64, p64, t64, q64 = (v.astype(np.float64) for v in (X, Y, P, T, Q))

    def total(x, p, lp):
        return (
            nn.SmoothL1Loss(0.7, "sum")(x, ms.Tensor(Y))
            + nn.HuberLoss("sum", 0.8)(x, ms.Tensor(Y))
            + nn.BCELoss(reduction="sum")(p, ms.Tensor(T))
            + nn.KLDivLoss("sum")(lp, ms.Tensor(Q))
        )

    gx, gp, glp = (g.asnumpy() for g in ms.grad(total, (0, 1, 2))(ms.Tensor(X), ms.Tensor(P), ms.Tensor(LOG_P)))
    d = x64 - y64
    want_x = np.where(np.abs(d) < 0.7, d / 0.7, np.sign(d)) + np.where(np.abs(d) < 0.8, d, 0.8 * np.sign(d))
    np.testing.assert_allclose(gx, want_x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gp, (p64 - t64) / (p64 * (1 - p64)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(glp, -q64, rtol=1e-6, atol=1e-7)


def test_ops_forms_and_huber_broadcasts():
    np.testing.assert_allclose(ops.smooth_l1_loss(ms.Tensor(X), ms.Tensor(Y)).asnumpy().shape, (2, 3))
    # MindSpore 2.7.0 CPU: HuberLoss()(X, Y[0]) broadcasts to 0.744375
    np.testing.assert_allclose(ops.huber_loss(ms.Tensor(X), ms.Tensor(Y[0])).asnumpy(), 0.744375, rtol=1e-6)
    np.testing.assert_allclose(ops.kl_div(ms.Tensor(LOG_P), ms.Tensor(Q), "batchmean").asnumpy(), 0.3031872, 1e-6)
    np.testing.assert_allclose(ops.binary_cross_entropy(ms.Tensor(P), ms.Tensor(T)).asnumpy(), 0.3531486, 1e-6)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: nn.SmoothL1Loss(beta=0.0), "SmoothL1Loss: beta must be a number > 0, got 0.0"),
        (lambda: nn.HuberLoss(delta=-1), "HuberLoss: delta must be a number > 0, got -1"),
        (lambda: nn.KLDivLoss("average"), "KLDivLoss: reduction must be 'none', 'mean', 'batchmean' or 'sum'"),
        (lambda: nn.BCELoss(reduction="batchmean"), "reduction must be one of"),
        (lambda: nn.SmoothL1Loss()(ms.Tensor(X), ms.Tensor(Y[0])), r"input \(2, 3\) and target \(3,\) must have"),
        (lambda: nn.BCELoss()(ms.Tensor(P), ms.Tensor(T[0])), r"logits \(2, 3\) and labels \(3,\) must have the same"),
        (lambda: nn.BCELoss(ms.Tensor(T[0]))(ms.Tensor(P), ms.Tensor(T)), r"logits \(2, 3\) and weight \(3,\)"),
        (lambda: nn.KLDivLoss()(ms.Tensor(LOG_P), ms.Tensor(Q[0])), r"logits \(2, 3\) and labels \(3,\)"),
        (lambda: nn.KLDivLoss("batchmean")(ms.Tensor(np.float32(1)), ms.Tensor(np.float32(1))), "needs logits with a"),
    ],
)
def test_errors_name_the_rule(make, message):
    with pytest.raises(ConfigurationError, match=message):
        make()
