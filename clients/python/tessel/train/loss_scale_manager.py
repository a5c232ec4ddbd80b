"""MindSpore's loss scale managers (`mindspore.train.loss_scale_manager`, also `mindspore.amp` and the top level):
what `Model(loss_scale_manager=...)` and `amp.build_train_network` scale the loss by, and the update cell
(`get_update_cell`) with which nn.TrainOneStepWithLossScaleCell skips a step whose gradients overflowed.
"""

from __future__ import annotations

from typing import Any

from tessel.core.errors import ConfigurationError
from tessel.nn.layers import positive_int


def _number(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{owner}: {name} must be a number, got {value!r}")
    return value


class LossScaleManager:
    """The base class: a loss scale, how it changes after a step, and the cell that changes it in the graph."""

    def get_loss_scale(self) -> Any:
        """The value the loss (so the gradients) is multiplied by."""

    def update_loss_scale(self, overflow: bool) -> None:
        """Change the scale after a step that did (or did not) overflow."""

    def get_update_cell(self) -> Any:
        """The cell TrainOneStepWithLossScaleCell changes the scale with (None: no such cell)."""


class FixedLossScaleManager(LossScaleManager):
    """A constant loss scale. With `drop_overflow_update=False` the step always updates the weights: give the
    optimizer the same `loss_scale`, so that it unscales the gradients."""

    def __init__(self, loss_scale: float = 128.0, drop_overflow_update: bool = True):
        if _number("FixedLossScaleManager", "loss_scale", loss_scale) < 1:
            raise ConfigurationError(f"FixedLossScaleManager: loss_scale must be >= 1, got {loss_scale}")
        if not isinstance(drop_overflow_update, bool):
            raise ConfigurationError(
                f"FixedLossScaleManager: drop_overflow_update must be a bool, got {drop_overflow_update!r}"
            )
        self._loss_scale = loss_scale
        self._drop_overflow_update = drop_overflow_update

    def get_loss_scale(self) -> float:
        return self._loss_scale

    def get_drop_overflow_update(self) -> bool:
        return self._drop_overflow_update

    def update_loss_scale(self, overflow: bool) -> None:
        """The scale is fixed: nothing changes."""

    def get_update_cell(self) -> Any:
        """None without dropping overflowing updates; else the cell TrainOneStepWithLossScaleCell runs."""
        if not self._drop_overflow_update:
            return None
        from tessel import nn

        return nn.FixedLossScaleUpdateCell(self._loss_scale)


class DynamicLossScaleManager(LossScaleManager):
    """A loss scale divided by `scale_factor` (never below 1) after a step that overflowed and multiplied by it
    after `scale_window` steps in a row that did not."""

    def __init__(self, init_loss_scale: float = 2**24, scale_factor: int = 2, scale_window: int = 2000):
        if _number("DynamicLossScaleManager", "init_loss_scale", init_loss_scale) < 1:
            raise ConfigurationError(f"DynamicLossScaleManager: init_loss_scale must be >= 1, got {init_loss_scale}")
        positive_int("DynamicLossScaleManager", "scale_window", scale_window)
        if _number("DynamicLossScaleManager", "scale_factor", scale_factor) <= 0:
            raise ConfigurationError(f"DynamicLossScaleManager: scale_factor must be > 0, got {scale_factor}")
        self.loss_scale = init_loss_scale
        self.scale_window = scale_window
        self.scale_factor = scale_factor
        self.increase_ratio = scale_factor
        self.decrease_ratio = 1 / scale_factor
        self.cur_iter = 1
        self.last_overflow_iter = 0
        self.bad_step_max = 1000
        self.bad_step = 0

    def get_loss_scale(self) -> float:
        return self.loss_scale

    def update_loss_scale(self, overflow: bool) -> None:
        """MindSpore's rule: down by the factor on an overflow (at least 1), up by it every `scale_window` steps
        without one; more than 1000 overflows in a row is an error."""
        if overflow:
            self.loss_scale = max(self.loss_scale * self.decrease_ratio, 1)
            self.last_overflow_iter = self.cur_iter
            self.bad_step += 1
        else:
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                self.loss_scale *= self.increase_ratio
            self.bad_step = 0
        if self.bad_step > self.bad_step_max:
            raise RuntimeError(
                f"DynamicLossScaleManager: the gradients overflowed {self.bad_step} steps in a row, more than "
                f"{self.bad_step_max}; lower the learning rate or init_loss_scale"
            )
        self.cur_iter += 1

    def get_drop_overflow_update(self) -> bool:
        return True

    def get_update_cell(self) -> Any:
        """The cell TrainOneStepWithLossScaleCell updates the scale with, from the current scale."""
        from tessel import nn

        return nn.DynamicLossScaleUpdateCell(self.loss_scale, self.scale_factor, self.scale_window)
