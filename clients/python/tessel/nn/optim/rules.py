"""The optimizers (MindSpore's names, arguments and formulas; see tessel.compiler.optimizers):

- SGD:      accum = momentum * accum + (1 - dampening) * g (accum = g on the first step); p -= lr * accum
            (p -= lr * (g + momentum * accum) with nesterov; p -= lr * g without momentum)
- Momentum: v = momentum * v + g; p -= lr * v (lr * (g + momentum * v) with use_nesterov)
- Adam:     bias-corrected moments; p -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)
            (with use_nesterov, beta1 * m + (1 - beta1) * g in place of m)
  LazyAdam: Adam's update (MindSpore's LazyAdam on dense gradients, which tessel's all are)
- AdamWeightDecay: p -= lr * (m / (sqrt(v) + eps) + weight_decay * p)
- RMSProp:  ms = decay * ms + (1 - decay) * g^2 (ms starts at 1); mom = momentum * mom + lr * g / sqrt(ms + eps);
            p -= mom (centered: mg = decay * mg + (1 - decay) * g, and sqrt(ms - mg^2 + eps))
- Adagrad:  accum += g^2 (accum starts at `accum`); p -= lr * g / sqrt(accum)
- Adadelta: accum = rho * accum + (1 - rho) * g^2; u = sqrt(accum_update + eps) / sqrt(accum + eps) * g;
            accum_update = rho * accum_update + (1 - rho) * u^2; p -= lr * u
- Rprop:    f = etaplus, etaminus or 1 as g * prev > 0, < 0 or 0; step_size = clip(step_size * f, *step_sizes)
            (it starts at lr); g' = 0 where f = etaminus, else g; p -= sign(g') * step_size; prev = g'
- FTRL:     n = accum + g^2; linear += g - (n^-lr_power - accum^-lr_power) / lr * p; accum = n;
            p = (sign(linear) * l1 - linear) / (n^-lr_power / lr + 2 * l2) where |linear| > l1, else 0
- ASGD:     p = p * (1 - lambd * eta) - eta * g; ax += (p - ax) * mu (ax = p where mu = 1); then, for update t,
            eta = lr / (1 + lambd * lr * t)^alpha (lr on the first update) and mu = 1 / max(1, t - t0)
- ProximalAdagrad: accum += g^2; a = lr / sqrt(accum); v = p - a * g; p = sign(v) * max(|v| - a * l1, 0) / (1 + a * l2)
Weight decay (except AdamWeightDecay's) adds weight_decay * p to the gradient of every parameter whose name
contains neither "beta" nor "gamma" (MindSpore's default filter), or of the parameter groups that ask for it.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from tessel.common.parameter import ParameterTuple
from tessel.common.support import keyword_options, log_once, not_supported_yet
from tessel.compiler import optimizers as rules
from tessel.core.errors import ConfigurationError
from tessel.nn.optim.optimizer import Optimizer, inert_faces

# Hyper-parameters are set (through vars) before Optimizer.__init__, which builds the rule from them.


def _open_unit(name: str, value: float) -> None:
    """MindSpore's beta check (optim/adam.py _check_param_value: INC_NEITHER): 0 < value < 1."""
    if not 0.0 < value < 1.0:
        raise ConfigurationError(f"{name} must be in (0.0, 1.0), got {value}")


def _floats(optimizer: str, **values: Any) -> None:
    """MindSpore's validator.check_value_type(name, value, [float]): an int is refused too."""
    for name, value in values.items():
        if not isinstance(value, float):
            raise TypeError(f"For '{optimizer}', the type of '{name}' should be 'float', but got {value!r}")


def _non_negative(optimizer: str, **values: float) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"For '{optimizer}', the '{name}' must be >= 0, but got {value}")


def _no_locking(optimizer: str, use_locking: bool) -> None:
    if use_locking:
        log_once(
            f"{optimizer}.use_locking",
            f"{optimizer}: use_locking=True has no effect in tessel; each update is one compiled step that alone "
            "writes the parameters and their state, so they are never updated concurrently",
            logging.INFO,
        )


