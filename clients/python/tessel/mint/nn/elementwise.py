"""mint.nn's element-wise cells: activations, the losses and padding, each calling mint.nn.functional with its
cell's arguments (MindSpore 2.7's mindspore/mint/nn/layer/activation.py, loss.py, padding.py)."""

from __future__ import annotations

from typing import Any

from tessel import nn as _nn
from tessel.common.dtype import DType
from tessel.core.errors import ConfigurationError
from tessel.mint.nn import functional
from tessel.nn.layers import make_parameter

__all__ = [
    "ELU",
    "GLU",
    "SELU",
    "BCELoss",
    "ConstantPad1d",
    "ConstantPad2d",
    "ConstantPad3d",
    "Hardshrink",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "KLDivLoss",
    "LogSigmoid",
    "Mish",
    "PReLU",
    "PixelShuffle",
    "ReflectionPad1d",
    "ReflectionPad2d",
    "ReflectionPad3d",
    "ReplicationPad1d",
    "ReplicationPad2d",
    "ReplicationPad3d",
    "SmoothL1Loss",
    "SoftMarginLoss",
    "Softshrink",
    "Threshold",
    "ZeroPad1d",
    "ZeroPad2d",
    "ZeroPad3d",
]


class _Function(_nn.Cell):
    """A cell that calls mint.nn.functional.`_fn` on its input with the attributes named in `_args`."""

    _fn = ""
    _args: tuple[str, ...] = ()

    def __init__(self, **attrs: Any):
        super().__init__()
        for name, value in attrs.items():
            setattr(self, name, value)

    def construct(self, input):
        return getattr(functional, self._fn)(input, *(getattr(self, name) for name in self._args))

    def extend_repr(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in self._args)


def _no_inplace(cell: str, inplace: bool) -> None:
    functional._no_inplace(cell, inplace, "mindspore.mint.nn")


class ELU(_Function):
    _fn, _args = "elu", ("alpha",)

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        _no_inplace("ELU", inplace)
        super().__init__(alpha=alpha, inplace=inplace)


class SELU(_Function):
    _fn = "selu"

    def __init__(self):
        super().__init__()


class Mish(_Function):
    _fn = "mish"

    def __init__(self):
        super().__init__()


class GLU(_Function):
    _fn, _args = "glu", ("dim",)

    def __init__(self, dim: int = -1):
        super().__init__(dim=dim)


class Hardshrink(_Function):
    _fn, _args = "hardshrink", ("lambd",)

    def __init__(self, lambd: float = 0.5):
        super().__init__(lambd=lambd)


class Softshrink(_Function):
    _fn, _args = "softshrink", ("lambd",)

    def __init__(self, lambd: float = 0.5):
        super().__init__(lambd=lambd)


class Hardsigmoid(_Function):
    _fn = "hardsigmoid"

    def __init__(self):
        super().__init__()


class Hardswish(_Function):
    _fn = "hardswish"

    def __init__(self):
        super().__init__()


class Hardtanh(_Function):
    _fn, _args = "hardtanh", ("min_val", "max_val")

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        _no_inplace("Hardtanh", inplace)
        super().__init__(min_val=min_val, max_val=max_val, inplace=inplace)


class LogSigmoid(_Function):
    _fn = "logsigmoid"

    def __init__(self):
        super().__init__()


class Threshold(_Function):
    _fn, _args = "threshold", ("threshold", "value")

    def __init__(self, threshold: float, value: float, inplace: bool = False):
        _no_inplace("Threshold", inplace)
        super().__init__(threshold=threshold, value=value, inplace=inplace)


