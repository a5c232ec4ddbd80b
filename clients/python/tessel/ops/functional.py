"""MindSpore's functional ops (`ops.matmul`, `ops.sum`, `ops.reshape`, …) over SDK Tensors.

Each function maps MindSpore's arguments onto one or a few registered compiler ops through `apply_op`, so it
works alike when tracing (graph mode, autodiff) and eagerly (PYNATIVE_MODE). Python scalars stay weakly typed.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel.common.dtype import DType, to_dtype
from tessel.common.tensor import Tensor
from tessel.common.tracing import apply_op, current
from tessel.compiler.dtypes import promote, scalar_dtype
from tessel.core.errors import ConfigurationError, NotSupportedYetError


def _unary(op: str, doc: str):
    def fn(input: Any) -> Tensor:
        return apply_op(op, input)

    fn.__doc__ = doc
    return fn


def _binary(op: str, doc: str):
    def fn(input: Any, other: Any) -> Tensor:
        return apply_op(op, input, other)

    fn.__doc__ = doc
    return fn


abs = _unary("Abs", "|x|, element-wise.")
neg = _unary("Neg", "-x, element-wise.")
exp = _unary("Exp", "e^x, element-wise.")
log = _unary("Log", "ln x, element-wise.")
rsqrt = _unary("Rsqrt", "1 / sqrt(x), element-wise.")
square = _unary("Square", "x², element-wise.")
sin = _unary("Sin", "sin x, element-wise.")
cos = _unary("Cos", "cos x, element-wise.")
erf = _unary("Erf", "erf x, element-wise.")
floor = _unary("Floor", "floor x, element-wise.")
ceil = _unary("Ceil", "ceil x, element-wise.")
round = _unary("Round", "x rounded half to even, element-wise.")
sign = _unary("Sign", "sign x, element-wise.")
reciprocal = _unary("Reciprocal", "1 / x, element-wise.")


def sqrt(x: Any) -> Tensor:
    """sqrt(x), element-wise."""
    return apply_op("Sqrt", x)


def logical_not(input: Any) -> Tensor:
    """not x, element-wise (bool); a number is true where it is non-zero, as MindSpore."""
    return apply_op("LogicalNot", _as_bool(input))


def stop_gradient(value: Any) -> Any:
    """value with no gradient flowing back through it. A tuple or list, nested too, keeps its structure with each
    Tensor in it stopped, and anything not a Tensor comes back as it is (MindSpore 2.7.0: stop_gradient((x, y)) is
    a tuple of two Tensors, stop_gradient(3.0) is 3.0)."""
    if isinstance(value, (tuple, list)):
        return type(value)(stop_gradient(v) for v in value)
    return apply_op("StopGradient", value) if isinstance(value, Tensor) else value


def zeros_like(input: Any, *, dtype: Any = None) -> Tensor:
    """Zeros of input's shape, of input's dtype unless `dtype` is given."""
    out = apply_op("ZerosLike", input)
    return out if dtype is None else cast(out, dtype)


def ones_like(input: Any, *, dtype: Any = None) -> Tensor:
    """Ones of input's shape, of input's dtype unless `dtype` is given."""
    out = apply_op("OnesLike", input)
    return out if dtype is None else cast(out, dtype)


add = _binary("Add", "x + y with broadcasting.")
sub = _binary("Sub", "x - y with broadcasting.")
mul = _binary("Mul", "x * y with broadcasting.")


def pow(input: Any, exponent: Any) -> Tensor:
    """input ** exponent with broadcasting. Integers raised to integers stay integers (MindSpore's and torch's),
    of the wider of the two, computed in float64 (exact below 2**53) and rounded back."""
    if dtype_of(input).is_int and dtype_of(exponent).is_int:
        if isinstance(exponent, (int, np.integer)) and exponent < 0:
            raise ConfigurationError(
                f"an integer tensor to the negative power {exponent} is not an integer; cast it to float first"
            )
        wide = apply_op("Pow", cast(input, DType.float64), cast(exponent, DType.float64))
        return cast(apply_op("Round", wide), _result_dtype(input, exponent))
    return apply_op("Pow", input, exponent)


maximum = _binary("Maximum", "Element-wise maximum.")
minimum = _binary("Minimum", "Element-wise minimum.")
equal = _binary("Equal", "x == y (bool).")
not_equal = _binary("NotEqual", "x != y (bool).")
ne = not_equal
greater = _binary("Greater", "x > y (bool).")
gt = greater
greater_equal = _binary("GreaterEqual", "x >= y (bool).")
ge = greater_equal
less = _binary("Less", "x < y (bool).")
lt = less
less_equal = _binary("LessEqual", "x <= y (bool).")
le = less_equal


def logical_and(input: Any, other: Any) -> Tensor:
    """x and y, element-wise (bool); numbers are true where non-zero, as MindSpore."""
    return apply_op("LogicalAnd", _as_bool(input), _as_bool(other))


def logical_or(input: Any, other: Any) -> Tensor:
    """x or y, element-wise (bool); numbers are true where non-zero, as MindSpore."""
    return apply_op("LogicalOr", _as_bool(input), _as_bool(other))


def _result_dtype(input: Any, other: Any) -> DType:
    """The dtype a binary op of these operands gives: the tensors' promoted dtype, Python scalars weak (an int next
    to an int tensor takes its dtype, a float next to an int tensor is float32), as MindSpore."""
    partner = None
    for value in (input, other):
        if _is_tensor(value):
            partner = dtype_of(value) if partner is None else promote(partner, dtype_of(value))
    for value in (input, other):
        if not _is_tensor(value):
            scalar = scalar_dtype(value, partner)
            partner = scalar if partner is None else promote(partner, scalar)
    return partner


def _in_float64(value: Any) -> Any:
    return cast(value, DType.float64) if _is_tensor(value) else float(value)


def dtype_of(x: Any) -> DType:
    """The dtype x has as an op input (Python ints are int64, floats float32, as MindSpore)."""
    if isinstance(x, Tensor):
        return x.dtype
    if isinstance(x, np.ndarray | np.generic):
        return to_dtype(x.dtype)
    return to_dtype(type(x))


def div(input: Any, other: Any, *, rounding_mode: str | None = None) -> Tensor:
    """input / other (MindSpore `ops.div`): rounding_mode None is true division (integers divide as float32);
    'floor' rounds the quotient down and 'trunc' towards zero, both keeping integer inputs integer."""
    if rounding_mode == "floor":
        return floor_divide(input, other)
    if rounding_mode == "trunc":
        ints = dtype_of(input).is_int and dtype_of(other).is_int
        # integers divide through float64, as floor_divide, so that the quotient is exact below 2**53
        wide = [cast(v, DType.float64) if _is_tensor(v) else float(v) for v in (input, other)] if ints else None
        quotient = apply_op("Div", *wide) if ints else apply_op("Div", input, other)
        truncated = select(less(quotient, 0), ceil(quotient), floor(quotient))
        return cast(truncated, dtype_of(input) if _is_tensor(input) else dtype_of(other)) if ints else truncated
    if rounding_mode is not None:
        raise ConfigurationError(
            f"ops.div: rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}; "
            "e.g. ops.div(x, y, rounding_mode='floor')"
        )
    if not _result_dtype(input, other).is_float:  # integers and bools divide as float32, as MindSpore
        input, other = (cast(v, DType.float32) if _is_tensor(v) else float(v) for v in (input, other))
    return apply_op("Div", input, other)


def true_divide(dividend: Any, divisor: Any) -> Tensor:
    """dividend / divisor, true division (integers divide as float32), as div without a rounding_mode."""
    return div(dividend, divisor)


def floor_divide(input: Any, other: Any) -> Tensor:
    """floor(x / y) in the operands' promoted dtype. Integers (and bools) are divided exactly through float64;
    float16/float32 too, so that the quotient floors as MindSpore's (and numpy's) do: 1.0 // 0.1 is 9, where
    floor(float32(1.0 / 0.1)) would give 10."""
    out = _result_dtype(input, other)
    if out == DType.float64:
        return apply_op("Floor", apply_op("Div", input, other))
    return cast(apply_op("Floor", apply_op("Div", _in_float64(input), _in_float64(other))), out)


def floor_div(x: Any, y: Any) -> Tensor:
    """floor(x / y), as floor_divide (MindSpore names this form's arguments x and y)."""
    return floor_divide(x, y)


def remainder(input: Any, other: Any) -> Tensor:
    """input - floor_divide(input, other) * other in the operands' dtype, as MindSpore's ops.remainder computes it
    (1.0 - 9 * 0.1 rounds to 0.09999996 in float32); the % operator is floor_mod, MindSpore's FloorMod."""
    out = _result_dtype(input, other)
    x, y = (cast(v, out) if _is_tensor(v) else v for v in (input, other))
    return sub(x, mul(floor_divide(x, y), y))


def floor_mod(x: Any, y: Any) -> Tensor:
    """x - floor(x / y) * y exactly, its sign following y (MindSpore's FloorMod, Tensor %): float16/float32 are
    computed in float64, where the product and the difference are exact (1.0 % 0.1 is 0.0999999866, as numpy)."""
    out = _result_dtype(x, y)
    if out == DType.float64:
        return sub(x, mul(floor_divide(x, y), y))
    x, y = _in_float64(x), _in_float64(y)
    return cast(sub(x, mul(apply_op("Floor", apply_op("Div", x, y)), y)), out)


def clamp(input: Any, min: Any = None, max: Any = None) -> Tensor:
    """input limited to [min, max]; an integer input stays integer, Python float bounds truncated to it (MindSpore
    2.7.0: clamp(int32 [-3, 0, 5], -1.5, 2.5) is int32 [-1, 0, 2])."""
    if _is_tensor(input) and not dtype_of(input).is_float:
        min, max = (int(b) if isinstance(b, float) else b for b in (min, max))
    # selects, not maximum/minimum: an input at a bound keeps its slope 1 (MindSpore's clamp; clip_by_value,
    # built from maximum and minimum, halves it there)
    out = input
    if min is not None:
        out = select(less(out, min), min, out)
    if max is not None:
        out = select(greater(out, max), max, out)
    return out


clip = clamp


def clip_by_value(x: Any, clip_value_min: Any = None, clip_value_max: Any = None) -> Any:
    """x (a Tensor, or a tuple or list of them) limited to [clip_value_min, clip_value_max], the bounds cast to x's
    dtype (MindSpore's ops.clip_by_value; min above max gives max)."""
    if clip_value_min is None and clip_value_max is None:
        raise ConfigurationError("clip_by_value: give clip_value_min, clip_value_max or both")
    if isinstance(x, (tuple, list)):
        return type(x)(clip_by_value(t, clip_value_min, clip_value_max) for t in x)
    if not isinstance(x, Tensor):
        raise ConfigurationError(f"clip_by_value: x must be a Tensor, or a tuple or list of them: {type(x).__name__}")
    out = x
    if clip_value_min is not None:
        out = maximum(out, cast(clip_value_min, x.dtype))
    if clip_value_max is not None:
        out = minimum(out, cast(clip_value_max, x.dtype))
    return out


def _clip_tensors(x: Any, who: str) -> list:
    tensors = [x] if isinstance(x, Tensor) else list(x) if isinstance(x, (tuple, list)) else None
    if not tensors or not builtins.all(isinstance(t, Tensor) for t in tensors):
        raise ConfigurationError(f"{who}: x must be a Tensor or a non-empty tuple or list of Tensors")
    return tensors


def clip_by_global_norm(x: Any, clip_norm: float = 1.0, use_norm: Any = None) -> tuple:
    """Every tensor of x times clip_norm / max(global norm, clip_norm), the global norm being the L2 norm of all of
    them together (MindSpore's ops.clip_by_global_norm). Under SEMI_AUTO/AUTO_PARALLEL the tensors are the whole
    ones, so the norm is the global one as MindSpore's all-reduce makes it."""
    if use_norm is not None:
        raise ConfigurationError(f"clip_by_global_norm: use_norm only supports None (as MindSpore), got {use_norm!r}")
    if isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float)) or not clip_norm > 0:
        raise ConfigurationError(f"clip_by_global_norm: clip_norm must be a number > 0, got {clip_norm!r}")
    if not isinstance(x, (tuple, list)):
        raise ConfigurationError(f"clip_by_global_norm: x must be a tuple or list of Tensors, got {type(x).__name__}")
    tensors = _clip_tensors(x, "clip_by_global_norm")
    squares = [cast(sum(square(t)), DType.float32) for t in tensors]
    total = squares[0]
    for part in squares[1:]:
        total = total + part
    norm = maximum(sqrt(total), float(clip_norm))
    return tuple(cast(t * float(clip_norm) / norm, t.dtype) for t in tensors)


