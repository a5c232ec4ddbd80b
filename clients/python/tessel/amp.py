"""`tessel.amp` — MindSpore's `mindspore.amp`: mixed precision and loss scaling.

    >>> net = amp.auto_mixed_precision(net, "O2")          # float16 but BatchNorm / LayerNorm, float32 outputs
    >>> scaler = amp.DynamicLossScaler(2**16, 2, 50)
    >>> loss = scaler.scale(loss)                           # in the function value_and_grad differentiates
    >>> finite = amp.all_finite(grads)                      # then: unscale, update only if finite, adjust

The levels act as MindSpore's do: O1 runs the cells on the white list (Dense, Conv2d, ...) and the white-list
primitives a network's own cells hold (MatMul, Conv2D, ReLU, ...) in float16 with float32 results; O2 runs the whole
network in float16 except the cells on the black list (BatchNorm, LayerNorm), whose results are cast to float16,
and returns float32 outputs; O3 runs all of it in float16, float32 outputs. A cell runs in float16 as
`Cell.to_float` makes it: its float inputs and parameters enter its ops cast.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from tessel import nn, ops
from tessel.common.dtype import DType, to_dtype
from tessel.common.parameter import Parameter
from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.nn.layers import positive_int
from tessel.train.loss_scale_manager import DynamicLossScaleManager, FixedLossScaleManager, LossScaleManager

__all__ = [
    "DynamicLossScaleManager",
    "DynamicLossScaler",
    "FixedLossScaleManager",
    "LossScaleManager",
    "LossScaler",
    "StaticLossScaler",
    "all_finite",
    "auto_mixed_precision",
    "build_train_network",
    "get_black_list",
    "get_white_list",
    "init_status",
]

# MindSpore's lists, less the classes tessel has not (a network cannot hold those)
AMP_WHITE_LIST: list[type] = [nn.Conv2d, nn.Dense, ops.Conv2D, ops.MatMul, ops.BatchMatMul, ops.ReLU]
AMP_BLACK_LIST: list[type] = [nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm]

_LEVELS = ("O0", "O1", "O2", "O3", "auto")
# MindSpore's train/amp.py _config_level
_CONFIG_LEVEL = {
    "O0": {"keep_batchnorm_fp32": False, "cast_model_type": DType.float32, "loss_scale_manager": None},
    "O1": {"keep_batchnorm_fp32": False, "cast_model_type": DType.float32, "loss_scale_manager": None},
    "O2": {"keep_batchnorm_fp32": True, "cast_model_type": DType.float16, "loss_scale_manager": "dynamic"},
    "O3": {"keep_batchnorm_fp32": False, "cast_model_type": DType.float16, "loss_scale_manager": None},
}


def get_white_list() -> list[type]:
    """A copy of the cells and primitives O1 runs in float16."""
    return list(AMP_WHITE_LIST)


def get_black_list() -> list[type]:
    """A copy of the cells O2 keeps in float32."""
    return list(AMP_BLACK_LIST)


# --- overflow checks and loss scalers -----------------------------------------------------------------------------


def init_status() -> Tensor:
    """The overflow status Ascend needs before all_finite; on other devices a zero (8,) float32 tensor, unused."""
    return Tensor(np.zeros(8, np.float32))


def all_finite(inputs: Any, status: Any = None) -> Tensor:
    """A bool scalar Tensor: whether every element of every tensor in `inputs` (gradients) is finite. `status` is
    MindSpore's Ascend overflow register (init_status); tessel checks the values themselves, on every device, so it
    changes nothing here (MindSpore's CPU and GPU ignore it too)."""
    tensors = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    if not tensors:
        raise ConfigurationError("amp.all_finite: inputs is empty; pass the gradients (a tuple of tensors)")
    finite = [ops.all(ops.isfinite(x)) for x in tensors]
    return ops.all(ops.stack(finite))


def _map(fn: Any, inputs: Any) -> Any:
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(_map(fn, x) for x in inputs)
    return fn(inputs)


def _scale_value(scale_value: Any, owner: str) -> Parameter:
    if isinstance(scale_value, bool) or not isinstance(scale_value, (int, float)):
        raise ConfigurationError(f"{owner}: scale_value must be an int or a float, got {scale_value!r}")
    if scale_value < 1.0:
        raise ConfigurationError(f"{owner}: scale_value must be >= 1, got {scale_value}")
    return Parameter(Tensor(np.float32(scale_value)), name="scale_value")


class LossScaler(ABC):
    """Scales the loss (so the gradients) up before the backward pass and the gradients down after it."""

    @abstractmethod
    def scale(self, inputs: Any) -> Any:
        """`inputs` (a Tensor or a tuple of them) times the scale."""

    @abstractmethod
    def unscale(self, inputs: Any) -> Any:
        """`inputs` (a Tensor or a tuple of them) divided by the scale."""

    @abstractmethod
    def adjust(self, grads_finite: Any) -> Any:
        """Change the scale after a step whose gradients were (or were not) all finite."""


class _ScalerBase(LossScaler):
    scale_value: Parameter

    def scale(self, inputs: Any) -> Any:
        return _map(lambda x: x * self.scale_value.astype(x.dtype), inputs)

    def unscale(self, inputs: Any) -> Any:
        return _map(lambda x: x * ops.reciprocal(self.scale_value).astype(x.dtype), inputs)


class StaticLossScaler(_ScalerBase):
    """A constant scale."""

    def __init__(self, scale_value: float):
        self.scale_value = _scale_value(scale_value, "StaticLossScaler")

    def adjust(self, grads_finite: Any) -> bool:
        """The scale is fixed: returns False."""
        return False


class DynamicLossScaler(_ScalerBase):
    """A scale multiplied by `scale_factor` after `scale_window` steps in a row with finite gradients and divided
    by it (never below 1) after a step without; `adjust` works in graphs too (select and assign)."""

    def __init__(self, scale_value: float, scale_factor: int, scale_window: int):
        self.scale_value = _scale_value(scale_value, "DynamicLossScaler")
        self.scale_window = positive_int("DynamicLossScaler", "scale_window", scale_window)
        self.scale_factor = positive_int("DynamicLossScaler", "scale_factor", scale_factor)
        self.counter = Parameter(Tensor(np.int32(0)), name="counter")

    def adjust(self, grads_finite: Any) -> bool:
        one = ops.ones((), self.scale_value.dtype)
        raised = self.scale_value * self.scale_factor
        grown = ops.select(ops.all(ops.isfinite(raised)), raised, self.scale_value)
        kept_or_grown = ops.select(self.counter == (self.scale_window - 1), grown, self.scale_value)
        value = ops.select(grads_finite, kept_or_grown, ops.maximum(one, self.scale_value / self.scale_factor))
        ops.assign(self.scale_value, value)
        counter = ((self.counter + 1) % self.scale_window) * ops.cast(grads_finite, DType.int32)
        ops.assign(self.counter, counter)
        return True


# --- mixed precision --------------------------------------------------------------------------------------------


class _OutputTo32(nn.Cell):
    """The network's float outputs cast back to float32 (O2, O3). Its parameters keep their names."""

    def __init__(self, backbone: nn.Cell):
        super().__init__(auto_prefix=False)
        self._backbone = backbone

    def construct(self, *args: Any, **kwargs: Any) -> Any:
        return nn.cell.cast_float_outputs(self._backbone(*args, **kwargs), DType.float32)


def _check_network(network: Any, owner: str) -> None:
    if not isinstance(network, nn.Cell):
        raise ConfigurationError(f"{owner}: network must be a Cell, got {type(network).__name__}")


def _float_dtype(dtype: Any, owner: str) -> DType:
    resolved = to_dtype(dtype)
    if resolved != DType.float16:
        raise NotSupportedYetError(
            f"{owner}: dtype {dtype!r} is not supported yet; tessel runs mixed precision in float16 (it has no "
            "bfloat16)"
        )
    return resolved


def _own_cell(cell: nn.Cell) -> bool:
    """A cell the user wrote (MindSpore's rewrite looks inside those, not inside its own library's cells)."""
    return not type(cell).__module__.startswith("tessel.")


def _white_list(network: nn.Cell, white_list: list[type], dtype: DType) -> nn.Cell:
    if network._float_dtype == dtype:  # to_float(float16) already: MindSpore leaves such a network alone
        return network
    cells = tuple(t for t in white_list if issubclass(t, nn.Cell))
    primitives = tuple(t for t in white_list if issubclass(t, ops.Primitive))
    for _, cell in network.cells_and_names():
        if cells and isinstance(cell, cells) and cell._float_dtype is None:
            cell.to_float(dtype)
            object.__setattr__(cell, "_output_dtype", DType.float32)
        elif primitives and _own_cell(cell):
            for value in vars(cell).values():
                if isinstance(value, primitives):
                    value._amp_dtype = dtype
    return network


def _black_list(network: nn.Cell, black_list: list[type], dtype: DType) -> None:
    """The network in `dtype`, but the black-listed cells in float32 with their outputs cast to `dtype`."""
    network.to_float(dtype)
    for _, cell in network.cells_and_names():
        if black_list and isinstance(cell, tuple(black_list)) and cell is not network:
            cell.to_float(DType.float32)
            object.__setattr__(cell, "_output_dtype", dtype)


def auto_mixed_precision(network: nn.Cell, amp_level: str = "O0", dtype: Any = DType.float16) -> nn.Cell:
    """`network` with mixed precision at `amp_level` ("O0": unchanged, "O1": the white list in float16, "O2": all
    but the black list, "O3": all of it; float32 outputs from O2 and O3). Returns the network to use."""
    _check_network(network, "auto_mixed_precision")
    level = _level(amp_level, "auto_mixed_precision")
    dtype = _float_dtype(dtype, "auto_mixed_precision")
    if level == "O0":
        return network
    if level == "O1":
        return _white_list(network, AMP_WHITE_LIST, dtype)
    if level == "O2":
        _black_list(network, AMP_BLACK_LIST, dtype)
    else:
        network.to_float(dtype)
    return _OutputTo32(network)


def _level(level: Any, owner: str) -> str:
    if not isinstance(level, str) or level not in _LEVELS:
        raise ConfigurationError(f"{owner}: the level must be one of {', '.join(_LEVELS)}, got {level!r}")
    if level == "auto":
        raise NotSupportedYetError(
            f"{owner}: level 'auto' is not supported yet (MindSpore picks O2 on GPU and O3 on Ascend, and refuses "
            "it on CPU); name the level"
        )
    return level


class _WithLossCellFp32(nn.Cell):
    """loss_fn in float32 on the float16 network's output (MindSpore's _add_loss_network)."""

    def __init__(self, backbone: nn.Cell, loss_fn: nn.Cell):
        super().__init__(auto_prefix=False)
        self._backbone, self._loss_fn = backbone, loss_fn

    def construct(self, data: Any, label: Any) -> Any:
        out = nn.cell.cast_float_outputs(self._backbone(data), DType.float32)
        return self._loss_fn(out, nn.cell.cast_float_outputs(label, DType.float32))


def build_train_network(
    network: nn.Cell,
    optimizer: Any,
    loss_fn: nn.Cell | None = None,
    level: str = "O0",
    boost_level: str = "O0",
    **kwargs: Any,
) -> nn.Cell:
    """The train step of `network` (with `loss_fn` when given) at mixed-precision `level`: a TrainOneStepCell whose
    gradients are scaled by the loss scale manager's scale, or, for a manager that drops overflowing updates (O2's
    default), a TrainOneStepWithLossScaleCell with the manager's update cell. kwargs: cast_model_type,
    keep_batchnorm_fp32, loss_scale_manager, each overriding what `level` implies."""
    _check_network(network, "build_train_network")
    if not isinstance(optimizer, nn.Optimizer):
        raise ConfigurationError(f"build_train_network: optimizer must be an nn.Optimizer, got {type(optimizer)}")
    level = _level(level, "build_train_network")
    if boost_level not in ("O0", "O1", "O2"):
        raise ConfigurationError(f"build_train_network: boost_level must be 'O0', 'O1' or 'O2', got {boost_level!r}")
    if boost_level != "O0":
        raise NotSupportedYetError(f"build_train_network: boost_level {boost_level!r} is not supported yet")
    config = dict(_CONFIG_LEVEL[level])
    for key, value in kwargs.items():
        if key not in config:
            raise ConfigurationError(
                f"build_train_network: unsupported argument {key!r}; the options are cast_model_type, "
                "keep_batchnorm_fp32 and loss_scale_manager"
            )
        config[key] = value
    cast_model_type = to_dtype(config["cast_model_type"])
    if cast_model_type not in (DType.float16, DType.float32):
        raise ConfigurationError(
            f"build_train_network: cast_model_type must be float16 or float32, got {cast_model_type}"
        )
    if not isinstance(config["keep_batchnorm_fp32"], bool):
        raise ConfigurationError(
            f"build_train_network: keep_batchnorm_fp32 must be a bool, got {config['keep_batchnorm_fp32']!r}"
        )
    manager = config["loss_scale_manager"]
    if manager == "dynamic":
        manager = DynamicLossScaleManager()
    if manager is not None and not isinstance(manager, LossScaleManager):
        raise ConfigurationError(f"build_train_network: loss_scale_manager must be a LossScaleManager, got {manager!r}")

    if cast_model_type == DType.float16:
        network.to_float(DType.float16)
        if config["keep_batchnorm_fp32"]:
            _black_list(network, AMP_BLACK_LIST, DType.float16)
    elif not config["keep_batchnorm_fp32"] and level == "O2":
        network.to_float(DType.float16)
    elif not (cast_model_type == DType.float32 and level in ("O2", "O3")):
        network = auto_mixed_precision(network, level)
    if loss_fn is not None:
        if not isinstance(loss_fn, nn.Cell):
            raise ConfigurationError(f"build_train_network: loss_fn must be a Cell, got {type(loss_fn).__name__}")
        cls = _WithLossCellFp32 if cast_model_type == DType.float16 else nn.WithLossCell
        network = cls(network, loss_fn)
    loss_scale = None
    if manager is not None:
        loss_scale = manager.get_loss_scale()
        update_cell = manager.get_update_cell()
        if update_cell is not None:  # overflowing steps are skipped (MindSpore refuses this on CPU; tessel runs it)
            return nn.TrainOneStepWithLossScaleCell(network, optimizer, scale_sense=update_cell).set_train()
    return nn.TrainOneStepCell(network, optimizer, loss_scale).set_train()
