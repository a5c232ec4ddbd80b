"""Evaluation metrics (MindSpore `train.Accuracy`, `Loss`, `TopKCategoricalAccuracy`, `MAE`, `MSE`, `Precision`,
`Recall`, `Fbeta`, `F1`, `ConfusionMatrix`): clear(), update(*outputs), eval()."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError


def _np(x: Any) -> np.ndarray:
    return x.asnumpy() if isinstance(x, Tensor) else np.asarray(x)


class Metric:
    """Base class, as MindSpore's: accumulate with update(), read with eval(), reset with clear(); calling a metric
    does all three on one batch. set_indexes([i, j]) makes update (where decorated with rearrange_inputs, as every
    built-in metric's is) read inputs i and j of what it is given. A subclass's __init__ calls clear() itself."""

    def __init__(self):
        self._indexes: list[int] | None = None

    @property
    def indexes(self) -> list[int] | None:
        return getattr(self, "_indexes", None)

    def set_indexes(self, indexes: list[int]) -> Metric:
        if not isinstance(indexes, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indexes):
            raise ConfigurationError(f"set_indexes: indexes must be a list of int, got {indexes!r}")
        self._indexes = indexes
        return self

    def _convert_data(self, data: Any) -> np.ndarray:
        if isinstance(data, (Tensor, list, np.ndarray)):
            return _np(data)
        raise ConfigurationError(f"{type(self).__name__}: inputs must be Tensor, list or numpy.ndarray, got {data!r}")

    def __call__(self, *inputs: Any) -> Any:
        self.clear()
        self.update(*inputs)
        return self.eval()

    def clear(self) -> None:
        raise NotImplementedError

    def update(self, *inputs: Any) -> None:
        raise NotImplementedError

    def eval(self) -> float:
        raise NotImplementedError


def rearrange_inputs(func: Callable) -> Callable:
    """MindSpore's decorator for Metric.update: with set_indexes, update gets only the inputs at those indexes."""

    @functools.wraps(func)
    def update(self: Metric, *inputs: Any) -> Any:
        indexes = self.indexes
        if indexes:
            if any(not -len(inputs) <= i < len(inputs) for i in indexes):
                raise ConfigurationError(
                    f"{type(self).__name__}.update: set_indexes {indexes} picks beyond its {len(inputs)} inputs"
                )
            inputs = tuple(inputs[i] for i in indexes)
        return func(self, *inputs)

    return update


class _Builtin(Metric):
    def __init__(self):
        super().__init__()
        self.clear()


def _one_hot(labels: np.ndarray) -> bool:
    """MindSpore's test for one-hot labels: 0/1 values that sum to 1 over the class axis (1)."""
    if labels.ndim < 2 or not np.equal(labels**2, labels).all():
        return False
    return bool(np.equal(labels.sum(axis=1), 1).all())


class Accuracy(_Builtin):
    """Fraction of samples classified right, as MindSpore. 'classification': the highest logit (over the class
    axis, 1) is the label; labels are class indices shaped (N,) + logits.shape[2:], or one-hot like the logits.
    'multilabel': predictions and labels of 0/1, the same shape (N, C, ...), and a sample is right when all its
    classes are."""

    def __init__(self, eval_type: str = "classification"):
        if eval_type not in ("classification", "multilabel"):
            raise ConfigurationError(f"Accuracy: eval_type must be 'classification' or 'multilabel', got {eval_type!r}")
        self._type = eval_type
        super().__init__()

    def clear(self) -> None:
        self._correct, self._total, self._classes = 0, 0, 0

    @rearrange_inputs
    def update(self, *inputs: Any) -> None:
        if len(inputs) != 2:
            raise ConfigurationError(f"Accuracy.update takes (logits, labels), got {len(inputs)} inputs")
        logits, labels = _np(inputs[0]), _np(inputs[1])
        classes = logits.shape[1] if logits.ndim >= 2 else 0
        if self._classes and classes != self._classes:
            raise ConfigurationError(
                f"Accuracy.update: logits of {classes} classes after updates with {self._classes}; clear() first"
            )
        if self._type == "multilabel":
            hits = self._multilabel_hits(logits, labels)
        else:
            if logits.ndim == labels.ndim and _one_hot(labels):
                labels = labels.argmax(axis=1)
            want = (logits.shape[0], *logits.shape[2:]) if logits.ndim >= 2 else None
            if want is None or labels.shape != want:
                raise ConfigurationError(
                    f"Accuracy.update: logits {logits.shape} take labels of shape {want} (class indices; the class "
                    f"axis is 1) or one-hot labels like the logits, got {labels.shape}; e.g. labels.reshape(-1) for "
                    "(N, 1)"
                )
            hits = np.equal(logits.argmax(axis=1), labels).reshape(-1)
        self._classes = classes
        self._correct += int(hits.sum())
        self._total += hits.size

    @staticmethod
    def _multilabel_hits(predicted: np.ndarray, labels: np.ndarray) -> np.ndarray:
        if predicted.shape != labels.shape or predicted.ndim < 2:
            raise ConfigurationError(
                f"Accuracy(eval_type='multilabel').update: predictions {predicted.shape} and labels {labels.shape} "
                "must have the same shape (N, C, ...)"
            )
        for what, values in (("predictions", predicted), ("labels", labels)):
            if not np.equal(values**2, values).all():
                raise ConfigurationError(
                    f"Accuracy(eval_type='multilabel').update: {what} must be 0 or 1 (threshold scores first)"
                )
        classes = predicted.shape[1]
        last = predicted.ndim - 1
        predicted = predicted.swapaxes(1, last).reshape(-1, classes)
        labels = labels.swapaxes(1, last).reshape(-1, classes)
        return np.equal(predicted, labels).all(axis=1)

    def eval(self) -> float:
        if not self._total:
            raise ConfigurationError("Accuracy.eval: no samples; call update() first")
        return np.float64(self._correct / self._total)  # MindSpore's type


class TopKCategoricalAccuracy(Accuracy):
    """Fraction of samples whose label is among the k highest logits (logits (N, C); labels (N,), (N, 1) or
    one-hot), as MindSpore's."""

    def __init__(self, k: int):
        if not isinstance(k, int) or k < 1:
            raise ConfigurationError(f"TopKCategoricalAccuracy: k must be an int >= 1, got {k!r}")
        self.k = k
        super().__init__()

    @rearrange_inputs
    def update(self, *inputs: Any) -> None:
        if len(inputs) != 2:
            raise ConfigurationError(f"TopKCategoricalAccuracy.update takes (logits, labels), got {len(inputs)} inputs")
        logits, labels = _np(inputs[0]), _np(inputs[1])
        if logits.ndim == labels.ndim and _one_hot(labels):
            labels = labels.argmax(axis=1)
        labels = labels.reshape(-1, 1)
        if logits.ndim != 2 or labels.shape[0] != logits.shape[0]:
            raise ConfigurationError(
                f"TopKCategoricalAccuracy.update: logits must be (N, C) with one label per row, got logits "
                f"{logits.shape} and {labels.shape[0]} labels"
            )
        top = np.argsort(-logits, axis=1)[:, : self.k]
        self._correct += int((top == labels).any(axis=1).sum())
        self._total += logits.shape[0]


class Top1CategoricalAccuracy(TopKCategoricalAccuracy):
    def __init__(self):
        super().__init__(1)


class Top5CategoricalAccuracy(TopKCategoricalAccuracy):
    def __init__(self):
        super().__init__(5)


class Loss(_Builtin):
    """Mean of the per-batch losses."""

    def clear(self) -> None:
        self._sum, self._count = 0.0, 0

    @rearrange_inputs
    def update(self, *inputs: Any) -> None:
        """One batch's loss: a scalar, or a 1-D loss (reduction='none') that counts as its mean, as MindSpore."""
        if len(inputs) != 1:
            raise ConfigurationError(f"Loss.update takes one loss, got {len(inputs)} inputs")
        loss = _np(inputs[0])
        if loss.ndim > 1:
            raise ConfigurationError(f"Loss.update expects a scalar or 1-D loss, got shape {loss.shape}")
        self._sum += float(loss.reshape(-1).mean())
        self._count += 1

    def eval(self) -> float:
        if not self._count:
            raise ConfigurationError("Loss.eval: no batches; call update() first")
        return np.float64(self._sum / self._count)  # MindSpore's type


class MAE(_Builtin):
    """Mean absolute error as MindSpore defines it: the sum of |pred - label| over all elements divided by the
    number of samples (rows), so an output of k values per sample sums k errors per sample."""

    def clear(self) -> None:
        self._sum, self._count = 0.0, 0

    @rearrange_inputs
    def update(self, *inputs: Any) -> None:
        if len(inputs) != 2:
            raise ConfigurationError(
                f"{type(self).__name__}.update takes (predicted value, true value), got {len(inputs)} inputs"
            )
        pred, label = _np(inputs[0]), _np(inputs[1])
        self._sum += float(self._errors(pred - label.reshape(pred.shape)).sum())
        self._count += label.shape[0] if label.ndim else 1

    @staticmethod
    def _errors(difference: np.ndarray) -> np.ndarray:
        return np.abs(difference)

    def eval(self) -> float:
        if not self._count:
            raise ConfigurationError(f"{type(self).__name__}.eval: no samples; call update() first")
        return np.float64(self._sum / self._count)  # MindSpore's type


class MSE(MAE):
    """Mean squared error, per sample as MAE."""

    @staticmethod
    def _errors(difference: np.ndarray) -> np.ndarray:
        return np.square(difference)


_EPS = sys.float_info.min  # MindSpore's: keeps x / (0 + eps) at 0 for a class never predicted or present


def _class_indices(metric: Metric, logits: np.ndarray, labels: np.ndarray, classes: int) -> np.ndarray:
    """Labels as class indices (one-hot labels like the logits are read by their argmax), checked against logits
    (N, C, d1, ...) as MindSpore's classification metrics check them."""
    name = type(metric).__name__
    if logits.ndim == labels.ndim and _one_hot(labels):
        labels = labels.argmax(axis=1)
    if logits.ndim < 2 or labels.shape != (logits.shape[0], *logits.shape[2:]):
        raise ConfigurationError(
            f"{name}.update: logits {logits.shape} (the class axis is 1) take labels of shape "
            f"{(logits.shape[0], *logits.shape[2:]) if logits.ndim >= 2 else '(N,)'} (class indices) or one-hot labels "
            f"like the logits, got {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ConfigurationError(
            f"{name}.update: labels must be class indices in [0, {classes - 1}] for logits of {classes} classes, got "
            f"values in [{labels.min()}, {labels.max()}]"
        )
    return labels.reshape(-1).astype(np.int64)


class _ClassCounts(_Builtin):
    """Per-class counts over every update: predicted (argmax) positives, actual positives, true positives."""

    def clear(self) -> None:
        self._classes = 0
        self._predicted = self._actual = self._true = np.zeros(0)

    @rearrange_inputs
    def update(self, *inputs: Any) -> None:
        name = type(self).__name__
        if len(inputs) != 2:
            raise ConfigurationError(f"{name}.update takes (logits, labels), got {len(inputs)} inputs")
        logits, labels = self._convert_data(inputs[0]), self._convert_data(inputs[1])
        classes = logits.shape[1] if logits.ndim >= 2 else 0
        if self._classes and classes != self._classes:
            raise ConfigurationError(
                f"{name}.update: logits of {classes} classes after updates with {self._classes}; clear() first"
            )
        labels = _class_indices(self, logits, labels, classes)
        predicted = np.moveaxis(logits, 1, -1).reshape(-1, classes).argmax(axis=1)
        if not self._classes:
            self._classes = classes
            self._predicted = self._actual = self._true = np.zeros(classes)
        self._predicted = self._predicted + np.bincount(predicted, minlength=classes)
        self._actual = self._actual + np.bincount(labels, minlength=classes)
        self._true = self._true + np.bincount(labels[predicted == labels], minlength=classes)

    def _per_class(self, numerator: np.ndarray, denominator: np.ndarray, average: Any) -> Any:
        """numerator / denominator per class (a class with neither reads 0), or their mean with average=True."""
        if not isinstance(average, bool):
            raise ConfigurationError(f"{type(self).__name__}.eval: average must be a bool, got {average!r}")
        if not self._classes:
            raise ConfigurationError(f"{type(self).__name__}.eval: no samples; call update() first")
        result = numerator / (denominator + _EPS)
        return result.mean() if average else result


def _classification_only(name: str, eval_type: str) -> None:
    if eval_type == "multilabel":
        from tessel.common.support import not_supported_yet

        raise not_supported_yet(f"{name}(eval_type='multilabel')", "only eval_type='classification' is implemented")
    if eval_type != "classification":
        raise ConfigurationError(f"{name}: eval_type must be 'classification' or 'multilabel', got {eval_type!r}")


class Precision(_ClassCounts):
    """Per class, the fraction of the samples predicted as it (argmax) that are it; eval(average=True) their mean."""

    def __init__(self, eval_type: str = "classification"):
        _classification_only("Precision", eval_type)
        super().__init__()

    def eval(self, average: bool = False) -> Any:
        return self._per_class(self._true, self._predicted, average)


class Recall(_ClassCounts):
    """Per class, the fraction of its samples predicted as it (argmax); eval(average=True) their mean."""

    def __init__(self, eval_type: str = "classification"):
        _classification_only("Recall", eval_type)
        super().__init__()

    def eval(self, average: bool = False) -> Any:
        return self._per_class(self._true, self._actual, average)


class Fbeta(_ClassCounts):
    """Per class, (1 + beta^2) precision recall / (beta^2 precision + recall), from the counts as MindSpore."""

    def __init__(self, beta: float):
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta > 0:
            raise ConfigurationError(f"Fbeta: beta must be a number > 0, got {beta!r}")
        self.beta = float(beta)
        super().__init__()

    def eval(self, average: bool = False) -> Any:
        b2 = self.beta**2
        return self._per_class((1.0 + b2) * self._true, b2 * self._actual + self._predicted, average)


class F1(Fbeta):
    """Fbeta with beta 1: the harmonic mean of precision and recall, per class."""

    def __init__(self):
        super().__init__(1.0)


class ConfusionMatrix(_Builtin):
    """counts[true class, predicted class] over every update. Predictions are logits (N, C, ...) read by argmax,
    or class indices shaped like the labels; float ones are binary scores cut at `threshold`. normalize: 'no_norm',
    'target' (rows sum to 1), 'prediction' (columns) or 'all'; an empty row or column reads 0."""

    def __init__(self, num_classes: int, normalize: str = "no_norm", threshold: float = 0.5):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ConfigurationError(f"ConfusionMatrix: num_classes must be an int >= 1, got {num_classes!r}")
        if normalize not in ("target", "prediction", "all", "no_norm"):
            raise ConfigurationError(
                f"ConfusionMatrix: normalize must be 'target', 'prediction', 'all' or 'no_norm', got {normalize!r}"
            )
        if not isinstance(threshold, float):
            raise ConfigurationError(f"ConfusionMatrix: threshold must be a float, got {threshold!r}")
        self.num_classes, self.normalize, self.threshold = num_classes, normalize, threshold
        super().__init__()

    def clear(self) -> None:
        self._matrix = np.zeros((self.num_classes, self.num_classes))
        self._updated = False

    @rearrange_inputs
    def update(self, *inputs: Any) -> None:
        if len(inputs) != 2:
            raise ConfigurationError(f"ConfusionMatrix.update takes (predictions, labels), got {len(inputs)} inputs")
        predicted, labels = self._convert_data(inputs[0]), self._convert_data(inputs[1])
        if predicted.ndim == labels.ndim + 1:
            predicted = predicted.argmax(axis=1)
        elif predicted.ndim != labels.ndim:
            raise ConfigurationError(
                f"ConfusionMatrix.update: predictions {predicted.shape} must be logits with a class axis 1 more than "
                f"the labels {labels.shape}, or shaped like them"
            )
        elif predicted.dtype.kind == "f":
            predicted = (predicted >= self.threshold).astype(np.int64)
        if predicted.shape != labels.shape:
            raise ConfigurationError(
                f"ConfusionMatrix.update: predictions give classes of shape {predicted.shape} for labels of shape "
                f"{labels.shape}"
            )
        for what, values in (("labels", labels), ("predicted classes", predicted)):
            if values.size and (values.min() < 0 or values.max() >= self.num_classes or (values % 1).any()):
                raise ConfigurationError(
                    f"ConfusionMatrix.update: {what} must be class indices in [0, {self.num_classes - 1}], got "
                    f"values in [{values.min()}, {values.max()}]"
                )
        pairs = labels.reshape(-1).astype(np.int64) * self.num_classes + predicted.reshape(-1).astype(np.int64)
        counts = np.bincount(pairs, minlength=self.num_classes**2)
        self._matrix += counts.reshape(self.num_classes, self.num_classes)
        self._updated = True

    def eval(self) -> np.ndarray:
        if not self._updated:
            raise ConfigurationError("ConfusionMatrix.eval: no samples; call update() first")
        matrix = self._matrix.astype(float)
        if self.normalize == "no_norm":
            return matrix
        total = {
            "target": matrix.sum(axis=1, keepdims=True),
            "prediction": matrix.sum(axis=0, keepdims=True),
            "all": matrix.sum(),
        }[self.normalize]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.nan_to_num(matrix / total, nan=0.0)


_BY_NAME = {
    "accuracy": Accuracy,
    "acc": Accuracy,
    "loss": Loss,
    "mae": MAE,
    "mse": MSE,
    "top_1_accuracy": Top1CategoricalAccuracy,
    "top_5_accuracy": Top5CategoricalAccuracy,
    "precision": Precision,
    "recall": Recall,
    "F1": F1,
}


def get_metrics(metrics: Any) -> dict[str, Metric]:
    """Metric objects by name from a set/list of names or a dict name -> Metric."""
    if metrics is None:
        return {}
    if isinstance(metrics, dict):
        bad = [k for k, v in metrics.items() if not isinstance(v, Metric)]
        if bad:
            raise ConfigurationError(f"metrics {bad} must be Metric instances")
        return dict(metrics)
    out = {}
    for name in metrics:
        if name not in _BY_NAME:
            raise ConfigurationError(f"unknown metric {name!r}; use one of {sorted(_BY_NAME)} or pass Metric objects")
        out[name] = _BY_NAME[name]()
    return out
