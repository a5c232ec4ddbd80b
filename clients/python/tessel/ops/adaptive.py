"""Adaptive pooling over the last two dims, as MindSpore's AdaptiveAvgPool2D / AdaptiveMaxPool2D: output cell i
of a dim of size L cut into `out` bins covers [floor(i * L / out), ceil((i + 1) * L / out)), so bins may overlap
and differ in size when out does not divide L.

    >>> ops.adaptive_avg_pool2d(x, (3, None)).shape      # x (N, C, 7, 5) -> (N, C, 3, 5)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tessel.common.tensor import Tensor
from tessel.common.tracing import apply_op
from tessel.core.errors import ConfigurationError
from tessel.core.options import not_supported_yet
from tessel.ops import functional as F
from tessel.ops.nn_functional import dense

__all__ = ["adaptive_avg_pool2d", "adaptive_max_pool2d"]


def _bins(size: int, out: int) -> list[tuple[int, int]]:
    return [(i * size // out, math.ceil((i + 1) * size / out)) for i in range(out)]


def _output_size(where: str, x: Any, output_size: Any) -> tuple[int, int]:
    """(oh, ow) from an int or a pair whose None entries keep the input's size; x must be 3-D or 4-D."""
    shape = tuple(x.shape)
    if len(shape) not in (3, 4):
        raise ConfigurationError(f"{where}: the input must be 3-D (C, H, W) or 4-D (N, C, H, W), got shape {shape}")
    return tuple(size if v is None else v for v, size in zip(check_output_size(where, output_size), shape[-2:]))


def check_output_size(where: str, output_size: Any) -> tuple:
    """output_size as an (h, w) pair: an int > 0 or a pair of them, None entries allowed (MindSpore checks it when
    the cell is built)."""
    pair = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    if len(pair) != 2 or not all(v is None or (isinstance(v, int) and v > 0) for v in pair):
        raise ConfigurationError(
            f"{where}: output_size must be an int > 0 or an (h, w) pair of them (None keeps the input's size), "
            f"got {output_size!r}"
        )
    return pair


def _swap_last(x: Any) -> Tensor:
    perm = list(range(len(x.shape)))
    perm[-2:] = perm[-1], perm[-2]
    return F.transpose(x, tuple(perm))


def adaptive_avg_pool2d(input: Any, output_size: Any) -> Tensor:
    """The mean of each bin of the last two dims of a 3-D or 4-D input. Averaging over a bin is averaging its rows
    then its columns, so this is two products with (out, L) bin-averaging matrices."""
    oh, ow = _output_size("ops.adaptive_avg_pool2d", input, output_size)
    h, w = input.shape[-2:]
    dtype = input.dtype.numpy

    def averaging(size: int, out: int) -> Tensor:
        matrix = np.zeros((out, size), dtype)
        for i, (start, end) in enumerate(_bins(size, out)):
            matrix[i, start:end] = 1.0 / (end - start)
        return Tensor(matrix)

    columns = dense(input, averaging(w, ow))  # (..., h, ow)
    return _swap_last(dense(_swap_last(columns), averaging(h, oh)))


def _slice(x: Any, axis: int, start: int, end: int) -> Tensor:
    ndim = len(x.shape)
    begin, stop = [None] * ndim, [None] * ndim
    begin[axis], stop[axis] = start, end
    return apply_op("StridedSlice", x, begin=tuple(begin), end=tuple(stop), strides=(1,) * ndim)


def adaptive_max_pool2d(input: Any, output_size: Any, return_indices: bool = False) -> Tensor:
    """The maximum of each bin of the last two dims of a 3-D or 4-D input: the maximum over the bin's rows, then
    over its columns (one slice per bin and dim)."""
    if return_indices:
        raise not_supported_yet(
            "adaptive_max_pool2d(return_indices=True)", "tessel returns the maxima only; drop return_indices"
        )
    oh, ow = _output_size("ops.adaptive_max_pool2d", input, output_size)
    h, w = input.shape[-2:]
    rows = F.concat([F.amax(_slice(input, -2, a, b), -2, keepdims=True) for a, b in _bins(h, oh)], -2)
    return F.concat([F.amax(_slice(rows, -1, a, b), -1, keepdims=True) for a, b in _bins(w, ow)], -1)
