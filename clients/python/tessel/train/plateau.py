"""Callbacks that watch a monitored value at each epoch end (MindSpore's EarlyStopping and ReduceLROnPlateau).

The monitor is "loss" (the last step's net_outputs, its first output where there are several) or a key of
cb_params.eval_results ("eval_loss" or a metric name), which an evaluation at each epoch end fills. "auto" mode
takes "loss", "eval_loss", "mae", "mse", ... as smaller-is-better and any other name as larger-is-better.

    >>> import tessel as ms
    >>> stop = ms.train.EarlyStopping(monitor="loss", patience=3, restore_best_weights=True)
    >>> model.train(20, dataset, callbacks=[stop, ms.train.ReduceLROnPlateau(monitor="loss", patience=1)])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessel.common.tensor import Tensor
from tessel.core.options import logger
from tessel.train.callback import Callback, RunContext, _printed_loss

_SMALLER_BETTER = {
    "hausdorff_distance",
    "mae",
    "mse",
    "loss",
    "perplexity",
    "mean_surface_distance",
    "root_mean_square_distance",
    "eval_loss",
}


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"The input value must be int and must >= 0, but got '{value}' with type '{type(value).__name__}'."
        )
    if value < 0:
        raise ValueError(f"The input value must be int and must >= 0, but got '{value}' with type 'int'.")
    return value


def _number(name: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"The type of '{name}' should be one of '['float', 'int']', but got type '{type(value).__name__}'."
        )
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"The input value must be a bool, but got {type(value).__name__}.")
    return value


class _PlateauWatch(Callback):
    """What both callbacks share: the monitor, its direction and min_delta, the best value so far."""

    _what = ""

    def __init__(self, monitor: Any, min_delta: Any, mode: Any):
        if not isinstance(monitor, str):
            raise TypeError(f"The type of 'monitor' should be 'str', but got type '{type(monitor).__name__}'.")
        if not isinstance(mode, str):
            raise TypeError(f"The type of 'mode' should be 'str', but got type '{type(mode).__name__}'.")
        self.monitor, self.min_delta, self.mode = monitor, abs(_number("min_delta", min_delta)), mode
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"mode should be 'auto', 'min' or 'max', but got {mode}.")
        self._smaller_better = mode == "min" or (mode == "auto" and monitor in _SMALLER_BETTER)
        self.best = self._worst()

    def _worst(self) -> float:
        return np.inf if self._smaller_better else -np.inf

    def is_improvement(self, value: Any, reference: Any) -> bool:
        """Better than `reference` by more than min_delta in the monitor's direction."""
        if self._smaller_better:
            return bool(np.less(value, reference - self.min_delta))
        return bool(np.greater(value, reference + self.min_delta))

    def _monitor_value(self, cb_params: Any) -> np.ndarray | None:
        """The monitored value at this epoch end, None (with a warning, as MindSpore) where it is not available.
        A value of 0 counts: MindSpore 2.7.0 tests the value's truth and so skips an epoch whose value is 0."""
        candidates = {}
        if self.monitor == "loss":
            value = _printed_loss(cb_params.get("net_outputs"))
        else:
            candidates = cb_params.get("eval_results") or {}
            value = candidates.get(self.monitor)
        if value is None:
            logger.warning(
                "%s is conditioned on %s, which is not available. Available choices are: %s",
                self._what,
                self.monitor,
                {"loss", *candidates},
            )
            return None
        value = np.asarray(value.asnumpy() if isinstance(value, Tensor) else value)
        if value.shape != ():
            raise ValueError(f"{type(self).__name__} only supports scalar monitor now.")
        return value


