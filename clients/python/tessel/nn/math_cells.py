"""MindSpore's deprecated single-op cells, kept in mindspore.nn 2.7.0 for old scripts: Tril, Triu, Roll, Norm, Range,
MatMul, Moments, ClipByNorm (nn/layer/basic.py, math.py), with their arguments and checks."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessel.common import dtype as mstype
from tessel.common.tensor import Tensor
from tessel.nn.cell import Cell
from tessel.ops import composed as C
from tessel.ops import functional as F


def _check_type(owner: str, name: str, value: Any, kinds: tuple) -> None:
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = [kind.__name__ for kind in kinds]
        raise TypeError(
            f"For '{owner}', the type of '{name}' should be one of {names}, but got {type(value).__name__}."
        )


def _squeezed(x, axis: Any):
    """MindSpore's Squeeze(axis): every size-1 dim for axis (), else the dims of axis."""
    return F.squeeze(x) if axis == () else F.squeeze(x, axis)


class Tril(Cell):
    """construct(x, k=0): the lower triangle of x's last two dims (on and below the k-th diagonal), zeros above."""

    def construct(self, x, k=0):
        if x.ndim < 2:
            raise ValueError(f"For primitive[Tril], the x's rank must be greater than or equal to 2, but got {x.ndim}.")
        return C.tril(x, k)


class Triu(Cell):
    """construct(x, k=0): the upper triangle of x's last two dims (on and above the k-th diagonal), zeros below."""

    def construct(self, x, k=0):
        if x.ndim < 2:
            raise ValueError(f"For primitive[Triu], the x's rank must be greater than or equal to 2, but got {x.ndim}.")
        return C.triu(x, k)


class Roll(Cell):
    """x's elements shifted by `shift` along `axis` (ints or equally long lists of them), wrapping around."""

    def __init__(self, shift: Any, axis: Any):
        super().__init__()
        _check_type("Roll", "shift", shift, (int, tuple, list))
        _check_type("Roll", "axis", axis, (int, tuple, list))
        shift = list(shift) if isinstance(shift, (tuple, list)) else [shift]
        axis = list(axis) if isinstance(axis, (tuple, list)) else [axis]
        if len(shift) != len(axis):
            raise ValueError(
                f"For 'Roll', the shape of 'shift' and the shape of 'axis' must be the same, but got the length of "
                f"'shift' {len(shift)} and the length of 'axis' {len(axis)}."
            )
        self.shift, self.axis = shift, axis

    def construct(self, input_x):
        for axis in self.axis:
            if not -input_x.ndim <= axis < input_x.ndim:
                raise ValueError(f"For 'Roll', the 'axis' {axis} is out of range for an input of rank {input_x.ndim}.")
        return C.roll(input_x, self.shift, self.axis)


class Norm(Cell):
    """sqrt(sum(x^2)) over axis (() = all axes); without keep_dims the size-1 dims are squeezed as MindSpore's
    Squeeze(axis) does (for axis () every size-1 dim, also those not reduced)."""

    def __init__(self, axis: Any = (), keep_dims: bool = False):
        super().__init__()
        _check_type("Norm", "keep_dims", keep_dims, (bool,))
        self.axis, self.keep_dims = axis, keep_dims

    def construct(self, x):
        axes = self.axis if self.axis != () else tuple(range(x.ndim))
        out = F.sqrt(F.sum(F.square(x), axes, True))
        return out if self.keep_dims else _squeezed(out, self.axis)

    def extend_repr(self) -> str:
        return f"axis={self.axis}, keep_dims={self.keep_dims}"


class Range(Cell):
    """The constant np.arange(start, limit, delta): float32 when that is float, else int32."""

    def __init__(self, start: Any, limit: Any = None, delta: Any = 1):
        super().__init__()
        if delta == 0:
            raise ValueError("For 'Range', the 'delta' can not be zero.")
        data = np.arange(start, limit, delta)
        self.ms_dtype = mstype.float32 if data.dtype == np.float64 else mstype.int32
        self.result_tensor = Tensor(data.astype(np.float32 if self.ms_dtype == mstype.float32 else np.int32))

    def construct(self):
        return self.result_tensor


