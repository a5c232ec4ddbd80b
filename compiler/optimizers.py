"""Optimizer update rules as data: each optimizer names its state and writes its update with tensor arithmetic.

The rules follow MindSpore's `nn` optimizers (weight decay adds `weight_decay * p` to the gradient, except in
AdamWeightDecay where it is decoupled):

- SGD:   accum = momentum * accum + (1 - dampening) * g  (accum = g on the first step); p -= lr * step,
         step = g + momentum * accum with nesterov, else accum (plain p -= lr * g without momentum)
- Momentum: v = momentum * v + g; p -= lr * (g + momentum * v) with nesterov, else lr * v
- Adam:  m, v moving averages; p -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)
- AdamWeightDecay: p -= lr * (m / (sqrt(v) + eps) + weight_decay * p)  (no bias correction, as in MindSpore)
- TorchAdam (mint.optim's Adam and AdamW, PyTorch's formula): m, v moving averages; at update t (from 1)
         p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps); AdamW first decays p *= 1 - lr * decay
         (decoupled), Adam adds decay * p to the gradient. maximize negates the gradient (SGD's too)
- RMSProp: ms = decay * ms + (1 - decay) * g^2 (ms starts at 1); mom = momentum * mom + lr * g / sqrt(ms + eps);
           p -= mom. Centered: mg = decay * mg + (1 - decay) * g, and sqrt(ms - mg^2 + eps) in the denominator
- Adagrad: accum += g^2 (accum starts at `accum`); p -= lr * g / sqrt(accum)
- Adadelta: accum = rho * accum + (1 - rho) * g^2; u = sqrt(accum_update + eps) / sqrt(accum + eps) * g;
            accum_update = rho * accum_update + (1 - rho) * u^2; p -= lr * u
- ProximalAdagrad: accum += g^2; a = lr / sqrt(accum); v = p - a * g;
                   p = sign(v) * max(|v| - a * l1, 0) / (1 + a * l2)
- Rprop: f = etaplus, etaminus or 1 as g * prev > 0, < 0 or 0; step_size = clip(step_size * f, min, max)
         (step_size = lr on the first step); g' = 0 where f = etaminus, else g; p -= sign(g') * step_size; prev = g'
- FTRL:  n = accum + g^2; linear += g - (n^-lr_power - accum^-lr_power) / lr * p; accum = n;
         p = (sign(linear) * l1 - linear) / (n^-lr_power / lr + 2 * l2) where |linear| > l1, else 0
- ASGD:  p = p * (1 - lambd * eta) - eta * g; ax += (p - ax) * mu (ax = p where mu = 1); then for update t (from 1)
         eta = lr / (1 + lambd * lr * t)^alpha and mu = 1 / max(1, t - t0). eta and mu are one number per parameter
         (eta = lr on the first update, mu = 1), computed in float32 as MindSpore's

Plain SGD (no momentum) folds the learning rate into the backward pass: the train step seeds it with lr, so
every gradient comes out times lr from the small tensors it is computed from, and the update is one subtraction
instead of a multiplication and a subtraction over every parameter (measured: 11 % of a batch-32 MLP step).

An optimizer is a frozen dataclass, so it is part of a train step's identity (and its graph hash).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from tessel.compiler.builder import SymbolicTensor, apply

T = SymbolicTensor


@dataclass(frozen=True)
class Slot:
    """One piece of optimizer state: per parameter (shaped like it, or with `scalar` one float32 number) or global
    (a float32 scalar)."""

    name: str
    init: float = 0.0
    scalar: bool = False


@dataclass(frozen=True)
class ParameterGroups:
    """What MindSpore's parameter groups set per parameter, by name: a weight decay other than the optimizer's
    (`decays`, 0 for none), and which learning rate it takes (`rates`: its index into the learning-rate input, which
    then holds `rate_count` rates, one per group; none: one scalar rate for every parameter)."""

    decays: tuple[tuple[str, float], ...] = ()
    rates: tuple[tuple[str, int], ...] = ()
    rate_count: int = 0

    @staticmethod
    def of(decays: Mapping[str, float], rates: Mapping[str, int] | None = None, rate_count: int = 0):
        return ParameterGroups(tuple(sorted(decays.items())), tuple(sorted((rates or {}).items())), rate_count)

    @cached_property
    def _decay_of(self) -> dict[str, float]:
        return dict(self.decays)

    @cached_property
    def _rate_of(self) -> dict[str, int]:
        return dict(self.rates)

    @property
    def rate_shape(self) -> tuple[int, ...]:
        """The learning-rate input's shape."""
        return (self.rate_count,) if self.rate_count else ()

    def decay(self, name: str, default: float) -> float:
        return self._decay_of.get(name, default)

    def rate(self, lr: T, name: str) -> T:
        """Parameter `name`'s learning rate, from the learning-rate input `lr`."""
        return lr[self._rate_of[name]] if self.rate_count else lr


