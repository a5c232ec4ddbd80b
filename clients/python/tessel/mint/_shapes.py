"""mint's creation functions and shape and index functions, composed from `tessel.ops`.

Index patterns (a flip, a roll, a diagonal) are constants made from the static shape, so each traces into graphs
and differentiates as the gathers it is made of.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel.common.dtype import DType, to_dtype
from tessel.common.support import not_supported_yet
from tessel.common.tensor import Tensor
from tessel.common.tracing import apply_op
from tessel.core.errors import ConfigurationError
from tessel.ops import composed as C
from tessel.ops import functional as F

# --- creation -------------------------------------------------------------------------------------------------------


def arange(start: Any = 0, end: Any = None, step: Any = 1, *, dtype: Any = None) -> Tensor:
    """[start, end) by step (one argument: [0, start)); int64 when all three are ints, float32 otherwise."""
    return C.arange(start, end, step, dtype=dtype)


def linspace(start: Any, end: Any, steps: int, *, dtype: Any = None) -> Tensor:
    """`steps` evenly spaced values from start to end, both included; float32 unless `dtype` says (an integer
    dtype truncates them)."""
    out = C.linspace(start, end, steps)
    if dtype is None or to_dtype(dtype) == DType.float32:
        return out
    if to_dtype(dtype).is_float:  # computed in the wider dtype, not widened from float32
        start, end = (v.asnumpy().item() if isinstance(v, Tensor) else v for v in (start, end))
        return C._constant(np.linspace(float(start), float(end), int(steps)).astype(to_dtype(dtype).numpy))
    return F.cast(out, dtype)


def eye(n: int, m: int | None = None, dtype: Any = None) -> Tensor:
    """An n x m matrix with ones on the diagonal, float32 unless `dtype` says."""
    return C.eye(n, m, dtype)


def meshgrid(*tensors: Any, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids of 1-D tensors, 'ij' (matrix) indexing by default, or 'xy'."""
    return C.meshgrid(*tensors, indexing=indexing)


def clone(input: Any) -> Tensor:
    """A copy of input."""
    return F.add(input, F.zeros_like(input))


# --- shapes ---------------------------------------------------------------------------------------------------------


