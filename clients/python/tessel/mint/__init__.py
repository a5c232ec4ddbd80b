"""`tessel.mint` — MindSpore's `mindspore.mint`: PyTorch-style functions (`input`, `dim`, `keepdim`) over tessel's ops.

    >>> from tessel import mint
    >>> x = mint.flatten(images, start_dim=1)             # mint.flatten flattens everything by default
    >>> total = mint.sum(mint.matmul(x, w), dim=1, keepdim=True)

Each function is a thin mapping onto `tessel.ops` with mint's argument names and defaults, so it traces into
compiled graphs and runs eagerly alike. The other names of MindSpore's mint (listed in `tessel.mint._names`) raise
NotSupportedYetError; `mint.nn`, `mint.nn.functional`, `mint.optim`, `mint.linalg`, `mint.special` and
`mint.distributed` follow the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessel.common.dtype import DType, to_dtype
from tessel.common.support import not_supported_yet, unsupported_names
from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError
from tessel.mint import distributed as distributed
from tessel.mint import linalg as linalg
from tessel.mint import nn as nn
from tessel.mint import optim as optim
from tessel.mint import special as special
from tessel.mint._bits import bitwise_and, bitwise_not, bitwise_or, bitwise_xor  # noqa: F401 - as below
from tessel.mint._math import (  # noqa: F401 - re-exported: __all__ lists the names of MINT defined here
    addcdiv,
    addcmul,
    all,
    allclose,
    any,
    argsort,
    cosh,
    count_nonzero,
    cummax,
    cummin,
    cumprod,
    cumsum,
    equal,
    exp2,
    expm1,
    fix,
    float_power,
    fmod,
    frac,
    histc,
    isclose,
    isinf,
    isneginf,
    item,
    kthvalue,
    lerp,
    log1p,
    log2,
    log10,
    logaddexp,
    logaddexp2,
    logical_xor,
    logsumexp,
    median,
    nan_to_num,
    nansum,
    norm,
    prod,
    searchsorted,
    sinc,
    sinh,
    sort,
    std,
    std_mean,
    tan,
    topk,
    trace,
    trunc,
    var,
    var_mean,
    xlogy,
)
from tessel.mint._names import MINT
from tessel.mint._products import (  # noqa: F401 - as above
    addbmm,
    addmm,
    addmv,
    baddbmm,
    cdist,
    cross,
    dot,
    einsum,
    mv,
    outer,
)
from tessel.mint._random import (  # noqa: F401 - as above
    bernoulli,
    multinomial,
    normal,
    rand,
    rand_like,
    randint,
    randint_like,
    randn,
    randn_like,
    randperm,
)
from tessel.mint._shapes import (  # noqa: F401 - re-exported, as above
    arange,
    clone,
    diag,
    diff,
    dstack,
    empty,
    empty_like,
    eye,
    flip,
    hstack,
    index_add,
    linspace,
    meshgrid,
    narrow,
    ravel,
    repeat_interleave,
    roll,
    scatter,
    scatter_add,
    select,
    swapaxes,
    take,
    tile,
    tril,
    triu,
    unbind,
)
from tessel.mint._trig import acos, acosh, asin, asinh, atan, atan2, atanh
from tessel.ops import composed as C
from tessel.ops import functional as F

_WHY = "tessel has no mapping for it yet; use the tessel.ops equivalent if there is one"

# --- element-wise ---------------------------------------------------------------------------------------------------
abs = F.abs
neg = F.neg
negative = F.neg
exp = F.exp
log = F.log
rsqrt = F.rsqrt
square = F.square
sin = F.sin
cos = F.cos
erf = F.erf
floor = F.floor
ceil = F.ceil
sign = F.sign
logical_not = F.logical_not
logical_and = F.logical_and
logical_or = F.logical_or
tanh = F.tanh
sigmoid = F.sigmoid
mul = F.mul
maximum = F.maximum
minimum = F.minimum
eq = F.equal
ne = F.not_equal
not_equal = F.not_equal
gt = F.greater
greater = F.greater
lt = F.less
less = F.less
le = F.less_equal
less_equal = F.less_equal
isnan = F.isnan
isfinite = F.isfinite


def ge(input: Any, other: Any) -> Tensor:
    return F.greater_equal(input, other)


greater_equal = ge


def _as_float(input: Any) -> Any:
    """An int or bool input as float32, as MindSpore 2.7's mint.sqrt and mint.reciprocal promote it."""
    return F.cast(input, DType.float32) if _integer(input) else input


