"""MindSpore functional ops that tessel composes from its registered ops (`ops.masked_fill`, `ops.cumsum`,
`ops.logsumexp`, ...): each lowers, differentiates and shards as the ops it is made of, in graphs and eagerly.

Index patterns (a flip, a roll, a lower triangle) are constants made from the static shape; creation ops (`arange`,
`eye`, `linspace`) give constant tensors. The formulas are the numerically careful ones (log1p and expm1 by
Kahan's correction, logsumexp from the maximum), checked against numpy in float64.
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from tessel.common.dtype import DType, to_dtype
from tessel.common.tensor import Tensor
from tessel.common.tracing import apply_op
from tessel.core.errors import ConfigurationError
from tessel.ops import functional as F
from tessel.ops.nn_functional import check_reduction, reduce_loss, tanh

__all__ = [
    "addcdiv",
    "addcmul",
    "arange",
    "argsort",
    "binary_cross_entropy",
    "cosine_similarity",
    "cumsum",
    "elu",
    "expm1",
    "eye",
    "flip",
    "hardsigmoid",
    "hardswish",
    "huber_loss",
    "index_select",
    "inner",
    "isclose",
    "isinf",
    "kl_div",
    "lerp",
    "linspace",
    "log1p",
    "logical_xor",
    "logsumexp",
    "masked_fill",
    "max",
    "meshgrid",
    "min",
    "mish",
    "mm",
    "narrow",
    "norm",
    "numel",
    "outer",
    "roll",
    "smooth_l1_loss",
    "softplus",
    "sort",
    "std",
    "std_mean",
    "tile",
    "topk",
    "trace",
    "tril",
    "triu",
    "unbind",
    "var",
    "var_mean",
]


def _shape(x: Any, who: str) -> tuple[int, ...]:
    shape = tuple(x.shape) if isinstance(x, Tensor) else np.shape(x)
    if any(not isinstance(d, (int, np.integer)) for d in shape):
        raise ConfigurationError(f"ops.{who}: needs a tensor of known shape, got {shape}")
    return tuple(int(d) for d in shape)


def _dim(axis: int, ndim: int, who: str) -> int:
    if not -ndim <= axis < builtins.max(ndim, 1):
        raise ConfigurationError(f"ops.{who}: dim {axis} is out of range for a {ndim}-D tensor")
    return axis % builtins.max(ndim, 1)


def _constant(array: np.ndarray) -> Tensor:
    return Tensor._wrap(np.asarray(array, order="C"))  # (np.ascontiguousarray makes a 0-d array 1-d)


# --- creation --------------------------------------------------------------------------------------------------


def arange(start: Any = 0, end: Any = None, step: Any = 1, *, dtype: Any = None) -> Tensor:
    """[start, end) by step (one argument: [0, start)); int64 when start, end and step are all ints, float32
    otherwise, unless `dtype` says."""
    if end is None:
        start, end = 0, start
    values = [v.asnumpy().item() if isinstance(v, Tensor) else v for v in (start, end, step)]
    if builtins.any(isinstance(v, bool) or not isinstance(v, (int, float, np.number)) for v in values):
        raise ConfigurationError(f"ops.arange: start, end and step must be numbers, got {values}")
    if values[2] == 0:
        raise ConfigurationError("ops.arange: step must not be 0")
    ints = builtins.all(isinstance(v, (int, np.integer)) for v in values)
    out = to_dtype(dtype) if dtype is not None else (DType.int64 if ints else DType.float32)
    return _constant(np.arange(*values, dtype=np.float64 if not ints else np.int64).astype(out.numpy))


def linspace(start: Any, end: Any, steps: int) -> Tensor:
    """`steps` evenly spaced float32 values from start to end, both included."""
    start, end = (v.asnumpy().item() if isinstance(v, Tensor) else v for v in (start, end))
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ConfigurationError(f"ops.linspace: steps must be an int >= 1, got {steps!r}")
    return _constant(np.linspace(float(start), float(end), int(steps)).astype(np.float32))


def eye(n: int, m: int | None = None, dtype: Any = None) -> Tensor:
    """An n x m matrix with ones on the diagonal (float32 unless `dtype` says)."""
    out = to_dtype(dtype) if dtype is not None else DType.float32
    return _constant(np.eye(int(n), int(n if m is None else m), dtype=out.numpy))


def meshgrid(*inputs: Any, indexing: str = "xy") -> tuple[Tensor, ...]:
    """Coordinate grids of 1-D tensors: 'xy' (Cartesian, the first two dims swapped) or 'ij' (matrix) indexing."""
    if len(inputs) == 1 and isinstance(inputs[0], (tuple, list)):
        inputs = tuple(inputs[0])
    if indexing not in ("xy", "ij"):
        raise ConfigurationError(f"ops.meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    sizes = [_shape(t, "meshgrid") for t in inputs]
    if builtins.any(len(s) != 1 for s in sizes):
        raise ConfigurationError(f"ops.meshgrid: every input must be 1-D, got shapes {sizes}")
    lengths = [s[0] for s in sizes]
    if indexing == "xy" and len(lengths) >= 2:
        lengths[0], lengths[1] = lengths[1], lengths[0]
    grids = []
    for i, t in enumerate(inputs):
        axis = (1 - i if i < 2 else i) if indexing == "xy" and len(inputs) >= 2 else i
        view = [1] * len(inputs)
        view[axis] = -1
        grids.append(F.broadcast_to(F.reshape(t, tuple(view)), tuple(lengths)))
    return tuple(grids)


# --- element-wise --------------------------------------------------------------------------------------------


def log1p(input: Any) -> Tensor:
    """ln(1 + x), exact for small x too (Kahan: log(u) * (x / (u - 1)) with u = 1 + x; the ratio is near 1, so a
    float16 65000 does not overflow), and inf at inf."""
    u = input + 1.0
    d = u - 1.0
    infinite = isinf(u)
    safe = F.select(F.logical_or(F.equal(d, 0.0), infinite), F.ones_like(d), d)
    # tiny x (u rounds to 1): x itself; x = inf: ln(u) = inf
    return F.select(F.equal(d, 0.0), input, F.select(infinite, F.log(u), F.log(u) * (input / safe)))


def isinf(input: Any) -> Tensor:
    """Whether each element is +inf or -inf (bool)."""
    return F.logical_and(F.logical_not(F.isfinite(input)), F.equal(input, input))


def expm1(input: Any) -> Tensor:
    """e^x - 1, exact for small x too (Kahan: (u - 1) * x / log(u) with u = e^x)."""
    u = F.exp(input)
    d = u - 1.0
    lu = F.log(u)
    small = F.equal(d, 0.0)
    safe = F.select(F.equal(lu, 0.0), F.ones_like(lu), lu)
    exact = F.select(F.equal(d, -1.0), d, d * input / safe)
    return F.select(small, input, F.select(F.isfinite(u), exact, u))


def softplus(input: Any, beta: float = 1, threshold: float = 20) -> Tensor:
    """log(1 + e^(beta x)) / beta, and x where beta * x > threshold."""
    scaled = input * float(beta)
    # max(z, 0) + log1p(e^-|z|): no overflow for large z, no cancellation for small
    soft = (F.maximum(scaled, 0.0) + log1p(F.exp(-F.abs(scaled)))) / float(beta)
    return F.select(F.greater(scaled, float(threshold)), input, soft)


def elu(input_x: Any, alpha: float = 1.0) -> Tensor:
    """x where x > 0, alpha * (e^x - 1) elsewhere."""
    positive = F.greater(input_x, 0.0)
    # the negative piece reads x itself (not min(x, 0), whose tie would halve the slope alpha at 0)
    return F.select(positive, input_x, expm1(F.select(positive, F.zeros_like(input_x), input_x)) * float(alpha))


def mish(x: Any) -> Tensor:
    """x * tanh(softplus(x))."""
    return x * tanh(softplus(x))


def _keep_int(function):
    """An integer input computed in float32 and truncated back, as MindSpore's kernels give integers."""

    def on(input: Any) -> Tensor:
        if F.dtype_of(input).is_float:
            return function(input)
        return F.cast(function(F.cast(input, DType.float32)), F.dtype_of(input))

    on.__name__, on.__doc__ = function.__name__, function.__doc__
    return on


