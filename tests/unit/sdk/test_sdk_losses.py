"""Loss cells against numpy (float64) references, every reduction, weights, ignore_index and label smoothing."""

from __future__ import annotations

import numpy as np
import pytest
from sdk_testkit import finite_difference, log_softmax, rand

import tessel as ms
from tessel import nn
from tessel.core.errors import ConfigurationError

LOGITS = rand(6, 4).astype(np.float64)
LABELS = np.array([0, 3, 1, 1, 2, 3], np.int32)
WEIGHT = np.array([1.0, 2.0, 0.5, 1.5])


def reduce(per, reduction, weights=None):
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / weights.sum() if weights is not None else per.mean()


def call(cell, logits, labels):
    return cell(ms.Tensor(logits.astype(np.float32)), ms.Tensor(labels)).asnumpy()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_class_indices(reduction):
    nll = -log_softmax(LOGITS)[np.arange(6), LABELS]
    got = call(nn.CrossEntropyLoss(reduction=reduction), LOGITS, LABELS)
    np.testing.assert_allclose(got, reduce(nll, reduction), rtol=1e-5)
    w = WEIGHT[LABELS]
    got = call(nn.CrossEntropyLoss(weight=ms.Tensor(WEIGHT.astype(np.float32)), reduction=reduction), LOGITS, LABELS)
    np.testing.assert_allclose(got, reduce(nll * w, reduction, w), rtol=1e-5)


def test_cross_entropy_ignore_index_label_smoothing_and_probabilities():
    labels = LABELS.copy()
    labels[[1, 4]] = -100
    nll = -log_softmax(LOGITS)[np.arange(6), np.maximum(labels, 0)]
    keep = labels != -100
    np.testing.assert_allclose(call(nn.CrossEntropyLoss(), LOGITS, labels), nll[keep].mean(), rtol=1e-5)
    smoothed = 0.9 * (-log_softmax(LOGITS)[np.arange(6), LABELS]) + 0.1 * (-log_softmax(LOGITS).mean(-1))
    np.testing.assert_allclose(
        call(nn.CrossEntropyLoss(label_smoothing=0.1), LOGITS, LABELS), smoothed.mean(), rtol=1e-5
    )
    probs = np.random.default_rng(1).dirichlet(np.ones(4), 6)
    want = -(probs * log_softmax(LOGITS)).sum(-1).mean()
    np.testing.assert_allclose(call(nn.CrossEntropyLoss(), LOGITS, probs.astype(np.float32)), want, rtol=1e-5)


def mindspore_nll(log_p, labels, weight, ignore_index, reduction, smoothing):
    """MindSpore's `ops.function.nn_func._nll_loss` (2.3 on) in float64, class axis last: the smoothing term is
    weighted by the class weights, and under 'mean' both terms are divided by the kept targets' weights."""
    keep = labels != ignore_index
    safe = np.where(keep, labels, 0)
    classes = np.ones(log_p.shape[-1]) if weight is None else weight
    w = classes[safe] * keep
    loss = -np.take_along_axis(log_p, safe[..., None], -1)[..., 0] * w
    smooth = -(log_p * classes).sum(-1) * keep
    if reduction == "sum":
        loss, smooth = loss.sum(), smooth.sum()
    elif reduction == "mean":
        loss, smooth = loss.sum() / w.sum(), smooth.sum() / w.sum()
    return (1 - smoothing) * loss + smoothing / log_p.shape[-1] * smooth


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_label_smoothing_with_weight_and_ignore_index_follows_mindspore(reduction, weighted):
    labels = LABELS.copy()
    labels[[1, 4]] = 7
    weight = WEIGHT if weighted else None
    want = mindspore_nll(log_softmax(LOGITS), labels, weight, 7, reduction, 0.2)
    w = None if weight is None else ms.Tensor(weight.astype(np.float32))
    loss = nn.CrossEntropyLoss(weight=w, ignore_index=7, reduction=reduction, label_smoothing=0.2)
    np.testing.assert_allclose(call(loss, LOGITS, labels), want, rtol=1e-5, atol=1e-6)
    x, y = ms.Tensor(log_softmax(LOGITS).astype(np.float32)), ms.Tensor(labels)
    got = ms.ops.nll_loss(x, y, w, ignore_index=7, reduction=reduction, label_smoothing=0.2).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # (N, C, H, W): the class axis is 1
    images = rand(2, 4, 3, 2).astype(np.float64)
    pixels = np.random.default_rng(3).integers(0, 4, (2, 3, 2)).astype(np.int32)
    pixels[0, 1, 1] = pixels[1, 2, 0] = 7
    want = mindspore_nll(log_softmax(np.moveaxis(images, 1, -1)), pixels, weight, 7, reduction, 0.2)
    got = ms.ops.cross_entropy(ms.Tensor(images.astype(np.float32)), ms.Tensor(pixels), w, 7, reduction, 0.2).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_softmax_cross_entropy_with_logits_and_nll():
    nll = -log_softmax(LOGITS)[np.arange(6), LABELS]
    sparse = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    np.testing.assert_allclose(call(sparse, LOGITS, LABELS), nll.mean(), rtol=1e-5)
    onehot = np.eye(4, dtype=np.float32)[LABELS]
    np.testing.assert_allclose(call(nn.SoftmaxCrossEntropyWithLogits(), LOGITS, onehot), nll, rtol=1e-5)
    np.testing.assert_allclose(call(nn.NLLLoss(), log_softmax(LOGITS), LABELS), nll.mean(), rtol=1e-5)
    nll_w = nn.NLLLoss(weight=ms.Tensor(WEIGHT.astype(np.float32)), reduction="sum")
    np.testing.assert_allclose(call(nll_w, log_softmax(LOGITS), LABELS), (nll * WEIGHT[LABELS]).sum(), rtol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(reduction):
    x, y = rand(3, 4), rand(3, 4, seed=1)
    np.testing.assert_allclose(call(nn.MSELoss(reduction), x, y), reduce((x - y) ** 2, reduction), rtol=1e-5)
    np.testing.assert_allclose(call(nn.L1Loss(reduction), x, y), reduce(np.abs(x - y), reduction), rtol=1e-5)
    t = (rand(3, 4, seed=2) > 0).astype(np.float32)
    bce = np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))
    np.testing.assert_allclose(call(nn.BCEWithLogitsLoss(reduction), x, t), reduce(bce, reduction), rtol=1e-5)


