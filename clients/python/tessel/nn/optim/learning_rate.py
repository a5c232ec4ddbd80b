"""Learning-rate schedules: MindSpore's per-step list builders (`nn.cosine_decay_lr`, …) and the
`LearningRateSchedule` cells (`nn.CosineDecayLR`, …). The optimizer evaluates the rate of each step on the host
and feeds it with the step, so a schedule never recompiles anything."""

from __future__ import annotations

import math

import numpy as np

from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError
from tessel.nn.cell import Cell


def _check_positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{name} must be a positive int, got {value!r}")


def _check_rates(positive: dict[str, float], non_negative: dict[str, float] | None = None) -> None:
    """MindSpore's checks of rates and powers (learning_rate_schedule._check_inputs, dynamic_lr): floats (an int is
    a TypeError there too: write 1.0), > 0 (or >= 0 for a lowest rate)."""
    for name, value in {**positive, **(non_negative or {})}.items():
        if not isinstance(value, float):
            raise TypeError(f"{name} must be a float, as in MindSpore, got {value!r}; write e.g. {name}=0.1")
        if not math.isfinite(value):
            raise ConfigurationError(f"{name} must be a finite number, got {value!r}")
        if value <= 0 and name in positive:
            raise ConfigurationError(f"{name} must be > 0, got {value}")
        if value < 0:
            raise ConfigurationError(f"{name} must be >= 0, got {value}")


def _check_stair(is_stair: object) -> None:
    if not isinstance(is_stair, bool):
        raise ConfigurationError(f"is_stair must be a bool, got {is_stair!r}")


def _check_cosine(min_lr: float, max_lr: float) -> None:
    _check_rates({"max_lr": max_lr}, {"min_lr": min_lr})
    if min_lr >= max_lr:
        raise ConfigurationError(f"min_lr must be below max_lr, got min_lr {min_lr} and max_lr {max_lr}")


def piecewise_constant_lr(milestone: list[int], learning_rates: list[float]) -> list[float]:
    """Rate learning_rates[j] for steps in [milestone[j-1], milestone[j]) (equal milestones give a rate no step)."""
    if len(milestone) != len(learning_rates) or any(b < a for a, b in zip([0, *milestone], milestone)):
        raise ConfigurationError("milestone must not decrease and must have one entry per learning rate")
    _check_positive(**{f"milestone[{i}]": m for i, m in enumerate(milestone)})
    for i, rate in enumerate(learning_rates):
        if not isinstance(rate, float):
            raise TypeError(f"piecewise_constant_lr: learning_rates[{i}] must be a float, got {rate!r}")
    out, start = [], 0
    for end, rate in zip(milestone, learning_rates):
        out += [float(rate)] * (end - start)
        start = end
    return out


def _per_step(total_step: int, step_per_epoch: int, rate) -> list[float]:
    _check_positive(total_step=total_step, step_per_epoch=step_per_epoch)
    return [float(rate(math.floor(i / step_per_epoch))) for i in range(total_step)]


def exponential_decay_lr(learning_rate, decay_rate, total_step, step_per_epoch, decay_epoch, is_stair=False):
    """learning_rate * decay_rate ** (epoch / decay_epoch) (floored with is_stair)."""
    _check_positive(decay_epoch=decay_epoch)
    _check_rates({"learning_rate": learning_rate, "decay_rate": decay_rate})
    _check_stair(is_stair)
    power = (lambda e: math.floor(e / decay_epoch)) if is_stair else (lambda e: e / decay_epoch)
    return _per_step(total_step, step_per_epoch, lambda e: learning_rate * decay_rate ** power(e))


def natural_exp_decay_lr(learning_rate, decay_rate, total_step, step_per_epoch, decay_epoch, is_stair=False):
    """learning_rate * exp(-decay_rate * epoch / decay_epoch)."""
    _check_positive(decay_epoch=decay_epoch)
    _check_rates({"learning_rate": learning_rate, "decay_rate": decay_rate})
    _check_stair(is_stair)
    power = (lambda e: math.floor(e / decay_epoch) * decay_epoch) if is_stair else (lambda e: e)
    return _per_step(total_step, step_per_epoch, lambda e: learning_rate * math.exp(-decay_rate * power(e)))


def inverse_decay_lr(learning_rate, decay_rate, total_step, step_per_epoch, decay_epoch, is_stair=False):
    """learning_rate / (1 + decay_rate * epoch / decay_epoch)."""
    _check_positive(decay_epoch=decay_epoch)
    _check_rates({"learning_rate": learning_rate, "decay_rate": decay_rate})
    _check_stair(is_stair)
    power = (lambda e: math.floor(e / decay_epoch)) if is_stair else (lambda e: e / decay_epoch)
    return _per_step(total_step, step_per_epoch, lambda e: learning_rate / (1 + decay_rate * power(e)))


def cosine_decay_lr(min_lr, max_lr, total_step, step_per_epoch, decay_epoch):
    """min_lr + (max_lr - min_lr) * (1 + cos(pi * min(epoch, decay_epoch) / decay_epoch)) / 2."""
    _check_positive(decay_epoch=decay_epoch)
    _check_cosine(min_lr, max_lr)
    return _per_step(
        total_step,
        step_per_epoch,
        lambda e: min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * min(e, decay_epoch) / decay_epoch)),
    )


