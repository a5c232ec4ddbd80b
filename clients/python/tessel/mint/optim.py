"""`tessel.mint.optim` — MindSpore's `mindspore.mint.optim`: Adam, AdamW and SGD with PyTorch's arguments and formulas.

Each takes `params` as Parameters or as parameter groups (dicts with their own `lr` and `weight_decay`), keeps
`param_groups` (a group's "lr" is the Parameter learning_rate_group_<i>, as MindSpore's; assigning a number to it or
its set_data changes the rate from the next update; MindSpore 2.7.0's SGD instead keeps reading the rate it was built
with, its group's "lr_float") and is called with the gradients, `optimizer(grads)`, in a value_and_grad loop or
inside nn.TrainOneStepCell. The formulas are PyTorch's (tessel.compiler.optimizers.TorchAdam and SGD):

- Adam:  g += weight_decay * p; m, v moving averages; p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
- AdamW: p *= 1 - lr * weight_decay, then Adam's step on the undecayed gradient
- SGD:   g += weight_decay * p; buf = momentum * buf + (1 - dampening) * g (buf = g on the first update);
         p -= lr * (g + momentum * buf) with nesterov, else lr * buf (lr * g without momentum)

maximize negates the gradient first. Checkpoints hold MindSpore's names: exp_avg.*, exp_avg_sq.* and state_step
(Adam, AdamW), momentum_buf.* and step_t (SGD); MindSpore keeps the learning rates in param_groups, out of them.
A hyper-parameter other than lr and weight_decay (betas, eps, momentum, ...) is compiled into the update, so it must
be the same in every group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from tessel.common.parameter import Parameter, ParameterTuple
from tessel.common.support import not_supported_yet
from tessel.compiler import optimizers as rules
from tessel.nn.optim.optimizer import Optimizer, _StateFace, inert_faces

__all__ = ["SGD", "Adam", "AdamW"]


class _Group(dict):
    """One of `param_groups`: a new "lr" (a number, or a Tensor) sets the group's rate from the next update; the other
    hyper-parameters are compiled into the update and refuse a change."""

    def __init__(self, values: dict, rate: Parameter, optimizer: str):
        super().__init__(values, lr=rate)
        self._rate, self._optimizer = rate, optimizer

    def __setitem__(self, key: str, value: Any) -> None:
        if key in ("lr", "lr_float"):
            if value is not self._rate:
                self._rate.set_data(value)
            return
        if key in self and not (value is self[key] or value == self[key]):
            raise not_supported_yet(
                f"changing mindspore.mint.optim.{self._optimizer}'s param_groups[...][{key!r}] after construction",
                f"tessel compiles {key} into the update; construct the optimizer with {key}={value!r}",
            )
        super().__setitem__(key, value)


class _MintOptimizer(Optimizer):
    """The mint face of tessel's optimizers: PyTorch's signature and parameter groups over the nn machinery."""

    _shared: ClassVar[tuple[str, ...]] = ()  # group keys compiled into the rule: one value for every group
    _step_name: ClassVar[str] = ""
    _step_face: ClassVar[tuple[tuple[int, ...], Any, int]] = ((), np.int32, 0)  # shape, dtype, value before update 1

    def __init__(self, params: Any, defaults: dict):
        name = type(self).__name__
        groups = _groups(params, defaults, name)
        if any(group.get("amsgrad") for group in groups):
            # MindSpore 2.7.0's mint Adam computes the maximum but never stores it (its CPU graph then gives plain
            # Adam's weights), and its AdamW's amsgrad is an Ascend kernel
            raise not_supported_yet(
                f"mindspore.mint.optim.{name}(amsgrad=True)",
                "tessel keeps no running maximum of the second moment; use amsgrad=False",
            )
        for key in self._shared:
            values = {repr(group[key]) for group in groups}
            if len(values) > 1:
                raise not_supported_yet(
                    f"mindspore.mint.optim.{name} parameter groups with different {key!r} ({sorted(values)})",
                    f"only lr and weight_decay may differ between groups; use one {key} for all, or one optimizer "
                    "per group",
                )
            vars(self)[key] = groups[0][key]
        vars(self)["defaults"] = defaults
        own = [{"params": g["params"], "lr": g["lr"], "weight_decay": g["weight_decay"]} for g in groups]
        super().__init__(defaults["lr"], own, defaults["weight_decay"])
        # MindSpore's mint optimizers keep their rates in param_groups (not saved) and have no global_step
        rates = [self._params.pop(rate_name) for rate_name, _ in self._group_rates]
        self._params.pop("global_step")
        shape, dtype, start = self._step_face
        get = lambda: np.full(shape, self._step + start, dtype)  # noqa: E731
        put = lambda value: self._set_step(np.asarray(value) - start)  # noqa: E731
        self._params[self._step_name] = _StateFace(self._step_name, np.full(shape, start, dtype), get, put)
        self.__dict__["param_groups"] = [_Group(g, rate, name) for g, rate in zip(groups, rates)]

    def _set_step(self, value: np.ndarray) -> None:
        self.__dict__["_step"] = int(np.asarray(value).reshape(-1)[0])
        for slot, glob in self._globals.items():
            glob.set_data(np.array(self._global_at(slot, self._step), np.float32))

    def _global_at(self, slot: str, step: int) -> float:
        """Global slot `slot`'s value after `step` updates (set when a checkpoint's step count is loaded)."""
        raise NotImplementedError


def _groups(params: Any, defaults: dict, name: str) -> list[dict]:
    """MindSpore's parameter groups (experimental.optim.Optimizer.add_param_group): a list of Parameters is one
    group; each group takes the defaults for the keys it lacks."""
    if params is None or not isinstance(params, Iterable):
        raise TypeError(f"For 'Optimizer', the argument params must be Iterable type, but got {type(params)}.")
    items = list(params)
    if not items:
        raise ValueError("For 'Optimizer', the argument params must not be empty.")
    if not isinstance(items[0], dict):
        items = [{"params": items}]
    groups, seen = [], set()
    for group in items:
        if not isinstance(group, dict):
            raise TypeError("Param group must be a dict.")
        members = [group["params"]] if isinstance(group["params"], Parameter) else list(group["params"])
        if not all(isinstance(p, Parameter) for p in members):
            raise TypeError(f"{name} can only optimize Parameters, got {[type(p).__name__ for p in members]}")
        if seen & {id(p) for p in members}:
            raise ValueError("some parameters appear in more than one parameter group.")
        seen |= {id(p) for p in members}
        unknown = set(group) - set(defaults) - {"params"}
        if unknown:
            raise not_supported_yet(
                f"mindspore.mint.optim.{name} parameter group keys {sorted(unknown)}",
                f"a group takes params and {sorted(defaults)}",
            )
        groups.append({**defaults, **group, "params": members})
    return groups


def _check_adam(name: str, lr: Any, betas: Any, eps: Any, weight_decay: Any, amsgrad: Any, maximize: Any) -> None:
    """MindSpore's _check_param_value and range checks of mint.optim.Adam and AdamW."""
    if not isinstance(betas, tuple) or len(betas) != 2:
        raise TypeError(f"For '{name}', 'betas' must be a tuple of 2 floats, but got {betas!r}")
    floats = {"betas[0]": betas[0], "betas[1]": betas[1], "eps": eps, "weight_decay": weight_decay, "lr": lr}
    for key, value in floats.items():
        if not isinstance(value, float):
            raise TypeError(f"For '{name}', the type of '{key}' should be 'float', but got {value!r}")
    for key, value in {"amsgrad": amsgrad, "maximize": maximize}.items():
        if not isinstance(value, bool):
            raise TypeError(f"For '{name}', the type of '{key}' should be 'bool', but got {value!r}")
    if lr < 0.0 or eps < 0.0 or weight_decay < 0.0:
        raise ValueError(f"Invalid lr, eps or weight_decay (each must be >= 0): {lr}, {eps}, {weight_decay}")
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")


