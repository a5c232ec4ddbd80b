"""Loss cells (MindSpore `nn.CrossEntropyLoss`, `nn.SoftmaxCrossEntropyWithLogits`, `nn.MSELoss`, `nn.L1Loss`,
`nn.MAELoss`, `nn.NLLLoss`, `nn.BCEWithLogitsLoss`, `nn.BCELoss`, `nn.SmoothL1Loss`, `nn.HuberLoss`,
`nn.KLDivLoss`): construct(logits, labels) → the loss, reduced by `reduction`."""

from __future__ import annotations

from typing import Any

from tessel.common import dtype as mstype
from tessel.common.tensor import Tensor
from tessel.common.tracing import apply_op
from tessel.core.errors import ConfigurationError
from tessel.nn.cell import Cell
from tessel.ops import composed
from tessel.ops import functional as F
from tessel.ops import primitive as P
from tessel.ops.nn_functional import check_reduction, reduce_loss


class LossBase(Cell):
    """Base of losses, as MindSpore's: `get_loss(x, weights)` applies weights and the reduction ('mean', 'sum' or
    'none') in float32 and returns x's dtype; `get_axis(x)` is every axis of x. A custom loss also finds MindSpore's
    `average` / `reduce` flags and its `reduce_mean`, `reduce_sum`, `mul`, `cast` primitives."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        check_reduction(reduction)
        self.reduction = reduction
        self.average, self.reduce = reduction != "sum", reduction != "none"
        self.reduce_mean, self.reduce_sum = P.ReduceMean(), P.ReduceSum()
        self.mul, self.cast = P.Mul(), P.Cast()

    def get_axis(self, x) -> tuple[int, ...]:
        return tuple(range(len(x.shape)))

    def get_loss(self, x, weights: Any = 1.0):
        dtype = x.dtype
        if dtype != mstype.float32:
            x = F.cast(x, mstype.float32)
        if not (isinstance(weights, float) and weights == 1.0):
            x = x * (F.cast(weights, mstype.float32) if isinstance(weights, Tensor) else weights)
        x = reduce_loss(x, self.reduction)
        return x if dtype == mstype.float32 else F.cast(x, dtype)

    def extend_repr(self) -> str:
        return f"reduction={self.reduction}"


def _check_labels(cell: Cell, logits, labels) -> None:
    if labels.dtype.is_int:
        expected = tuple(logits.shape[:1]) + tuple(logits.shape[2:]) if logits.ndim > 1 else ()
    elif labels.dtype.is_float:
        expected = tuple(logits.shape)
    else:
        raise ConfigurationError(f"{cell.cls_name} input 'labels' must be int class indices or float probabilities")
    if tuple(labels.shape) != expected:
        kind = "class indices" if labels.dtype.is_int else "probabilities"
        raise ConfigurationError(
            f"{cell.cls_name}: labels of shape {tuple(labels.shape)} ({kind}, {labels.dtype.value}) do not fit "
            f"logits of shape {tuple(logits.shape)}; expected labels of shape {expected}. Class indices must be int "
            "(e.g. a dataset TypeCast(ms.int32)); float labels are read as per-class probabilities"
        )


class CrossEntropyLoss(LossBase):
    """Softmax cross-entropy of logits (N, C) against class indices (N,) or probabilities (N, C)."""

    def __init__(
        self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0
    ):
        super().__init__(reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ConfigurationError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing}")
        self.weight, self.ignore_index, self.label_smoothing = weight, ignore_index, label_smoothing

    def construct(self, logits, labels):
        _check_labels(self, logits, labels)
        return F.cross_entropy(logits, labels, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class NLLLoss(LossBase):
    """Negative log-likelihood of log-probabilities (N, C) at class indices (N,)."""

    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(reduction)
        self.weight, self.ignore_index = weight, ignore_index

    def construct(self, logits, labels):
        _check_labels(self, logits, labels)
        return F.nll_loss(logits, labels, self.weight, self.ignore_index, self.reduction)


class SoftmaxCrossEntropyWithLogits(LossBase):
    """Per-sample softmax cross-entropy (reduction='none' by default); sparse=True takes class indices."""

    def __init__(self, sparse: bool = False, reduction: str = "none"):
        super().__init__(reduction)
        self.sparse = sparse

    def construct(self, logits, labels):
        if self.sparse:
            _check_labels(self, logits, labels)
            return self.get_loss(apply_op("SparseSoftmaxCrossEntropy", logits, labels))
        if tuple(labels.shape) != tuple(logits.shape):
            raise ConfigurationError(
                f"SoftmaxCrossEntropyWithLogits(sparse=False): labels {tuple(labels.shape)} must be one-hot/"
                f"probabilities shaped like logits {tuple(logits.shape)}; pass sparse=True for class indices"
            )
        # MindSpore runs its SoftmaxCrossEntropyWithLogits primitive, whose bprop gives the labels no gradient
        labels = F.stop_gradient(F.cast(labels, logits.dtype))
        return self.get_loss(apply_op("SoftmaxCrossEntropy", logits, labels))


class MSELoss(LossBase):
    """(x - y)², reduced."""

    def construct(self, logits, labels):
        return F.mse_loss(logits, labels, self.reduction)


class L1Loss(LossBase):
    """|x - y|, reduced."""

    def construct(self, logits, labels):
        return F.l1_loss(logits, labels, self.reduction)


class MAELoss(LossBase):
    """Mean absolute error |logits - labels|, reduced by `reduction`; labels broadcast against logits (MindSpore
    `nn.MAELoss`: logits (32, 1) against labels (32,) give a (32, 32) loss before reduction)."""

    def construct(self, logits, label):
        return F.l1_loss(logits, label, self.reduction)


class BCEWithLogitsLoss(LossBase):
    """Sigmoid cross-entropy of logits against targets in [0, 1]."""

    def __init__(self, reduction: str = "mean", weight: Any = None, pos_weight: Any = None):
        super().__init__(reduction)
        self.weight, self.pos_weight = weight, pos_weight

    def construct(self, logits, labels):
        return F.binary_cross_entropy_with_logits(logits, labels, self.weight, self.pos_weight, self.reduction)


class BCELoss(LossBase):
    """Binary cross-entropy of probabilities (`logits`, in [0, 1]) against targets of the same shape; `weight`, of
    that shape too, rescales each element."""

    def __init__(self, weight: Any = None, reduction: str = "mean"):
        super().__init__(reduction)
        self.weight = weight

    def construct(self, logits, labels):
        return composed.binary_cross_entropy(logits, labels, self.weight, self.reduction)


class SmoothL1Loss(LossBase):
    """Squared error below `beta`, absolute error above it; unreduced by default, as MindSpore."""

    def __init__(self, beta: float = 1.0, reduction: str = "none"):
        super().__init__(reduction)
        self.beta = composed.positive_number(beta, "SmoothL1Loss", "beta")

    def construct(self, logits, labels):
        return composed.smooth_l1_loss(logits, labels, self.beta, self.reduction)


class HuberLoss(LossBase):
    """Squared error below `delta`, `delta` times the absolute error above it (less half of delta)."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__(reduction)
        self.delta = composed.positive_number(delta, "HuberLoss", "delta")

    def construct(self, logits, labels):
        return composed.huber_loss(logits, labels, self.reduction, self.delta)


class KLDivLoss(LossBase):
    """Kullback-Leibler divergence of log-probabilities `logits` from `labels`; reduction 'batchmean' gives the
    divergence proper, 'mean' (the default) averages over every element, as MindSpore."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        if reduction not in ("none", "mean", "batchmean", "sum"):
            raise ConfigurationError(
                f"KLDivLoss: reduction must be 'none', 'mean', 'batchmean' or 'sum', got {reduction!r}"
            )
        self.reduction = reduction

    def construct(self, logits, labels):
        return composed.kl_div(logits, labels, self.reduction)
