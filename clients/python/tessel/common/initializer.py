"""Parameter initializers with MindSpore's names, defaults and formulas, drawn from the global seed's streams.

>>> from tessel.common.initializer import initializer, HeUniform
>>> w = initializer(HeUniform(), (512, 784))          # a Tensor; same values on every rank for one seed
>>> b = initializer("zeros", (512,))
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tessel.common import seed
from tessel.common.dtype import DType, float32, to_dtype
from tessel.core.errors import ConfigurationError


def _fans(shape: tuple[int, ...], who: str) -> tuple[int, int]:
    if len(shape) < 2:
        raise ConfigurationError(
            f"{who} needs a shape of at least 2 dims (out, in, ...) to compute fan_in/fan_out, got {shape}"
        )
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _gain(nonlinearity: str, slope: float) -> float:
    # MindSpore's gains: 1 for the linear functions (every convolution included), sigmoid 1, tanh 5/3, relu sqrt 2
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
    gains = {**dict.fromkeys(linear, 1.0), "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0)}
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity not in gains:
        raise ConfigurationError(f"unknown nonlinearity {nonlinearity!r}; use one of {[*gains, 'leaky_relu']}")
    return gains[nonlinearity]


class Initializer:
    """Base class: `generate(shape, dtype)` returns a new numpy array (drawing from the next seeded stream), or,
    inside `no_init_parameters()`, a `Deferred` that draws the same values when (and as far as) they are needed.

    `_values(shape, rng, full)` draws `shape` values; `full` is the whole tensor's shape when `shape` is a run of
    its rows (fans come from it). `sequential` initializers draw element after element, so a run of rows drawn
    after the rows before it equals those rows of the whole draw."""

    sequential = True

    def generate(self, shape: tuple[int, ...], dtype: DType) -> np.ndarray | Deferred:
        if _deferring():
            return Deferred(self, tuple(shape), dtype, seed.next_stream_key())
        return self._values(tuple(shape), seed.next_stream()).astype(dtype.numpy)

    def _values(self, shape: tuple[int, ...], rng: np.random.Generator, full: tuple[int, ...] | None = None):
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class Constant(Initializer):
    def __init__(self, value: float):
        self.value = value

    def _values(self, shape, rng, full=None):
        return np.full(shape, self.value, np.float64)


class Zero(Constant):
    def __init__(self):
        super().__init__(0.0)


class One(Constant):
    def __init__(self):
        super().__init__(1.0)


class Normal(Initializer):
    """N(mean, sigma²); MindSpore's "normal" is Normal(sigma=0.01)."""

    def __init__(self, sigma: float = 0.01, mean: float = 0.0):
        self.sigma, self.mean = sigma, mean

    def _values(self, shape, rng, full=None):
        return rng.normal(self.mean, self.sigma, shape)


class Uniform(Initializer):
    """U(-scale, scale)."""

    def __init__(self, scale: float = 0.07):
        self.scale = scale

    def _values(self, shape, rng, full=None):
        return rng.uniform(-self.scale, self.scale, shape)


class TruncatedNormal(Initializer):
    """N(mean, sigma²) redrawn until inside [a, b] (absolute bounds, as in MindSpore 2.x)."""

    sequential = False  # the redraws come after the whole first draw

    def __init__(self, sigma: float = 0.01, mean: float = 0.0, a: float = -2.0, b: float = 2.0):
        self.sigma, self.mean, self.a, self.b = sigma, mean, a, b

    def _values(self, shape, rng, full=None):
        out = rng.normal(self.mean, self.sigma, shape)
        bad = (out < self.a) | (out > self.b)
        while bad.any():
            out[bad] = rng.normal(self.mean, self.sigma, int(bad.sum()))
            bad = (out < self.a) | (out > self.b)
        return out


class XavierUniform(Initializer):
    """U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out))."""

    def __init__(self, gain: float = 1.0):
        self.gain = gain

    def _values(self, shape, rng, full=None):
        fan_in, fan_out = _fans(full or shape, "XavierUniform")
        bound = self.gain * math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, shape)


class XavierNormal(Initializer):
    """N(0, s²), s = gain * sqrt(2 / (fan_in + fan_out))."""

    def __init__(self, gain: float = 1.0):
        self.gain = gain

    def _values(self, shape, rng, full=None):
        fan_in, fan_out = _fans(full or shape, "XavierNormal")
        return rng.normal(0.0, self.gain * math.sqrt(2.0 / (fan_in + fan_out)), shape)