class Adam(_MintOptimizer):
    """mindspore.mint.optim.Adam: PyTorch's Adam, its weight decay added to the gradient (L2)."""

    _slot_names: ClassVar[dict[str, str]] = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
    _step_globals: ClassVar[frozenset[str]] = frozenset({"bias_correction1", "bias_correction2"})
    _shared: ClassVar[tuple[str, ...]] = ("betas", "eps", "maximize")
    _step_name: ClassVar[str] = "state_step"
    _step_face: ClassVar[tuple[tuple[int, ...], Any, int]] = ((1,), np.float32, 0)
    _decoupled: ClassVar[bool] = False

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
    ):
        name = type(self).__name__
        _check_adam(name, lr, betas, eps, weight_decay, amsgrad, maximize)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        beta1, beta2 = self.betas
        return rules.TorchAdam(0.0, weight_decay, beta1, beta2, self.eps, self._decoupled, self.maximize)

    def _global_at(self, slot: str, step: int) -> float:
        return 1.0 - self.betas[slot == "bias_correction2"] ** step


class AdamW(Adam):
    """mindspore.mint.optim.AdamW: PyTorch's AdamW, its weight decay decoupled (p *= 1 - lr * weight_decay)."""

    _step_face: ClassVar[tuple[tuple[int, ...], Any, int]] = ((1,), np.float32, -1)  # MindSpore's starts at -1
    _decoupled: ClassVar[bool] = True

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
    ):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)


