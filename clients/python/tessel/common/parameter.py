"""`Parameter`: a trainable Tensor whose value lives on the daemon between steps.

A Parameter starts on the host. The first compiled run puts it into the daemon's store (under `key`, unique per
Parameter); optimizer steps then update it there in place, and reading it (`asnumpy`) fetches the current value
once per update. `set_data` makes the host value current again; the next run puts it back.

Under SEMI_AUTO/AUTO parallelism the first plan that uses a parameter gives it a layout (`layout`): from then on
the daemon holds this rank's slice, and `asnumpy()` returns that slice, as MindSpore's sliced parameters do;
`shape` stays the parameter's full (global) shape, the one networks are traced with.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import numpy as np

from tessel.common.dtype import ms_name
from tessel.common.initializer import Deferred
from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError, TesselError
from tessel.core.options import not_supported_yet

DEFAULT_NAME = "Parameter"
_serials = itertools.count()
_every: weakref.WeakSet = weakref.WeakSet()  # every Parameter alive (report_layouts)


class Parameter(Tensor):
    """MindSpore `Parameter(default_input, name=None, requires_grad=True, layerwise_parallel=False, ...)`.

    >>> import numpy as np, tessel as ms
    >>> w = ms.Parameter(ms.Tensor(np.ones((2, 3), np.float32)), name="w")
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Parameter:
        return object.__new__(cls)  # Tensor.__new__ reads Tensor's own arguments (placeholder shapes)

    def __init__(
        self,
        default_input: Any,
        name: str | None = None,
        requires_grad: bool = True,
        layerwise_parallel: bool = False,
        parallel_optimizer: bool = True,
        key: str | None = None,
    ):
        # Inside no_init_parameters() an initializer's values come Deferred: drawn when first needed (a slice only,
        # once the parameter is laid out), see tessel.common.initializer.Deferred.
        self._deferred = default_input if isinstance(default_input, Deferred) else None
        if self._deferred is not None:
            self._array, self._ref, self._sym = None, None, None
        else:
            super().__init__(default_input.asnumpy() if isinstance(default_input, Tensor) else default_input)
        self.name = name
        self.requires_grad = requires_grad
        self.layerwise_parallel = layerwise_parallel
        self.parallel_optimizer = parallel_optimizer
        self._serial = next(_serials)
        self._key = key
        self._device: int | None = None  # id of the engine whose store holds this parameter's value
        self._host_stale = False  # the store holds a newer value than self._array
        self._global_shape = tuple(self._deferred.shape if self._deferred is not None else self._array.shape)
        self._layout = None  # under SEMI_AUTO/AUTO: the compiler Layout of its slices, once a plan placed it
        self._layout_engine: int | None = None  # the engine (job) that layout belongs to
        self._local = False  # self._array holds this rank's slice, not the whole value
        self._pipeline: tuple[int, bool] | None = None  # pipeline parallel: (engine id, this rank's stage holds it)
        self._comm_fusion = 1
        _every.add(self)
        mark_host_write()

    @property
    def comm_fusion(self) -> int:
        """The fusion group of this parameter's gradient reduction (MindSpore's default 1; Cell.set_comm_fusion):
        the train step of Model.train / TrainOneStepCell under DATA_PARALLEL, SEMI_AUTO and AUTO fuses only
        gradients of one index into a bucket (each bucket still closes at comm_fusion's size), and index 0 reduces
        the gradient on its own."""
        return self._comm_fusion

    @comm_fusion.setter
    def comm_fusion(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigurationError(f"comm_fusion of parameter {self.name!r} must be an int >= 0, got {value!r}")
        self._comm_fusion = value

    @property
    def shape(self) -> tuple:
        """The full shape (under SEMI_AUTO/AUTO too, where a rank holds a slice of it)."""
        return self._global_shape

    @property
    def dtype(self) -> Any:
        if self._array is None and self._deferred is not None:
            return self._deferred.dtype
        return super().dtype

    @property
    def has_init(self) -> bool:
        """True while the value is not drawn yet (created inside no_init_parameters)."""
        return self._array is None and self._deferred is not None

    def init_data(self, layout: Any = None, set_sliced: bool = False) -> Parameter:
        """Draw the value now (MindSpore `init_data`): the whole tensor, or this rank's slice once laid out.
        `layout` and `set_sliced` (MindSpore's own slicing of the parameter) are not supported yet."""
        if layout is not None or set_sliced is not False:
            given = "layout" if layout is not None else "set_sliced"
            value = layout if layout is not None else set_sliced
            raise not_supported_yet(
                f"Parameter.init_data({given}={value!r})",
                "tessel slices parameters by its own plan; call init_data() without layout and set_sliced",
            )
        if self.has_init:
            self._draw()
        return self

    def _draw(self) -> None:
        """Draw a deferred value: this rank's slice when the parameter is laid out, else the whole tensor."""
        if self._layout is not None:
            from tessel.common.engine import engine

            slices = self._layout.local_slices(self.shape, layout_rank(engine()))
            self._array, self._local = self._deferred.piece(slices), True
        else:
            self._array, self._local = self._deferred.full(), False
        self._deferred = None

    @property
    def layout(self):
        """How the parameter is sliced over the ranks (a compiler Layout), or None when every rank holds it whole."""
        return self._layout

    def place(self, layout, engine_id: int) -> None:
        """Give the parameter the layout a plan decided (once per job; the daemon then holds its slice)."""
        if self._layout_engine == engine_id and self._layout is not None and not self._layout.same_as(layout):
            raise ConfigurationError(
                f"parameter {self.name!r} is sliced as {self._layout.describe()}, and a new plan asks for "
                f"{layout.describe()}; a parameter keeps one layout in a job"
            )
        if self._layout_engine != engine_id and self._local:
            raise TesselError(
                f"parameter {self.name!r} holds only this rank's slice from an earlier job; its full value is lost. "
                "Load it from a checkpoint (save_checkpoint gathers the slices) before using it in a new job"
            )
        if self._layout_engine == engine_id and self._layout is not None:
            return
        if self._device == engine_id:  # the daemon holds the whole value: bring it back, then stage the slice
            if self._host_stale:
                self.asnumpy()
            self._device = None
            mark_host_write()
        self._layout, self._layout_engine = layout, engine_id

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str | None) -> None:
        if value is None:
            value = DEFAULT_NAME
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"a Parameter name must be a non-empty str, got {value!r}")
        self._name = value

    @property
    def key(self) -> str:
        """The name of this parameter in the daemon's store (and in compiled graphs): fixed once first used."""
        if self._key is None:
            self._key = f"{self._name}#{self._serial}"
        return self._key

    @property
    def data(self) -> Parameter:
        return self

    def value(self) -> Tensor:
        """The parameter's value: a copy when run eagerly; inside a traced (graph-mode) function the parameter
        itself, read where the value is used (as MindSpore's Load), so an op on another pipeline stage that reads
        it makes the parameter shared by both stages, and gradients reach it."""
        from tessel.common.tracing import current

        trace = current()
        if trace is not None:
            return Tensor._wrap_symbolic(trace.to_symbolic(self))
        return Tensor._wrap(np.array(self.asnumpy()))

    @property
    def held(self) -> bool:
        """False when pipeline parallel put this parameter on other stages than this rank's (it is not updated
        here, and reading it is an error); True otherwise."""
        if self._pipeline is None:
            return True
        from tessel.common.engine import engine

        return self._pipeline[0] != engine().id or self._pipeline[1]

    def asnumpy(self) -> np.ndarray:
        if not self.held:
            from tessel.communication import get_rank

            raise ConfigurationError(
                f"parameter {self.name!r} belongs to another pipeline stage: rank {get_rank()} does not hold or "
                "update it (pipeline parallel keeps each parameter on the stages whose cells use it). Read it on a "
                "rank of that stage (checkpoints saved there hold it)"
            )
        if self.has_init:
            self._draw()
        if self._host_stale:
            from tessel.common.engine import engine

            current = engine()
            if current.id != self._device:
                raise TesselError(
                    f"parameter {self.name!r} was last updated on a daemon session that has since closed; "
                    "its value is lost. Save checkpoints before releasing the runtime"
                )
            self._array = current.get([self.key])[self.key]
            self._host_stale, self._local = False, self._layout is not None
        # Read-only: an in-place edit would change the host copy only; use set_data to change a parameter.
        self._array.flags.writeable = False
        return self._array

    def set_data(self, data: Any, slice_shape: bool = False) -> Parameter:
        """Replace the value (the full shape, or with slice_shape=True this rank's slice of a sliced parameter;
        cast to this parameter's dtype). The next run puts it on the daemon."""
        array = data.asnumpy() if isinstance(data, Tensor) else np.asarray(data)
        local = slice_shape and self._layout is not None
        want = self._layout.local_shape(self.shape) if local else self.shape
        if array.shape != tuple(want):
            what = "this rank's slice" if local else "parameter"
            raise ConfigurationError(
                f"set_data: {what} {self.name!r} has shape {tuple(want)}, the new value {array.shape}; "
                "the shapes must match"
            )
        self._set_host(np.array(array, dtype=self.dtype.numpy), local)
        return self

    def _set_host(self, array: np.ndarray, local: bool | None = None) -> None:
        self._deferred = None
        if local is None:  # a slice of a sliced parameter is its slice, anything else the whole value
            local = self._layout is not None and tuple(array.shape) != self._global_shape
        self._array, self._host_stale, self._device, self._local = array, False, None, local
        mark_host_write()

    def _staged_value(self, rank: int) -> np.ndarray:
        """What the daemon of `rank` stores: the value, or its slice when the parameter is sliced."""
        if self.has_init:
            self._draw()
        if self._layout is None or self._local:
            return self._array
        from tessel.compiler.parallel import piece

        return piece(self._array, self._layout, rank)

    def clone(self, init: Any = "same") -> Parameter:
        """A new Parameter with this one's value (init='same') or a fresh initialisation."""
        from tessel.common.initializer import init_array

        if init == "same":
            value = self._deferred if self.has_init else np.array(self.asnumpy())
        else:
            value = init_array(init, self.shape, self.dtype)
        made = Parameter(value, self.name, self.requires_grad, self.layerwise_parallel, self.parallel_optimizer)
        made.comm_fusion = self.comm_fusion
        return made

    def __deepcopy__(self, memo: dict) -> Parameter:
        # A copy is a new parameter: its own store key, the current value.
        value = self._deferred if self.has_init else np.array(self.asnumpy())
        copy = Parameter(value, self.name, self.requires_grad, self.layerwise_parallel, self.parallel_optimizer)
        copy.comm_fusion = self.comm_fusion
        memo[id(self)] = copy
        return copy

    def __repr__(self) -> str:
        return (
            f"Parameter (name={self.name}, shape={tuple(self.shape)}, dtype={ms_name(self.dtype)}, "
            f"requires_grad={self.requires_grad})"
        )

    __str__ = __repr__  # print(param) shows its description in MindSpore, not its values

    def copy(self) -> Parameter:
        """A new Parameter of the same value and name (MindSpore's: clone(init='same'))."""
        return self.clone(init="same")

    __hash__ = object.__hash__