def test_bce_with_logits_gradient_is_sigmoid_minus_label_even_at_zero_logits():
    # zero logits are common (a zero-initialised head); the gradient there is 0.5 - y, not 0 or -1
    x = np.array([0.0, 0.0, 1.0, -1.0, 100.0, -100.0], np.float32)
    y = np.array([0.0, 1.0, 1.0, 0.0, 0.0, 1.0], np.float32)
    loss = nn.BCEWithLogitsLoss(reduction="sum")
    grad = ms.grad(lambda z: loss(z, ms.Tensor(y)))(ms.Tensor(x)).asnumpy()
    np.testing.assert_allclose(grad, 1.0 / (1.0 + np.exp(-x.astype(np.float64))) - y, rtol=1e-6, atol=1e-7)


def test_cross_entropy_gradient_matches_finite_differences():
    loss = nn.CrossEntropyLoss(weight=ms.Tensor(WEIGHT.astype(np.float32)))
    grad = ms.grad(lambda z, y: loss(z, y))(ms.Tensor(LOGITS.astype(np.float32)), ms.Tensor(LABELS)).asnumpy()
    logits = LOGITS.copy()

    def reference():
        w = WEIGHT[LABELS]
        return float((-log_softmax(logits)[np.arange(6), LABELS] * w).sum() / w.sum())

    np.testing.assert_allclose(grad, finite_difference(reference, logits), rtol=1e-4, atol=1e-6)


def test_label_errors_name_the_problem():
    with pytest.raises(ConfigurationError, match=r"labels of shape \(6, 4\).*expected labels of shape \(6,\)"):
        call(nn.CrossEntropyLoss(), LOGITS, np.zeros((6, 4), np.int32))
    with pytest.raises(ConfigurationError, match="reduction must be one of"):
        nn.MSELoss("average")