def _bools(optimizer: str, **values: Any) -> None:
    for name, value in values.items():
        if not isinstance(value, bool):
            raise TypeError(f"{optimizer}: {name} must be a bool, got {value!r}")


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, dampening and Nesterov. Its weight decay skips the
    parameters named beta or gamma, as every optimizer's (MindSpore 2.x's SGD decays through the base class's
    filter; its kernel gets a weight decay of 0)."""

    _slot_names: ClassVar[dict[str, str]] = {"accum": "accum"}
    _hyper: ClassVar[tuple[str, ...]] = ("momentum",)
    _per_parameter_globals: ClassVar[frozenset[str]] = frozenset({"stat"})

    def __init__(
        self,
        params: Any,
        learning_rate: Any = 0.1,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        loss_scale: float = 1.0,
    ):
        _bools("SGD", nesterov=nesterov)
        if momentum < 0 or (nesterov and (momentum <= 0 or dampening != 0)):
            raise ConfigurationError("SGD: momentum must be >= 0; nesterov needs momentum > 0 and dampening = 0")
        if dampening < 0:  # MindSpore's sgd.py
            raise ConfigurationError(f"SGD: dampening must be >= 0, got {dampening}")
        vars(self).update(momentum=float(momentum), dampening=float(dampening), nesterov=nesterov)
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        if not momentum:
            # MindSpore's SGD keeps accum.* and stat.* whatever its momentum; without one neither enters an update
            # nor changes (measured on MindSpore 2.7.0: zeros and ones after a step, and dampening changes nothing),
            # so checkpoints carry them as MindSpore writes them and a value loaded into them changes nothing either
            for prefix, value in (("accum", lambda: 0.0), ("stat", lambda: 1.0)):
                setattr(self, prefix, ParameterTuple(inert_faces(prefix, self.parameters, value)))

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.SGD(0.0, weight_decay, float(self.momentum), self.dampening, self.nesterov)


class Momentum(Optimizer):
    """Momentum: v = momentum * v + g; p -= lr * v."""

    _slot_names: ClassVar[dict[str, str]] = {"moments": "moments"}
    _hyper: ClassVar[tuple[str, ...]] = ("momentum",)

    def __init__(
        self,
        params: Any,
        learning_rate: Any,
        momentum: float,
        weight_decay: float = 0.0,
        loss_scale: float = 1.0,
        use_nesterov: bool = False,
    ):
        _bools("Momentum", use_nesterov=use_nesterov)
        if momentum < 0:
            raise ConfigurationError(f"Momentum: momentum must be >= 0, got {momentum}")
        vars(self).update(momentum=float(momentum), use_nesterov=use_nesterov)
        super().__init__(learning_rate, params, weight_decay, loss_scale)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.Momentum(0.0, weight_decay, float(self.momentum), self.use_nesterov)


_ADAM_OPTIONS = {
    "use_lazy": ((False,), "tessel has no lazy (sparse-row) Adam; every row of every parameter is updated"),
    "use_offload": ((False,), "tessel runs the Adam update where the parameters live, never offloaded to the host"),
}


class Adam(Optimizer):
    """Adam with bias correction (MindSpore's Adam)."""

    _slot_names: ClassVar[dict[str, str]] = {"moment1": "moment1", "moment2": "moment2"}

    def __init__(
        self,
        params: Any,
        learning_rate: Any = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        use_locking: bool = False,
        use_nesterov: bool = False,
        weight_decay: float = 0.0,
        loss_scale: float = 1.0,
        use_amsgrad: bool = False,
        **kwargs: Any,
    ):
        keyword_options("Adam", kwargs, unsupported=_ADAM_OPTIONS)
        _bools("Adam", use_locking=use_locking, use_nesterov=use_nesterov, use_amsgrad=use_amsgrad)
        _open_unit("beta1", beta1)
        _open_unit("beta2", beta2)
        if eps <= 0:
            raise ConfigurationError(f"Adam: eps must be > 0, got {eps}")
        if use_amsgrad:
            raise not_supported_yet(
                "mindspore.nn.Adam(use_amsgrad=True)",
                "tessel's Adam keeps no running maximum of the second moment; use use_amsgrad=False",
            )
        if use_locking:
            log_once(
                "Adam.use_locking",
                "Adam: use_locking=True has no effect in tessel; each update is one compiled step that alone writes "
                "the parameters and moments, so they are never updated concurrently",
                logging.INFO,
            )
        vars(self).update(beta1=beta1, beta2=beta2, eps=eps, use_nesterov=use_nesterov)
        super().__init__(learning_rate, params, weight_decay, loss_scale)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.Adam(0.0, weight_decay, self.beta1, self.beta2, self.eps, self.use_nesterov)


class LazyAdam(Adam):
    """MindSpore's LazyAdam: Adam that updates only the rows a sparse gradient names. tessel's gradients are dense,
    and on dense gradients MindSpore 2.7.0's LazyAdam runs Adam's kernel (measured: the same weights and checkpoint
    keys as Adam's, bit for bit, after 3 steps)."""

    def __init__(
        self,
        params: Any,
        learning_rate: Any = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        use_locking: bool = False,
        use_nesterov: bool = False,
        weight_decay: float = 0.0,
        loss_scale: float = 1.0,
    ):
        _floats("LazyAdam", beta1=beta1, beta2=beta2, eps=eps, weight_dacay=weight_decay)  # MindSpore's spelling
        super().__init__(params, learning_rate, beta1, beta2, eps, use_locking, use_nesterov, weight_decay, loss_scale)


class AdamWeightDecay(Optimizer):
    """Adam with decoupled weight decay and no bias correction (MindSpore's AdamWeightDecay)."""

    _slot_names: ClassVar[dict[str, str]] = {"moment1": "adam_m", "moment2": "adam_v"}

    def __init__(
        self,
        params: Any,
        learning_rate: Any = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ):
        _open_unit("beta1", beta1)
        _open_unit("beta2", beta2)
        if eps <= 0:
            raise ConfigurationError(f"AdamWeightDecay: eps must be > 0, got {eps}")
        vars(self).update(beta1=beta1, beta2=beta2, eps=eps)
        super().__init__(learning_rate, params, weight_decay, 1.0)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.AdamWeightDecay(0.0, weight_decay, self.beta1, self.beta2, self.eps)


class RMSProp(Optimizer):
    """RMSProp, centered or not, with momentum (MindSpore's: mean_square starts at 1, the learning rate is inside
    the moment)."""

    _slot_names: ClassVar[dict[str, str]] = {"mean_grad": "mean_grad", "mean_square": "mean_square", "moment": "moment"}

    def __init__(
        self,
        params: Any,
        learning_rate: Any = 0.1,
        decay: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-10,
        use_locking: bool = False,
        centered: bool = False,
        loss_scale: float = 1.0,
        weight_decay: float = 0.0,
    ):
        _floats("RMSProp", decay=decay, momentum=momentum, epsilon=epsilon)
        _non_negative("RMSProp", decay=decay, momentum=momentum)
        if epsilon <= 0:
            raise ValueError(f"For 'RMSProp', the 'epsilon' must be > 0, but got {epsilon}")
        _bools("RMSProp", use_locking=use_locking, centered=centered)
        _no_locking("RMSProp", use_locking)
        vars(self).update(decay=decay, momentum=momentum, epsilon=epsilon, centered=centered)
        super().__init__(learning_rate, params, weight_decay, loss_scale)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.RMSProp(0.0, weight_decay, self.decay, self.momentum, self.epsilon, self.centered)


class Adagrad(Optimizer):
    """Adagrad (MindSpore's: the accumulator starts at `accum`)."""

    _slot_names: ClassVar[dict[str, str]] = {"accum": "accum"}

    def __init__(
        self,
        params: Any,
        accum: float = 0.1,
        learning_rate: Any = 0.001,
        update_slots: bool = True,
        loss_scale: float = 1.0,
        weight_decay: float = 0.0,
    ):
        _floats("Adagrad", accum=accum)
        _bools("Adagrad", update_slots=update_slots)
        _non_negative("Adagrad", accum=accum)
        if not update_slots:
            # MindSpore 2.7.0's CPU kernel adds g^2 to the accumulator whatever update_slots says (measured: the
            # weights after 3 steps are those of update_slots=True), against its documentation; neither is a
            # reference to follow
            raise not_supported_yet(
                "mindspore.nn.Adagrad(update_slots=False)",
                "MindSpore's CPU kernel updates the accumulator anyway; use update_slots=True (what it computes)",
            )
        vars(self).update(accum_init=accum)
        super().__init__(learning_rate, params, weight_decay, loss_scale)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.Adagrad(0.0, weight_decay, self.accum_init)


class Adadelta(Optimizer):
    """Adadelta (MindSpore's)."""

    _slot_names: ClassVar[dict[str, str]] = {"accum": "accum", "accum_update": "accum_update"}

    def __init__(
        self,
        params: Any,
        learning_rate: Any = 1.0,
        rho: float = 0.9,
        epsilon: float = 1e-6,
        loss_scale: float = 1.0,
        weight_decay: float = 0.0,
    ):
        _floats("Adadelta", rho=rho, epsilon=epsilon)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"For 'Adadelta', the 'rho' must be in range [0.0, 1.0], but got {rho}")
        _non_negative("Adadelta", epsilon=epsilon)
        vars(self).update(rho=rho, epsilon=epsilon)
        super().__init__(learning_rate, params, weight_decay, loss_scale)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.Adadelta(0.0, weight_decay, self.rho, self.epsilon)


