"""More loss cells of MindSpore 2.7.0's nn/loss/loss.py, with its arguments, defaults and reductions: RMSELoss,
MarginRankingLoss, CosineEmbeddingLoss, SoftMarginLoss, MultiLabelSoftMarginLoss, MultiMarginLoss,
HingeEmbeddingLoss, TripletMarginLoss, PoissonNLLLoss, GaussianNLLLoss, DiceLoss, MultiClassDiceLoss, FocalLoss."""

from __future__ import annotations

import math
from typing import Any

from tessel.common import dtype as mstype
from tessel.common.tensor import Tensor
from tessel.nn.cell import Cell
from tessel.nn.layers import get_activation
from tessel.nn.loss import LossBase, MSELoss
from tessel.ops import functional as F

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(owner: str, reduction: Any) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"For '{owner}', the 'reduction' must be in ['mean', 'sum', 'none'], but got {reduction}.")


def _check_float(owner: str, name: str, value: Any, kinds: tuple = (float,)) -> None:
    if isinstance(value, bool) or not isinstance(value, kinds):
        names = " or ".join(kind.__name__ for kind in kinds)
        raise TypeError(f"For '{owner}', the type of '{name}' should be {names}, but got {type(value).__name__}.")


def _check_tensor(owner: str, **tensors: Any) -> None:
    for name, value in tensors.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"For '{owner}', the '{name}' must be a Tensor, but got {type(value).__name__}.")


def _softplus_naive(x):
    """log(1 + e^x) as MindSpore's multilabel_soft_margin_loss and soft_margin_loss write it (inf for x > ~88)."""
    return F.log(F.exp(x) + 1.0)


class RMSELoss(LossBase):
    """sqrt(mean((logits - label)^2))."""

    def __init__(self):
        super().__init__()
        self.MSELoss = MSELoss()

    def construct(self, logits, label):
        return F.sqrt(self.MSELoss(logits, label))


class MarginRankingLoss(LossBase):
    """max(0, -target * (input1 - input2) + margin), reduced; target holds 1 or -1; margin is a float."""

    def __init__(self, margin: float = 0.0, reduction: str = "mean"):
        super().__init__(reduction)
        self.margin = margin

    def construct(self, input1, input2, target):
        _check_float("margin_ranking_loss", "margin", self.margin)
        _check_tensor("margin_ranking_loss", input1=input1, input2=input2, target=target)
        return self.get_loss(F.maximum(-target * (input1 - input2) + self.margin, 0.0))


