"""mint's element-wise functions, reductions and orderings, composed from `tessel.ops`.

Each keeps mint's PyTorch-style arguments (`input`, `dim`, `keepdim`, keyword-only `dtype` and `correction`) and
the dtypes MindSpore 2.7.0 gives (integer and bool inputs of log2, exp2 and logsumexp become float32; prod widens
them to int64; float_power computes in float64; sort, argsort and topk give int64 indices). Many of these functions are
Ascend-only kernels in MindSpore 2.7.0; their results follow MindSpore's documented formulas, checked against numpy.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from tessel.common.dtype import DType
from tessel.common.support import not_supported_yet
from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError
from tessel.ops import composed as C
from tessel.ops import functional as F


def _integer(x: Any) -> bool:
    dtype = F.dtype_of(x)
    return dtype.is_int or dtype == DType.bool_


def _float(input: Any) -> Any:
    """An int or bool input as float32, as mint's log2, exp2, logsumexp, ... promote it."""
    return F.cast(input, DType.float32) if _integer(input) else input


# --- element-wise ---------------------------------------------------------------------------------------------------


def log1p(input: Any) -> Tensor:
    """ln(1 + input), exact for small inputs too."""
    return C.log1p(_float(input))


def expm1(input: Any) -> Tensor:
    """e^input - 1, exact for small inputs too."""
    return C.expm1(_float(input))


def log2(input: Any) -> Tensor:
    """log base 2, element-wise; int and bool give float32."""
    return F.log(_float(input)) * (1.0 / math.log(2.0))


def log10(input: Any) -> Tensor:
    """log base 10, element-wise; int and bool give float32."""
    return F.log(_float(input)) * (1.0 / math.log(10.0))


def exp2(input: Any) -> Tensor:
    """2 ** input, element-wise; int and bool give float32."""
    return F.pow(2.0, _float(input))


def tan(input: Any) -> Tensor:
    """sin / cos, element-wise (MindSpore 2.7.0's CPU Tan refuses integer inputs; they give float32 here)."""
    x = _float(input)
    return F.sin(x) / F.cos(x)


def sinh(input: Any) -> Tensor:
    """(e^x - e^-x) / 2 from expm1, so small x keep their digits."""
    x = _float(input)
    return (C.expm1(x) - C.expm1(-x)) * 0.5


def cosh(input: Any) -> Tensor:
    """(e^x + e^-x) / 2."""
    x = _float(input)
    return (F.exp(x) + F.exp(-x)) * 0.5


def trunc(input: Any) -> Tensor:
    """input rounded toward zero; integers come back as they are."""
    if _integer(input):
        return input
    return F.select(F.less(input, 0.0), F.ceil(input), F.floor(input))


fix = trunc


def frac(input: Any) -> Tensor:
    """input - trunc(input), the fractional part with input's sign."""
    return input - trunc(input)


def isinf(input: Any) -> Tensor:
    """Whether each element is +inf or -inf (bool); integers never are."""
    return F.zeros_like(input, dtype=DType.bool_) if _integer(input) else C.isinf(input)


def isneginf(input: Any) -> Tensor:
    """Whether each element is -inf (bool)."""
    return F.logical_and(isinf(input), F.less(input, 0))