def polynomial_decay_lr(
    learning_rate, end_learning_rate, total_step, step_per_epoch, decay_epoch, power, update_decay_epoch=False
):
    """(learning_rate - end) * (1 - min(epoch, decay_epoch) / decay_epoch) ** power + end."""
    _check_positive(decay_epoch=decay_epoch)
    _check_rates({"learning_rate": learning_rate, "power": power}, {"end_learning_rate": end_learning_rate})

    def rate(e):
        span = decay_epoch * max(1, math.ceil(e / decay_epoch)) if update_decay_epoch else decay_epoch
        return (learning_rate - end_learning_rate) * (1 - min(e, span) / span) ** power + end_learning_rate

    return _per_step(total_step, step_per_epoch, rate)


def warmup_lr(learning_rate, total_step, step_per_epoch, warmup_epoch):
    """learning_rate * min(epoch, warmup_epoch) / warmup_epoch."""
    _check_positive(warmup_epoch=warmup_epoch)
    _check_rates({"learning_rate": learning_rate})
    return _per_step(total_step, step_per_epoch, lambda e: learning_rate * min(e, warmup_epoch) / warmup_epoch)


class LearningRateSchedule(Cell):
    """A learning rate computed from the global step. Subclasses give `lr_at(step) -> float`; a subclass that
    only defines construct(global_step) is evaluated eagerly, step by step."""

    def lr_at(self, step: int) -> float:
        return float(np.asarray(self.construct(Tensor._wrap(np.array(step, np.int32))).asnumpy()))

    def construct(self, global_step):
        step = int(global_step.asnumpy()) if isinstance(global_step, Tensor) else int(global_step)
        return Tensor._wrap(np.array(self.lr_at(step), np.float32))

    def __call__(self, global_step):
        return self.construct(global_step)


class _Decay(LearningRateSchedule):
    def __init__(self, learning_rate: float, decay_rate: float, decay_steps: int, is_stair: bool = False):
        super().__init__()
        _check_positive(decay_steps=decay_steps)
        _check_rates({"learning_rate": learning_rate, "decay_rate": decay_rate})
        _check_stair(is_stair)
        self.learning_rate, self.decay_rate, self.decay_steps, self.is_stair = (
            learning_rate,
            decay_rate,
            decay_steps,
            is_stair,
        )

    def _p(self, step: int) -> float:
        p = step / self.decay_steps
        return math.floor(p) if self.is_stair else p


class ExponentialDecayLR(_Decay):
    def lr_at(self, step: int) -> float:
        return self.learning_rate * self.decay_rate ** self._p(step)


class NaturalExpDecayLR(_Decay):
    # MindSpore's construct (not its docstring's formula): p = step, or with is_stair floor(step / decay_steps) *
    # decay_steps; as natural_exp_decay_lr, so the schedule cell and the list agree with MindSpore's numbers.
    def lr_at(self, step: int) -> float:
        p = math.floor(step / self.decay_steps) * self.decay_steps if self.is_stair else step
        return self.learning_rate * math.exp(-self.decay_rate * p)


class InverseDecayLR(_Decay):
    def lr_at(self, step: int) -> float:
        return self.learning_rate / (1 + self.decay_rate * self._p(step))


class CosineDecayLR(LearningRateSchedule):
    def __init__(self, min_lr: float, max_lr: float, decay_steps: int):
        super().__init__()
        _check_positive(decay_steps=decay_steps)
        _check_cosine(min_lr, max_lr)
        self.min_lr, self.max_lr, self.decay_steps = min_lr, max_lr, decay_steps

    def lr_at(self, step: int) -> float:
        p = min(step, self.decay_steps) / self.decay_steps
        return self.min_lr + 0.5 * (self.max_lr - self.min_lr) * (1 + math.cos(math.pi * p))


class PolynomialDecayLR(LearningRateSchedule):
    def __init__(
        self,
        learning_rate: float,
        end_learning_rate: float,
        decay_steps: int,
        power: float,
        update_decay_steps: bool = False,
    ):
        super().__init__()
        _check_positive(decay_steps=decay_steps)
        _check_rates({"learning_rate": learning_rate, "power": power}, {"end_learning_rate": end_learning_rate})
        if not isinstance(update_decay_steps, bool):
            raise ConfigurationError(f"update_decay_steps must be a bool, got {update_decay_steps!r}")
        self.learning_rate, self.end_learning_rate = learning_rate, end_learning_rate
        self.decay_steps, self.power, self.update_decay_steps = decay_steps, power, update_decay_steps

    def lr_at(self, step: int) -> float:
        span = self.decay_steps
        if self.update_decay_steps:
            span *= max(1, math.ceil(step / self.decay_steps))
        p = min(step, span) / span
        return (self.learning_rate - self.end_learning_rate) * (1 - p) ** self.power + self.end_learning_rate


class WarmUpLR(LearningRateSchedule):
    def __init__(self, learning_rate: float, warmup_steps: int):
        super().__init__()
        _check_positive(warmup_steps=warmup_steps)
        _check_rates({"learning_rate": learning_rate})
        self.learning_rate, self.warmup_steps = learning_rate, warmup_steps

    def lr_at(self, step: int) -> float:
        return self.learning_rate * min(step, self.warmup_steps) / self.warmup_steps