class ParameterTuple(tuple):
    """An immutable tuple of Parameters (MindSpore `ParameterTuple`)."""

    def __new__(cls, iterable=()):
        items = tuple(iterable)
        bad = [type(p).__name__ for p in items if not isinstance(p, Parameter)]
        if bad:
            raise ConfigurationError(f"ParameterTuple holds Parameters only, got {bad}")
        return super().__new__(cls, items)

    def clone(self, prefix: str, init: Any = "same") -> ParameterTuple:
        """Copies named "<prefix>.<name>" (how optimizers make their moment slots)."""
        clones = []
        for p in self:
            copy = p.clone(init)
            copy.name = f"{prefix}.{p.name}"
            clones.append(copy)
        return ParameterTuple(clones)


# Bumped whenever any Parameter's host value changes, so a step can skip checking every parameter when none did.
_host_writes = 0


def report_layouts(path: str) -> None:
    """Write, as JSON, how this rank holds every parameter: its full shape, its local shape and layout, and whether
    it holds it at all ("held": False, "local": None for a parameter pipeline parallel keeps on another stage) (a
    debugging view of a plan: `TESSEL_PARAMETER_REPORT=DIR` rewrites DIR/rank_<r>.json after each plan)."""
    import json

    report = {}
    for p in sorted(_every, key=lambda q: q._serial):
        layout = p.layout
        local = list(layout.local_shape(p.shape)) if layout is not None else list(p.shape)
        described = (
            None
            if layout is None
            else {"device_matrix": list(layout.device_matrix), "tensor_map": str(layout.tensor_map)}
        )
        held = p.held  # False: pipeline parallel keeps it on another stage
        report[p.name] = {"shape": list(p.shape), "local": local if held else None, "layout": described, "held": held}
    with open(path, "w") as out:
        json.dump(report, out, indent=1)


