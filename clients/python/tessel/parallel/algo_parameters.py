"""MindSpore's `set_algo_parameters` / `get_algo_parameters` / `reset_algo_parameters`: knobs of the
AUTO_PARALLEL strategy search.

Every key takes the value tessel's search follows: it weighs strategies that leave some devices as repeated copies
(fully_use_devices=False, where MindSpore's default is True: the one key whose default differs), does not force
element-wise ops onto the strategy of the ops after them, searches every candidate (no approximation) and does not
align MatMul slices (MindSpore's defaults). Another value of a key is checked as MindSpore checks it and then raises
NotSupportedYetError: the search cannot honour it yet, and a setting that changed nothing would mislead.

    >>> ms.set_algo_parameters(fully_use_devices=False)
    >>> ms.get_algo_parameters("algo_approxi_epsilon")
    0.1
"""

from __future__ import annotations

from typing import Any

from tessel.common.support import not_supported_yet

__all__ = ["get_algo_parameters", "reset_algo_parameters", "set_algo_parameters"]

_DEFAULTS: dict[str, Any] = {
    "fully_use_devices": False,
    "elementwise_op_strategy_follow": False,
    "enable_algo_approxi": False,
    "algo_approxi_epsilon": 0.1,
    "tensor_slice_align_enable": False,
    "tensor_slice_align_size": 16,
}
_WHY_NOT = {
    "fully_use_devices": "tessel's search also weighs strategies that leave devices as repeated copies and cannot "
    "be limited to strategies that use every device yet",
    "elementwise_op_strategy_follow": "tessel's search does not force element-wise ops onto the strategy of the "
    "ops after them",
    "enable_algo_approxi": "tessel's dynamic_programming search weighs every candidate; it has no approximation",
    "algo_approxi_epsilon": "tessel's search has no approximation for the epsilon to tune",
    "tensor_slice_align_enable": "tessel's search does not check MatMul slice shapes against an alignment",
    "tensor_slice_align_size": "tessel's search does not check MatMul slice shapes against an alignment",
}
_values = dict(_DEFAULTS)


def _check(key: str, value: Any) -> None:
    """MindSpore's type and range checks of one key."""
    kind = type(_DEFAULTS[key])
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise TypeError(f"The '{key}' must be {kind.__name__}, but got {type(value).__name__}.")
    if key == "tensor_slice_align_size" and not 1 <= value <= 1024:
        raise ValueError(f"Align_size must be in [1, 1024], but got {value}")
    if key == "algo_approxi_epsilon" and not 0 < value <= 1:
        raise ValueError(f"The epsilon value should be in the range (0, 1], but got {value}")


def set_algo_parameters(**kwargs: Any) -> None:
    """Set knobs of the AUTO_PARALLEL strategy search (MindSpore `set_algo_parameters`; see the module docstring:
    only the values tessel's search follows are accepted)."""
    for key, value in kwargs.items():
        if key not in _DEFAULTS:
            raise ValueError(f"Set context keyword {key} is not recognized!")
        _check(key, value)
        if value != _DEFAULTS[key]:
            raise not_supported_yet(f"set_algo_parameters({key}={value!r})", _WHY_NOT[key])
        _values[key] = value


def get_algo_parameters(attr_key: str) -> Any:
    """The value of one knob of the strategy search (MindSpore `get_algo_parameters`)."""
    if attr_key not in _DEFAULTS:
        raise ValueError(f"Get context keyword {attr_key} is not recognized!")
    return _values[attr_key]


def reset_algo_parameters() -> None:
    """Every knob back to its default (MindSpore `reset_algo_parameters`)."""
    _values.update(_DEFAULTS)