class SoftMarginLoss(LossBase):
    """log(1 + e^(-labels * logits)), reduced."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def construct(self, logits, labels):
        _check_reduction("SoftMarginLoss", self.reduction)
        if tuple(logits.shape) != tuple(labels.shape):
            raise ValueError(f"For 'SoftMarginLoss', logits {tuple(logits.shape)} and labels must have one shape.")
        return self.get_loss(_softplus_naive(-labels * logits))


class MultiLabelSoftMarginLoss(LossBase):
    """-(target * log sigmoid(x) + (1 - target) * log sigmoid(-x)) * weight, averaged over the classes (last dim),
    then reduced over the batch."""

    def __init__(self, weight: Any = None, reduction: str = "mean"):
        super().__init__(reduction)
        self.weight = weight

    def construct(self, x, target):
        _check_tensor("multilabel_soft_margin_loss", input=x, target=target)
        loss = target * _softplus_naive(-x) + (1 - target) * _softplus_naive(x)
        if self.weight is not None:
            loss = loss * self.weight
        return self.get_loss(F.sum(loss, x.ndim - 1) / x.shape[-1])


class MultiMarginLoss(LossBase):
    """For each sample i: sum over classes j != target_i of max(0, margin - x[i, target_i] + x[i, j])^p, times
    weight[target_i], divided by the number of classes; then reduced. p is 1 or 2."""

    def __init__(self, p: int = 1, margin: float = 1.0, reduction: str = "mean", weight: Any = None):
        super().__init__()
        if p not in (1, 2) or isinstance(p, bool):
            raise ValueError(f"For 'MultiMarginLoss', the 'p' must be 1 or 2, but got {p}.")
        _check_float("MultiMarginLoss", "margin", margin)
        _check_reduction("MultiMarginLoss", reduction)
        self.p, self.margin, self.reduction, self.weight = p, margin, reduction, weight

    def construct(self, x, target, weight=None):
        _check_tensor("MultiMarginLoss", x=x, target=target)
        if self.weight is not None:
            weight = self.weight
        if x.ndim != 2 or target.ndim != 1 or target.shape[0] != x.shape[0]:
            raise ValueError(
                f"For 'MultiMarginLoss', x must be (N, C) and target (N,), got {tuple(x.shape)} and "
                f"{tuple(target.shape)}."
            )
        classes = x.shape[1]
        index = F.reshape(F.cast(target, mstype.int32), (-1, 1))
        chosen = F.gather_elements(x, 1, index)
        hinge = F.maximum(self.margin - chosen + x, 0.0)
        if self.p == 2:
            hinge = hinge * hinge
        others = F.select(F.equal(F.one_hot(F.cast(target, mstype.int32), classes, 1.0, 0.0), 1.0), 0.0 * x, hinge)
        if weight is not None:
            others = others * F.gather_elements(F.reshape(weight, (1, -1)) + 0.0 * x, 1, index)
        return self.get_loss(F.sum(others, 1) / classes)


class CosineEmbeddingLoss(LossBase):
    """1 - cos(x1, x2) where labels == 1, max(0, cos(x1, x2) - margin) where labels == -1 (cosine over dim 1);
    margin is a float in [-1, 1]."""

    def __init__(self, margin: float = 0.0, reduction: str = "mean"):
        super().__init__(reduction)
        _check_float("CosineEmbeddingLoss", "margin", margin)
        if not -1.0 <= margin <= 1.0:
            raise ValueError(f"For 'CosineEmbeddingLoss', the 'margin' must be in [-1.0, 1.0], but got {margin}.")
        self.margin = margin

    def construct(self, logits_x1, logits_x2, labels):
        _check_tensor("CosineEmbeddingLoss", logits_x1=logits_x1, logits_x2=logits_x2, labels=labels)
        if tuple(logits_x1.shape) != tuple(logits_x2.shape) or logits_x1.dtype != logits_x2.dtype:
            raise TypeError("For 'CosineEmbeddingLoss', logits_x1 and logits_x2 must have one shape and dtype.")
        product = F.sum(logits_x1 * logits_x2, (1,))
        norms = F.sqrt(F.sum(F.square(logits_x1), (1,))) * F.sqrt(F.sum(F.square(logits_x2), (1,)))
        cosine = product / norms
        zeros = F.zeros_like(cosine)
        positive = F.select(F.equal(labels, 1), 1.0 - cosine, zeros)
        negative = F.select(F.equal(labels, -1), F.maximum(cosine - self.margin, 0.0), zeros)
        return self.get_loss(positive + negative)


class HingeEmbeddingLoss(LossBase):
    """logits where labels > 0, max(0, margin - logits) where labels < 0 (0 where labels == 0), reduced."""

    def __init__(self, margin: float = 1.0, reduction: str = "mean"):
        super().__init__()
        _check_float("HingeEmbeddingLoss", "margin", margin, (float, int))
        if reduction not in ("none", "sum", "mean"):
            raise ValueError(f"For 'HingeEmbeddingLoss', 'reduction' must be 'none', 'sum' or 'mean', got {reduction}.")
        self.margin, self.reduction = margin, reduction

    def construct(self, logits, labels):
        if tuple(logits.shape) != tuple(labels.shape):
            raise ValueError(f"For 'HingeEmbeddingLoss', logits {tuple(logits.shape)} and labels must have one shape.")
        positive = F.cast(F.greater(labels, 0), logits.dtype)
        negative = F.cast(F.less(labels, 0), logits.dtype)
        loss = positive * logits + F.maximum(self.margin * negative - negative * logits, 0.0)
        return F.mean(loss) if self.reduction == "mean" else F.sum(loss) if self.reduction == "sum" else loss


class TripletMarginLoss(LossBase):
    """max(d(x, positive) - d(x, negative) + margin, 0) with d(a, b) = ||a - b + eps||_p over the last dim; swap
    uses min(d(x, negative), d(positive, negative)). A construct argument margin is used unless the cell's own
    margin differs from 1.0, as MindSpore's."""

    def __init__(self, p: int = 2, swap: bool = False, eps: float = 1e-6, reduction: str = "mean", margin: float = 1.0):
        super().__init__()
        self.p, self.swap, self.eps, self.reduction, self.margin = p, swap, eps, reduction, margin

    def _distance(self, a, b):
        diff = F.abs(a - b + self.eps)
        if self.p == 2:
            return F.sqrt(F.sum(diff * diff, -1))
        if self.p == 1:
            return F.sum(diff, -1)
        return F.pow(F.sum(F.pow(diff, float(self.p)), -1), 1.0 / self.p)

    def construct(self, x, positive, negative, margin=1.0):
        _check_reduction("TripletMarginLoss", self.reduction)
        if isinstance(self.p, bool) or not isinstance(self.p, int) or self.p < 1:
            raise TypeError(f"For 'TripletMarginLoss', 'p' must be a positive int, but got {self.p!r}.")
        if self.margin != 1.0:
            margin = self.margin
        near, far = self._distance(x, positive), self._distance(x, negative)
        if self.swap:
            far = F.minimum(far, self._distance(positive, negative))
        return self.get_loss(F.maximum(near - far + margin, 0.0))