def layout_rank(engine) -> int:
    """This rank's place in the mesh parameter layouts are over: its rank, or under pipeline parallel its place
    among the ranks of its stage (each stage's ranks plan the network among themselves)."""
    from tessel.parallel.pipeline import mesh

    return mesh(engine.world_size, engine.runtime.rank).index


def mark_host_write() -> None:
    global _host_writes
    _host_writes += 1


def host_writes() -> int:
    return _host_writes


def stage(engine, params, feed: dict[str, np.ndarray]) -> None:
    """Add every parameter the daemon does not hold yet (or holds an older value of) to `feed`."""
    for p in params:
        if p._device != engine.id:
            if p._host_stale:
                p.asnumpy()  # raises: the value only existed on a closed session
            feed[p.key] = p._staged_value(layout_rank(engine))
            p._device = engine.id


def updated_on_device(params) -> None:
    """The daemon changed these parameters: their host copies are stale."""
    for p in params:
        p._host_stale = True


def fetch_all(params) -> None:
    """Bring every stale parameter's value to the host in one request."""
    stale = [p for p in params if p._host_stale]
    if not stale:
        return
    from tessel.common.engine import engine

    current = engine()
    values = current.get([p.key for p in stale if p._device == current.id])
    for p in stale:
        if p.key in values:
            p._array, p._host_stale, p._local = values[p.key], False, p._layout is not None
        else:
            p.asnumpy()  # raises the lost-session error