class EarlyStopping(_PlateauWatch):
    """Stop training (run_context.request_stop()) once the monitor has not improved on its best by more than
    min_delta for `patience` epochs (MindSpore's EarlyStopping). As MindSpore's, the wait counter is raised at every
    epoch end and reset by an improvement, and training stops as soon as it reaches patience: patience=0 stops after
    the first epoch. An improvement resets the counter only where it also beats `baseline`, if given.
    restore_best_weights=True puts back, when stopping, the train network's parameters of the best epoch.

    MindSpore 2.7.0's constructor stores min_delta in place of a given baseline (and takes any baseline), so there a
    baseline acts as baseline=min_delta; tessel uses the baseline given, as MindSpore documents it."""

    _what = "Early stopping"

    def __init__(
        self,
        monitor: str = "eval_loss",
        min_delta: float = 0,
        patience: int = 0,
        verbose: bool = False,
        mode: str = "auto",
        baseline: float | None = None,
        restore_best_weights: bool = False,
    ):
        super().__init__(monitor, min_delta, mode)
        self.patience, self.verbose = _non_negative_int(patience), _bool(verbose)
        self.baseline = None if baseline is None else _number("baseline", baseline)
        self.restore_best_weights = _bool(restore_best_weights)
        self.wait, self.stopped_epoch, self.best_weights_param_dict = 0, 0, None

    def on_train_begin(self, run_context: RunContext) -> None:
        self.wait, self.stopped_epoch, self.best_weights_param_dict = 0, 0, None
        self.best = self._worst()

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        cb_params = run_context.original_args()
        current = self._monitor_value(cb_params)
        if current is None:
            return
        network = cb_params.train_network
        if self.restore_best_weights and self.best_weights_param_dict is None:
            self.best_weights_param_dict = _snapshot(network)
        self.wait += 1
        if self.is_improvement(current, self.best):
            self.best = current
            if self.restore_best_weights:
                self.best_weights_param_dict = _snapshot(network)
            if self.baseline is None or self.is_improvement(current, self.baseline):
                self.wait = 0
        if self.wait >= self.patience:
            self.stopped_epoch = cb_params.get("cur_epoch_num")
            run_context.request_stop()
            if self.restore_best_weights and self.best_weights_param_dict is not None:
                if self.verbose:
                    print("Restoring model weights from the end of the best epoch.")
                for name, parameter in network.parameters_dict().items():
                    parameter.set_data(Tensor(self.best_weights_param_dict[name]))

    def on_train_end(self, run_context: RunContext) -> None:
        if self.stopped_epoch > 0 and self.verbose:
            print(f"Epoch {self.stopped_epoch:05d}: early stopping")


def _snapshot(network: Any) -> dict[str, np.ndarray]:
    return {name: np.array(parameter.asnumpy(), copy=True) for name, parameter in network.parameters_dict().items()}


class ReduceLROnPlateau(_PlateauWatch):
    """Multiply the optimizer's learning rate by `factor` (not below min_lr) once the monitor has not improved on its
    best by more than min_delta for `patience` epochs, then wait `cooldown` epochs before counting again
    (MindSpore's ReduceLROnPlateau). The rate is computed in float32, as MindSpore's Parameter holds it, and takes
    effect at the next step. Only a fixed learning rate can be lowered, as in MindSpore: a per-step list, a
    LearningRateSchedule or per-group rates raise ValueError at the first epoch end."""

    _what = "Learning rate reduction"

    def __init__(
        self,
        monitor: str = "eval_loss",
        factor: float = 0.1,
        patience: int = 10,
        verbose: bool = False,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0,
    ):
        if isinstance(factor, bool) or not isinstance(factor, float):
            raise TypeError(f"The input value must be 'float',  but got '{type(factor).__name__}'.")
        if not 0.0 < factor < 1.0:
            raise ValueError(f"The input value must be in range of (0.0, 1.0), but got {factor} with type 'float'.")
        self.factor = factor
        self.patience, self.verbose = _non_negative_int(patience), _bool(verbose)
        super().__init__(monitor, min_delta, mode)
        self.cooldown, self.min_lr = _non_negative_int(cooldown), _number("min_lr", min_lr)
        self.cooldown_counter, self.wait = 0, 0

    def on_train_begin(self, run_context: RunContext) -> None:
        self.cooldown_counter, self.wait = 0, 0
        self.best = self._worst()

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        from tessel.nn.optim.optimizer import LearningRate

        cb_params = run_context.original_args()
        optimizer = cb_params.optimizer
        rate = getattr(optimizer, "learning_rate", None)
        if not isinstance(rate, LearningRate) or getattr(optimizer, "_group_rates", None):
            raise ValueError("ReduceLROnPlateau does not support dynamic learning rate and group learning rate now.")
        current = self._monitor_value(cb_params)
        if current is None:
            return
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self.is_improvement(current, self.best):
            self.best, self.wait = current, 0
        elif self.cooldown_counter <= 0:
            self.wait += 1
            if self.wait >= self.patience:
                lr = np.float32(rate)
                if lr > np.float32(self.min_lr):
                    new_lr = max(lr * np.float32(self.factor), self.min_lr)  # printed as MindSpore prints it
                    rate.set_data(np.array(new_lr, np.float32))
                    if self.verbose:
                        epoch = cb_params.cur_epoch_num
                        print(f"Epoch {epoch:05d}: ReduceLROnPlateau reducing learning rate to {new_lr!s}.")
                self.cooldown_counter, self.wait = self.cooldown, 0
