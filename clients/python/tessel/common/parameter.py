"""`Parameter`: a trainable Tensor whose value lives on the daemon between steps.

A Parameter starts on the host. The first compiled run puts it into the daemon's store (under `key`, unique per
Parameter); optimizer steps then update it there in place, and reading it (`asnumpy`) fetches the current value
once per update. `set_data` makes the host value current again; the next run puts it back.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from tessel.common.dtype import ms_name
from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError, TesselError

DEFAULT_NAME = "Parameter"
_serials = itertools.count()


class Parameter(Tensor):
    """MindSpore `Parameter(default_input, name=None, requires_grad=True, layerwise_parallel=False, ...)`.

    >>> import numpy as np, tessel as ms
    >>> w = ms.Parameter(ms.Tensor(np.ones((2, 3), np.float32)), name="w")
    """

    def __init__(
        self,
        default_input: Any,
        name: str | None = None,
        requires_grad: bool = True,
        layerwise_parallel: bool = False,
        parallel_optimizer: bool = True,
        key: str | None = None,
    ):
        source = default_input.asnumpy() if isinstance(default_input, Tensor) else default_input
        super().__init__(source)
        self.name = name
        self.requires_grad = requires_grad
        self.layerwise_parallel = layerwise_parallel
        self.parallel_optimizer = parallel_optimizer
        self._serial = next(_serials)
        self._key = key
        self._device: int | None = None  # id of the engine whose store holds this parameter's value
        self._host_stale = False  # the store holds a newer value than self._array
        mark_host_write()

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
        return Tensor._wrap(np.array(self.asnumpy()))

    def asnumpy(self) -> np.ndarray:
        if self._host_stale:
            from tessel.common.engine import engine

            current = engine()
            if current.id != self._device:
                raise TesselError(
                    f"parameter {self.name!r} was last updated on a daemon session that has since closed; "
                    "its value is lost. Save checkpoints before releasing the runtime"
                )
            self._array = current.get([self.key])[self.key]
            self._host_stale = False
        # Read-only: an in-place edit would change the host copy only; use set_data to change a parameter.
        self._array.flags.writeable = False
        return self._array

    def set_data(self, data: Any, slice_shape: bool = False) -> Parameter:
        """Replace the value (same shape; cast to this parameter's dtype). The next run puts it on the daemon."""
        array = data.asnumpy() if isinstance(data, Tensor) else np.asarray(data)
        if array.shape != self.shape:
            raise ConfigurationError(
                f"set_data: parameter {self.name!r} has shape {self.shape}, the new value {array.shape}; "
                "the shapes must match"
            )
        self._set_host(np.array(array, dtype=self.dtype.numpy))
        return self

    def _set_host(self, array: np.ndarray) -> None:
        self._array, self._host_stale, self._device = array, False, None
        mark_host_write()

    def clone(self, init: Any = "same") -> Parameter:
        """A new Parameter with this one's value (init='same') or a fresh initialisation."""
        from tessel.common.initializer import init_array

        value = np.array(self.asnumpy()) if init == "same" else init_array(init, self.shape, self.dtype)
        return Parameter(value, self.name, self.requires_grad, self.layerwise_parallel, self.parallel_optimizer)

    def __deepcopy__(self, memo: dict) -> Parameter:
        # A copy is a new parameter: its own store key, the current value.
        copy = Parameter(np.array(self.asnumpy()), self.name, self.requires_grad, self.layerwise_parallel)
        memo[id(self)] = copy
        return copy

    def __repr__(self) -> str:
        return (
            f"Parameter (name={self.name}, shape={tuple(self.shape)}, dtype={ms_name(self.dtype)}, "
            f"requires_grad={self.requires_grad})"
        )

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
            feed[p.key] = p._array
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
            p._array, p._host_stale = values[p.key], False
        else:
            p.asnumpy()  # raises the lost-session error