class ProximalAdagrad(Optimizer):
    """Adagrad with the l1 / l2 proximal step (MindSpore's ApplyProximalAdagrad on dense gradients)."""

    _slot_names: ClassVar[dict[str, str]] = {"accum": "accum"}

    def __init__(
        self,
        params: Any,
        accum: float = 0.1,
        learning_rate: Any = 0.001,
        l1: float = 0.0,
        l2: float = 0.0,
        use_locking: bool = False,
        loss_scale: float = 1.0,
        weight_decay: float = 0.0,
    ):
        _floats("ProximalAdagrad", accum=accum, l1=l1, l2=l2)
        _bools("ProximalAdagrad", use_locking=use_locking)
        _non_negative("ProximalAdagrad", accum=accum, l1=l1, l2=l2)
        _no_locking("ProximalAdagrad", use_locking)
        vars(self).update(accum_init=accum, l1=l1, l2=l2)
        super().__init__(learning_rate, params, weight_decay, loss_scale)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.ProximalAdagrad(0.0, weight_decay, self.accum_init, self.l1, self.l2)


class Rprop(Optimizer):
    """Resilient backpropagation (MindSpore's: every step size starts at the learning rate of the first update)."""

    _slot_names: ClassVar[dict[str, str]] = {"prev": "prev", "step_size": "step_size"}
    _step_globals: ClassVar[frozenset[str]] = frozenset({"step"})

    def __init__(
        self,
        params: Any,
        learning_rate: Any = 0.1,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-6, 50.0),
        weight_decay: float = 0.0,
    ):
        for name, pair in (("etas", etas), ("step_sizes", step_sizes)):  # MindSpore's checks and errors
            if not isinstance(pair, tuple):
                raise TypeError(f"For Rprop, {name} must be a tuple, but got {type(pair)}.")
            if len(pair) != 2:
                raise ValueError(f"For Rprop, {name} must be a tuple with the size of 2, but got {len(pair)}.")
        if step_sizes[0] > step_sizes[1]:
            raise ValueError(
                "For Rprop, maximal step size should not be less than minimal step size, but got "
                f"{step_sizes[0]} > {step_sizes[1]}."
            )
        if not 0.0 < etas[0] < 1.0:
            raise ValueError(f"For 'Rprop', the 'etaminus' must be in range (0.0, 1.0), but got {etas[0]}")
        _floats("Rprop", etaplus=etas[1], min_step_sizes=step_sizes[0], max_step_sizes=step_sizes[1])
        if etas[1] <= 1.0:
            raise ValueError(f"For Rprop, etaplus must be greater than 1.0, but got etaplus {etas[1]}.")
        vars(self).update(etaminus=etas[0], etaplus=etas[1], step_size_min=step_sizes[0], step_size_max=step_sizes[1])
        super().__init__(learning_rate, params, weight_decay)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.Rprop(0.0, weight_decay, self.etaminus, self.etaplus, self.step_size_min, self.step_size_max)


