"""mint's random functions: `rand`, `randn`, `randint`, `randperm`, `normal`, `bernoulli`, `multinomial`, `*_like`.

They draw as tessel's other random op, dropout: eagerly from the next stream of `set_seed` (so a run after
`set_seed(s)` draws the same numbers), and in a traced function from RandomUniformLike ops seeded in creation order,
new numbers at every run. The numbers are MindSpore's in distribution, shape, dtype and range, not bit for bit.
`generator` may be None or ms.default_generator (set_seed's state); a Generator of one's own is not supported yet.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tessel.common import seed as _seed
from tessel.common.dtype import DType, to_dtype
from tessel.common.support import not_supported_yet
from tessel.common.tensor import Tensor
from tessel.common.tracing import apply_op, current
from tessel.core.errors import ConfigurationError
from tessel.ops import composed as C
from tessel.ops import functional as F


def _no_generator(generator: Any, who: str) -> None:
    """The global generator (None or ms.default_generator, whose state is set_seed's) is the one tessel draws from."""
    from tessel.common.generator import default_generator

    if generator is not None and generator is not default_generator:
        raise not_supported_yet(
            f"mindspore.mint.{who}(generator=<a Generator of your own>)",
            "tessel's random functions draw from ms.default_generator only; seed it with ms.manual_seed(seed)",
        )


def _shape(size: tuple, who: str) -> tuple[int, ...]:
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise ConfigurationError(f"mint.{who}: size must be ints >= 0, got {shape}")
    return tuple(int(d) for d in shape)


def _uniform(shape: tuple[int, ...]) -> Tensor:
    """float32 uniform numbers in [0, 1)."""
    if current() is None:
        return Tensor._wrap(_seed.next_stream().random(shape, dtype=np.float32))
    return apply_op("RandomUniformLike", F.zeros(shape, DType.float32), seed=_seed.next_op_seed())


def _normal(shape: tuple[int, ...]) -> Tensor:
    """float32 standard normal numbers (Box-Muller from two uniforms)."""
    if current() is None:
        return Tensor._wrap(_seed.next_stream().standard_normal(shape, dtype=np.float32))
    radius = F.sqrt(-2.0 * F.log(1.0 - _uniform(shape)))  # 1 - u lies in (0, 1]
    return radius * F.cos(_uniform(shape) * (2.0 * math.pi))


def _as(value: Tensor, dtype: Any) -> Tensor:
    return value if dtype is None else F.cast(value, to_dtype(dtype))


def rand(*size: Any, generator: Any = None, dtype: Any = None) -> Tensor:
    """Uniform numbers in [0, 1) of shape `size`, float32 unless `dtype` says."""
    _no_generator(generator, "rand")
    return _as(_uniform(_shape(size, "rand")), dtype)


def rand_like(input: Any, *, dtype: Any = None) -> Tensor:
    """Uniform numbers in [0, 1) of input's shape and dtype (or `dtype`)."""
    return _as(_uniform(tuple(input.shape)), input.dtype if dtype is None else dtype)


def randn(*size: Any, generator: Any = None, dtype: Any = None) -> Tensor:
    """Standard normal numbers of shape `size`, float32 unless `dtype` says."""
    _no_generator(generator, "randn")
    return _as(_normal(_shape(size, "randn")), dtype)


def randn_like(input: Any, *, dtype: Any = None) -> Tensor:
    """Standard normal numbers of input's shape and dtype (or `dtype`)."""
    return _as(_normal(tuple(input.shape)), input.dtype if dtype is None else dtype)


def _integers(low: int, high: int, shape: tuple[int, ...], dtype: Any, who: str) -> Tensor:
    if not low < high:
        raise ConfigurationError(f"mint.{who}: low {low} must be below high {high}")
    span = float(high - low)
    drawn = F.floor(F.cast(_uniform(shape), DType.float64) * span) + float(low)
    return F.cast(F.minimum(drawn, float(high - 1)), DType.int64 if dtype is None else dtype)


def randint(*args: Any, generator: Any = None, dtype: Any = None) -> Tensor:
    """Integers uniform in [low, high) of shape `size`: randint(high, size) or randint(low, high, size); int64
    unless `dtype` says."""
    _no_generator(generator, "randint")
    if len(args) not in (2, 3):
        raise ConfigurationError(f"mint.randint: give (high, size) or (low, high, size), got {len(args)} arguments")
    low, high, size = (0, *args) if len(args) == 2 else args
    return _integers(int(low), int(high), _shape((size,), "randint"), dtype, "randint")


def randint_like(*args: Any, dtype: Any = None) -> Tensor:
    """Integers uniform in [low, high) of input's shape and dtype (or `dtype`): randint_like(input, high) or
    randint_like(input, low, high)."""
    if len(args) not in (2, 3):
        raise ConfigurationError(f"mint.randint_like: give (input, high) or (input, low, high), got {len(args)}")
    input, low, high = (args[0], 0, args[1]) if len(args) == 2 else args
    return _integers(int(low), int(high), tuple(input.shape), input.dtype if dtype is None else dtype, "randint_like")


def randperm(n: int, *, generator: Any = None, dtype: Any = DType.int64) -> Tensor:
    """A random permutation of 0 .. n - 1 (the order that sorts n uniform numbers), int64 unless `dtype` says."""
    _no_generator(generator, "randperm")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ConfigurationError(f"mint.randperm: n must be an int >= 0, got {n!r}")
    if n == 0:
        return C._constant(np.zeros(0, to_dtype(dtype).numpy))
    return F.cast(C.sort(_uniform((int(n),)), 0, False)[1], dtype)


def normal(mean: Any = 0.0, std: Any = 1.0, size: Any = None, generator: Any = None) -> Tensor:
    """mean + std * a standard normal number: of the broadcast shape of tensor mean and std, or of `size` when both
    are numbers; float32."""
    _no_generator(generator, "normal")
    tensors = [v for v in (mean, std) if isinstance(v, Tensor)]
    if tensors:
        shape = np.broadcast_shapes(*(tuple(t.shape) for t in tensors))
    elif size is None:
        raise ConfigurationError("mint.normal: with a number mean and std, give size")
    else:
        shape = _shape((size,), "normal")
    return mean + std * _normal(tuple(shape))


def bernoulli(input: Any, *, generator: Any = None) -> Tensor:
    """1 with probability input, else 0, element-wise, of input's dtype."""
    _no_generator(generator, "bernoulli")
    return F.cast(F.less(_uniform(tuple(input.shape)), F.cast(input, DType.float32)), input.dtype)


def multinomial(input: Any, num_samples: int, replacement: bool = False, *, generator: Any = None) -> Tensor:
    """int64 indices drawn from each row of the non-negative weights `input` (1-D or 2-D; they need not sum to 1):
    without replacement the num_samples largest of log(weight) + Gumbel noise (which is drawing one by one without
    putting back), with replacement the positions of uniform numbers in the running sums of the weights."""
    _no_generator(generator, "multinomial")
    shape = C._shape(input, "mint.multinomial")
    if len(shape) not in (1, 2) or isinstance(num_samples, bool) or not isinstance(num_samples, int):
        raise ConfigurationError(f"mint.multinomial: input must be 1-D or 2-D and num_samples an int, got {shape}")
    if num_samples < 1 or (not replacement and num_samples > shape[-1]):
        raise ConfigurationError(
            f"mint.multinomial: num_samples {num_samples} must be in [1, {shape[-1]}] without replacement"
        )
    weights = F.cast(input, DType.float32)
    if not replacement:
        gumbel = -F.log(-F.log(1.0 - _uniform(shape)))  # 1 - u lies in (0, 1]
        return F.cast(C.topk(F.log(weights) + gumbel, num_samples, -1)[1], DType.int64)
    running = C.cumsum(weights, -1)
    total = F.gather(running, C._constant(np.array([shape[-1] - 1], np.int64)), len(shape) - 1)
    targets = _uniform((*shape[:-1], num_samples)) * total
    below = F.less_equal(F.expand_dims(running, -2), F.expand_dims(targets, -1))
    index = F.sum(F.cast(below, DType.int64), -1)
    return F.minimum(index, shape[-1] - 1)