UNGROUPED = ParameterGroups()  # every parameter: the optimizer's weight decay and its one learning rate


@dataclass(frozen=True)
class Optimizer:
    """Base class. `update` returns the new parameter and new slot values; `update_globals` the new globals."""

    learning_rate: float = 0.01
    weight_decay: float = 0.0

    def slots(self) -> tuple[Slot, ...]:
        return ()

    def global_slots(self) -> tuple[Slot, ...]:
        return ()

    def update(self, p: T, g: T, slots: dict[str, T], glob: dict[str, T], lr: T, decay: float) -> tuple[T, dict]:
        """`decay`: this parameter's weight decay (the rule's `weight_decay`, another of its parameter group, or 0)."""
        raise NotImplementedError

    def update_globals(self, glob: dict[str, T]) -> dict[str, T]:
        return {}

    def folds_learning_rate(self) -> bool:
        """Whether the update is p - lr * g (plus weight decay) and reads g nowhere else. The train step then seeds
        the backward pass with lr instead of 1, so the gradients arrive already times lr (`update_scaled`)."""
        return False

    def update_scaled(self, p: T, lr_g: T, lr: T, decay: float) -> T:
        """The new parameter from lr * g, for an optimizer that folds_learning_rate."""
        raise NotImplementedError

    @staticmethod
    def _decayed(p: T, g: T, decay: float) -> T:
        return g + decay * p if decay else g


@dataclass(frozen=True)
class SGD(Optimizer):
    learning_rate: float = 0.1
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    maximize: bool = False

    def slots(self):
        return (Slot("accum"),) if self.momentum else ()

    def global_slots(self):
        return (Slot("stat", 1.0),) if self.momentum else ()

    def update(self, p, g, slots, glob, lr, decay):
        g = self._decayed(p, -g if self.maximize else g, decay)
        if not self.momentum:
            return p - lr * g, {}
        # stat is 1 on the first step only: then the accumulator starts as the gradient itself.
        scale = _like(1.0 - self.dampening * (1.0 - glob["stat"]), g)
        accum = self.momentum * slots["accum"] + scale * g
        step = g + self.momentum * accum if self.nesterov else accum
        return p - lr * step, {"accum": accum}

    def folds_learning_rate(self):
        return not self.momentum and not self.maximize

    def update_scaled(self, p, lr_g, lr, decay):
        if decay:
            lr_g = lr_g + (lr * decay) * p
        return p - lr_g

    def update_globals(self, glob):
        return {"stat": apply("ZerosLike", glob["stat"])} if self.momentum else {}


@dataclass(frozen=True)
class Momentum(Optimizer):
    learning_rate: float = 0.01
    momentum: float = 0.9
    use_nesterov: bool = False

    def slots(self):
        return (Slot("moments"),)

    def update(self, p, g, slots, glob, lr, decay):
        g = self._decayed(p, g, decay)
        v = self.momentum * slots["moments"] + g
        step = g + self.momentum * v if self.use_nesterov else v
        return p - lr * step, {"moments": v}


def _like(x: T, ref: T) -> T:
    """x in ref's dtype: the float32 globals (beta powers, the first-step flag) meet float16 parameters."""
    return x if x.dtype == ref.dtype else apply("Cast", x, dtype=ref.dtype)


def _moments(opt, g: T, slots: dict[str, T]) -> tuple[T, T]:
    m = opt.beta1 * slots["moment1"] + (1.0 - opt.beta1) * g
    v = opt.beta2 * slots["moment2"] + (1.0 - opt.beta2) * g * g
    return m, v


@dataclass(frozen=True)
class Adam(Optimizer):
    learning_rate: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    use_nesterov: bool = False

    def slots(self):
        return (Slot("moment1"), Slot("moment2"))

    def global_slots(self):
        return (Slot("beta1_power", 1.0), Slot("beta2_power", 1.0))

    def update(self, p, g, slots, glob, lr, decay):
        g = self._decayed(p, g, decay)
        m, v = _moments(self, g, slots)
        b1t, b2t = glob["beta1_power"] * self.beta1, glob["beta2_power"] * self.beta2
        lr_t = lr * _like(apply("Sqrt", 1.0 - b2t) / (1.0 - b1t), lr)
        direction = self.beta1 * m + (1.0 - self.beta1) * g if self.use_nesterov else m
        return p - lr_t * direction / (apply("Sqrt", v) + self.eps), {"moment1": m, "moment2": v}

    def update_globals(self, glob):
        return {"beta1_power": glob["beta1_power"] * self.beta1, "beta2_power": glob["beta2_power"] * self.beta2}