class ASGD(Optimizer):
    """Averaged SGD (MindSpore's: eta and mu are one number per parameter, saved as eta_<name> and mu_<name>; ax is
    the average)."""

    _slot_names: ClassVar[dict[str, str]] = {"ax": "ax_", "eta": "eta_{}", "mu": "mu_{}"}
    _step_globals: ClassVar[frozenset[str]] = frozenset({"step"})

    def __init__(
        self,
        params: Any,
        learning_rate: Any = 0.1,
        lambd: float = 1e-4,
        alpha: float = 0.75,
        t0: float = 1e6,
        weight_decay: float = 0.0,
    ):
        _floats("ASGD", lambd=lambd, alpha=alpha, t0=t0)
        vars(self).update(lambd=lambd, alpha=alpha, t0=t0)
        super().__init__(learning_rate, params, weight_decay)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.ASGD(0.0, weight_decay, self.lambd, self.alpha, self.t0)


class FTRL(Optimizer):
    """Follow-the-regularized-leader (MindSpore's FTRL on dense gradients). Its weight decay, unlike the other
    optimizers', also decays the parameters named beta or gamma (MindSpore's FTRL sets every decay flag)."""

    _slot_names: ClassVar[dict[str, str]] = {"moments": "moments", "linear": "linear"}
    _decay_filtered: ClassVar[bool] = False

    def __init__(
        self,
        params: Any,
        initial_accum: float = 0.1,
        learning_rate: float = 0.001,
        lr_power: float = -0.5,
        l1: float = 0.0,
        l2: float = 0.0,
        use_locking: bool = False,
        loss_scale: float = 1.0,
        weight_decay: float = 0.0,
    ):
        items = list(params)
        if not isinstance(learning_rate, (float, int)) or any(isinstance(g, dict) and "lr" in g for g in items):
            raise ValueError(  # MindSpore's check, before its type checks
                "For 'FTRL', dynamic learning rate and group learning rate are currently not supported in FTRL, "
                "they should all be false."
            )
        _floats("FTRL", initial_accum=initial_accum, learning_rate=learning_rate, lr_power=lr_power, l1=l1, l2=l2)
        _non_negative("FTRL", initial_accum=initial_accum, l1=l1, l2=l2)
        if learning_rate <= 0:
            raise ValueError(f"For 'FTRL', the 'learning_rate' must be > 0, but got {learning_rate}")
        if lr_power > 0:
            raise ValueError(f"For 'FTRL', the 'lr_power' must be <= 0, but got {lr_power}")
        _bools("FTRL", use_locking=use_locking)
        _no_locking("FTRL", use_locking)
        vars(self).update(initial_accum=initial_accum, lr_power=lr_power, l1=l1, l2=l2)
        super().__init__(learning_rate, items, weight_decay, loss_scale)

    def _make_rule(self, weight_decay: float) -> rules.Optimizer:
        return rules.FTRL(0.0, weight_decay, self.initial_accum, self.lr_power, self.l1, self.l2)