class PoissonNLLLoss(LossBase):
    """e^input - target * input (log_input) or input - target * log(input + eps); full adds Stirling's
    target * log(target) - target + 0.5 * log(2 * pi * target) where target > 1."""

    def __init__(self, log_input: bool = True, full: bool = False, eps: float = 1e-8, reduction: str = "mean"):
        super().__init__(reduction)
        self.log_input, self.full, self.eps = log_input, full, eps

    def construct(self, input, target):
        _check_tensor("PoissonNLLLoss", input=input, target=target)
        target = F.cast(target, input.dtype)
        loss = F.exp(input) - target * input if self.log_input else input - target * F.log(input + self.eps)
        if self.full:
            target = F.maximum(target, self.eps)
            stirling = (target + 0.5) * F.log(target) - target + 0.5 * math.log(2 * math.pi)
            loss = loss + F.select(F.greater(target, 1.0), stirling, F.zeros_like(stirling))
        return self.get_loss(loss)


class GaussianNLLLoss(LossBase):
    """0.5 * (log(max(var, eps)) + (logits - labels)^2 / max(var, eps)) (+ 0.5 * log(2 * pi) when full), reduced.
    var may lack logits' last dim."""

    def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean"):
        super().__init__()
        if not isinstance(eps, float):
            raise TypeError(f"For 'GaussianNLLLoss', the 'eps' must be 'float', but got {type(eps).__name__}.")
        if not eps > 0:
            raise ValueError(f"For 'GaussianNLLLoss', the 'eps' must be in range (0, inf), but got {eps}.")
        if not isinstance(full, bool):
            raise TypeError(f"For 'GaussianNLLLoss', the type of 'full' should be bool, but got {type(full).__name__}.")
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(
                f"For 'gaussian_nll_loss', the 'reduction' should be in ['none', 'mean', 'sum'], got {reduction}."
            )
        self.full, self.eps, self.reduction = full, eps, reduction

    def construct(self, logits, labels, var):
        _check_tensor("GaussianNLLLoss", logits=logits, labels=labels, var=var)
        if tuple(logits.shape) != tuple(var.shape) and tuple(logits.shape[:-1]) == tuple(var.shape):
            var = F.expand_dims(var, -1)
        clamped = F.maximum(var, self.eps)
        loss = 0.5 * (F.log(clamped) + F.square(logits - labels) / clamped)
        if self.full:
            loss = loss + 0.5 * math.log(2 * math.pi)
        return F.mean(loss) if self.reduction == "mean" else F.sum(loss) if self.reduction == "sum" else loss


def _check_same_shape(owner: str, logits, label) -> None:
    if tuple(logits.shape) != tuple(label.shape):
        raise ValueError(
            f"For '{owner}', the 'logits' shape must be equal to 'labels' shape, but got {tuple(logits.shape)} and "
            f"{tuple(label.shape)}."
        )


class DiceLoss(LossBase):
    """1 - 2 * sum(logits * label) / (sum(logits^2) + sum(label^2) + smooth), over all elements."""

    def __init__(self, smooth: float = 1e-5):
        super().__init__()
        _check_float("DiceLoss", "smooth", smooth)
        if smooth <= 0:
            raise ValueError(f"For 'DiceLoss', the 'smooth' must be a positive float, but got {smooth}.")
        self.smooth = smooth

    def construct(self, logits, label):
        _check_tensor("DiceLoss", logits=logits, labels=label)
        _check_same_shape("DiceLoss", logits, label)
        logits, label = F.reshape(logits, (-1,)), F.reshape(label, (-1,))
        union = F.sum(logits * logits) + F.sum(label * label)
        return 1 - 2 * F.sum(logits * label) / (union + self.smooth)