@dataclass(frozen=True)
class AdamWeightDecay(Optimizer):
    learning_rate: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6

    def slots(self):
        return (Slot("moment1"), Slot("moment2"))

    def update(self, p, g, slots, glob, lr, decay):
        m, v = _moments(self, g, slots)
        step = m / (apply("Sqrt", v) + self.eps)
        if decay:
            step = step + decay * p
        return p - lr * step, {"moment1": m, "moment2": v}


@dataclass(frozen=True)
class TorchAdam(Optimizer):
    learning_rate: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    decoupled: bool = False  # AdamW: the weight decay shrinks p instead of joining the gradient
    maximize: bool = False

    def slots(self):
        return (Slot("exp_avg"), Slot("exp_avg_sq"))

    def global_slots(self):
        # 1 - beta^t of the update about to run is (1 - beta) + beta * (1 - beta^(t-1)): kept that way it has no
        # cancellation in float32 (1 - float32(0.999) is 1.3e-5 off 0.001), so it is PyTorch's float64 value
        return (Slot("bias_correction1"), Slot("bias_correction2"))

    def update(self, p, g, slots, glob, lr, decay):
        if self.maximize:
            g = -g
        if decay and self.decoupled:
            p = p - (lr * decay) * p
        elif decay:
            g = g + decay * p
        m = self.beta1 * slots["exp_avg"] + (1.0 - self.beta1) * g
        v = self.beta2 * slots["exp_avg_sq"] + (1.0 - self.beta2) * g * g
        bias1, bias2 = self.update_globals(glob).values()
        step_size = lr / _like(bias1, lr)
        root_bias = _like(apply("Sqrt", bias2), v)
        return p - step_size * m / (apply("Sqrt", v) / root_bias + self.eps), {"exp_avg": m, "exp_avg_sq": v}

    def update_globals(self, glob):
        return {
            "bias_correction1": (1.0 - self.beta1) + self.beta1 * glob["bias_correction1"],
            "bias_correction2": (1.0 - self.beta2) + self.beta2 * glob["bias_correction2"],
        }


@dataclass(frozen=True)
class RMSProp(Optimizer):
    learning_rate: float = 0.1
    decay: float = 0.9
    momentum: float = 0.0
    epsilon: float = 1e-10
    centered: bool = False

    def slots(self):
        # MindSpore starts the mean square at 1 (its mean_square is cloned with init='ones')
        kept = (Slot("mean_square", 1.0), Slot("moment"))
        return (Slot("mean_grad"), *kept) if self.centered else kept

    def update(self, p, g, slots, glob, lr, decay):
        g = self._decayed(p, g, decay)
        ms = self.decay * slots["mean_square"] + (1.0 - self.decay) * g * g
        new = {"mean_square": ms}
        if self.centered:
            mg = self.decay * slots["mean_grad"] + (1.0 - self.decay) * g
            ms, new["mean_grad"] = ms - mg * mg, mg
        new["moment"] = self.momentum * slots["moment"] + lr * g / apply("Sqrt", ms + self.epsilon)
        return p - new["moment"], new


@dataclass(frozen=True)
class Adagrad(Optimizer):
    learning_rate: float = 1e-3
    accum: float = 0.1

    def slots(self):
        return (Slot("accum", self.accum),)

    def update(self, p, g, slots, glob, lr, decay):
        g = self._decayed(p, g, decay)
        accum = slots["accum"] + g * g
        return p - lr * g / apply("Sqrt", accum), {"accum": accum}


@dataclass(frozen=True)
class Adadelta(Optimizer):
    learning_rate: float = 1.0
    rho: float = 0.9
    epsilon: float = 1e-6

    def slots(self):
        return (Slot("accum"), Slot("accum_update"))

    def update(self, p, g, slots, glob, lr, decay):
        g = self._decayed(p, g, decay)
        accum = self.rho * slots["accum"] + (1.0 - self.rho) * g * g
        step = apply("Sqrt", slots["accum_update"] + self.epsilon) / apply("Sqrt", accum + self.epsilon) * g
        accum_update = self.rho * slots["accum_update"] + (1.0 - self.rho) * step * step
        return p - lr * step, {"accum": accum, "accum_update": accum_update}