def tril(input: Any, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (on and below the `diagonal`-th diagonal), zeros elsewhere."""
    return C.tril(input, diagonal)


def triu(input: Any, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (on and above the `diagonal`-th diagonal), zeros elsewhere."""
    return C.triu(input, diagonal)


def flip(input: Any, dims: Any) -> Tensor:
    """input reversed along each of `dims`."""
    return C.flip(input, dims)


def roll(input: Any, shifts: Any, dims: Any = None) -> Tensor:
    """Elements shifted along `dims` by `shifts`, wrapping around (dims None: the flattened tensor)."""
    return C.roll(input, shifts, dims)


def tile(input: Any, dims: Any) -> Tensor:
    """input repeated dims[i] times along dim i."""
    return C.tile(input, dims)


def narrow(input: Any, dim: int, start: int, length: int) -> Tensor:
    """`length` elements of input along `dim` from `start` (a negative start counts from the end)."""
    size = C._shape(input, "mint.narrow")[C._dim(int(dim), F._ndim(input), "mint.narrow")]
    return C.narrow(input, dim, start + size if start < 0 else start, length)


def swapaxes(input: Any, axis0: int, axis1: int) -> Tensor:
    """input with dims axis0 and axis1 swapped."""
    perm = list(range(F._ndim(input)))
    perm[axis0], perm[axis1] = perm[axis1], perm[axis0]
    return F.transpose(input, perm)


def ravel(input: Any) -> Tensor:
    """input flattened to 1-D."""
    return F.reshape(input, (-1,))


def unbind(input: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices of input along `dim`, that dim removed."""
    return C.unbind(input, dim)


def select(input: Any, dim: int, index: int) -> Tensor:
    """The slice of input at `index` along `dim`, that dim removed (a negative index counts from the end)."""
    ndim = F._ndim(input)
    dim = C._dim(int(dim), ndim, "mint.select")
    size = C._shape(input, "mint.select")[dim]
    if not -size <= index < size:
        raise ConfigurationError(f"mint.select: index {index} is out of range for dim {dim} of size {size}")
    return F.gather(input, C._constant(np.array(index % size, np.int64)), dim)


def _at_least(tensors: Sequence[Any], rank: int) -> list[Tensor]:
    out = []
    for t in tensors:
        shape = C._shape(t, "mint.stack")
        if len(shape) == 1 and rank >= 2:
            shape = (1, *shape)
        out.append(F.reshape(t, shape + (1,) * (rank - len(shape)) if len(shape) < rank else shape))
    return out


def hstack(tensors: Sequence[Any]) -> Tensor:
    """The tensors joined along dim 1 (along dim 0 when they are 1-D)."""
    tensors = list(tensors)
    if all(F._ndim(t) <= 1 for t in tensors):
        return F.concat([F.reshape(t, (-1,)) for t in tensors], 0)
    return F.concat(tensors, 1)


def dstack(tensors: Sequence[Any]) -> Tensor:
    """The tensors joined along dim 2, each made at least 3-D first ((n,) as (1, n, 1), (m, n) as (m, n, 1))."""
    return F.concat(_at_least(list(tensors), 3), 2)


def take(input: Any, index: Any) -> Tensor:
    """input's elements at `index` of its flattened form (negative indices count from the end); index's shape."""
    flat = F.reshape(input, (-1,))
    size = int(np.prod(C._shape(input, "mint.take")))
    return F.gather(flat, F.floor_mod(index, size), 0)


def diag(input: Any, diagonal: int = 0) -> Tensor:
    """A 1-D input as the `diagonal`-th diagonal of a square matrix (zeros elsewhere); a 2-D input's
    `diagonal`-th diagonal as a 1-D tensor."""
    shape = C._shape(input, "mint.diag")
    k = int(diagonal)
    if len(shape) == 1:
        n = shape[0] + abs(k)
        rows, cols = np.indices((n, n))
        index = np.where(cols - rows == k, np.minimum(rows, cols), shape[0])  # shape[0]: the appended zero
        padded = F.concat([input, F.zeros((1,), input.dtype)], 0)
        return F.gather(padded, C._constant(index.astype(np.int64)), 0)
    if len(shape) != 2:
        raise ConfigurationError(f"mint.diag: input must be 1-D or 2-D, got shape {shape}")
    rows = np.arange(max(0, -k), min(shape[0], shape[1] - k))
    flat = rows * shape[1] + rows + k
    return F.gather(F.reshape(input, (-1,)), C._constant(flat.astype(np.int64)), 0)


def diff(input: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Tensor:
    """The n-th forward difference along `dim` (prepend and append joined on first); bool inputs give xor."""
    dim = C._dim(int(dim), F._ndim(input), "mint.diff")
    out = F.concat([t for t in (prepend, input, append) if t is not None], dim)
    for _ in range(int(n)):
        size = C._shape(out, "mint.diff")[dim]
        if size == 0:
            break
        later, earlier = C.narrow(out, dim, 1, size - 1), C.narrow(out, dim, 0, size - 1)
        out = C.logical_xor(later, earlier) if F.dtype_of(out) == DType.bool_ else later - earlier
    return out


def _no_device(device: Any, who: str) -> None:
    if device is not None:
        raise not_supported_yet(f"mindspore.mint.{who}(device={device!r})", "leave device None: tessel places tensors")


def empty(*size: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """A tensor of shape `size` (ints or one sequence), float32 unless `dtype` says; its contents are unspecified
    in MindSpore, and zeros here."""
    _no_device(device, "empty")
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    return F.zeros(shape, dtype or DType.float32)


def empty_like(input: Any, *, dtype: Any = None, device: Any = None) -> Tensor:
    """A tensor of input's shape and dtype (or `dtype`); its contents are unspecified in MindSpore, and zeros here."""
    _no_device(device, "empty_like")
    return F.zeros_like(input, dtype=dtype)


def repeat_interleave(input: Any, repeats: Any, dim: int | None = None, *, output_size: int | None = None) -> Tensor:
    """Each element repeated `repeats` times (an int, or one count per element) along `dim` (the flattened input
    when None). The counts must be known when tracing: a Tensor of them is read eagerly."""
    x = F.reshape(input, (-1,)) if dim is None else input
    axis = 0 if dim is None else C._dim(int(dim), F._ndim(x), "mint.repeat_interleave")
    counts = np.asarray(repeats.asnumpy() if isinstance(repeats, Tensor) else repeats, np.int64).reshape(-1)
    size = C._shape(x, "mint.repeat_interleave")[axis]
    if counts.size not in (1, size) or (counts < 0).any():
        raise ConfigurationError(f"mint.repeat_interleave: repeats must be one count >= 0 or {size} of them")
    index = np.repeat(np.arange(size, dtype=np.int64), np.broadcast_to(counts, (size,)))
    if output_size is not None and output_size != index.size:
        raise ConfigurationError(f"mint.repeat_interleave: output_size {output_size} is not the total {index.size}")
    return F.gather(x, C._constant(index), axis)


def scatter_add(input: Any, dim: int, index: Any, src: Any) -> Tensor:
    """input with src[i][j] added at input[index[i][j]][j] (dim 0), ...; repeated indices add up. src may be larger
    than index: its leading part is used."""
    dim = C._dim(int(dim), F._ndim(input), "mint.scatter_add")
    return apply_op("ScatterAdd", input, index, _leading(src, index, input.dtype), axis=dim)


def _leading(src: Any, index: Any, dtype: DType) -> Tensor:
    """src cut to index's shape (a number: filled to it), as the scatters read it."""
    if not isinstance(src, Tensor):
        return F.full(C._shape(index, "mint.scatter"), src, dtype=dtype)
    wanted, shape = C._shape(index, "mint.scatter"), C._shape(src, "mint.scatter")
    for axis, (n, have) in enumerate(zip(wanted, shape)):
        if n != have:
            src = C.narrow(src, axis, 0, n)
    return src


def scatter(input: Any, dim: int, index: Any, src: Any) -> Tensor:
    """input with input[index[i][j]][j] = src[i][j] (dim 0), ...; src a tensor or a number. Where an index repeats,
    MindSpore and torch leave which of the values lands undefined; here their mean lands (the value itself when src
    is a number, as MindSpore 2.7.0 gives)."""
    dim = C._dim(int(dim), F._ndim(input), "mint.scatter")
    values = _leading(src, index, input.dtype)
    zeros = F.zeros_like(input)
    hits = apply_op("ScatterAdd", zeros, index, F.ones_like(values), axis=dim)
    landed = apply_op("ScatterAdd", zeros, index, values, axis=dim)
    hit = F.greater(hits, 0)
    mean = F.cast(landed / F.select(hit, hits, F.ones_like(hits)), input.dtype)
    return F.select(hit, mean, input)


def index_add(input: Any, dim: int, index: Any, source: Any, *, alpha: Any = 1) -> Tensor:
    """input with alpha * source's slices along `dim` added at the 1-D `index` positions (repeats add up)."""
    dim = C._dim(int(dim), F._ndim(input), "mint.index_add")
    shape = C._shape(source, "mint.index_add")
    view = [1] * len(shape)
    view[dim] = -1
    spread = F.broadcast_to(F.reshape(F.cast(index, DType.int64), tuple(view)), shape)
    return apply_op("ScatterAdd", input, spread, source if alpha == 1 else source * alpha, axis=dim)