def _total_norm(tensors: list, p: float) -> Tensor:
    """The norm of order p of the tensors' own norms, each (sum x^p)^(1/p) as MindSpore's; order inf is the largest
    |x|."""
    if p == float("inf"):
        norms = [amax(abs(t)) for t in tensors]
        total = norms[0]
        for part in norms[1:]:
            total = maximum(total, part)
        return total
    norms = [cast(pow(sum(pow(t, p)), 1.0 / p), t.dtype) for t in tensors]
    stacked = stack(norms)
    return cast(pow(sum(pow(stacked, p)), 1.0 / p), stacked.dtype)


def clip_by_norm(x: Any, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Any:
    """x (a Tensor, or a tuple or list of them) scaled by max_norm / (total norm + 1e-6) when that is below 1, else
    x itself (MindSpore's ops.clip_by_norm). Where x is not clipped its gradient is the upstream one, as MindSpore
    2.7.0's (at x = 0 too: the norm's infinite slope at 0 must not meet that branch's zero gradient, which would be
    NaN, so the norm on the gradient path is taken of ones there)."""
    tensors = _clip_tensors(x, "clip_by_norm")
    p = float(norm_type)
    total = _total_norm([stop_gradient(t) for t in tensors], p)
    if error_if_nonfinite:
        if current() is not None:
            raise NotSupportedYetError(
                "clip_by_norm: error_if_nonfinite=True inside a graph is not supported yet (it needs the norm's "
                "value while the graph is traced); check ops.isfinite on the result instead"
            )
        if not np.isfinite(total.asnumpy()).all():
            raise RuntimeError(f"clip_by_norm: the total norm of order {norm_type} of the input is not finite")
    clipping = less(float(max_norm) / (total + 1e-6), 1.0)
    norm = _total_norm([select(clipping, t, ones_like(t)) for t in tensors], p)
    coef = float(max_norm) / (norm + 1e-6)
    clipped = [select(clipping, t * cast(coef, t.dtype), t) for t in tensors]
    return clipped[0] if isinstance(x, Tensor) else type(x)(clipped)


def isnan(input: Any) -> Tensor:
    return not_equal(input, input)


def isfinite(input: Any) -> Tensor:
    return logical_and(equal(input, input), less(abs(input), float("inf")))


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor | np.ndarray)