def isclose(input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """|input - other| <= atol + rtol * |other| element-wise (bool)."""
    return C.isclose(input, other, rtol, atol, equal_nan)


def allclose(input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """Whether every element is close, a Python bool (MindSpore 2.7.0's mint.allclose ends in .item()), so it runs
    eagerly only."""
    return builtins.bool(F.all(C.isclose(input, other, rtol, atol, equal_nan)).asnumpy())


def equal(input: Any, other: Any) -> bool:
    """Whether input and other have the same shape and elements, a Python bool (MindSpore 2.7.0's mint.equal ends in
    .item()), so it runs eagerly only."""
    if tuple(input.shape) != tuple(other.shape):
        return False
    return builtins.bool(F.all(F.equal(input, other)).asnumpy())


def logical_xor(input: Any, other: Any) -> Tensor:
    """input xor other, element-wise (bool); numbers are true where non-zero."""
    return C.logical_xor(input, other)


def lerp(input: Any, end: Any, weight: Any) -> Tensor:
    """input + weight * (end - input)."""
    return C.lerp(input, end, weight)


def addcmul(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
    """input + value * tensor1 * tensor2."""
    return C.addcmul(input, tensor1, tensor2, value)


def addcdiv(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
    """input + value * tensor1 / tensor2."""
    return C.addcdiv(input, tensor1, tensor2, value)


def xlogy(input: Any, other: Any) -> Tensor:
    """input * ln(other), 0 where input is 0 (even where other is 0 too)."""
    x, y = _float(input), _float(other)
    zero = F.equal(x, 0.0)
    safe = F.select(F.logical_and(zero, F.logical_not(F.isnan(y))), F.ones_like(y), y)
    return F.select(F.logical_and(zero, F.logical_not(F.isnan(y))), F.zeros_like(x * safe), x * F.log(safe))


def logaddexp(input: Any, other: Any) -> Tensor:
    """ln(e^input + e^other), from the larger operand so that neither overflows."""
    x, y = _float(input), _float(other)
    top = F.maximum(x, y)
    return top + C.log1p(F.exp(-F.abs(x - y)))


def logaddexp2(input: Any, other: Any) -> Tensor:
    """log2(2^input + 2^other), from the larger operand."""
    x, y = _float(input), _float(other)
    top = F.maximum(x, y)
    return top + C.log1p(F.pow(2.0, -F.abs(x - y))) * (1.0 / math.log(2.0))


def sinc(input: Any) -> Tensor:
    """sin(pi x) / (pi x), 1 at x = 0."""
    x = _float(input)
    zero = F.equal(x, 0.0)
    scaled = F.select(zero, F.ones_like(x), x) * math.pi
    return F.select(zero, F.ones_like(x), F.sin(scaled) / scaled)


def float_power(input: Any, exponent: Any) -> Tensor:
    """input ** exponent computed in float64 (MindSpore 2.7.0: float64 for float32 and int32 inputs alike)."""
    base = F.cast(input, DType.float64) if isinstance(input, Tensor) else float(input)
    power = F.cast(exponent, DType.float64) if isinstance(exponent, Tensor) else float(exponent)
    return F.pow(base, power)


def fmod(input: Any, other: Any) -> Tensor:
    """input - trunc(input / other) * other: the remainder with input's sign (remainder's follows other)."""
    r = F.floor_mod(input, other)
    flipped = F.logical_and(F.not_equal(r, 0), F.not_equal(F.less(r, 0), F.less(input, 0)))
    return F.select(flipped, r - other, r)


def nan_to_num(input: Any, nan: Any = None, posinf: Any = None, neginf: Any = None) -> Tensor:
    """NaN as `nan` (0), +inf as `posinf` and -inf as `neginf` (the dtype's largest and lowest by default)."""
    if _integer(input):
        return input
    finfo = np.finfo(input.dtype.numpy)
    inf = C.isinf(input)
    out = C.masked_fill(input, F.isnan(input), 0.0 if nan is None else float(nan))
    out = C.masked_fill(out, F.logical_and(inf, F.greater(input, 0.0)), finfo.max if posinf is None else posinf)
    return C.masked_fill(out, F.logical_and(inf, F.less(input, 0.0)), finfo.min if neginf is None else neginf)


# --- reductions -----------------------------------------------------------------------------------------------------


def all(input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Whether every element over `dim` (all dims when None) is non-zero (bool)."""
    return F.all(input, dim, keepdim)


def any(input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Whether any element over `dim` (all dims when None) is non-zero (bool)."""
    return F.any(input, dim, keepdim)


def _product(input: Any, dim: int) -> Tensor:
    """The product along `dim` (kept, length 1), multiplied out slice by slice so that zeros and their gradients
    are exact (a product of exp(sum(log)) would not be)."""
    parts = F.split(input, 1, dim) if input.shape[dim] > 1 else (input,)
    out = parts[0]
    for part in parts[1:]:
        out = out * part
    return out


def prod(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """The product over `dim` (every element when None); integer and bool inputs give int64 unless `dtype` says
    (MindSpore 2.7.0: prod of int32 and of bool is int64)."""
    if dtype is None and _integer(input):
        dtype = DType.int64
    x = input if dtype is None else F.cast(input, dtype)
    if dim is None:
        return F.reshape(_product(F.reshape(x, (-1,)), 0), ())
    dim = C._dim(int(dim), F._ndim(x), "mint.prod")
    out = _product(x, dim)
    return out if keepdim else F.squeeze(out, dim)


def cumsum(input: Any, dim: int, dtype: Any = None) -> Tensor:
    """Running sums along `dim`, of input's dtype unless `dtype` says."""
    return C.cumsum(input, dim, dtype)


def cumprod(input: Any, dim: int, dtype: Any = None) -> Tensor:
    """Running products along `dim`, of input's dtype unless `dtype` says (MindSpore 2.7.0: int32 stays int32)."""
    x = input if dtype is None else F.cast(input, dtype)
    dim = C._dim(int(dim), F._ndim(x), "mint.cumprod")
    if x.shape[dim] <= 1:
        return x
    parts = list(F.split(x, 1, dim))
    for k in range(1, len(parts)):
        parts[k] = parts[k - 1] * parts[k]
    return F.concat(parts, dim)


def _moments(input: Any, dim: Any, correction: Any, keepdim: bool) -> tuple[Tensor, Tensor]:
    """(variance dividing by max(0, N - correction), mean) over `dim`."""
    if isinstance(correction, bool) or not isinstance(correction, int):
        raise ConfigurationError(f"mint.var: correction must be an int, got {correction!r}")
    shape = C._shape(input, "mint.var")
    dims = None if dim is None else C._dims(dim)
    n = builtins.max(C._count(shape, dims) - correction, 0)
    mean = F.mean(input, dims, True)
    variance = F.sum(F.square(input - mean), dims, keepdim) / float(n)
    return variance, (mean if keepdim else F.mean(input, dims, False))


def var(input: Any, dim: Any = None, *, correction: int = 1, keepdim: bool = False) -> Tensor:
    """The variance over `dim` (all dims when None), dividing by N - correction (Bessel's, 1, by default)."""
    return _moments(input, dim, correction, keepdim)[0]


def std(input: Any, dim: Any = None, *, correction: int = 1, keepdim: bool = False) -> Tensor:
    """The standard deviation over `dim`, dividing by N - correction."""
    return F.sqrt(_moments(input, dim, correction, keepdim)[0])


def var_mean(input: Any, dim: Any = None, *, correction: int = 1, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """(variance, mean) over `dim`."""
    return _moments(input, dim, correction, keepdim)


def std_mean(input: Any, dim: Any = None, *, correction: int = 1, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """(standard deviation, mean) over `dim`."""
    variance, mean = _moments(input, dim, correction, keepdim)
    return F.sqrt(variance), mean


def logsumexp(input: Any, dim: Any, keepdim: bool = False) -> Tensor:
    """ln(sum(e^input)) over `dim`, from the maximum; int and bool give float32."""
    return C.logsumexp(_float(input), dim, keepdim)


def count_nonzero(input: Any, dim: Any = None) -> Tensor:
    """The number of non-zero elements over `dim` (all dims when None), int64."""
    return F.sum(F.cast(F.not_equal(input, 0), DType.int64), dim)


def nansum(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """The sum over `dim` with NaNs counted as 0; integer and bool inputs sum as int64 unless `dtype` says."""
    if dtype is None and _integer(input):
        dtype = DType.int64
    x = input if dtype is None else F.cast(input, dtype)
    if F.dtype_of(x).is_float:
        x = F.select(F.isnan(x), F.zeros_like(x), x)
    return F.sum(x, dim, keepdim)


def trace(input: Any) -> Tensor:
    """The sum of the main diagonal of a 2-D tensor; integer and bool inputs give int64."""
    return C.trace(F.cast(input, DType.int64) if _integer(input) else input)


# --- ordering -------------------------------------------------------------------------------------------------------


def sort(input: Any, *, dim: int = -1, descending: bool = False, stable: bool = False) -> tuple[Tensor, Tensor]:
    """(sorted values, int64 indices) along `dim`; equal elements keep their order (a stable sort either way)."""
    values, index = C.sort(input, dim, bool(descending))
    return values, F.cast(index, DType.int64)


def argsort(input: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The int64 indices that sort input along `dim` (stably)."""
    return sort(input, dim=dim, descending=descending, stable=stable)[1]


def topk(input: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]:
    """(values, int64 indices) of the k largest (largest=False: smallest) elements along `dim`, in order (sorted=False
    may return any order; these come sorted)."""
    values, index = C.topk(input, k, dim, largest, sorted)
    return values, F.cast(index, DType.int64)


def item(input: Any) -> Any:
    """The value of a one-element tensor as a Python number (eagerly only)."""
    return input.asnumpy().item()


def _sorted_along(input: Any, dim: int) -> tuple[Tensor, Tensor]:
    values, index = C.sort(input, dim, False)
    return values, F.cast(index, DType.int64)


def _pick(values: Tensor, index: Tensor, dim: int, position: int, keepdim: bool) -> tuple[Tensor, Tensor]:
    at = C._constant(np.array([position], np.int64))
    picked, where = F.gather(values, at, dim), F.gather(index, at, dim)
    return (picked, where) if keepdim else (F.squeeze(picked, dim), F.squeeze(where, dim))


def median(input: Any, dim: int | None = None, keepdim: bool = False) -> Any:
    """The lower median of all elements (dim None), or (values, int64 indices) of the lower medians along `dim`."""
    if dim is None:
        flat = F.reshape(input, (-1,))
        values, index = _sorted_along(flat, 0)
        return F.reshape(_pick(values, index, 0, (int(flat.shape[0]) - 1) // 2, True)[0], ())
    dim = C._dim(int(dim), F._ndim(input), "mint.median")
    values, index = _sorted_along(input, dim)
    return _pick(values, index, dim, (int(input.shape[dim]) - 1) // 2, keepdim)


def kthvalue(input: Any, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """(values, int64 indices) of the k-th smallest elements along `dim` (k counts from 1)."""
    dim = C._dim(int(dim), F._ndim(input), "mint.kthvalue")
    if not 1 <= k <= input.shape[dim]:
        raise ConfigurationError(f"mint.kthvalue: k must be in [1, {input.shape[dim]}], got {k}")
    values, index = _sorted_along(input, dim)
    return _pick(values, index, dim, int(k) - 1, keepdim)


def _running(input: Any, dim: int, better) -> tuple[Tensor, Tensor]:
    """(running extremum, int64 index of it) along `dim`; a later equal element takes over the index (torch's
    cummax and cummin); the values are read at the indices, so the gradient goes to those elements."""
    dim = C._dim(int(dim), F._ndim(input), "mint.cummax")
    size = int(input.shape[dim])
    parts = F.split(input, 1, dim) if size > 1 else (input,)
    best, where = parts[0], F.zeros_like(parts[0], dtype=DType.int64)
    indices = [where]
    for k in range(1, size):
        take = F.logical_not(better(best, parts[k]))
        best = F.select(take, parts[k], best)
        where = F.select(take, F.full(tuple(where.shape), k, dtype=DType.int64), where)
        indices.append(where)
    index = F.concat(indices, dim) if size > 1 else where
    return F.gather_elements(input, dim, index), index


def cummax(input: Any, dim: int) -> tuple[Tensor, Tensor]:
    """(running maxima, their int64 indices) along `dim`."""
    return _running(input, dim, F.greater)


def cummin(input: Any, dim: int) -> tuple[Tensor, Tensor]:
    """(running minima, their int64 indices) along `dim`."""
    return _running(input, dim, F.less)


def searchsorted(
    sorted_sequence: Any,
    values: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Any = None,
) -> Tensor:
    """For each value, the index in the sorted last dim of sorted_sequence where it would be inserted: before equal
    elements (right=False, side 'left') or after them; int64 (int32 with out_int32)."""
    if side not in (None, "left", "right") or (side == "left" and right):
        raise ConfigurationError(
            f"mint.searchsorted: side must be None, 'left' or 'right' and agree with right, got {side!r}"
        )
    right = right or side == "right"
    sequence = sorted_sequence if sorter is None else F.gather_elements(sorted_sequence, -1, sorter)
    below = F.less_equal if right else F.less
    if isinstance(values, Tensor):
        counts = below(F.expand_dims(sequence, -2), F.expand_dims(values, -1))
    else:
        counts = below(sequence, values)
    return F.cast(F.sum(F.cast(counts, DType.int64), -1), DType.int32 if out_int32 else DType.int64)


def norm(input: Any, p: Any = "fro", dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """The p-norm of input's elements over `dim` (all dims when None), as a vector: p 'fro' or 2 the square root of
    the sum of squares, inf / -inf the largest / smallest |x|, 0 the count of non-zeros, other p (sum |x|^p)^(1/p).
    Integer inputs give float32. ('nuc' needs singular values: not supported yet.)"""
    x = _float(input if dtype is None else F.cast(input, dtype))
    if p == "nuc":
        raise not_supported_yet("mindspore.mint.norm(p='nuc')", "it needs singular values")
    if isinstance(p, str) and p != "fro":
        raise ConfigurationError(f"mint.norm: p must be a number, 'fro' or 'nuc', got {p!r}")
    dims = None if dim is None else tuple(C._dims(dim))
    return C._vector_norm(x, None if p == "fro" else p, dims, keepdim)


def histc(input: Any, bins: int = 100, min: Any = 0, max: Any = 0) -> Tensor:
    """Counts of input's elements in `bins` equal bins over [min, max] (the data's own range when min equals max,
    both 0 by default), of input's dtype; elements outside are ignored, and max itself falls in the last bin."""
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ConfigurationError(f"mint.histc: bins must be an int >= 1, got {bins!r}")
    if min > max:
        raise ConfigurationError(f"mint.histc: min {min} must not exceed max {max}")
    x = F.cast(F.reshape(input, (-1,)), DType.float32)
    if min == max:
        low, high = F.amin(x), F.amax(x)
        same = F.equal(low, high)  # one value: the bins span [value - 1, value + 1], as torch
        low, high = F.select(same, low - 1.0, low), F.select(same, high + 1.0, high)
    else:
        low, high = float(min), float(max)
    inside = F.logical_and(F.greater_equal(x, low), F.less_equal(x, high))
    position = F.floor((x - low) * float(bins) / (high - low))
    position = F.minimum(position, float(bins - 1))
    edges = C._constant(np.arange(bins, dtype=np.float32))
    hits = F.logical_and(F.expand_dims(inside, 0), F.equal(F.expand_dims(position, 0), F.expand_dims(edges, 1)))
    return F.cast(F.sum(F.cast(hits, DType.float32), 1), F.dtype_of(input))