@_keep_int
def hardsigmoid(input: Any) -> Tensor:
    """relu6(x + 3) / 6, whose slope is 1/6 inside (-3, 3) and 0 at -3 and 3 too (MindSpore's HSigmoidGrad)."""
    inside = F.logical_and(F.greater(input, -3.0), F.less(input, 3.0))
    edge = F.select(F.greater_equal(input, 3.0), F.ones_like(input), F.zeros_like(input))
    return F.select(inside, (input + 3.0) / 6.0, edge)


@_keep_int
def hardswish(x: Any) -> Tensor:
    """x * relu6(x + 3) / 6, whose slope is (2x + 3) / 6 on [-3, 3], ends included (MindSpore's HSwishGrad)."""
    inside = F.logical_and(F.greater_equal(x, -3.0), F.less_equal(x, 3.0))
    return F.select(inside, x * (x + 3.0) / 6.0, F.select(F.greater(x, 3.0), x, F.zeros_like(x)))


def lerp(input: Any, end: Any, weight: Any) -> Tensor:
    """input + weight * (end - input)."""
    return input + weight * (end - input)


def addcmul(input: Any, tensor1: Any, tensor2: Any, value: Any = 1) -> Tensor:
    """input + value * tensor1 * tensor2."""
    return input + tensor1 * tensor2 * value