def matmul(input: Any, other: Any, transpose_a: bool = False, transpose_b: bool = False) -> Tensor:
    """Matrix product: 2-D × 2-D is MatMul, batched inputs BatchMatMul; a 1-D operand is a vector."""
    a_dim, b_dim = _ndim(input), _ndim(other)
    if a_dim == 1 or b_dim == 1:
        a = expand_dims(input, 0) if a_dim == 1 else input
        b = expand_dims(other, -1) if b_dim == 1 else other
        out = matmul(a, b, transpose_a, transpose_b)
        return squeeze(out, -1 if b_dim == 1 else -2) if a_dim != b_dim else reshape(out, ())
    op = "MatMul" if a_dim == 2 and b_dim == 2 else "BatchMatMul"
    return apply_op(op, input, other, transpose_a=transpose_a, transpose_b=transpose_b)


def bmm(input_x: Any, mat2: Any) -> Tensor:
    return apply_op("BatchMatMul", input_x, mat2)


def _ndim(x: Any) -> int:
    return x.ndim if isinstance(x, Tensor) else np.ndim(x)


def _axis(axis: Any) -> Any:
    if axis is None or (isinstance(axis, (tuple, list)) and len(axis) == 0):
        return None
    return tuple(axis) if isinstance(axis, (tuple, list)) else int(axis)


