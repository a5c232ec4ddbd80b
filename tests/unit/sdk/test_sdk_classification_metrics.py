"""train.Precision, Recall, Fbeta, F1 and ConfusionMatrix: the values MindSpore 2.7.0 gives for the same updates
(measured with its own metrics), the ways to name them, and the errors."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import nn, train
from tessel.core.errors import ConfigurationError, NotSupportedYetError

X = np.array([[0.2, 0.5, 0.3], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.4, 0.3], [0.6, 0.3, 0.1]], np.float32)
Y = np.array([1, 0, 2, 2, 1])
X2, Y2 = np.array([[0.1, 0.2, 0.7], [0.9, 0.05, 0.05]], np.float32), np.array([2, 1])

# MindSpore 2.7.0: metric.clear(); metric.update(X, Y); metric.update(X2, Y2); metric.eval(), metric.eval(True)
MINDSPORE = {
    "Precision": ([1 / 3, 0.5, 1.0], 0.611111111111111),
    "Recall": ([1.0, 1 / 3, 2 / 3], 2 / 3),
    "F1": ([0.5, 0.4, 0.8], 0.5666666666666668),
    "Fbeta(0.5)": ([0.38461538461538464, 0.45454545454545453, 0.9090909090909091], 0.5827505827505828),
}


def make(name: str) -> train.Metric:
    return train.Fbeta(0.5) if name == "Fbeta(0.5)" else getattr(train, name)()


@pytest.mark.parametrize("name", list(MINDSPORE))
def test_precision_recall_and_f_scores_give_mindsporess_values(name):
    metric = make(name)
    metric.clear()
    metric.update(ms.Tensor(X), ms.Tensor(Y))
    metric.update(X2, Y2)
    per_class, mean = MINDSPORE[name]
    np.testing.assert_allclose(metric.eval(), per_class, rtol=1e-12)
    np.testing.assert_allclose(metric.eval(average=True), mean, rtol=1e-12)
    one_hot = make(name)
    one_hot.update(X, np.eye(3)[Y])  # one-hot labels are read by their argmax
    plain = make(name)
    plain.update(X, Y)
    np.testing.assert_array_equal(one_hot.eval(), plain.eval())


def test_precision_of_per_pixel_logits_reads_the_class_axis_1():
    logits = np.random.default_rng(0).random((2, 3, 4)).astype(np.float32)
    metric = train.Precision()
    metric.update(logits, np.array([[0, 1, 2, 1], [2, 2, 0, 1]]))
    np.testing.assert_allclose(metric.eval(), [1.0, 0.25, 1 / 3], rtol=1e-12)  # MindSpore 2.7.0


@pytest.mark.parametrize(
    ("normalize", "want"),
    [
        ("no_norm", [[1, 0, 0], [2, 1, 0], [0, 1, 2]]),
        ("target", [[1, 0, 0], [2 / 3, 1 / 3, 0], [0, 1 / 3, 2 / 3]]),
        ("prediction", [[1 / 3, 0, 0], [2 / 3, 0.5, 0], [0, 0.5, 1]]),
        ("all", [[1 / 7, 0, 0], [2 / 7, 1 / 7, 0], [0, 1 / 7, 2 / 7]]),
    ],
)
def test_confusion_matrix_gives_mindsporess_counts_and_normalizations(normalize, want):
    metric = train.ConfusionMatrix(3, normalize=normalize)
    metric.update(X, Y)
    metric.update(ms.Tensor(X2), ms.Tensor(Y2))
    np.testing.assert_allclose(metric.eval(), want, rtol=1e-12)


def test_confusion_matrix_thresholds_scores_and_reads_an_empty_row_as_zeros():
    binary = train.ConfusionMatrix(2, threshold=0.6)
    binary.update(np.array([0.1, 0.6, 0.7, 0.3], np.float32), np.array([0, 1, 0, 1]))
    np.testing.assert_array_equal(binary.eval(), [[1, 1], [1, 1]])  # MindSpore 2.7.0
    rows = train.ConfusionMatrix(4, normalize="target")
    rows.update(np.array([0, 1, 3]), np.array([0, 0, 3]))
    np.testing.assert_array_equal(rows.eval(), [[0.5, 0.5, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]])


def test_names_by_which_mindspore_finds_them():
    assert ms.Precision is nn.Precision is train.Precision and ms.ConfusionMatrix is nn.ConfusionMatrix
    metrics = train.metrics.get_metrics({"precision", "recall", "F1"})
    assert {k: type(v) for k, v in metrics.items()} == {
        "precision": train.Precision,
        "recall": train.Recall,
        "F1": train.F1,
    }


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: train.Precision("multilabel"), NotSupportedYetError, r"Precision\(eval_type='multilabel'\)"),
        (lambda: train.Recall("binary"), ConfigurationError, "eval_type must be 'classification' or 'multilabel'"),
        (lambda: train.Fbeta(0), ConfigurationError, "Fbeta: beta must be a number > 0, got 0"),
        (lambda: train.ConfusionMatrix(3, "rows"), ConfigurationError, "normalize must be 'target', 'prediction'"),
        (lambda: train.ConfusionMatrix(3, threshold=1), ConfigurationError, "threshold must be a float, got 1"),
        (lambda: train.Precision().eval(), ConfigurationError, r"Precision.eval: no samples; call update\(\) first"),
        (lambda: train.ConfusionMatrix(2).eval(), ConfigurationError, "no samples"),
        (
            lambda: train.Recall().update(X, Y[:3]),
            ConfigurationError,
            r"logits \(5, 3\) .* take labels of shape \(5,\)",
        ),
        (lambda: train.F1().update(X, Y + 1), ConfigurationError, r"class indices in \[0, 2\] .* values in \[1, 3\]"),
        (lambda: train.Recall().update(X, -Y), ConfigurationError, r"values in \[-2, 0\]"),
        (
            lambda: train.ConfusionMatrix(2).update(X, Y),
            ConfigurationError,
            r"labels must be class indices in \[0, 1\]",
        ),
    ],
)
def test_errors_name_the_rule(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_class_count_may_not_change_between_updates():
    metric = train.Precision()
    metric.update(X, Y)
    with pytest.raises(ConfigurationError, match="logits of 2 classes after updates with 3; clear"):
        metric.update(X[:, :2], np.zeros(5, int))
    with pytest.raises(ConfigurationError, match="average must be a bool"):
        metric.eval(average="yes")


def test_accuracy_multilabel_and_a_class_count_that_changes():
    """MindSpore 2.7.0: multilabel accuracy 0.5 for both inputs below; a second update with another class count
    is a ValueError there."""
    metric = train.Accuracy("multilabel")
    metric.update(
        np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]]), np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 0]])
    )
    assert metric.eval() == 0.5
    per_pixel = train.Accuracy("multilabel")
    per_pixel.update(np.array([[[1, 0], [0, 1], [1, 1]]]), np.array([[[1, 0], [0, 1], [1, 0]]]))
    assert per_pixel.eval() == 0.5
    with pytest.raises(ConfigurationError, match="predictions must be 0 or 1"):
        train.Accuracy("multilabel").update(np.array([[0.3, 0.7]]), np.array([[0, 1]]))
    with pytest.raises(ConfigurationError, match=r"predictions \(1, 2\) and labels \(1, 3\) must have the same shape"):
        train.Accuracy("multilabel").update(np.array([[0, 1]]), np.array([[0, 1, 0]]))
    accuracy = train.Accuracy()
    accuracy.update(np.ones((2, 3)), np.array([0, 1]))
    with pytest.raises(ConfigurationError, match="logits of 4 classes after updates with 3"):
        accuracy.update(np.ones((2, 4)), np.array([0, 1]))
    with pytest.raises(ConfigurationError, match="eval_type must be 'classification' or 'multilabel'"):
        train.Accuracy("binary")
