"""`tensor[key]` on SymbolicTensors: basic numpy indexing lowered to StridedSlice + Reshape, or Gather.

Supported keys: ints, slices, `None` (new axis), `...`, and one int tensor or list of ints (gathered along its
axis, every other entry a full slice; a constant list of bools picks its true positions). Boolean mask tensors are
data-dependent shapes and raise TraceError.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessel.compiler.builder import SymbolicTensor, apply, constant_like
from tessel.compiler.dtypes import DType
from tessel.compiler.errors import TraceError
from tessel.compiler.shapes import format_shape


def _expand_ellipsis(key: tuple, ndim: int) -> tuple:
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise TraceError("an index can contain at most one Ellipsis (...)")
    if consumed > ndim:
        raise TraceError(f"too many indices ({consumed}) for a tensor of rank {ndim}")
    # Identity tests only: `==` on a SymbolicTensor would emit an Equal op.
    at = next((i for i, k in enumerate(key) if k is Ellipsis), None)
    if at is None:
        return key + (slice(None),) * (ndim - consumed)
    return key[:at] + (slice(None),) * (ndim - consumed) + key[at + 1 :]


def _constant_index(x: SymbolicTensor, k: Any) -> Any:
    """A list or numpy array in a key: an int64 constant index (a bool one: the positions where it is true)."""
    if not isinstance(k, (list, np.ndarray)):
        return k
    array = np.asarray(k)
    if array.dtype == np.bool_:
        array = np.flatnonzero(array) if array.ndim == 1 else None
    if array is None or array.dtype.kind not in "iu":
        raise TraceError(f"an index list must hold ints (or be a 1-D list of bools), got {k!r}")
    return constant_like(x, array.astype(np.int64), DType.int64)


def getitem(x: SymbolicTensor, key: Any) -> SymbolicTensor:
    key = key if isinstance(key, tuple) else (key,)
    key = _expand_ellipsis(tuple(_constant_index(x, k) for k in key), x.ndim)
    tensors = [i for i, k in enumerate(key) if isinstance(k, SymbolicTensor)]
    if tensors:
        return _gather(x, key, tensors)
    begin, end, strides, out_shape = [], [], [], []
    dim = 0
    for k in key:
        if k is None:
            out_shape.append(1)
            continue
        size = x.shape[dim]
        if isinstance(k, slice):
            begin.append(k.start)
            end.append(k.stop)
            strides.append(1 if k.step is None else k.step)
            out_shape.append(None)  # filled from the slice's inferred shape
        else:
            index = int(k)
            if isinstance(size, int) and not -size <= index < size:
                raise TraceError(
                    f"index {index} is out of bounds for dim {dim} of size {size} ({format_shape(x.shape)})"
                )
            begin.append(index)
            end.append(None if index == -1 else index + 1)
            strides.append(1)
        dim += 1
    sliced = apply("StridedSlice", x, begin=tuple(begin), end=tuple(end), strides=tuple(strides))
    kept = iter(d for d, k in zip(sliced.shape, (k for k in key if k is not None)) if isinstance(k, slice))
    shape = tuple(next(kept) if d is None else d for d in out_shape)
    return sliced if shape == sliced.shape else apply("Reshape", sliced, shape=shape)


def _gather(x: SymbolicTensor, key: tuple, tensors: list[int]) -> SymbolicTensor:
    (axis,) = tensors if len(tensors) == 1 else (None,)
    others_full = all(isinstance(k, slice) and k == slice(None) for i, k in enumerate(key) if i != axis)
    if axis is None or not others_full:
        raise TraceError("tensor indexing supports one int tensor index with full slices elsewhere; use ops.Gather")
    index = key[axis]
    if not index.dtype.is_int:
        raise TraceError(
            f"indexing with a {index.dtype.value} tensor: boolean masks give data-dependent shapes, which a graph "
            "cannot hold. Use ops.Select (where) to choose elements, or an int index tensor"
        )
    return apply("Gather", x, index, axis=axis)


def setitem(x: SymbolicTensor, key: Any, value: Any) -> SymbolicTensor:
    """x with x[key] = value, as a new value (a graph cannot write in place): a constant mask of the positions the
    key names (numpy's rules, on x's static shape) selects value there. A tensor value is broadcast to x[key]'s
    shape and scattered to those positions; the gradient reaches x outside them and value inside."""
    if not all(isinstance(d, int) for d in x.shape):
        raise TraceError(f"x[key] = value in a graph needs a static shape, got {format_shape(x.shape)}")
    if any(isinstance(k, SymbolicTensor) for k in (key if isinstance(key, tuple) else (key,))):
        raise TraceError(
            "x[key] = value in a graph takes constant keys (ints, slices, lists); for a tensor mask use "
            "ops.masked_fill(x, mask, value) or ops.select"
        )
    positions = np.arange(int(np.prod(x.shape, dtype=np.int64))).reshape(x.shape)
    try:
        picked = positions[key]
    except (IndexError, TypeError) as exc:
        raise TraceError(f"x[{key!r}] = ...: {exc} (x is {format_shape(x.shape)})") from None
    mask = np.zeros(positions.size, dtype=bool)
    mask[picked.reshape(-1)] = True
    flat = apply("Reshape", x, shape=(positions.size,))
    if isinstance(value, SymbolicTensor):
        if value.dtype != x.dtype:
            value = apply("Cast", value, dtype=x.dtype)
        spread = apply("Reshape", apply("BroadcastTo", value, shape=picked.shape), shape=(picked.size,))
        index = constant_like(x, picked.reshape(-1).astype(np.int64), DType.int64)
        value = apply("ScatterAdd", apply("ZerosLike", flat), index, spread, axis=0)
    written = apply("Select", constant_like(x, mask, DType.bool_), value, flat)
    return apply("Reshape", written, shape=tuple(x.shape))