def sum(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """The sum over `dim`; with `dtype` the input is cast first, so the sum is taken in that type (as MindSpore).
    A bool tensor is summed as int64, a count ((pred == y).sum()), as MindSpore's sum_ext and mint.sum do."""
    narrow = (DType.bool_, DType.uint8, DType.int8, DType.int16)
    if dtype is None and dtype_of(input) in (*narrow, DType.int32):
        dtype = DType.int64  # as MindSpore's sum_ext promotes them (and ONNX has no ReduceSum for some)
    dtype = None if dtype is None else to_dtype(dtype)
    if dtype in narrow:
        # ONNX has no ReduceSum for these: sum as int64 and wrap into dtype after (MindSpore 2.7.0 measured:
        # [100, 100, 3] int32 .sum(dtype=ms.int8) is int8 -53), the same as summing in dtype
        return cast(sum(cast(input, DType.int64), dim, keepdim), dtype)
    source = input if dtype is None else cast(input, dtype)
    return apply_op("ReduceSum", source, axis=_axis(dim), keep_dims=bool(keepdim))


def mean(x: Any, axis: Any = None, keep_dims: bool = False) -> Tensor:
    return apply_op("ReduceMean", x, axis=_axis(axis), keep_dims=bool(keep_dims))


def amax(input: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return apply_op("ReduceMax", input, axis=_axis(axis), keep_dims=bool(keepdims))


def amin(input: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return apply_op("ReduceMin", input, axis=_axis(axis), keep_dims=bool(keepdims))


def all(input: Any, axis: Any = None, keep_dims: bool = False) -> Tensor:
    """Whether every element over `axis` (every dim when None) is true (non-zero), a bool tensor (MindSpore's
    ops.all)."""
    return amin(_as_bool(input), axis, keep_dims)


def any(input: Any, axis: Any = None, keep_dims: bool = False) -> Tensor:
    """Whether any element over `axis` (every dim when None) is true (non-zero), a bool tensor (MindSpore's
    ops.any)."""
    return amax(_as_bool(input), axis, keep_dims)


def _as_bool(input: Any) -> Any:
    if not _is_tensor(input):
        return builtins.bool(input)
    return input if dtype_of(input) == DType.bool_ else not_equal(input, 0)


def _arg(op: str, input: Any, dim: Any, keepdim: bool, output_type: DType = DType.int64) -> Tensor:
    if dtype_of(input) == DType.bool_:  # ONNX's ArgMax has no bool kernel; the order is False < True
        input = cast(input, DType.uint8)
    if dim is None:
        return apply_op(op, reshape(input, (-1,)), axis=0, keep_dims=False, output_type=output_type)
    return apply_op(op, input, axis=int(dim), keep_dims=bool(keepdim), output_type=output_type)


def argmax(input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Index of the maximum (over the flattened tensor when dim is None), int64."""
    return _arg("Argmax", input, dim, keepdim)


def argmin(input: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Index of the minimum (over the flattened tensor when axis is None), int32: MindSpore's ops.argmin takes
    axis/keepdims and returns P.Argmin's int32, unlike argmax (mint.argmin is torch's: dim/keepdim, int64)."""
    return _arg("Argmin", input, axis, keepdims, DType.int32)


def cast(input: Any, dtype: Any) -> Tensor:
    dtype = to_dtype(dtype)
    if isinstance(input, Tensor) and input.dtype == dtype:
        return input
    return apply_op("Cast", input, dtype=dtype)


def reshape(input: Any, shape: Any) -> Tensor:
    if isinstance(shape, Tensor):
        shape = tuple(int(d) for d in shape.asnumpy().reshape(-1))
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return apply_op("Reshape", input, shape=shape)


def transpose(input: Any, input_perm: Sequence[int]) -> Tensor:
    """The dims of `input` in the order `input_perm`; a negative entry counts from the end (MindSpore's CPU/GPU)."""
    ndim = len(input.shape) if isinstance(input, Tensor) else np.ndim(input)
    return apply_op("Transpose", input, perm=tuple(int(p) + ndim if int(p) < 0 else int(p) for p in input_perm))


def permute(input: Any, axis: Sequence[int]) -> Tensor:
    return transpose(input, axis)


def expand_dims(input_x: Any, axis: int) -> Tensor:
    return apply_op("ExpandDims", input_x, axis=int(axis))


def unsqueeze(input: Any, dim: int) -> Tensor:
    return expand_dims(input, dim)


def squeeze(input: Any, axis: Any = None) -> Tensor:
    """input without its size-1 dims (those of `axis`); a named dim of another size stays, as MindSpore 2.7's
    squeeze leaves it."""
    if axis is None:
        return apply_op("Squeeze", input, axis=())
    axes = _axis(axis)
    shape = tuple(input.shape)
    ones = tuple(a for a in ((axes,) if isinstance(axes, int) else axes) if shape[a] == 1)
    return apply_op("Squeeze", input, axis=ones) if ones else input


def flatten(input: Any, order: str = "C", *, start_dim: int = 1, end_dim: int = -1) -> Tensor:
    """Merge dims start_dim..end_dim (MindSpore `ops.flatten`, default: keep dim 0).

    order='F' is MindSpore's column-major flatten: the dims are first reversed (one Transpose, so a traced graph
    holds it too), then start_dim..end_dim of the reversed tensor are merged; flattening every dim gives numpy's
    x.flatten(order='F').
    """
    if order not in ("C", "F"):
        raise ConfigurationError(
            f"ops.flatten: order must be 'C' (row-major) or 'F' (column-major), got {order!r}; e.g. order='F'"
        )
    shape = input.shape if isinstance(input, Tensor) else np.shape(input)
    ndim = len(shape)
    if ndim <= 1:  # nothing to merge or reorder: a 0-D input becomes 1-D, as MindSpore
        return reshape(input, (1,)) if ndim == 0 else input
    if order == "F":
        input = transpose(input, tuple(reversed(range(ndim))))
        shape = tuple(reversed(shape))
    for name, dim in (("start_dim", start_dim), ("end_dim", end_dim)):
        if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
            raise ConfigurationError(f"ops.flatten: {name} must be an int in [{-ndim}, {ndim}) for a {ndim}-D input, "
                                     f"got {dim!r}")  # fmt: skip
    start, end = start_dim % ndim, end_dim % ndim
    if start > end:
        raise ConfigurationError(
            f"ops.flatten: start_dim {start_dim} comes after end_dim {end_dim} (dims {start} > {end} of a {ndim}-D "
            "input); give start_dim <= end_dim"
        )
    if start == 1 and end == ndim - 1:
        return apply_op("Flatten", input)
    if start == end:
        return input
    merged = shape[start : end + 1]
    if builtins.any(isinstance(d, str) for d in merged):  # ops.any is this module's
        raise ConfigurationError(f"flatten: cannot merge symbolic dims {merged}; flatten dims of known size")
    return reshape(input, (*shape[:start], int(np.prod(merged)), *shape[end + 1 :]))


def concat(tensors: Sequence[Any], axis: int = 0) -> Tensor:
    return apply_op("Concat", *tensors, axis=int(axis))


cat = concat


def stack(tensors: Sequence[Any], axis: int = 0) -> Tensor:
    """The tensors joined along a new `axis`; a single Tensor is a list of one, as MindSpore takes it."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    return concat([expand_dims(t, axis) for t in tensors], axis)


def split(tensor: Any, split_size_or_sections: Any, axis: int = 0) -> tuple[Tensor, ...]:
    """Split along `axis` into chunks of `split_size_or_sections` (an int; the last may be smaller) or sizes."""
    dim = tensor.shape[axis]
    if isinstance(split_size_or_sections, np.integer):
        split_size_or_sections = int(split_size_or_sections)
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        sizes = tuple(min(step, dim - i) for i in range(0, dim, step))
    else:
        sizes = tuple(int(s) for s in split_size_or_sections)
    out = apply_op("Split", tensor, axis=int(axis), sizes=sizes)
    return out if isinstance(out, tuple) else (out,)


def chunk(input: Any, chunks: int, axis: int = 0) -> tuple[Tensor, ...]:
    dim = input.shape[axis]
    return split(input, -(-dim // chunks), axis)


def broadcast_to(input: Any, shape: Sequence[int]) -> Tensor:
    return apply_op("BroadcastTo", input, shape=tuple(shape))


def gather(input_params: Any, input_indices: Any, axis: int, batch_dims: int = 0) -> Tensor:
    if batch_dims:
        raise ConfigurationError("ops.gather: batch_dims is not supported; use batch_dims=0")
    return apply_op("Gather", input_params, input_indices, axis=int(axis))


def gather_elements(input: Any, dim: int, index: Any) -> Tensor:
    return apply_op("GatherElements", input, index, axis=int(dim))


def one_hot(indices: Any, depth: int, on_value: Any = 1, off_value: Any = 0, axis: int = -1) -> Tensor:
    """MindSpore's `ops.one_hot`: the result has `on_value`'s dtype as `Tensor(on_value)` gives it (int64 for an
    int, the default 1; float32 for a float; bool for a bool); `off_value` must have the same."""
    dtype, off_dtype = _value_dtype(on_value), _value_dtype(off_value)
    if dtype != off_dtype:
        raise ConfigurationError(
            f"ops.one_hot: on_value ({dtype}) and off_value ({off_dtype}) must have one dtype, as in MindSpore; "
            "e.g. one_hot(x, depth, 1.0, 0.0) or one_hot(x, depth, 1, 0)"
        )
    on = float(on_value.asnumpy()) if isinstance(on_value, Tensor) else float(on_value)
    off = float(off_value.asnumpy()) if isinstance(off_value, Tensor) else float(off_value)
    return apply_op("OneHot", indices, depth=int(depth), on_value=on, off_value=off, axis=int(axis), dtype=dtype)


def _value_dtype(value: Any) -> DType:
    """The dtype of `Tensor(value)` in MindSpore: a Python float is float32, an int int64, NumPy scalars keep theirs."""
    if isinstance(value, Tensor):
        return value.dtype
    if isinstance(value, float):
        return DType.float32
    return to_dtype(np.asarray(value).dtype)


def select(condition: Any, input: Any, other: Any) -> Tensor:
    return apply_op("Select", condition, input, other)


def where(condition: Any, input: Any, other: Any) -> Tensor:
    return apply_op("Select", condition, input, other)


def _filled(shape: Any, value: float, dtype: Any) -> Tensor:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = to_dtype(dtype or DType.float32)
    if current() is None:
        return Tensor._wrap(np.full(shape, value, dtype.numpy))
    return apply_op("Fill", shape=shape, dtype=dtype, value=value)


def zeros(size: Any, dtype: Any = None) -> Tensor:
    return _filled(size, 0, dtype)


def ones(shape: Any, dtype: Any = None) -> Tensor:
    return _filled(shape, 1, dtype)


def full(size: Any, fill_value: Any, *, dtype: Any = None) -> Tensor:
    """A tensor of `fill_value`, int64 unless `dtype` says otherwise (MindSpore 2.7's ops.full: full((2,), 3.5) is
    int64 [3, 3]; mint.full follows the fill value instead)."""
    return _filled(size, fill_value, DType.int64 if dtype is None else dtype)


def fill(type: Any, shape: Any, value: Any) -> Tensor:
    return _filled(shape, value, type)


def depend(value: Any, expr: Any) -> Any:
    """`value`, computed after `expr` (ordering only matters in graphs)."""
    trace = current()
    if trace is None:
        return value
    deps = [e for e in (expr if isinstance(expr, (tuple, list)) else (expr,)) if isinstance(e, Tensor)]
    return apply_op("Depend", value, *deps) if deps else value


def assign(variable: Any, value: Any) -> Any:
    """Write `value` into Parameter `variable` (a state update of the compiled graph when tracing)."""
    trace = current()
    if trace is not None:
        return trace.assign(variable, cast(value, variable.dtype))
    variable.set_data(value)
    return variable


def assign_add(variable: Any, value: Any) -> Any:
    """variable += value (MindSpore ops.assign_add)."""
    return assign(variable, variable + value)


def assign_sub(variable: Any, value: Any) -> Any:
    """variable -= value (MindSpore ops.assign_sub)."""
    return assign(variable, variable - value)


def shape(input_x: Any) -> tuple:
    return tuple(input_x.shape)


def rank(input_x: Any) -> int:
    return len(input_x.shape)


def size(input_x: Any) -> int:
    return input_x.size


from tessel.ops.nn_functional import *  # noqa: E402,F403 - one namespace, as MindSpore's ops
