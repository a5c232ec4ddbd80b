"""Parameter initializers with MindSpore's names, defaults and formulas, drawn from the global seed's streams.

>>> from tessel.common.initializer import initializer, HeUniform
>>> w = initializer(HeUniform(), (512, 784))          # a Tensor; same values on every rank for one seed
>>> b = initializer("zeros", (512,))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
    gains = {"linear": 1.0, "conv2d": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0)}
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity not in gains:
        raise ConfigurationError(f"unknown nonlinearity {nonlinearity!r}; use one of {[*gains, 'leaky_relu']}")
    return gains[nonlinearity]


class Initializer:
    """Base class: `generate(shape, dtype)` returns a new numpy array (drawing from the next seeded stream)."""

    def generate(self, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        return self._values(tuple(shape), seed.next_stream()).astype(dtype.numpy)

    def _values(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class Constant(Initializer):
    def __init__(self, value: float):
        self.value = value

    def _values(self, shape, rng):
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

    def _values(self, shape, rng):
        return rng.normal(self.mean, self.sigma, shape)


class Uniform(Initializer):
    """U(-scale, scale)."""

    def __init__(self, scale: float = 0.07):
        self.scale = scale

    def _values(self, shape, rng):
        return rng.uniform(-self.scale, self.scale, shape)


class TruncatedNormal(Initializer):
    """N(mean, sigma²) redrawn until inside [a, b] (absolute bounds, as in MindSpore 2.x)."""

    def __init__(self, sigma: float = 0.01, mean: float = 0.0, a: float = -2.0, b: float = 2.0):
        self.sigma, self.mean, self.a, self.b = sigma, mean, a, b

    def _values(self, shape, rng):
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

    def _values(self, shape, rng):
        fan_in, fan_out = _fans(shape, "XavierUniform")
        bound = self.gain * math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, shape)


class XavierNormal(Initializer):
    """N(0, s²), s = gain * sqrt(2 / (fan_in + fan_out))."""

    def __init__(self, gain: float = 1.0):
        self.gain = gain

    def _values(self, shape, rng):
        fan_in, fan_out = _fans(shape, "XavierNormal")
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

    def _values(self, shape, rng):
        bound = math.sqrt(3.0) * self._bound_scale(shape)
        return rng.uniform(-bound, bound, shape)


class HeNormal(HeUniform):
    """Kaiming normal: N(0, s²), s = gain / sqrt(fan)."""

    def _values(self, shape, rng):
        return rng.normal(0.0, self._bound_scale(shape), shape)


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


def init_array(init: Any, shape: Sequence[int], dtype: Any = float32) -> np.ndarray:
    """The numpy values of `init` for `shape` and `dtype` (arrays are checked against the shape)."""
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
    return Tensor(init_array(init, shape, dtype))
