"""Evaluation metrics (MindSpore `train.Accuracy`, `Loss`, `TopKCategoricalAccuracy`, `MAE`, `MSE`):
clear(), update(*outputs), eval()."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError


def _np(x: Any) -> np.ndarray:
    return x.asnumpy() if isinstance(x, Tensor) else np.asarray(x)


class Metric:
    """Base class: accumulate with update(), read with eval(), reset with clear()."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        raise NotImplementedError

    def update(self, *inputs: Any) -> None:
        raise NotImplementedError

    def eval(self) -> float:
        raise NotImplementedError


class Accuracy(Metric):
    """Fraction of samples whose highest logit is the label (labels as indices or one-hot)."""

    def __init__(self, eval_type: str = "classification"):
        if eval_type != "classification":
            raise ConfigurationError(f"Accuracy: only eval_type='classification' is supported, got {eval_type!r}")
        super().__init__()

    def clear(self) -> None:
        self._correct, self._total = 0, 0

    def update(self, *inputs: Any) -> None:
        if len(inputs) != 2:
            raise ConfigurationError(f"Accuracy.update takes (logits, labels), got {len(inputs)} inputs")
        logits, labels = _np(inputs[0]), _np(inputs[1])
        if labels.ndim == logits.ndim:
            labels = labels.argmax(-1)
        self._correct += int((logits.argmax(-1) == labels.reshape(logits.shape[:-1])).sum())
        self._total += labels.size

    def eval(self) -> float:
        if not self._total:
            raise ConfigurationError("Accuracy.eval: no samples; call update() first")
        return self._correct / self._total


class TopKCategoricalAccuracy(Accuracy):
    """Fraction of samples whose label is among the k highest logits."""

    def __init__(self, k: int):
        if not isinstance(k, int) or k < 1:
            raise ConfigurationError(f"TopKCategoricalAccuracy: k must be an int >= 1, got {k!r}")
        self.k = k
        super().__init__()

    def update(self, *inputs: Any) -> None:
        logits, labels = _np(inputs[0]), _np(inputs[1])
        if labels.ndim == logits.ndim:
            labels = labels.argmax(-1)
        top = np.argsort(-logits, axis=-1)[..., : self.k]
        self._correct += int((top == labels[..., None]).any(-1).sum())
        self._total += labels.size


class Top1CategoricalAccuracy(TopKCategoricalAccuracy):
    def __init__(self):
        super().__init__(1)


class Top5CategoricalAccuracy(TopKCategoricalAccuracy):
    def __init__(self):
        super().__init__(5)


class Loss(Metric):
    """Mean of the per-batch losses."""

    def clear(self) -> None:
        self._sum, self._count = 0.0, 0

    def update(self, *inputs: Any) -> None:
        loss = _np(inputs[0])
        if loss.size != 1:
            raise ConfigurationError(f"Loss.update expects a scalar loss, got shape {loss.shape}")
        self._sum += float(loss.reshape(()))
        self._count += 1

    def eval(self) -> float:
        if not self._count:
            raise ConfigurationError("Loss.eval: no batches; call update() first")
        return self._sum / self._count


class MAE(Metric):
    """Mean absolute error as MindSpore defines it: the sum of |pred - label| over all elements divided by the
    number of samples (rows), so an output of k values per sample sums k errors per sample."""

    def clear(self) -> None:
        self._sum, self._count = 0.0, 0

    def update(self, *inputs: Any) -> None:
        pred, label = _np(inputs[0]), _np(inputs[1])
        self._sum += float(np.abs(pred - label.reshape(pred.shape)).sum())
        self._count += label.shape[0] if label.ndim else 1

    def eval(self) -> float:
        return self._sum / self._count


class MSE(MAE):
    """Mean squared error, per sample as MAE."""

    def update(self, *inputs: Any) -> None:
        pred, label = _np(inputs[0]), _np(inputs[1])
        self._sum += float(np.square(pred - label.reshape(pred.shape)).sum())
        self._count += label.shape[0] if label.ndim else 1


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