def sqrt(input: Any) -> Tensor:
    """sqrt(input), element-wise (mint names the argument input, ops.sqrt x); int and bool give float32."""
    return F.sqrt(_as_float(input))


def reciprocal(input: Any) -> Tensor:
    """1 / input, element-wise; int and bool give float32 (1 / False is inf)."""
    return F.reciprocal(_as_float(input))


def round(input: Any, *, decimals: int = 0) -> Tensor:
    """Round half to even, to `decimals` decimal places; an int tensor is already round and comes back as it is."""
    if not decimals and _integer(input):
        return input
    if not decimals:
        return F.round(input)
    scale = 10.0**decimals
    return F.div(F.round(F.mul(input, scale)), scale)


def add(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:
    """input + alpha * other."""
    return F.add(input, other if alpha == 1 else F.mul(other, alpha))


def sub(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:
    """input - alpha * other."""
    return F.sub(input, other if alpha == 1 else F.mul(other, alpha))


def div(input: Any, other: Any, *, rounding_mode: str | None = None) -> Tensor:
    """True division (integers divide as float32); rounding_mode 'floor' or 'trunc' rounds the quotient and keeps
    integer inputs integer."""
    if rounding_mode is None:
        return F.div(input, other)
    if rounding_mode == "floor":
        return F.floor_divide(input, other)
    if rounding_mode != "trunc":
        raise ConfigurationError(f"mint.div: rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")
    return F.div(input, other, rounding_mode="trunc")  # integers exact: ops.div divides them through float64


divide = div


def pow(input: Any, exponent: Any) -> Tensor:
    return F.pow(input, exponent)


def remainder(input: Any, other: Any) -> Tensor:
    """input - floor(input / other) * other (the sign follows other)."""
    return F.remainder(input, other)


def floor_divide(input: Any, other: Any) -> Tensor:
    return F.floor_divide(input, other)


def clamp(input: Any, min: Any = None, max: Any = None) -> Tensor:
    if min is None and max is None:
        raise ConfigurationError("mint.clamp: at least one of min and max must be given")
    return F.clamp(input, min, max)


clip = clamp

# --- linear algebra -------------------------------------------------------------------------------------------------


def matmul(input: Any, other: Any) -> Tensor:
    """Matrix product with broadcasting; 1-D operands are vectors."""
    return F.matmul(input, other)


def bmm(input: Any, mat2: Any) -> Tensor:
    return F.bmm(input, mat2)


def mm(input: Any, mat2: Any) -> Tensor:
    if F._ndim(input) != 2 or F._ndim(mat2) != 2:
        raise ConfigurationError(f"mint.mm: both inputs must be 2-D, got ranks {F._ndim(input)} and {F._ndim(mat2)}")
    return F.matmul(input, mat2)


# --- reductions -----------------------------------------------------------------------------------------------------


def _integer(x: Any) -> bool:
    dtype = F.dtype_of(x)
    return dtype.is_int or dtype == DType.bool_


def sum(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """Sum over `dim` (all dims when None); integer and bool inputs sum as int64 unless `dtype` says otherwise."""
    if dtype is None and _integer(input):
        dtype = DType.int64
    if dtype is not None:
        input = F.cast(input, dtype)
    return F.sum(input, dim, keepdim)


def mean(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    if dtype is not None:
        input = F.cast(input, dtype)
    return F.mean(input, dim, keepdim)


def amax(input: Any, dim: Any = (), keepdim: bool = False) -> Tensor:
    return F.amax(input, dim, keepdim)


def amin(input: Any, dim: Any = (), keepdim: bool = False) -> Tensor:
    return F.amin(input, dim, keepdim)


def argmax(input: Any, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the maximum (of the flattened input when dim is None), int64."""
    return F.argmax(input, dim, keepdim)


def argmin(input: Any, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the minimum (of the flattened input when dim is None), int64 (torch's; ops.argmin gives int32)."""
    return F._arg("Argmin", input, dim, keepdim)


def _extreme(values, along, elementwise, input: Any, dim: Any, keepdim: bool, other: Any) -> Any:
    if other is not None or isinstance(dim, Tensor):
        return elementwise(input, dim if other is None else other)
    if dim is None:
        return values(input)
    return along(input, dim, keepdim)


def max(input: Any, dim: Any = None, keepdim: bool = False, *, other: Any = None) -> Any:
    """max(input): the maximum; max(input, dim, keepdim=False): (values, int64 indices), the gradient going to the
    returned index only (MindSpore's ArgMaxWithValue, so equal maxima do not share it); max(input, other): the
    element-wise maximum."""
    return _extreme(F.amax, C.max, F.maximum, input, dim, keepdim, other)


def min(input: Any, dim: Any = None, keepdim: bool = False, *, other: Any = None) -> Any:
    """min(input), min(input, dim, keepdim=False) -> (values, indices), min(input, other), as max."""
    return _extreme(F.amin, C.min, F.minimum, input, dim, keepdim, other)


# --- shapes ---------------------------------------------------------------------------------------------------------


def reshape(input: Any, shape: Sequence[int]) -> Tensor:
    return F.reshape(input, shape)


def transpose(input: Any, dim0: int, dim1: int) -> Tensor:
    """Swap dims dim0 and dim1."""
    perm = list(range(F._ndim(input)))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return F.transpose(input, perm)


def permute(input: Any, dims: Sequence[int]) -> Tensor:
    return F.transpose(input, dims)


def t(input: Any) -> Tensor:
    """The transpose of a 2-D tensor; 0-D and 1-D tensors are returned as they are."""
    return input if F._ndim(input) < 2 else transpose(input, 0, 1)


def flatten(input: Any, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims start_dim..end_dim (all of them by default)."""
    return F.flatten(input, start_dim=start_dim, end_dim=end_dim)


def squeeze(input: Any, dim: int | Sequence[int]) -> Tensor:
    """Remove the given dims where their length is 1 (others stay)."""
    ndim = F._ndim(input)
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    ones = tuple(d % ndim for d in dims if input.shape[d] == 1)
    return F.squeeze(input, ones) if ones else input


def unsqueeze(input: Any, dim: int) -> Tensor:
    return F.expand_dims(input, dim)


def cat(tensors: Sequence[Any], dim: int = 0) -> Tensor:
    return F.concat(tensors, dim)


concat = cat


def stack(tensors: Sequence[Any], dim: int = 0) -> Tensor:
    return F.stack(tensors, dim)


def split(tensor: Any, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    return F.split(tensor, split_size_or_sections, dim)


def chunk(input: Any, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    return F.chunk(input, chunks, dim)


def broadcast_to(input: Any, shape: Sequence[int]) -> Tensor:
    return F.broadcast_to(input, shape)


def gather(input: Any, dim: int, index: Any) -> Tensor:
    """out[i][j] = input[index[i][j]][j] (dim 0), ... (PyTorch's gather)."""
    return F.gather_elements(input, dim, index)


def index_select(input: Any, dim: int, index: Any) -> Tensor:
    return F.gather(input, index, dim)


def where(condition: Any, input: Any = None, other: Any = None) -> Tensor:
    """input where condition, else other."""
    if input is None and other is None:
        raise not_supported_yet(
            "mindspore.mint.where(condition) (the indices of the true elements)",
            "its output shape depends on the data, which tessel's compiled graphs cannot express yet",
        )
    return F.where(condition, input, other)


def softmax(input: Any, dim: int, *, dtype: Any = None) -> Tensor:
    return F.softmax(input, dim, dtype=dtype)


# --- creation -------------------------------------------------------------------------------------------------------


def zeros(size: Any, *, dtype: Any = None) -> Tensor:
    return F.zeros(size, dtype)


def ones(size: Any, *, dtype: Any = None) -> Tensor:
    return F.ones(size, dtype)


def full(size: Any, fill_value: Any, *, dtype: Any = None) -> Tensor:
    """A tensor of `fill_value`; its dtype follows fill_value (int64, float32 or bool) unless given."""
    return F.full(size, fill_value, dtype=F.dtype_of(fill_value) if dtype is None else dtype)


def _like(input: Any, dtype: Any) -> Tensor:
    return input if dtype is None else F.cast(input, to_dtype(dtype))


def zeros_like(input: Any, *, dtype: Any = None) -> Tensor:
    return F.zeros_like(_like(input, dtype))


def ones_like(input: Any, *, dtype: Any = None) -> Tensor:
    return F.ones_like(_like(input, dtype))


def full_like(input: Any, fill_value: Any, *, dtype: Any = None) -> Tensor:
    base = F.zeros_like(_like(input, dtype))
    return F.cast(F.add(base, fill_value), base.dtype)


conv2d = nn.functional.conv2d  # MindSpore 2.7.0's mint.conv2d is mint.nn.functional.conv2d
arccos, arccosh, arcsin, arcsinh, arctan, arctan2, arctanh = acos, acosh, asin, asinh, atan, atan2, atanh

__getattr__ = unsupported_names("mindspore.mint", MINT, _WHY)
__all__ = sorted({name for name in MINT if name in globals()} | {"distributed", "linalg", "nn", "optim", "special"})