def addcdiv(input: Any, tensor1: Any, tensor2: Any, value: Any = 1) -> Tensor:
    """input + value * tensor1 / tensor2."""
    return input + tensor1 / tensor2 * value


def isclose(input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """|input - other| <= atol + rtol * |other| element-wise (bool); equal infinities are close; NaNs only with
    equal_nan."""
    close = F.less_equal(F.abs(input - other), atol + rtol * F.abs(other))
    close = F.logical_or(close, F.equal(input, other))
    if equal_nan:
        close = F.logical_or(close, F.logical_and(F.isnan(input), F.isnan(other)))
    return close


def logical_xor(input: Any, other: Any) -> Tensor:
    """input xor other, element-wise (bool)."""
    a = input if _is_bool(input) else F.not_equal(input, 0)
    b = other if _is_bool(other) else F.not_equal(other, 0)
    return F.logical_and(F.logical_or(a, b), F.logical_not(F.logical_and(a, b)))


def _is_bool(x: Any) -> bool:
    return F.dtype_of(x) == DType.bool_


def masked_fill(input_x: Any, mask: Any, value: Any) -> Tensor:
    """`value` where `mask` is true, input_x elsewhere (mask broadcasts to input_x)."""
    if isinstance(value, Tensor):
        return F.select(mask, F.cast(value, input_x.dtype), input_x)
    return F.select(mask, _constant(np.asarray(value, input_x.dtype.numpy)), input_x)


# --- reductions ------------------------------------------------------------------------------------------------


def logsumexp(input: Any, dim: Any, keepdim: bool = False) -> Tensor:
    """log(sum(e^(x - max))) + max over `dim`, MindSpore's documented formula, which neither overflows nor
    underflows. As there, a slice whose maximum is infinite gives NaN (MindSpore 2.7.0: [-inf, -inf] and [inf, 1]
    are both nan)."""
    top = F.stop_gradient(F.amax(input, dim, True))
    out = F.log(F.sum(F.exp(input - top), dim, True)) + top
    return out if keepdim else F.squeeze(out, dim)


def _ddof(ddof: Any, who: str) -> int:
    if isinstance(ddof, bool):  # MindSpore: True is the unbiased estimate
        return int(ddof)
    if not isinstance(ddof, (int, np.integer)):
        raise ConfigurationError(f"ops.{who}: ddof must be an int or a bool, got {ddof!r}")
    return int(ddof)


def _count(shape: tuple[int, ...], axis: Any) -> int:
    if axis is None or axis == () or axis == []:
        return int(np.prod(shape))
    axes = _dims(axis)
    return int(np.prod([shape[_dim(a, len(shape), "var")] for a in axes]))


def var_mean(input: Any, axis: Any = None, ddof: Any = 0, keepdims: bool = False) -> tuple[Tensor, Tensor]:
    """(variance, mean) over `axis` (every dim when None); the variance divides by N - ddof."""
    shape = _shape(input, "var_mean")
    n = _count(shape, axis) - _ddof(ddof, "var_mean")
    mean = F.mean(input, axis, True)
    var = F.sum(F.square(input - mean), axis, keepdims) / float(n)
    return var, (mean if keepdims else F.mean(input, axis, False))


def var(input: Any, axis: Any = None, ddof: Any = 0, keepdims: bool = False) -> Tensor:
    """The variance over `axis` (every dim when None), dividing by N - ddof (ddof True: 1)."""
    return var_mean(input, axis, ddof, keepdims)[0]


def std_mean(input: Any, axis: Any = None, ddof: Any = 0, keepdims: bool = False) -> tuple[Tensor, Tensor]:
    """(standard deviation, mean) over `axis`."""
    variance, mean = var_mean(input, axis, ddof, keepdims)
    return F.sqrt(variance), mean


def std(input: Any, axis: Any = None, ddof: Any = 0, keepdims: bool = False) -> Tensor:
    """The standard deviation over `axis` (every dim when None), dividing by N - ddof (ddof True: 1)."""
    return F.sqrt(var(input, axis, ddof, keepdims))


def _vector_norm(x: Any, ord: Any, dim: Any, keepdim: bool) -> Tensor:
    if ord is None or ord == 2:
        return F.sqrt(F.sum(F.square(x), dim, keepdim))
    if ord == float("inf"):
        return F.amax(F.abs(x), dim, keepdim)
    if ord == float("-inf"):
        return F.amin(F.abs(x), dim, keepdim)
    if ord == 0:
        return F.sum(F.cast(F.not_equal(x, 0), x.dtype), dim, keepdim)
    if ord == 1:
        return F.sum(F.abs(x), dim, keepdim)
    p = float(ord)
    return F.pow(F.sum(F.pow(F.abs(x), p), dim, keepdim), 1.0 / p)


def norm(A: Any, ord: Any = None, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """Vector norms (dim an int, or None with ord None: all elements) and matrix norms (dim two ints, or None on a
    2-D input with ord given): ord None/2/inf/-inf/0/p for vectors; 'fro', 1, -1, inf, -inf for matrices ('nuc',
    2 and -2 need singular values: not supported yet). The square-root norms (ord None, 2, 'fro') of an integer
    input are float32, as MindSpore 2.7.0's (norm of int32 [0, 1, 2, 3] is float32 3.7416575)."""
    x = A if dtype is None else F.cast(A, dtype)
    if F.dtype_of(x).is_int and (ord is None or ord == 2 or ord == "fro"):
        x = F.cast(x, DType.float32)
    shape = _shape(x, "norm")
    if dim is None and ord is None:
        return _vector_norm(x, None, None, keepdim)
    if dim is None:
        dim = (0, 1) if len(shape) == 2 else 0 if len(shape) == 1 else None
        if dim is None:
            raise ConfigurationError(
                f"ops.norm: with ord {ord!r} and no dim, the input must be 1-D or 2-D, got {shape}"
            )
    dims = _dims(dim)
    if len(dims) == 1:
        if isinstance(ord, str):
            raise ConfigurationError(f"ops.norm: ord {ord!r} is a matrix norm; give dim two dims")
        return _vector_norm(x, ord, dims[0], keepdim)
    if len(dims) != 2:
        raise ConfigurationError(f"ops.norm: dim must be an int or two ints, got {dim!r}")
    rows, cols = (_dim(d, len(shape), "norm") for d in dims)
    if ord is None or ord == "fro":
        return F.sqrt(F.sum(F.square(x), (rows, cols), keepdim))
    if ord in (1, -1, float("inf"), float("-inf")):
        summed, kept = (rows, cols) if ord in (1, -1) else (cols, rows)
        sums = F.sum(F.abs(x), summed, True)
        out = (F.amax if ord in (1, float("inf")) else F.amin)(sums, kept, True)
        if ord in (float("inf"), float("-inf")) and F.dtype_of(x).is_int:
            out = F.cast(out, F.dtype_of(x))  # MindSpore 2.7.0: int32 for inf and -inf, int64 for 1 and -1
        return out if keepdim else F.squeeze(out, (rows, cols))
    from tessel.common.support import not_supported_yet

    raise not_supported_yet(f"mindspore.ops.norm(ord={ord!r}) of a matrix", "it needs singular values")


def cosine_similarity(x1: Any, x2: Any, dim: int = 1, eps: float = 1e-08) -> Tensor:
    """sum(x1 * x2) / max(|x1| * |x2|, eps) along `dim`."""
    dot = F.sum(x1 * x2, dim)
    lengths = F.sqrt(F.sum(F.square(x1), dim)) * F.sqrt(F.sum(F.square(x2), dim))
    return dot / F.maximum(lengths, float(eps))


def cumsum(x: Any, axis: int, dtype: Any = None) -> Tensor:
    """Running sums along `axis` (a product with a triangle of ones: exact for integers below 2**53)."""
    source = x if dtype is None else F.cast(x, dtype)
    shape = _shape(source, "cumsum")
    axis = _dim(int(axis), len(shape), "cumsum")
    n = shape[axis] if shape else 1
    kind = source.dtype
    wide = F.cast(source, DType.float64) if kind.is_int or kind == DType.bool_ else source
    moved = F.transpose(wide, [*[d for d in range(len(shape)) if d != axis], axis]) if shape else F.reshape(wide, (1,))
    triangle = _constant(np.triu(np.ones((n, n), wide.dtype.numpy)))
    summed = F.matmul(moved, triangle)
    back = list(range(len(shape) - 1))
    back.insert(axis, len(shape) - 1)
    out = F.transpose(summed, back) if shape else F.reshape(summed, ())
    if kind.is_int or kind == DType.bool_:
        out = F.cast(F.round(out), DType.int64 if kind == DType.bool_ else kind)
    return out


def trace(input: Any) -> Tensor:
    """The sum of the main diagonal of a 2-D tensor, of the input's dtype (MindSpore 2.7.0: an int8 or int32 trace
    stays int8 or int32, where a plain sum would widen it to int64)."""
    shape = _shape(input, "trace")
    if len(shape) != 2:
        raise ConfigurationError(f"ops.trace: input must be 2-D, got shape {shape}")
    total = F.sum(input * _constant(np.eye(*shape, dtype=input.dtype.numpy)))
    return F.cast(total, input.dtype) if input.dtype.is_int else total


def numel(input: Any) -> int:
    """The number of elements."""
    return int(np.prod(_shape(input, "numel")))


# --- shapes and indices ----------------------------------------------------------------------------------------


def _triangle(input: Any, diagonal: int, lower: bool, who: str) -> Tensor:
    shape = _shape(input, who)
    if len(shape) < 2:
        raise ConfigurationError(f"ops.{who}: input must be at least 2-D, got shape {shape}")
    rows, cols = shape[-2:]
    keep = (np.tril if lower else np.triu)(np.ones((rows, cols), bool), int(diagonal))
    return F.select(_constant(keep), input, F.zeros_like(input))


def tril(input: Any, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (on and below the `diagonal`-th diagonal); zeros elsewhere."""
    return _triangle(input, diagonal, True, "tril")


def triu(input: Any, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (on and above the `diagonal`-th diagonal); zeros elsewhere."""
    return _triangle(input, diagonal, False, "triu")


def _dims(dims: Any) -> list[int]:
    return [int(dims)] if isinstance(dims, (int, np.integer)) else [int(d) for d in dims]


def flip(input: Any, dims: Any) -> Tensor:
    """input with the order of elements reversed along each of `dims`."""
    shape = _shape(input, "flip")
    out = input
    for d in _dims(dims):
        axis = _dim(d, len(shape), "flip")
        out = F.gather(out, _constant(np.arange(shape[axis] - 1, -1, -1, dtype=np.int64)), axis)
    return out


def roll(input: Any, shifts: Any, dims: Any = None) -> Tensor:
    """Elements shifted along `dims` by `shifts` (wrapping around); with dims None the flattened tensor, reshaped
    back."""
    shape = _shape(input, "roll")
    if dims is None:
        total = int(np.prod(shape))
        flat = F.reshape(input, (total,))
        step = _dims(shifts)
        if len(step) != 1:
            raise ConfigurationError("ops.roll: with dims None, shifts must be one int")
        index = (np.arange(total) - step[0]) % builtins.max(total, 1)
        return F.reshape(F.gather(flat, _constant(index.astype(np.int64)), 0), shape)
    steps, axes = _dims(shifts), _dims(dims)
    if len(steps) != len(axes):
        raise ConfigurationError(f"ops.roll: shifts {steps} and dims {axes} must have the same length")
    out = input
    for step, d in zip(steps, axes):
        axis = _dim(d, len(shape), "roll")
        index = (np.arange(shape[axis]) - step) % builtins.max(shape[axis], 1)
        out = F.gather(out, _constant(index.astype(np.int64)), axis)
    return out


def tile(input: Any, dims: Any) -> Tensor:
    """input repeated dims[i] times along dim i; a shorter dims counts from the last dim, a longer one adds leading
    dims of size 1 to input."""
    shape = _shape(input, "tile")
    reps = _dims(dims)
    if builtins.any(r < 0 for r in reps):
        raise ConfigurationError(f"ops.tile: dims must be >= 0, got {reps}")
    ndim = builtins.max(len(shape), len(reps))
    shape = (1,) * (ndim - len(shape)) + shape
    reps = [1] * (ndim - len(reps)) + reps
    x = F.reshape(input, tuple(v for d in shape for v in (1, d)))
    x = F.broadcast_to(x, tuple(v for r, d in zip(reps, shape) for v in (r, d)))
    return F.reshape(x, tuple(r * d for r, d in zip(reps, shape)))


def unbind(input: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices of input along `dim`, that dim removed."""
    shape = _shape(input, "unbind")
    axis = _dim(int(dim), len(shape), "unbind")
    return tuple(F.squeeze(part, axis) for part in F.split(input, 1, axis))


def narrow(input: Any, axis: int, start: int, length: int) -> Tensor:
    """`length` elements of input along `axis` from `start`."""
    shape = _shape(input, "narrow")
    axis = _dim(int(axis), len(shape), "narrow")
    if not 0 <= start <= shape[axis] or length < 0 or start + length > shape[axis]:
        raise ConfigurationError(
            f"ops.narrow: start {start} and length {length} must lie within dim {axis} of size {shape[axis]}"
        )
    return F.gather(input, _constant(np.arange(start, start + length, dtype=np.int64)), axis)


def index_select(input: Any, axis: int, index: Any) -> Tensor:
    """The entries of input along `axis` at the 1-D int `index`."""
    shape = _shape(index, "index_select")
    if len(shape) != 1:
        raise ConfigurationError(f"ops.index_select: index must be 1-D, got shape {shape}")
    return F.gather(input, index, int(axis))


# --- products --------------------------------------------------------------------------------------------------


def outer(input: Any, vec2: Any) -> Tensor:
    """The outer product of two 1-D tensors."""
    if len(_shape(input, "outer")) != 1 or len(_shape(vec2, "outer")) != 1:
        raise ConfigurationError("ops.outer: both inputs must be 1-D")
    return F.reshape(input, (-1, 1)) * F.reshape(vec2, (1, -1))


def inner(input: Any, other: Any) -> Tensor:
    """Sums of products over the last dims (a number times a tensor when either is 0-D)."""
    a, b = _shape(input, "inner"), _shape(other, "inner")
    if not a or not b:
        return input * other
    if a[-1] != b[-1]:
        raise ConfigurationError(f"ops.inner: the last dims differ: {a} and {b}")
    lead = F.reshape(input, (-1, a[-1]))
    out = F.matmul(lead, F.transpose(F.reshape(other, (-1, b[-1])), [1, 0]))
    return F.reshape(out, a[:-1] + b[:-1])


def mm(input: Any, mat2: Any) -> Tensor:
    """The matrix product of two 2-D tensors."""
    if len(_shape(input, "mm")) != 2 or len(_shape(mat2, "mm")) != 2:
        raise ConfigurationError("ops.mm: both inputs must be 2-D")
    return F.matmul(input, mat2)


# --- losses (MindSpore's formulas; their nn cells are in tessel.nn.loss) ----------------------------------------


def positive_number(value: Any, who: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigurationError(f"{who}: {name} must be a number > 0, got {value!r}")
    return float(value)


def _same_shapes(who: str, **tensors: Any) -> None:
    (a, x), (b, y) = tensors.items()
    if _shape(x, who) != _shape(y, who):
        raise ConfigurationError(
            f"{who}: {a} {_shape(x, who)} and {b} {_shape(y, who)} must have the same shape (MindSpore does not "
            "broadcast them); reshape one to the other's shape"
        )


def smooth_l1_loss(input: Any, target: Any, beta: float = 1.0, reduction: str = "none") -> Tensor:
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, for d = input - target (same shapes)."""
    who = "smooth_l1_loss"
    beta = positive_number(beta, who, "beta")  # MindSpore's CPU and GPU kernels need beta > 0
    check_reduction(reduction)
    _same_shapes(who, input=input, target=target)
    d = F.abs(input - F.cast(target, input.dtype))
    return reduce_loss(F.select(F.less(d, beta), d * d * (0.5 / beta), d - 0.5 * beta), reduction)


def huber_loss(input: Any, target: Any, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), for d = input - target (broadcast)."""
    delta = positive_number(delta, "huber_loss", "delta")
    check_reduction(reduction)
    d = F.abs(input - target)
    return reduce_loss(F.select(F.less(d, delta), d * d * 0.5, (d - 0.5 * delta) * delta), reduction)


_BCE_EPSILON = 1e-12  # MindSpore's BinaryCrossEntropy kernel adds it to the logarithms' arguments


def binary_cross_entropy(logits: Any, labels: Any, weight: Any = None, reduction: str = "mean") -> Tensor:
    """-weight (y log(x + 1e-12) + (1 - y) log(1 - x + 1e-12)) for probabilities x (`logits`) and targets y, with
    MindSpore's gradient (x - y) / max(x (1 - x), 1e-12) and none for the targets, as its kernel and bprop (measured
    on MindSpore 2.7.0 at x = [1, 0, 1e-13, 0], y = [0, 1, 1, 0]: losses [27.631, 27.631, 27.536, 0], gradients
    [1e12, -1e12, -1e12, 0]: a certain wrong answer costs 27.63, not infinity, and keeps its pull)."""
    who = "binary_cross_entropy"
    check_reduction(reduction)
    _same_shapes(who, logits=logits, labels=labels)
    x, y = logits, F.stop_gradient(F.cast(labels, logits.dtype))
    value = -(y * F.log(x + _BCE_EPSILON) + (1.0 - y) * F.log(1.0 - x + _BCE_EPSILON))
    slope = (x - y) / F.maximum(x * (1.0 - x), _BCE_EPSILON)
    # the value, differentiated as `slope` (its analytic derivative but where x(1 - x) is below 1e-12)
    per = F.stop_gradient(value) + (x - F.stop_gradient(x)) * F.stop_gradient(slope)
    if weight is not None:
        _same_shapes(who, logits=logits, weight=weight)
        per = per * F.cast(weight, logits.dtype)
    return reduce_loss(per, reduction)


def kl_div(logits: Any, labels: Any, reduction: str = "mean") -> Tensor:
    """labels (log labels - logits) for log-probabilities `logits` (0 where labels are 0); reduction 'mean' over
    every element, 'batchmean' the sum over the first dimension's length (the divergence proper), 'sum', 'none'."""
    who = "kl_div"
    if reduction not in ("none", "mean", "batchmean", "sum"):
        raise ConfigurationError(f"{who}: reduction must be 'none', 'mean', 'batchmean' or 'sum', got {reduction!r}")
    _same_shapes(who, logits=logits, labels=labels)
    y = F.cast(labels, logits.dtype)
    positive = F.greater(y, 0.0)
    per = F.select(positive, y * (F.log(F.select(positive, y, F.ones_like(y))) - logits), F.zeros_like(y))
    if reduction != "batchmean":
        return reduce_loss(per, reduction)
    if not _shape(logits, who):
        raise ConfigurationError(f"{who}: reduction='batchmean' needs logits with a batch dimension, got a scalar")
    return F.sum(per) / float(_shape(logits, who)[0])


# --- ordering (the TopK op gives the indices; the values are the input gathered there, so they differentiate) -----


def _ordered(input: Any, k: int | None, axis: int, largest: bool) -> tuple[Tensor, Tensor]:
    index = apply_op("TopK", input, k=k, axis=int(axis), largest=bool(largest))
    return F.gather_elements(input, axis, index), index


def topk(input: Any, k: int, dim: Any = None, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]:
    """(values, int32 indices) of the k largest (largest=False: smallest) elements along `dim` (the last when None),
    in order; equal elements keep their order (MindSpore's ops.topk; sorted=False may return any order, and this
    returns them sorted)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ConfigurationError(f"ops.topk: k must be an int, got {k!r}")
    if not isinstance(largest, bool):
        raise ConfigurationError(f"ops.topk: largest must be a bool, got {largest!r}")
    values, index = _ordered(input, int(k), -1 if dim is None else dim, largest)
    return values, F.cast(index, DType.int32)


def sort(input_x: Any, axis: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """(sorted values, int32 indices into the input) along `axis`; equal elements keep their order (MindSpore's
    ops.sort)."""
    values, index = _ordered(input_x, None, axis, descending)
    return values, F.cast(index, DType.int32)


def argsort(input: Any, axis: int = -1, descending: bool = False) -> Tensor:
    """The int32 indices that sort `input` along `axis` (MindSpore's ops.argsort)."""
    return sort(input, axis, descending)[1]


def _extremum(who: str, input: Any, axis: Any, keepdims: bool, initial: Any, where: Any) -> tuple[Tensor, Tensor]:
    if initial is not None or where is not None:
        from tessel.common.support import not_supported_yet

        raise not_supported_yet(f"ops.{who}(initial=..., where=...)", "reduce a masked_fill of the input instead")
    reduce, arg = (F.amax, F.argmax) if who == "max" else (F.amin, F.argmin)
    if not _shape(input, who) or axis is None:
        # MindSpore's ops.max / ops.min: a 0-d input or axis=None give index 0, not the flat position
        return reduce(input), _constant(np.array(0, np.int64))
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ConfigurationError(f"ops.{who}: axis must be an int or None, got {axis!r}")
    index = F.cast(arg(input, int(axis), True), DType.int64)
    # the value is read at its index, so the gradient goes to that one element (MindSpore's ArgMaxWithValue),
    # not shared among equal maxima as amax's is
    values = F.gather_elements(input, int(axis), index)
    if not keepdims:
        values, index = F.squeeze(values, int(axis)), F.squeeze(index, int(axis))
    return values, index


def max(input: Any, axis: Any = None, keepdims: bool = False, *, initial: Any = None, where: Any = None):
    """(maximum along `axis`, its int64 index, the first among equals) as MindSpore's ops.max."""
    return _extremum("max", input, axis, keepdims, initial, where)


def min(input: Any, axis: Any = None, keepdims: bool = False, *, initial: Any = None, where: Any = None):
    """(minimum along `axis`, its int64 index, the first among equals) as MindSpore's ops.min."""
    return _extremum("min", input, axis, keepdims, initial, where)
