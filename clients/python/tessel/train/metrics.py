"""Evaluation metrics (MindSpore `train.Accuracy`, `Loss`, `TopKCategoricalAccuracy`, `MAE`, `MSE`):
clear(), update(*outputs), eval()."""

from __future__ import annotations

import functools
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
    """Fraction of samples whose highest logit (over the class axis, 1) is the label, as MindSpore: labels are class
    indices shaped (N,) + logits.shape[2:], or one-hot like the logits."""

    def __init__(self, eval_type: str = "classification"):
        if eval_type != "classification":
            raise ConfigurationError(f"Accuracy: only eval_type='classification' is supported, got {eval_type!r}")
        super().__init__()

    def clear(self) -> None:
        self._correct, self._total = 0, 0

    @rearrange_inputs
    def update(self, *inputs: Any) -> None:
        if len(inputs) != 2:
            raise ConfigurationError(f"Accuracy.update takes (logits, labels), got {len(inputs)} inputs")
        logits, labels = _np(inputs[0]), _np(inputs[1])
        if logits.ndim == labels.ndim and _one_hot(labels):
            labels = labels.argmax(axis=1)
        want = (logits.shape[0], *logits.shape[2:]) if logits.ndim >= 2 else None
        if want is None or labels.shape != want:
            raise ConfigurationError(
                f"Accuracy.update: logits {logits.shape} take labels of shape {want} (class indices; the class axis "
                f"is 1) or one-hot labels like the logits, got {labels.shape}; e.g. labels.reshape(-1) for (N, 1)"
            )
        hits = np.equal(logits.argmax(axis=1), labels).reshape(-1)
        self._correct += int(hits.sum())
        self._total += hits.size

    def eval(self) -> float:
        if not self._total:
            raise ConfigurationError("Accuracy.eval: no samples; call update() first")
        return self._correct / self._total


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
        return self._sum / self._count


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
        return self._sum / self._count


class MSE(MAE):
    """Mean squared error, per sample as MAE."""

    @staticmethod
    def _errors(difference: np.ndarray) -> np.ndarray:
        return np.square(difference)


_BY_NAME = {
    "accuracy": Accuracy,
    "acc": Accuracy,
    "loss": Loss,
    "mae": MAE,
    "mse": MSE,
    "top_1_accuracy": Top1CategoricalAccuracy,
    "top_5_accuracy": Top5CategoricalAccuracy,
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
