"""Activation cells with parameters or arguments of their own (PReLU, Threshold, CELU, GLU, Softmax2d) and OneHot,
with MindSpore 2.7.0's nn signatures (nn/layer/activation.py, basic.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessel.common import dtype as mstype
from tessel.common.parameter import Parameter
from tessel.common.tensor import Tensor
from tessel.nn.cell import Cell
from tessel.ops import functional as F


class PReLU(Cell):
    """x where x > 0, else w * x, with a learnt slope per channel (dim 1) or one shared slope (channel=1). The
    slope is the parameter `w`, named "a" as MindSpore's, initialised from w (a float, a list of `channel` floats or
    a float tensor of shape (channel,)).

    >>> from tessel import nn
    >>> act = nn.PReLU(channel=16, w=0.25)
    """

    def __init__(self, channel: int = 1, w: Any = 0.25):
        super().__init__()
        if isinstance(channel, bool) or not isinstance(channel, int):
            raise TypeError(f"For 'PReLU', the 'channel' must be an int, but got {type(channel).__name__}.")
        if channel <= 0:
            raise ValueError(f"For 'PReLU', the 'channel' must be a positive int, but got {channel}.")
        if isinstance(w, (float, np.float32)):
            w = np.full((channel,), w, np.float32)
        elif isinstance(w, list):
            if len(w) != channel:
                raise ValueError(
                    f"For 'PReLU', the length of 'w' must be equal to the 'channel' when the 'w' is a list, but got "
                    f"the length of 'w': {len(w)}, the 'channel': {channel}."
                )
            for item in w:
                if not isinstance(item, (float, np.float32)):
                    raise ValueError(
                        f"For 'PReLU', all elements in 'w' must be float when the 'w' is a list, got {item}."
                    )
            w = np.array(w, np.float32)
        elif isinstance(w, Tensor):
            if w.dtype not in (mstype.float16, mstype.float32):
                raise ValueError(f"For 'PReLU', the dtype of 'w' must be float16 or float32, but got {w.dtype}.")
            if len(w.shape) != 1 or w.shape[0] != channel:
                raise ValueError(
                    f"For 'PReLU', 'w' must be 1-D with 'channel' = {channel} elements, but got shape {w.shape}."
                )
        else:
            raise TypeError(f"For 'PReLU', the 'w' only supported float, list and tensor, but got {type(w).__name__}.")
        self.w = Parameter(w if isinstance(w, Tensor) else Tensor(w), name="a")

    def construct(self, x):
        w = F.cast(self.w, x.dtype)
        channels = x.shape[1] if x.ndim >= 2 else 1
        if w.shape[0] not in (1, channels):
            raise ValueError(
                f"For 'Prelu', the length of 'weight' must be equal to number of channels: {channels}, "
                f"but got {w.shape[0]}."
            )
        if x.ndim >= 2:
            w = F.reshape(w, (-1,) + (1,) * (x.ndim - 2))
        return F.select(F.greater(x, 0.0), x, x * w)


class Threshold(Cell):
    """x where x > threshold, else value.

    >>> from tessel import nn
    >>> act = nn.Threshold(0.1, 20.0)
    """

    def __init__(self, threshold: float, value: float):
        super().__init__()
        self.threshold, self.value = threshold, value

    def construct(self, input_x):
        for name, number in (("thr", self.threshold), ("value", self.value)):
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                raise TypeError(
                    f"For 'threshold', the type of '{name}' should be one of '['float', 'int']', "
                    f"but got type '{type(number).__name__}'."
                )
        return F.select(F.greater(input_x, float(self.threshold)), input_x, F.zeros_like(input_x) + self.value)


class CELU(Cell):
    """max(0, x) + min(0, alpha * (e^(x / alpha) - 1)); alpha is a float other than 0 (checked when the cell
    runs, as MindSpore's CeLU primitive checks it)."""

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = alpha

    def construct(self, x):
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, float):
            raise TypeError(f"CeLU(alpha={type(self.alpha).__name__}): alpha must be a float, as CeLU(alpha=<float>)")
        if self.alpha == 0.0:
            raise ValueError("For primitive[CeLU], the alpha must be not equal to 0 , but got 0.")
        negative = self.alpha * (F.exp(F.minimum(x, 0.0) / self.alpha) - 1.0)
        return F.select(F.greater(x, 0.0), x, negative)


class GLU(Cell):
    """a * sigmoid(b) for the two halves a, b of the input along `axis` (whose length must be even)."""

    def __init__(self, axis: int = -1):
        super().__init__()
        self.dim = axis

    def construct(self, x):
        size = x.shape[self.dim]
        if size % 2:
            raise ValueError(f"For 'Split', the size of dim {self.dim} ({size}) must be divisible by output_num 2.")
        first, second = F.split(x, size // 2, self.dim)
        return first * F.sigmoid(second)


class Softmax2d(Cell):
    """Softmax over the channels (axis -3) of a (C, H, W) or (N, C, H, W) input."""

    def construct(self, x):
        if x.ndim not in (3, 4):
            raise ValueError(f"For 'Softmax2d', the in_shape must have 3 or 4 dims, but got {x.ndim}.")
        return F.softmax(x, -3)


class OneHot(Cell):
    """indices as one-hot vectors of `depth` along `axis`: on_value at the index, off_value elsewhere, in `dtype`.

    >>> from tessel import nn
    >>> onehot = nn.OneHot(depth=4)
    """

    def __init__(
        self, axis: int = -1, depth: int = 1, on_value: float = 1.0, off_value: float = 0.0, dtype: Any = None
    ):
        super().__init__()
        self.axis, self.depth, self.on_value, self.off_value = axis, depth, on_value, off_value
        self.dtype = mstype.float32 if dtype is None else dtype

    def construct(self, indices):
        if indices.dtype not in (mstype.int32, mstype.int64):
            raise TypeError(
                "For primitive[OneHot], the input argument[indices] must be a type of {Tensor[Int32], "
                f"Tensor[Int64]}}, but got Tensor[{mstype.ms_name(indices.dtype)}]."
            )
        on = Tensor(np.array(self.on_value, mstype.dtype_to_nptype(self.dtype)))
        off = Tensor(np.array(self.off_value, mstype.dtype_to_nptype(self.dtype)))
        return F.one_hot(indices, self.depth, on, off, self.axis)