class PReLU(_nn.Cell):
    """x where x > 0, else weight * x; weight (num_parameters,) filled with init: one slope or one per channel."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, dtype: Any = None):
        super().__init__()
        self.num_parameters = num_parameters
        self.weight = make_parameter(float(init), (num_parameters,), dtype or DType.float32, "weight")

    def construct(self, input):
        return functional.prelu(input, self.weight)


class _Loss(_nn.Cell):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ConfigurationError(
                f"mint.nn.{self.cls_name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
            )
        self.reduction = reduction


class BCELoss(_Loss):
    """Binary cross-entropy of probabilities against targets, each element weighted by `weight` when given."""

    def __init__(self, weight: Any = None, reduction: str = "mean"):
        super().__init__(reduction)
        self.weight = weight

    def construct(self, input, target):
        return functional.binary_cross_entropy(input, target, self.weight, self.reduction)


class KLDivLoss(_nn.Cell):
    """Kullback-Leibler divergence of log-probabilities against targets (log-probabilities too when log_target)."""

    def __init__(self, reduction: str = "mean", log_target: bool = False):
        super().__init__()
        if reduction not in ("mean", "batchmean", "sum", "none"):
            raise ConfigurationError(
                f"mint.nn.KLDivLoss: reduction must be 'mean', 'batchmean', 'sum' or 'none', got {reduction!r}"
            )
        self.reduction, self.log_target = reduction, log_target

    def construct(self, input, target):
        return functional.kl_div(input, target, self.reduction, self.log_target)


class SmoothL1Loss(_Loss):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, for d = input - target."""

    def __init__(self, reduction: str = "mean", beta: float = 1.0):
        super().__init__(reduction)
        self.beta = beta

    def construct(self, input, target):
        return functional.smooth_l1_loss(input, target, self.reduction, self.beta)


class SoftMarginLoss(_Loss):
    """log(1 + e^(-target * input)) for targets of +1 and -1."""

    def construct(self, input, target):
        return functional.soft_margin_loss(input, target, self.reduction)


class _Pad(_nn.Cell):
    """Pads of mint's padding cells: an int for every side, or (left, right[, top, bottom[, front, back]])."""

    _mode, _dims = "constant", 1

    def __init__(self, padding: Any, value: float | None = None):
        super().__init__()
        sides = 2 * self._dims
        pads = (padding,) * sides if isinstance(padding, int) else tuple(padding)
        if len(pads) != sides or not all(isinstance(p, int) for p in pads):
            raise ConfigurationError(
                f"mint.nn.{self.cls_name}: padding must be an int or {sides} ints, got {padding!r}"
            )
        self.padding, self.value = pads, value

    def construct(self, input):
        return functional.pad(input, self.padding, self._mode, self.value)

    def extend_repr(self) -> str:
        return f"padding={self.padding}"


class _ConstantPad(_Pad):
    def __init__(self, padding: Any, value: float):
        super().__init__(padding, float(value))


class _ZeroPad(_Pad):
    def __init__(self, padding: Any):
        super().__init__(padding, 0.0)


class _ReflectionPad(_Pad):
    _mode = "reflect"

    def __init__(self, padding: Any):
        super().__init__(padding)


class _ReplicationPad(_Pad):
    _mode = "replicate"

    def __init__(self, padding: Any):
        super().__init__(padding)


class ConstantPad1d(_ConstantPad):
    _dims = 1


class ConstantPad2d(_ConstantPad):
    _dims = 2


class ConstantPad3d(_ConstantPad):
    _dims = 3


class ZeroPad1d(_ZeroPad):
    _dims = 1


class ZeroPad2d(_ZeroPad):
    _dims = 2


class ZeroPad3d(_ZeroPad):
    _dims = 3


class ReflectionPad1d(_ReflectionPad):
    _dims = 1


class ReflectionPad2d(_ReflectionPad):
    _dims = 2


class ReflectionPad3d(_ReflectionPad):
    _dims = 3


class ReplicationPad1d(_ReplicationPad):
    _dims = 1


class ReplicationPad2d(_ReplicationPad):
    _dims = 2


class ReplicationPad3d(_ReplicationPad):
    _dims = 3


class PixelShuffle(_Function):
    _fn, _args = "pixel_shuffle", ("upscale_factor",)

    def __init__(self, upscale_factor: int):
        super().__init__(upscale_factor=upscale_factor)