class HeUniform(Initializer):
    """Kaiming uniform: U(-b, b), b = gain * sqrt(3 / fan). `HeUniform(math.sqrt(5))` is Dense's default."""

    def __init__(self, negative_slope: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"):
        if mode not in ("fan_in", "fan_out"):
            raise ConfigurationError(f"HeUniform mode must be 'fan_in' or 'fan_out', got {mode!r}")
        self.negative_slope, self.mode, self.nonlinearity = negative_slope, mode, nonlinearity

    def _bound_scale(self, shape) -> float:
        fan_in, fan_out = _fans(shape, type(self).__name__)
        return _gain(self.nonlinearity, self.negative_slope) / math.sqrt(fan_in if self.mode == "fan_in" else fan_out)

    def _values(self, shape, rng, full=None):
        bound = math.sqrt(3.0) * self._bound_scale(full or shape)
        return rng.uniform(-bound, bound, shape)


class HeNormal(HeUniform):
    """Kaiming normal: N(0, s²), s = gain / sqrt(fan)."""

    def _values(self, shape, rng, full=None):
        return rng.normal(0.0, self._bound_scale(full or shape), shape)


# --- deferred initialisation (no_init_parameters) -------------------------------------------------------------

_DEFER = threading.local()
_CHUNK_BYTES = 4 << 20  # rows drawn at a time when only a slice is kept


def _deferring() -> bool:
    return getattr(_DEFER, "depth", 0) > 0


@contextlib.contextmanager
def no_init_parameters() -> Iterator[None]:
    """Parameters created inside are not drawn until a compiled run needs them; under SEMI_AUTO/AUTO_PARALLEL each
    rank then draws only its slice (MindSpore `mindspore.nn.utils.no_init_parameters`).

        >>> with no_init_parameters():
        ...     net = Network()            # nothing is allocated for the weights yet

    A rank's slice is exactly that slice of the values one device would draw (same seed, same stream), so N ranks
    still equal one device; MindSpore instead seeds each slice apart. A slice costs drawing the rows up to its last
    one, a chunk at a time: memory for the slice and one chunk, never the whole tensor."""
    _DEFER.depth = getattr(_DEFER, "depth", 0) + 1
    try:
        yield
    finally:
        _DEFER.depth -= 1


class Deferred:
    """An initializer's values for one tensor, not drawn yet (the stream is reserved when it is made)."""

    has_init = True

    def __init__(self, init: Initializer, shape: tuple[int, ...], dtype: DType, key: list[int] | None):
        self.init, self.shape, self.dtype, self.key = init, tuple(shape), dtype, key

    @staticmethod
    def constant(value: float, shape: tuple[int, ...], dtype: DType) -> Deferred:
        return Deferred(Constant(value), shape, dtype, None)

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng(self.key)

    def full(self) -> np.ndarray:
        """The whole tensor."""
        return self.init._values(self.shape, self._rng()).astype(self.dtype.numpy)

    def piece(self, slices: tuple[slice, ...]) -> np.ndarray:
        """The values of `full()[slices]` (contiguous slices), drawing no more than the rows up to the last one."""
        if not self.shape or not self.init.sequential:
            return np.ascontiguousarray(self.full()[slices])
        rows, rest = slices[0], tuple(slices[1:])
        start, stop = rows.indices(self.shape[0])[:2]
        row_bytes = max(1, int(np.prod(self.shape[1:], dtype=np.int64)) * 8)
        step = max(1, _CHUNK_BYTES // row_bytes)
        rng, parts, done = self._rng(), [], 0
        while done < stop:
            count = min(step, stop - done)
            chunk = self.init._values((count, *self.shape[1:]), rng, self.shape)
            low, high = max(start, done), min(stop, done + count)
            if low < high:
                parts.append(chunk[low - done : high - done][(slice(None), *rest)].astype(self.dtype.numpy))
            done += count
        if not parts:
            return np.zeros((0, *self.full_shape_of(rest)), self.dtype.numpy)
        return np.ascontiguousarray(np.concatenate(parts))

    def full_shape_of(self, rest: tuple[slice, ...]) -> tuple[int, ...]:
        return tuple(len(range(*s.indices(d))) for s, d in zip(rest, self.shape[1:]))

    def asnumpy(self) -> np.ndarray:
        return self.full()

    def __repr__(self) -> str:
        return f"Deferred({self.init!r}, shape={self.shape}, dtype={self.dtype})"


_BY_NAME = {
    "zeros": Zero,
    "zero": Zero,
    "ones": One,
    "one": One,
    "normal": Normal,
    "uniform": Uniform,
    "truncatednormal": TruncatedNormal,
    "xavier_uniform": XavierUniform,
    "xavieruniform": XavierUniform,
    "xavier_normal": XavierNormal,
    "he_uniform": HeUniform,
    "heuniform": HeUniform,
    "he_normal": HeNormal,
    "henormal": HeNormal,
}


def as_initializer(init: Any) -> Initializer | np.ndarray:
    """An Initializer for names and instances; numbers become Constant; arrays/Tensors are returned as arrays."""
    if isinstance(init, Initializer):
        return init
    if isinstance(init, str):
        cls = _BY_NAME.get(init.strip().lower())
        if cls is None:
            raise ConfigurationError(f"unknown initializer {init!r}; use one of {sorted(set(_BY_NAME))}")
        return cls()
    if isinstance(init, (bool, int, float)):
        return Constant(float(init))
    if hasattr(init, "asnumpy"):
        return np.asarray(init.asnumpy())
    if isinstance(init, np.ndarray):
        return init
    raise ConfigurationError(f"cannot initialise from {type(init).__name__}; pass a name, an Initializer or an array")


def init_array(init: Any, shape: Sequence[int], dtype: Any = float32) -> np.ndarray | Deferred:
    """The numpy values of `init` for `shape` and `dtype` (arrays are checked against the shape); inside
    `no_init_parameters()` an initializer's values come `Deferred`."""
    shape, dtype = tuple(int(d) for d in shape), to_dtype(dtype)
    made = as_initializer(init)
    if isinstance(made, np.ndarray):
        if made.shape != shape:
            raise ConfigurationError(f"initial value has shape {made.shape}, expected {shape}")
        return made.astype(dtype.numpy)
    return made.generate(shape, dtype)


def initializer(init: Any, shape: Sequence[int] | int | None = None, dtype: Any = float32):
    """A Tensor of `shape` initialised by `init` (a name, an Initializer, a number or an array) — MindSpore's API."""
    from tessel.common.tensor import Tensor

    if isinstance(shape, int):
        shape = (shape,)
    if shape is None:
        made = as_initializer(init)
        if not isinstance(made, np.ndarray):
            raise ConfigurationError("initializer(init, shape): shape is required unless init is an array")
        shape = made.shape
    values = init_array(init, shape, dtype)
    return values if isinstance(values, Deferred) else Tensor(values)