def test_shape_mismatches_that_would_broadcast_are_errors():
    # A (N, 1) output against (N,) labels broadcast to (N, N): a wrong loss and gradient with no error (MindSpore's
    # BCEWithLogitsLoss requires equal shapes); float class indices were taken as probabilities and broadcast.
    from tessel import ops

    logits = ms.Tensor(np.array([[0.5], [-1.0], [2.0]], np.float32))
    labels = ms.Tensor(np.array([1.0, 0.0, 1.0], np.float32))
    with pytest.raises(ConfigurationError, match=r"input \(3, 1\) and target \(3,\) must have the same shape"):
        nn.BCEWithLogitsLoss()(logits, labels)
    scores = ms.Tensor(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    with pytest.raises(ConfigurationError, match=r"float target holds class probabilities .* pass an int target"):
        ops.cross_entropy(scores, ms.Tensor(np.array([1.0, 0.0, 3.0, 2.0], np.float32)))


@pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
def test_a_custom_loss_on_loss_base_as_mindsporess_tutorial_writes_it(mode):
    """MindSpore's custom-loss tutorial: a LossBase subclass whose construct ends in self.get_loss(x); get_loss
    reduces in float32 and returns the input's dtype; get_axis and the reduce_mean primitive are there too."""
    ms.set_context(mode=getattr(ms, mode))

    class MAELoss(nn.LossBase):
        def __init__(self, reduction="mean"):
            super().__init__(reduction)
            self.abs = ms.ops.Abs()

        def construct(self, base, target):
            return self.get_loss(self.abs(base - target), ms.Tensor(np.float32([2.0, 1.0])))

    base = np.array([[1.0, 2.0], [3.0, 4.5]], np.float16)
    target = np.zeros((2, 2), np.float16)
    weighted = np.abs(base.astype(np.float64)) * [2.0, 1.0]
    for reduction, want in (("mean", weighted.mean()), ("sum", weighted.sum()), ("none", weighted)):
        loss = MAELoss(reduction)
        out = loss(ms.Tensor(base), ms.Tensor(target))
        assert out.dtype == ms.float16
        np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-3)
    loss = MAELoss()
    assert (loss.average, loss.reduce, MAELoss("sum").average, MAELoss("none").reduce) == (True, True, False, False)
    assert loss.get_axis(ms.Tensor(base)) == (0, 1)
    assert float(loss.reduce_mean(ms.Tensor(np.float32([1, 2, 6])), 0).asnumpy()) == 3.0


@pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
def test_a_label_beyond_the_classes_is_an_error_naming_the_op_and_the_line(mode):
    """ONNX Runtime's failure (a GatherElements index out of range, in an unnamed node) comes back as an
    ExecutionError that names the tessel op, the user's line that made it, and what to check."""
    from tessel.core.errors import ExecutionError

    ms.set_context(mode=getattr(ms, mode))
    loss = nn.CrossEntropyLoss()
    logits = ms.Tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ExecutionError) as raised:
        loss(logits, ms.Tensor(np.array([3, 0], np.int32)))
    message = str(raised.value)
    assert "failed at op SparseSoftmaxCrossEntropy (made at " in message and "test_sdk_losses.py:" in message
    assert "labels must be class indices in [0, classes)" in message


@pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
def test_cross_entropy_of_one_unbatched_sample_differentiates(mode):
    """Logits (C,) and a 0-d label: MindSpore 2.7.0 gives loss 1.3425353 and gradient [0.2138, 0.2363, -0.7388,
    0.2887]; the gradient raised on a symbolic class count (OneHot of a 0-d label) here."""
    ms.set_context(mode=getattr(ms, mode))
    z = ms.Tensor(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    label = ms.Tensor(np.array(2, np.int32))
    loss, grad = ms.value_and_grad(lambda t: nn.CrossEntropyLoss()(t, label))(z)
    p = np.exp([0.1, 0.2, 0.3, 0.4]) / np.exp([0.1, 0.2, 0.3, 0.4]).sum()
    np.testing.assert_allclose(loss.asnumpy(), -np.log(p[2]), rtol=1e-6)
    np.testing.assert_allclose(grad.asnumpy(), p - np.eye(4)[2], rtol=1e-5, atol=1e-7)
    smoothed = nn.CrossEntropyLoss(weight=ms.Tensor(np.float32([1, 2, 3, 4])), label_smoothing=0.1)
    _, grad = ms.value_and_grad(lambda t: smoothed(t, label))(z)
    # MindSpore 2.7.0: [2.01940686e-01, 2.15722352e-01, -6.68170333e-01, 2.50507295e-01]
    np.testing.assert_allclose(grad.asnumpy(), [0.201940686, 0.215722352, -0.668170333, 0.250507295], rtol=1e-5)


@pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
def test_dense_softmax_cross_entropy_gives_its_labels_no_gradient_as_mindspore(mode):
    """MindSpore 2.7.0: grad w.r.t. (logits, labels) of SoftmaxCrossEntropyWithLogits(reduction='sum') is
    (softmax - labels, 0): its primitive's bprop returns zeros for the labels."""
    ms.set_context(mode=getattr(ms, mode))
    logits = np.array([[0.5, -1.0, 2.0], [0.0, 0.3, 0.1]], np.float32)
    labels = np.array([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]], np.float32)
    loss = nn.SoftmaxCrossEntropyWithLogits(reduction="sum")
    g_logits, g_labels = ms.grad(lambda a, b: loss(a, b), grad_position=(0, 1))(ms.Tensor(logits), ms.Tensor(labels))
    soft = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_allclose(g_logits.asnumpy(), soft - labels, rtol=1e-5, atol=1e-7)
    assert not g_labels.asnumpy().any()