@dataclass(frozen=True)
class ProximalAdagrad(Optimizer):
    learning_rate: float = 1e-3
    accum: float = 0.1
    l1: float = 0.0
    l2: float = 0.0

    def slots(self):
        return (Slot("accum", self.accum),)

    def update(self, p, g, slots, glob, lr, decay):
        g = self._decayed(p, g, decay)
        accum = slots["accum"] + g * g
        rate = lr / apply("Sqrt", accum)
        moved = p - rate * g
        if self.l1:
            moved = apply("Sign", moved) * apply("ReLU", apply("Abs", moved) - rate * self.l1)
        if self.l2:
            moved = moved / (1.0 + rate * self.l2)
        return moved, {"accum": accum}


@dataclass(frozen=True)
class Rprop(Optimizer):
    learning_rate: float = 0.1
    etaminus: float = 0.5
    etaplus: float = 1.2
    step_size_min: float = 1e-6
    step_size_max: float = 50.0

    def slots(self):
        return (Slot("prev"), Slot("step_size"))

    def global_slots(self):
        return (Slot("step"),)  # updates done: the first one starts every step size at the learning rate

    def update(self, p, g, slots, glob, lr, decay):
        g = self._decayed(p, g, decay)
        later = _like(apply("Minimum", glob["step"], 1.0), g)  # 0 on the first step, then 1
        size = later * slots["step_size"] + (1.0 - later) * lr
        agree, one = apply("Sign", g * slots["prev"]), apply("OnesLike", g)
        factor = apply(
            "Select", agree > 0.0, one * self.etaplus, apply("Select", agree < 0.0, one * self.etaminus, one)
        )
        size = apply("Minimum", apply("Maximum", size * factor, self.step_size_min), self.step_size_max)
        g = apply("Select", agree < 0.0, apply("ZerosLike", g), g)  # a sign change: no step, and none remembered
        return p - apply("Sign", g) * size, {"prev": g, "step_size": size}

    def update_globals(self, glob):
        return {"step": glob["step"] + 1.0}


@dataclass(frozen=True)
class ASGD(Optimizer):
    learning_rate: float = 0.1
    lambd: float = 1e-4
    alpha: float = 0.75
    t0: float = 1e6

    def slots(self):
        return (Slot("ax"), Slot("eta", 0.0, True), Slot("mu", 1.0, True))

    def global_slots(self):
        return (Slot("step"),)  # updates done: the first one takes eta from the learning rate

    def update(self, p, g, slots, glob, lr, decay):
        g = _like(self._decayed(p, g, decay), glob["step"])
        lr = _like(lr, glob["step"])
        later = apply("Minimum", glob["step"], 1.0)  # 0 on the first update, then 1
        eta, mu = later * slots["eta"] + (1.0 - later) * lr, slots["mu"]
        new = _like(p, eta) * (1.0 - self.lambd * eta) - eta * g
        ax = slots["ax"]
        ax = apply("Select", mu == 1.0, _like(new, ax), ax + _like((new - _like(ax, new)) * mu, ax))
        t = glob["step"] + 1.0
        eta = lr / (1.0 + self.lambd * lr * t) ** self.alpha
        mu = 1.0 / apply("Maximum", t - self.t0, 1.0)
        return _like(new, p), {"ax": ax, "eta": eta, "mu": mu}

    def update_globals(self, glob):
        return {"step": glob["step"] + 1.0}


@dataclass(frozen=True)
class FTRL(Optimizer):
    learning_rate: float = 1e-3
    initial_accum: float = 0.1
    lr_power: float = -0.5
    l1: float = 0.0
    l2: float = 0.0

    def slots(self):
        return (Slot("moments", self.initial_accum), Slot("linear"))

    def update(self, p, g, slots, glob, lr, decay):
        g = self._decayed(p, g, decay)
        accum = slots["moments"] + g * g
        power, old_power = accum**-self.lr_power, slots["moments"] ** -self.lr_power
        linear = slots["linear"] + g - (power - old_power) / lr * p
        # sign(linear) * l1 as documented; MindSpore's CPU kernel takes +l1 wherever linear is not 0
        shrunk = apply("Sign", linear) * self.l1 - linear if self.l1 else -linear
        quadratic = power / lr + 2.0 * self.l2 if self.l2 else power / lr
        new = apply("Select", apply("Abs", linear) > self.l1, shrunk / quadratic, apply("ZerosLike", p))
        return new, {"moments": accum, "linear": linear}
