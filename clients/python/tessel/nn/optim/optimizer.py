"""`nn.Optimizer`: parameters, learning rate (fixed, per-step list or schedule), weight decay and moment slots.

The update rule is the compiler's (`tessel.compiler.optimizers`, MindSpore's formulas). Calling the optimizer
with gradients applies one update on the daemon: compiled once per gradient signature, parameters and slots
updated in place. When the gradients are handles left on the daemon by value_and_grad, the update reads them
there (nothing crosses the wire but the learning rate). Inside a trace the update is added to the graph.
Model.train instead fuses forward, backward and this update into one graph (`build_train_step`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from tessel.common.compiled import CompiledFunction, captured_changed
from tessel.common.dtype import DType
from tessel.common.initializer import Deferred
from tessel.common.parameter import Parameter, ParameterTuple
from tessel.common.tensor import Tensor
from tessel.common.tracing import current
from tessel.compiler import SymbolicTensor, apply
from tessel.compiler.optimizers import Optimizer as Rule
from tessel.compiler.optimizers import ParameterGroups
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.nn.cell import Cell
from tessel.nn.optim.learning_rate import LearningRateSchedule

_serials = itertools.count()


def _decay_filter(p: Parameter) -> bool:
    # MindSpore's default: no weight decay on normalisation scales and shifts.
    return "beta" not in p.name and "gamma" not in p.name


def _parse_params(
    parameters: Any, weight_decay: float, filtered: bool = True
) -> tuple[list[Parameter], dict[str, float], list[tuple[int, Any, list[str]]]]:
    """(parameters, each one's weight decay by key, the groups with a learning rate of their own as (group number,
    rate, keys)) from a list or MindSpore parameter groups. `filtered`: a plain list leaves normalisation scales and
    shifts undecayed (MindSpore's decay_filter, which SGD does not apply); a group's weight decay applies to all of
    its parameters, as MindSpore's."""
    items = list(parameters)
    if not items:
        raise ConfigurationError("the optimizer got an empty parameter list; pass net.trainable_params()")
    default = float(weight_decay)
    if not isinstance(items[0], dict):
        bad = [type(p).__name__ for p in items if not isinstance(p, Parameter)]
        if bad:
            raise ConfigurationError(f"optimizer parameters must be Parameters, got {bad}")
        return items, {p.key: default if not filtered or _decay_filter(p) else 0.0 for p in items}, []
    params, decays, rates, order = [], {}, [], None
    for number, group in enumerate(items):
        unknown = set(group) - {"params", "lr", "weight_decay", "order_params", "grad_centralization"}
        if unknown:  # MindSpore's _check_group_params
            raise KeyError(
                "For 'Optimizer', the key in group params must be one of in ['params', 'lr', 'weight_decay', "
                f"'order_params', 'grad_centralization'], but got {sorted(unknown)}."
            )
        if group.get("grad_centralization", False) is not False:
            from tessel.common.support import not_supported_yet

            raise not_supported_yet(
                "the parameter group key 'grad_centralization': True",
                "gradients are applied as computed; drop the key or set it to False",
            )
        if "order_params" in group:
            if set(group) != {"order_params"}:  # MindSpore's _check_group_params
                raise ConfigurationError(
                    f"the order_params dict of the parameter groups takes only the key 'order_params', got "
                    f"{sorted(group)}"
                )
            order = list(group["order_params"])
            continue
        members = list(group["params"])
        bad = [type(p).__name__ for p in members if not isinstance(p, Parameter)]
        if bad:
            raise TypeError(f"For 'Optimizer', the element in group parameters must be Parameter type, but got {bad}")
        seen = {p.key for p in params}
        again = [p.name for p in members if p.key in seen]
        if again:
            raise RuntimeError(
                f"For 'Optimizer', the {again[0]} parameter already exists, it does not support repeated setting. "
                "Please check whether the optimizer parameter has been set multiple times."
            )
        params += members
        decay = float(group.get("weight_decay", weight_decay))
        if decay < 0:
            raise ConfigurationError(f"a parameter group's weight_decay must be >= 0, got {decay}")
        decays.update((p.key, decay) for p in members)
        if "lr" in group:
            rates.append((number, group["lr"], [p.key for p in members]))
    if order is not None:  # MindSpore's _order_and_adjust_group_params: the same parameters, in this order
        if len(order) != len(params) or {id(p) for p in order} != {id(p) for p in params}:
            raise ConfigurationError(
                f"order_params must list exactly the parameters of the groups ({len(params)}), in the order wanted; "
                f"got {len(order)} that are not the same"
            )
        params = order
    return params, decays, rates


def _rate_at(source: Any, step: int) -> float:
    """The rate of update `step` (0-based) from a fixed rate, a per-step list (its last value past its end) or a
    schedule."""
    if isinstance(source, LearningRateSchedule):
        return float(source.lr_at(step))
    if isinstance(source, np.ndarray):
        return float(source[min(step, len(source) - 1)])
    return float(source)


class HostNumber(float):
    """A number an optimizer keeps on the host (its fixed learning rate, its momentum), read and set as MindSpore's
    Parameter of it is: `asnumpy()`, `set_data(value)` and `ops.assign` (a callback changing it mid-training). The
    new value takes effect at the next step."""

    def __new__(cls, value: float, put: Any = None, get: Any = None):
        made = super().__new__(cls, value)
        made._put, made._get = put, get
        return made

    def asnumpy(self) -> np.ndarray:
        """The optimizer's value now (as a Parameter kept by a callback reads it), this number's where it has none."""
        return np.array(float(self) if self._get is None else self._get(), np.float32)

    @property
    def shape(self) -> tuple:
        return ()

    @property
    def dtype(self) -> DType:
        return DType.float32

    def set_data(self, data: Any, slice_shape: bool = False) -> HostNumber:
        if self._put is None:
            raise ConfigurationError("this number belongs to no optimizer; set the optimizer's attribute instead")
        return self._put(np.asarray(data.asnumpy() if isinstance(data, Tensor) else data))


class LearningRate(HostNumber):
    """A fixed learning rate: fed to the update every step, so a new one compiles nothing."""

    def __new__(cls, value: float, optimizer: Any = None):
        if optimizer is None:
            return super().__new__(cls, value)
        return super().__new__(cls, value, optimizer._set_rate, lambda: optimizer.learning_rate_at(optimizer._step))


def _lr_source(learning_rate: Any) -> Any:
    if isinstance(learning_rate, LearningRateSchedule):
        return learning_rate
    if isinstance(learning_rate, Tensor):
        learning_rate = learning_rate.asnumpy()
    values = np.asarray(learning_rate, dtype=np.float64)
    if values.ndim > 1 or values.size == 0 or not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ConfigurationError(
            f"learning_rate must be a non-negative float, a 1-D list of per-step rates or a LearningRateSchedule, "
            f"got {learning_rate!r}"
        )
    return float(values) if values.ndim == 0 else values


def _slot_value(p: Parameter, slot: Any) -> Any:
    """A moment slot's start: a constant like the parameter; not drawn yet when the parameter is not either (a
    rank then allocates only its slice). A scalar slot: one float32 number."""
    if slot.scalar:
        return np.array(slot.init, np.float32)
    if p.has_init:
        return Deferred.constant(slot.init, p.shape, p.dtype)
    return np.full(p.shape, slot.init, p.dtype.numpy)


class _RateFeed:
    """An optimizer's learning-rate input: the next update's rate, or (`ahead`, sink mode) each of the next updates'
    rates where they differ."""

    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer

    def __call__(self) -> np.ndarray:
        return self.optimizer._lr_feed()

    def ahead(self, steps: int) -> np.ndarray | None:
        return self.optimizer._lr_ahead(steps)


class _StateFace(Parameter):
    """A Parameter standing for optimizer state that tessel keeps elsewhere (the step count and the rates on the host,
    SGD's first-step flag as one scalar), so that checkpoints hold MindSpore's names and shapes: saving reads
    `get()`, loading calls `put(array)`."""

    def __init__(self, name: str, value: Any, get: Any, put: Any):
        super().__init__(value, name, requires_grad=False)
        self._get, self._put = get, put

    def asnumpy(self) -> np.ndarray:
        return self._get()

    def set_data(self, data: Any, slice_shape: bool = False) -> Parameter:
        value = np.asarray(data.asnumpy() if isinstance(data, Tensor) else data)
        if value.shape != tuple(self.shape):
            raise ConfigurationError(
                f"{self.name}: the optimizer's value has shape {tuple(self.shape)}, got {value.shape}; was it "
                "saved from an optimizer built another way (another learning-rate list, other parameters)?"
            )
        self._put(value)
        return self


def inert_faces(prefix: str, params: Sequence[Parameter], value: Any) -> list[Parameter]:
    """Per parameter, "<prefix>.<name>": state MindSpore's optimizer keeps that no update of this one reads (SGD's
    accumulators without momentum), saved as `value()` everywhere; a value loaded into it is not used."""

    def face(p: Parameter) -> Parameter:
        get = lambda: np.full(p.shape, value(), p.dtype.numpy)  # noqa: E731
        return _StateFace(f"{prefix}.{p.name}", Deferred.constant(0.0, tuple(p.shape), p.dtype), get, lambda v: None)

    return [face(p) for p in params]


def _assign(trace: Any, target: Any, value: Any) -> None:
    """target = value, or where the trace gates updates (an overflowing loss-scaled step) the old value when the gate
    is false."""
    gate = trace.update_gate
    apply("Assign", target, value if gate is None else apply("Select", gate, value, target))


class Optimizer(Cell):
    """Base class of the optimizers in rules.py. Subclasses build `self._rule` (a compiler rule)."""

    _slot_names: ClassVar[dict[str, str]] = {}  # compiler slot -> MindSpore checkpoint prefix
    # Hyper-parameters MindSpore keeps as Parameters (saved and loaded; set_data changes them); tessel compiles
    # them into the update, which a new value rebuilds.
    _hyper: ClassVar[tuple[str, ...]] = ()
    # Global (scalar) slots that MindSpore keeps once per parameter (SGD's first-step flag): checkpoints see one
    # Parameter per parameter, "<slot>.<parameter>", all holding the scalar.
    _per_parameter_globals: ClassVar[frozenset[str]] = frozenset()
    # Global slots MindSpore has no Parameter for (Rprop's count of updates, which MindSpore reads from global_step):
    # not saved; loading global_step sets them.
    _step_globals: ClassVar[frozenset[str]] = frozenset()
    # MindSpore's optimizers decay every parameter but the beta/gamma ones (decay_filter); its SGD decays them all
    _decay_filtered: ClassVar[bool] = True

    def __init__(self, learning_rate: Any, parameters: Any, weight_decay: float = 0.0, loss_scale: float = 1.0):
        super().__init__(auto_prefix=False)
        if type(self)._make_rule is Optimizer._make_rule:
            raise NotSupportedYetError(
                f"{type(self).__name__}: an optimizer of your own (a subclass of nn.Optimizer with its own construct) "
                "is not supported yet; tessel compiles the update rules of its own optimizers (tessel.nn.optim.rules); "
                "meanwhile update the parameters with ops.assign in your training step"
            )
        if isinstance(weight_decay, Cell):
            raise NotSupportedYetError(
                f"{type(self).__name__}: a weight_decay that is a Cell (a dynamic weight decay) is not supported yet; "
                "give a number"
            )
        decay = float(weight_decay)
        if decay < 0 or loss_scale <= 0:
            raise ConfigurationError(f"weight_decay must be >= 0 and loss_scale > 0, got {decay}, {loss_scale}")
        params, decays, rates = _parse_params(parameters, decay, self._decay_filtered)
        self.parameters = ParameterTuple(params)
        self.weight_decay, self.loss_scale = decay, float(loss_scale)
        source = _lr_source(learning_rate)
        self.key = f"optimizer{next(_serials)}"
        self._step = 0
        # MindSpore's checkpoint of an optimizer: global_step, learning_rate (none for a schedule), each group's
        # own learning_rate_group_<n>, the hyper-parameters it keeps as Parameters (momentum), the global slots,
        # then the per-parameter ones.
        self._params["global_step"] = _StateFace("global_step", np.zeros(1, np.int32), self._step_array, self._set_step)
        self.__dict__["_global_step"] = self._params["global_step"]
        self.learning_rate = LearningRate(source, self) if isinstance(source, float) else source
        self._group_rates: list[list] = []  # [name, rate] of each group with a learning rate of its own
        rate_of = {}
        for number, group_rate, keys in rates:
            self._add_group_rate(f"learning_rate_group_{number}", group_rate, source)
            rate_of.update((key, len(self._group_rates)) for key in keys)
        # the default rate is read unless every group has its own (MindSpore then stores no learning_rate)
        self.__dict__["_default_read"] = not rates or len(rate_of) < len(params)
        self._rate_face(source)
        count = 1 + len(self._group_rates) if self._group_rates else 0
        rate_of = {p.key: 0 for p in params} | rate_of if count else {}
        own_decays = {key: d for key, d in decays.items() if d != decay}
        self.__dict__["_groups"] = ParameterGroups.of(own_decays, rate_of, count)
        for name in self._hyper:
            put = self._hyper_setter(name)
            live = self._hyper_value(name)
            vars(self)[name] = HostNumber(vars(self)[name], put, live)
            value = np.asarray(live(), np.float32)
            self._params[name] = _StateFace(name, value, lambda live=live: np.asarray(live(), np.float32), put)
        # MindSpore scales the weight decay by loss_scale too (Optimizer._preprocess_weight_decay and group decays:
        # weight_decay * self.loss_scale), decays the still-scaled gradients and divides: (S*g + S*wd*p) / S, so
        # g + wd*p whatever S. tessel unscales first and decays by wd.
        self._rule: Rule = self._make_rule(decay)
        self._globals: dict[str, Parameter] = {}
        for slot in self._rule.global_slots():
            glob = Parameter(np.array(slot.init, np.float32), slot.name, False, key=f"{self.key}/{slot.name}")
            self._globals[slot.name] = glob
            if slot.name not in self._per_parameter_globals | self._step_globals:
                setattr(self, slot.name, glob)
        self._slots: dict[str, list[Parameter]] = {}
        for slot in self._rule.slots():
            prefix = self._slot_names.get(slot.name, slot.name)
            # a name with {} in it is the whole checkpoint name of the parameter's slot (ASGD's "eta_{}")
            named, attribute = (prefix, slot.name) if "{}" in prefix else (prefix + ".{}", prefix)
            made = [
                Parameter(_slot_value(p, slot), named.format(p.name), False, key=f"{p.key}/{slot.name}") for p in params
            ]
            self._slots[slot.name] = made
            setattr(self, attribute, ParameterTuple(made))
        for name in self._per_parameter_globals & self._globals.keys():
            setattr(self, name, ParameterTuple(self._flag_faces(name, params)))
        object.__setattr__(
            self,
            "_update",
            CompiledFunction(
                lambda *grads: self._emit(grads), f"{self.cls_name}_update", symbolic_batch=False, arg_names=()
            ),
        )

    def _make_rule(self, weight_decay: float) -> Rule:
        raise NotImplementedError

    def __setattr__(self, name: str, value: Any) -> None:
        # The rate and the hyper-parameters live on the host; their Parameters only carry them to checkpoints.
        # Assigning a Tensor sets the value through that Parameter, as MindSpore's attribute assignment does.
        if name == "learning_rate" and not isinstance(value, Tensor):
            source = _lr_source(value)
            object.__setattr__(self, name, LearningRate(source, self) if isinstance(source, float) else source)
            if "_groups" in vars(self):  # a rate of another kind: its Parameter follows (none for a schedule)
                self._rate_face(source)
        elif name in self._hyper and "_rule" in vars(self) and not isinstance(value, Tensor):
            self._hyper_setter(name)(np.asarray(value))
        else:
            super().__setattr__(name, value)

    # --- the values checkpoints hold (_StateFace) ---------------------------------------------------------------
    def _step_array(self) -> np.ndarray:
        return np.array([self._step], np.int32)

    def _set_step(self, value: np.ndarray) -> None:
        self.__dict__["_step"] = int(value.reshape(-1)[0])
        for name in self._step_globals:
            self._globals[name].set_data(np.array(self._step, np.float32))

    def _rate_array(self) -> np.ndarray:
        return np.asarray(self.learning_rate, np.float32)  # a fixed rate or a list: a schedule has no Parameter

    def _rate_face(self, source: Any) -> None:
        """The learning_rate Parameter checkpoints hold, of the rate's shape (none for a schedule, or where no
        parameter reads the default rate)."""
        face = self._params.get("learning_rate")
        wanted = self._default_read and not isinstance(source, LearningRateSchedule)
        rate = np.asarray(source, np.float32) if wanted else None
        if face is not None and rate is not None and tuple(face.shape) == rate.shape:
            return  # the same kind of rate: the Parameter reads it already (and a load iterating over it goes on)
        self._params.pop("learning_rate", None)
        if wanted:
            self._params["learning_rate"] = _StateFace("learning_rate", rate, self._rate_array, self._set_rate)

    def _set_rate(self, value: np.ndarray) -> Any:
        self.learning_rate = value.astype(np.float64)  # checked by _lr_source, as a rate given to the constructor
        return self.learning_rate

    def _hyper_value(self, name: str) -> Any:
        """A reader of hyper-parameter `name`'s value in force."""
        return lambda: float(vars(self)[name])

    def _hyper_setter(self, name: str) -> Any:
        def put(value: np.ndarray) -> HostNumber:
            new = float(np.asarray(value, np.float64).reshape(-1)[0]) if np.size(value) == 1 else None
            if new is None or not np.isfinite(new) or new < 0:
                raise ConfigurationError(f"{self.cls_name}.{name} takes one non-negative number, got {value!r}")
            old = vars(self)[name]
            if np.float32(new) == np.float32(old):
                return old
            vars(self)[name] = HostNumber(new, put, self._hyper_value(name))
            rule = self._make_rule(self.weight_decay)
            if rule.slots() != self._rule.slots() or rule.global_slots() != self._rule.global_slots():
                vars(self)[name] = old
                raise NotSupportedYetError(
                    f"not supported yet: setting {self.cls_name}.{name} from {old} to {np.float32(new)!s}, which "
                    f"changes the state the optimizer keeps; construct the optimizer with {name}={np.float32(new)!s}"
                )
            vars(self)["_rule"] = rule
            captured_changed()  # the compiled updates hold the old value
            return vars(self)[name]

        return put

    def _flag_faces(self, name: str, params: Sequence[Parameter]) -> list[Parameter]:
        """One Parameter per parameter, each reading and setting the global slot `name`."""
        glob = self._globals[name]

        def put(value: np.ndarray) -> None:
            if value.size and not np.all(value == value.flat[0]):
                raise NotSupportedYetError(
                    f"not supported yet: {self.cls_name}'s {name} differing within one parameter's values; tessel "
                    f"keeps one {name} for all parameters"
                )
            if value.size:
                glob.set_data(np.array(value.flat[0], np.float32))

        def face(p: Parameter) -> Parameter:
            get = lambda: np.full(p.shape, glob.asnumpy(), p.dtype.numpy)  # noqa: E731
            return _StateFace(f"{name}.{p.name}", Deferred.constant(1.0, tuple(p.shape), p.dtype), get, put)

        return [face(p) for p in params]

    # --- learning rate ----------------------------------------------------------------------------------------
    @property
    def lr_key(self) -> str:
        return f"{self.key}/learning_rate"

    def learning_rate_at(self, step: int) -> float:
        """The learning rate used by update number `step` (0-based). Past the end of a per-step list this reads
        its last value; an update there is refused (`_lr_feed`). With parameter groups of their own rates: the
        optimizer's learning_rate, which the other groups take."""
        return _rate_at(self.learning_rate, step)

    @property
    def groups(self) -> ParameterGroups:
        """What the parameter groups set per parameter key: weight decays and learning rates."""
        return self.__dict__["_groups"]

    def get_lr(self) -> Any:
        """The current step's learning rate; with groups of their own rates, one per parameter (MindSpore's). Fixed
        rates come as the Parameters that hold them (ops.assign on one changes the rate, as in MindSpore); where any
        rate is a list or a schedule, as this step's values."""
        indices = [self._rate_index(p) for p in self.parameters] if self._group_rates else [0]
        sources = [self.learning_rate] + [rate for _, rate in self._group_rates]
        if not any(isinstance(rate, (np.ndarray, LearningRateSchedule)) for rate in sources):
            faces = tuple(self._rate_source(i) for i in indices)
            return faces if self._group_rates else faces[0]
        rates = self._rates_at(self._step)
        values = tuple(Tensor._wrap(np.array(rates[i], np.float32)) for i in indices)
        return values if self._group_rates else values[0]

    def get_lr_parameter(self, param: Parameter | list[Parameter]) -> Any:
        """The learning rate of `param` (a Parameter or a list of them): the Parameter a checkpoint holds it in, or
        its LearningRateSchedule (MindSpore's get_lr_parameter)."""
        if isinstance(param, Parameter):
            return self._rate_source(self._rate_index(param))
        if isinstance(param, list):
            return [self._rate_source(self._rate_index(p)) for p in param]
        raise TypeError(f"For 'get_lr_parameter', the 'param' must be 'Parameter' or 'list' type, but got {param!r}")

    def _rate_index(self, param: Parameter) -> int:
        if not any(param is p for p in self.parameters):
            raise ConfigurationError(f"get_lr_parameter: {param.name!r} is not a parameter of this {self.cls_name}")
        return self.groups._rate_of.get(param.key, 0)

    def _rate_source(self, index: int) -> Any:
        """The Parameter (or schedule) of rate `index`: 0 the optimizer's learning_rate, i the i-th group's."""
        if index == 0:
            lr = self.learning_rate
            return lr if isinstance(lr, LearningRateSchedule) else self._params["learning_rate"]
        name, rate = self._group_rates[index - 1]
        return rate if isinstance(rate, LearningRateSchedule) else self._params[name]

    def _rates_at(self, step: int) -> list[float]:
        """Each rate of update `step`: the optimizer's, then each group's of its own."""
        return [self.learning_rate_at(step)] + [_rate_at(rate, step) for _, rate in self._group_rates]

    def _add_group_rate(self, name: str, rate: Any, default: Any) -> None:
        rate = _lr_source(rate)
        lists = [r for r in [default] + [r for _, r in self._group_rates] if isinstance(r, np.ndarray)]
        if isinstance(rate, np.ndarray) and lists and len(rate) != len(lists[0]):
            raise ValueError(  # MindSpore's _parse_group_params
                "For 'Optimizer', the Tensor type dynamic learning rate in group must be the same size as the "
                "argument 'learning_rate'."
            )
        entry = [name, rate]
        self._group_rates.append(entry)
        if isinstance(rate, LearningRateSchedule):
            return

        def put(value: np.ndarray) -> None:
            entry[1] = _lr_source(value.astype(np.float64))

        get = lambda: np.asarray(entry[1], np.float32)  # noqa: E731
        self._params[name] = _StateFace(name, np.asarray(rate, np.float32), get, put)

    def rate_feed(self) -> _RateFeed:
        """The learning-rate input of a compiled update (see _RateFeed)."""
        return _RateFeed(self)

    def _lr_feed(self) -> np.ndarray:
        self._check_rate_list(self._step + 1)
        # The same (read-only) array while the rates stay the same: the daemon then need not bind it again.
        value = tuple(self._rates_at(self._step)) if self._group_rates else self.learning_rate_at(self._step)
        cached = self.__dict__.get("_lr_cached")
        if cached is None or cached[0] != value:
            array = np.array(value, np.float32)
            array.flags.writeable = False
            cached = self.__dict__["_lr_cached"] = (value, array)
        return cached[1]

    def _lr_ahead(self, steps: int) -> np.ndarray | None:
        """The rates of the next `steps` updates, one row per update, for a sink-mode Execute that runs them all;
        None where one rate (row) serves them all (then `_lr_feed` gives it)."""
        sources = [self.learning_rate] + [rate for _, rate in self._group_rates]
        if not any(isinstance(rate, (np.ndarray, LearningRateSchedule)) for rate in sources):
            return None
        self._check_rate_list(self._step + steps)
        if self._group_rates:
            rates = np.array([self._rates_at(self._step + k) for k in range(steps)], np.float32)
        else:
            rates = np.array([self.learning_rate_at(self._step + k) for k in range(steps)], np.float32)
        return None if np.all(rates == rates[0]) else rates

    def _check_rate_list(self, updates: int) -> None:
        named = [("learning_rate", self.learning_rate)] if self._default_read else []
        for name, rate in named + [tuple(entry) for entry in self._group_rates]:
            if isinstance(rate, np.ndarray) and updates > len(rate):
                # MindSpore gathers the step's rate from the list, and on CPU and GPU an index past the end is an
                # error
                raise ConfigurationError(
                    f"{self.cls_name}'s {name} list has {len(rate)} per-step values, but update "
                    f"{len(rate) + 1} is about to run; give one value per step of the whole training (e.g. "
                    "nn.piecewise_constant_lr or nn.cosine_decay_lr over total_step = epochs * steps per epoch), or "
                    "a LearningRateSchedule"
                )

    def _advance(self) -> None:
        self.__dict__["_step"] += 1  # once per step: skip Cell.__setattr__

    @property
    def global_step(self) -> Parameter:
        """How many updates ran (MindSpore's `global_step`, a Parameter saved with the optimizer's state, so a
        resumed run continues its learning-rate schedule where it stopped)."""
        return self.__dict__["_global_step"]

    # --- state ------------------------------------------------------------------------------------------------
    def slot_parameters(self) -> list[Parameter]:
        """Every moment slot and global (beta powers) parameter."""
        return [p for made in self._slots.values() for p in made] + list(self._globals.values())

    def rename_map(self) -> dict[str, str]:
        """build_train_step's generic input names -> this optimizer's store names."""
        mapping = {"learning_rate": self.lr_key}
        mapping.update({f"optimizer/{name}": p.key for name, p in self._globals.items()})
        return mapping

    # --- applying an update ----------------------------------------------------------------------------------
    def __call__(self, gradients: Sequence[Any]) -> Any:
        gradients = tuple(gradients)
        if len(gradients) != len(self.parameters):
            raise ConfigurationError(
                f"{self.cls_name} updates {len(self.parameters)} parameters but got {len(gradients)} gradients; "
                "pass the gradients of exactly optimizer.parameters, in that order"
            )
        for p, g in zip(self.parameters, gradients):
            if tuple(g.shape) != tuple(p.shape):
                raise ConfigurationError(f"gradient for {p.name!r} has shape {tuple(g.shape)}, expected {p.shape}")
        if current() is not None:
            return self._emit(gradients)
        self._shard_state()
        self._update(*gradients)
        return True

    def _shard_state(self) -> None:
        """Optimizer parallel and an update called on gradients (value_and_grad + optimizer(grads)): under
        SEMI_AUTO/AUTO the parallel pass gives the moment slots the layout of each rank's block
        (common/partition.py); under DATA_PARALLEL this path keeps whole state (Model.train and TrainOneStepCell
        shard it), and says so."""
        from tessel import context
        from tessel.common import partition
        from tessel.common.engine import engine

        if context.optimizer_shard_config() is None or partition.active() or engine().world_size == 1:
            return
        from tessel.common.support import log_once

        log_once(
            "optimizer-parallel-functional",
            "enable_parallel_optimizer: an optimizer called on gradients (optimizer(grads)) under DATA_PARALLEL "
            "updates whole parameters and keeps whole state; Model.train and TrainOneStepCell shard it",
        )

    def _emit(self, gradients: Sequence[Any]) -> Any:
        """Add the update of every parameter (and slot) to the current trace."""
        trace = current()
        groups = self.groups
        lr = trace.run_input(self.lr_key, groups.rate_shape, DType.float32, self.rate_feed())
        if self._advance not in trace.after_run:
            trace.after_run.append(self._advance)
        glob = {name: trace.param(p) for name, p in self._globals.items()}
        for i, (p, g) in enumerate(zip(self.parameters, gradients)):
            p_sym, g_sym = trace.param(p), trace.to_symbolic(g)
            if not isinstance(g_sym, SymbolicTensor):
                g_sym = SymbolicTensor(trace.builder, trace.builder.constant(np.asarray(g_sym, p.dtype.numpy)))
            if self.loss_scale != 1.0:
                g_sym = g_sym * (1.0 / self.loss_scale)
            slots = {name: trace.param(made[i]) for name, made in self._slots.items()}
            decay, rate = groups.decay(p.key, self.weight_decay), groups.rate(lr, p.key).astype(p.dtype)
            new_p, new_slots = self._rule.update(p_sym, g_sym.astype(p.dtype), slots, glob, rate, decay)
            _assign(trace, p_sym, new_p)
            for name, value in new_slots.items():
                _assign(trace, slots[name], value)
        for name, value in self._rule.update_globals(glob).items():
            _assign(trace, glob[name], value)
        return True

    def extend_repr(self) -> str:
        lr = self.learning_rate
        return f"learning_rate={lr if isinstance(lr, float) else type(lr).__name__}, weight_decay={self.weight_decay}"