class MultiClassDiceLoss(LossBase):
    """The mean over the classes (dim 1) of DiceLoss(logits[:, i], label[:, i]) (weighted by weights[i], skipping
    ignore_indiex), after `activation` (MindSpore's names: 'softmax', 'logsoftmax', 'relu', 'relu6', 'tanh',
    'sigmoid', which run over the last axis; a Cell; or None)."""

    _ACTIVATIONS = ("softmax", "logsoftmax", "relu", "relu6", "tanh", "sigmoid")

    def __init__(self, weights: Any = None, ignore_indiex: int | None = None, activation: Any = "softmax"):
        super().__init__()
        if weights is not None and not isinstance(weights, Tensor):
            raise TypeError(f"For 'MultiClassDiceLoss', 'weights' must be a Tensor, but got {type(weights).__name__}.")
        if isinstance(weights, Tensor) and weights.ndim != 2:
            raise ValueError(f"For 'MultiClassDiceLoss', the dimension of 'weights' must be 2, but got {weights.ndim}.")
        if ignore_indiex is not None and (isinstance(ignore_indiex, bool) or not isinstance(ignore_indiex, int)):
            raise TypeError(f"For 'MultiClassDiceLoss', 'ignore_indiex' must be an int, got {ignore_indiex!r}.")
        if isinstance(activation, str) and activation not in self._ACTIVATIONS:
            raise ValueError(
                f"For 'MultiClassDiceLoss', the 'activation' must be in {list(self._ACTIVATIONS)}, got {activation}."
            )
        activation = get_activation(activation) if isinstance(activation, str) else activation
        if activation is not None and not isinstance(activation, Cell):
            raise TypeError(f"For 'MultiClassDiceLoss', the 'activation' must be str or Cell, got {type(activation)}.")
        self.weights, self.ignore_indiex, self.activation = weights, ignore_indiex, activation
        self.binarydiceloss = DiceLoss(smooth=1e-5)

    def construct(self, logits, label):
        _check_tensor("MultiClassDiceLoss", logits=logits, labels=label)
        _check_same_shape("MultiClassDiceLoss", logits, label)
        if logits.ndim < 2:
            raise ValueError(
                f"For 'MultiClassDiceLoss', the 'logits' dimension must be greater than 1, got {logits.ndim}."
            )
        classes = label.shape[1]
        if self.weights is not None and self.weights.shape[0] != classes:
            raise ValueError(
                f"For 'MultiClassDiceLoss', the weight shape[0] should be equal to label.shape[1], but got "
                f"{self.weights.shape[0]} and {classes}."
            )
        if self.activation is not None:
            logits = self.activation(logits)
        total = 0
        for i in range(classes):
            if i != self.ignore_indiex:
                loss = self.binarydiceloss(logits[:, i], label[:, i])
                if self.weights is not None:
                    loss = loss * self.weights[i]
                total = total + loss
        return total / classes


class FocalLoss(LossBase):
    """-(1 - p)^gamma * log p of the labelled class, p = softmax(logits) over dim 1, averaged over the classes
    (labels of one channel hold class indices; labels of C channels are one-hot or soft targets), optionally
    weighted per class, then reduced."""

    def __init__(self, weight: Any = None, gamma: float = 2.0, reduction: str = "mean"):
        super().__init__(reduction)
        _check_float("FocalLoss", "gamma", gamma)
        if weight is not None and not isinstance(weight, Tensor):
            raise TypeError(f"For 'FocalLoss', the type of 'weight' must be a Tensor, but got {type(weight).__name__}.")
        if isinstance(weight, Tensor) and weight.ndim != 1:
            raise ValueError(f"For 'FocalLoss', the dimension of 'weight' must be 1, but got {weight.ndim}.")
        self.weight, self.gamma = weight, gamma

    def construct(self, logits, labels):
        _check_tensor("FocalLoss", logits=logits, labels=labels)
        if logits.ndim != labels.ndim or logits.ndim < 2:
            raise ValueError(
                f"For 'FocalLoss', logits and labels must have one rank >= 2, got {logits.ndim} and {labels.ndim}."
            )
        indices = labels.shape[1] == 1
        if not indices and labels.shape[1] != logits.shape[1]:
            raise ValueError(
                f"For 'FocalLoss', labels must have 1 or {logits.shape[1]} channels, but got {labels.shape[1]}."
            )
        if labels.dtype not in (mstype.int32, mstype.int64, mstype.float16, mstype.float32):
            raise TypeError(f"For 'FocalLoss', labels must be int32, int64, float16 or float32, got {labels.dtype}.")
        batch = logits.shape[0]
        logits = F.reshape(logits, (batch, logits.shape[1], -1))
        labels = F.reshape(labels, (batch, labels.shape[1], -1))
        log_probability = F.log_softmax(logits, 1)
        if indices:
            index = F.cast(labels, mstype.int32)
            log_probability = F.squeeze(F.gather_elements(log_probability, 1, index), 1)
        probability = F.exp(log_probability)
        if self.weight is not None:
            weight = F.reshape(self.weight, (1, -1, 1)) + F.zeros_like(logits)
            if indices:
                weight = F.squeeze(F.gather_elements(weight, 1, index), 1)
            log_probability = log_probability * weight
        focus = F.pow(1.0 - probability, self.gamma)
        if indices:
            return self.get_loss(F.mean(-focus * log_probability, 1))
        return self.get_loss(F.mean(-focus * F.cast(labels, logits.dtype) * log_probability, -1))