class SGD(_MintOptimizer):
    """mindspore.mint.optim.SGD: PyTorch's SGD with momentum, dampening, Nesterov and maximize."""

    _slot_names: ClassVar[dict[str, str]] = {"accum": "momentum_buf"}
    _step_globals: ClassVar[frozenset[str]] = frozenset({"stat"})
    _shared: ClassVar[tuple[str, ...]] = ("momentum", "dampening", "nesterov", "maximize")
    _step_name: ClassVar[str] = "step_t"
    _decay_filtered: ClassVar[bool] = False

    def __init__(
        self,
        params: Any,
        lr: Any,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
    ):
        numbers = {"momentum": momentum, "weight_decay": weight_decay, "dampening": dampening}
        for key, value in numbers.items():
            if not isinstance(value, (float, int)):
                raise TypeError(f"For 'SGD', the type of '{key}' should be float, int or bool, but got {value!r}")
        for key, value in {"nesterov": nesterov, "maximize": maximize}.items():
            if not isinstance(value, bool):
                raise TypeError(f"For 'SGD', the type of '{key}' should be 'bool', but got {value!r}")
        if lr < 0.0 or momentum < 0.0 or weight_decay < 0.0:
            raise ValueError(
                f"Invalid lr, momentum or weight_decay (each must be >= 0): {lr}, {momentum}, {weight_decay}"
            )
        if nesterov and (momentum <= 0.0 or dampening != 0.0):
            raise ValueError(
                "For 'SGD', if 'nesterov' is true, 'momentum' must be > 0.0 and 'dampening' must equal to 0.0, but "
                f"got 'momentum' {momentum}, 'dampening' {dampening}"
            )
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            dampening=dampening,
            nesterov=nesterov,
            maximize=maximize,
        )
        super().__init__(params, defaults)
        if not self.momentum:
            # MindSpore keeps momentum_buf.* whatever the momentum; without one no update reads or changes it
            self.momentum_buf = ParameterTuple(inert_faces("momentum_buf", self.parameters, lambda: 0.0))

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        momentum, dampening = float(self.momentum), float(self.dampening)
        return rules.SGD(0.0, weight_decay, momentum, dampening, self.nesterov, self.maximize)

    def _global_at(self, slot: str, step: int) -> float:
        return 1.0 if step == 0 else 0.0  # stat: 1 until the first update, which starts the momentum buffer as g