class MatMul(Cell):
    """x1 @ x2 with broadcast batch dims, either transposed first (its last two dims); 1-D operands are vectors."""

    def __init__(self, transpose_x1: bool = False, transpose_x2: bool = False):
        super().__init__()
        _check_type("MatMul", "transpose_x1", transpose_x1, (bool,))
        _check_type("MatMul", "transpose_x2", transpose_x2, (bool,))
        self.transpose_x1, self.transpose_x2 = transpose_x1, transpose_x2

    def construct(self, x1, x2):
        inner1 = x1.shape[-2] if self.transpose_x1 and x1.ndim > 1 else x1.shape[-1]
        inner2 = x2.shape[-1] if self.transpose_x2 and x2.ndim > 1 else x2.shape[-2 if x2.ndim > 1 else -1]
        if inner1 != inner2:
            raise ValueError(
                f"For 'MatMul', the inner dims of x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must be equal, "
                f"got {inner1} and {inner2}."
            )
        if x1.ndim == 1 and x2.ndim == 1:
            return F.sum(x1 * x2, -1)
        a = F.expand_dims(x1, 0) if x1.ndim == 1 else x1
        b = F.expand_dims(x2, 1) if x2.ndim == 1 else x2
        batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
        if a.ndim > 2 or b.ndim > 2:
            a = F.broadcast_to(a, (*batch, *a.shape[-2:])) if tuple(a.shape[:-2]) != batch else a
            b = F.broadcast_to(b, (*batch, *b.shape[-2:])) if tuple(b.shape[:-2]) != batch else b
        out = F.matmul(a, b, self.transpose_x1 and x1.ndim > 1, self.transpose_x2 and x2.ndim > 1)
        if x1.ndim == 1:
            out = F.squeeze(out, -2)
        return F.squeeze(out, -1) if x2.ndim == 1 else out


class Moments(Cell):
    """(mean, variance) of x over axis (None = all axes); the variance's gradient does not flow through the mean
    (MindSpore stops it there). float16 inputs are computed in float32 and returned as float16."""

    def __init__(self, axis: Any = None, keep_dims: bool | None = None):
        super().__init__()
        axis = () if axis is None else axis
        if isinstance(axis, tuple):
            for index, item in enumerate(axis):
                _check_type("Moments", f"axis[{index}]", item, (int,))
        _check_type("Moments", "axis", axis, (int, tuple))
        keep_dims = False if keep_dims is None else keep_dims
        _check_type("Moments", "keep_dims", keep_dims, (bool,))
        self.axis, self.keep_dims = axis, keep_dims

    def construct(self, x):
        if x.dtype not in (mstype.float16, mstype.float32):
            raise TypeError(f"For 'Moments', the 'input x' must be float16 or float32, but got {x.dtype}.")
        dtype = x.dtype
        wide = F.cast(x, mstype.float32) if dtype == mstype.float16 else x
        axes = self.axis if self.axis != () else tuple(range(x.ndim))
        mean = F.mean(wide, axes, keep_dims=True)
        variance = F.mean(F.square(wide - F.stop_gradient(mean)), axes, keep_dims=True)
        if not self.keep_dims:
            mean, variance = _squeezed(mean, self.axis), _squeezed(variance, self.axis)
        return (F.cast(mean, dtype), F.cast(variance, dtype)) if dtype == mstype.float16 else (mean, variance)


class ClipByNorm(Cell):
    """construct(x, clip_norm): x * clip_norm / max(||x||_2 over axis (None = all), clip_norm); clip_norm a Tensor."""

    def __init__(self, axis: Any = None):
        super().__init__()
        self.axis = axis

    def construct(self, x, clip_norm):
        if not isinstance(x, Tensor) or not isinstance(clip_norm, Tensor):
            raise TypeError("For 'ClipByNorm', the input args must be tensor.")
        axes = tuple(range(x.ndim)) if self.axis is None else self.axis
        l2 = F.sqrt(F.sum(F.square(F.cast(x, mstype.float32)), axes, True))
        clip = F.cast(clip_norm, mstype.float32)
        return F.cast(x, mstype.float32) * clip / F.maximum(l2, clip)
