"""Padding and pixel- or channel-reshuffling cells with MindSpore 2.7.0's nn signatures (nn/layer/padding.py,
basic.py Pad, image.py PixelShuffle / PixelUnshuffle, channel_shuffle.py ChannelShuffle). Paddings are given
PyTorch's way, (last_before, last_after, second_last_before, ...), except nn.Pad's ((before, after) per dim, from
the first dim)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessel.common.tensor import Tensor
from tessel.nn.cell import Cell
from tessel.ops import functional as F


def _mint_functional():
    # tessel.mint.nn imports tessel.nn, so its functional module is imported when a cell first runs
    from tessel.mint.nn import functional

    return functional


_CONSTANT_LENGTH = {"ConstantPad1d": 2, "ConstantPad2d": 4, "ZeroPad2d": 4, "ConstantPad3d": 6}


class _ConstantPadNd(Cell):
    def __init__(self, padding: Any, value: float, name: str):
        super().__init__()
        most = _CONSTANT_LENGTH[name]
        if isinstance(padding, int):
            padding = (padding,) * most
        elif isinstance(padding, tuple):
            if len(padding) % 2:
                raise ValueError(
                    f"For '{name}', the length of parameter 'padding' with tuple type must be a multiple of 2, "
                    f"but got {len(padding)}"
                )
            if (name == "ConstantPad1d" and len(padding) != 2) or len(padding) > most:
                raise ValueError(f"For '{name}', the length of parameter 'padding' must be at most {most}.")
        else:
            raise TypeError(
                f"For '{name}', the type of parameter 'padding' must be in [int, tuple], got {type(padding)}"
            )
        if not isinstance(value, (int, float)):
            raise TypeError(f"For '{name}', the type of parameter 'value' must be in [int, float], got {type(value)}")
        self.padding, self.value = padding, value

    def construct(self, x):
        for index, pair in enumerate(zip(self.padding[::2], self.padding[1::2])):
            size = x.shape[x.ndim - 1 - index]
            if min(pair) < -size or size + sum(pair) <= 0:
                raise ValueError(
                    f"For '{self.cls_name}', the shape of input after padding must be positive, the input shape is "
                    f"{tuple(x.shape)}, padding {pair} of dim {x.ndim - 1 - index} leaves none."
                )
        return _mint_functional().pad(x, self.padding, "constant", float(self.value))


class ConstantPad1d(_ConstantPadNd):
    """Pad the last dim with `value`: padding an int (both sides) or (left, right); negative pads crop."""

    def __init__(self, padding: Any, value: float):
        super().__init__(padding, value, "ConstantPad1d")


class ConstantPad2d(_ConstantPadNd):
    """Pad the last two dims with `value`: padding an int or (left, right, top, bottom)."""

    def __init__(self, padding: Any, value: float):
        super().__init__(padding, value, "ConstantPad2d")


class ConstantPad3d(_ConstantPadNd):
    """Pad the last three dims with `value`: padding an int or a tuple of up to 6."""

    def __init__(self, padding: Any, value: float):
        super().__init__(padding, value, "ConstantPad3d")


class ZeroPad2d(_ConstantPadNd):
    """Pad the last two dims with zeros: padding an int or (left, right, top, bottom)."""

    def __init__(self, padding: Any):
        super().__init__(padding, 0, "ZeroPad2d")


class _EdgePadNd(Cell):
    """Reflection (mirror without repeating the edge) or replication (repeat the edge) padding."""

    _mode = ""

    def __init__(self, padding: Any, dims: int):
        super().__init__()
        name = self.cls_name
        if isinstance(padding, int):
            padding = (padding,) * (2 * dims)
        if not isinstance(padding, tuple):
            raise TypeError(
                f"For '{name}' the input 'padding' must be an integer or tuple, got {type(padding).__name__}"
            )
        if len(padding) % 2:
            raise ValueError(f"For '{name}' the length of input 'padding' must be divisible by 2, got {len(padding)}.")
        if not all(isinstance(i, int) for i in padding):
            raise TypeError(f"For '{name}' every element in 'padding' must be integer, but got {padding}.")
        if self._mode == "reflect" and not all(i >= 0 for i in padding):
            raise ValueError(f"For '{name}' every element in 'padding' must be >= 0. but got {padding}.")
        self.padding = padding

    def construct(self, x):
        functional = _mint_functional()
        if any(p < 0 for p in self.padding):  # replication's negative pads crop, as MindSpore's PadV3
            x = functional.pad(x, tuple(min(p, 0) for p in self.padding), "constant")
        return functional.pad(x, tuple(max(p, 0) for p in self.padding), self._mode)


class ReflectionPad1d(_EdgePadNd):
    """Mirror-pad the last dim (the edge not repeated): padding an int or (left, right), each < the dim's size."""

    _mode = "reflect"

    def __init__(self, padding: Any):
        super().__init__(padding, 1)


class ReflectionPad2d(_EdgePadNd):
    """Mirror-pad the last two dims: padding an int or (left, right, top, bottom)."""

    _mode = "reflect"

    def __init__(self, padding: Any):
        super().__init__(padding, 2)


class ReflectionPad3d(_EdgePadNd):
    """Mirror-pad the last three dims: padding an int or (left, right, top, bottom, front, back)."""

    _mode = "reflect"

    def __init__(self, padding: Any):
        super().__init__(padding, 3)


class ReplicationPad1d(_EdgePadNd):
    """Pad the last dim by repeating its edge values: padding an int or (left, right)."""

    _mode = "replicate"

    def __init__(self, padding: Any):
        super().__init__(padding, 1)


class ReplicationPad2d(_EdgePadNd):
    """Pad the last two dims by repeating their edge values: padding an int or (left, right, top, bottom)."""

    _mode = "replicate"

    def __init__(self, padding: Any):
        super().__init__(padding, 2)


class ReplicationPad3d(_EdgePadNd):
    """Pad the last three dims by repeating their edge values: padding an int or a tuple of 6."""

    _mode = "replicate"

    def __init__(self, padding: Any):
        super().__init__(padding, 3)


def _symmetric_indices(size: int, before: int, after: int) -> np.ndarray:
    """The source position of each output position along a dim mirrored with its edge repeated (SYMMETRIC)."""
    folded = np.arange(-before, size + after) % (2 * size)
    return np.where(folded < size, folded, 2 * size - 1 - folded)


class Pad(Cell):
    """Pad with paddings ((before, after) for each dim from the first, at most 4 dims): mode 'CONSTANT' (zeros),
    'REFLECT' (mirror, edge not repeated; pads < the dim's size) or 'SYMMETRIC' (mirror, edge repeated; pads <= the
    dim's size).

    >>> from tessel import nn
    >>> pad = nn.Pad(paddings=((1, 1), (2, 2)), mode="CONSTANT")
    """

    def __init__(self, paddings: tuple, mode: str = "CONSTANT"):
        super().__init__()
        if mode not in ("CONSTANT", "REFLECT", "SYMMETRIC"):
            raise ValueError(
                f"For 'Pad', the 'mode' should be in ['CONSTANT', 'REFLECT', 'SYMMETRIC'], but got {mode}."
            )
        if not isinstance(paddings, tuple):
            raise TypeError(f"For 'Pad', the type of 'paddings' must be tuple, but got {type(paddings).__name__}.")
        for item in paddings:
            if len(item) != 2:
                raise ValueError(f"For 'Pad', the dimension of 'paddings' must be (n, 2), but got {paddings}.")
        if len(paddings) > 4:
            raise ValueError(f"For 'Pad', only 'paddings' up to 4 dims is supported, but got {len(paddings)}.")
        self.mode, self.paddings = mode, paddings

    def construct(self, x):
        if len(self.paddings) != x.ndim:
            raise ValueError(f"For 'Pad', 'paddings' must have one (before, after) per dim of x {tuple(x.shape)}.")
        for axis, (before, after) in enumerate(self.paddings):
            size = x.shape[axis]
            most = size - 1 if self.mode == "REFLECT" else size
            if min(before, after) < 0 or (self.mode != "CONSTANT" and max(before, after) > most):
                raise ValueError(
                    f"For 'Pad' in mode {self.mode}, the paddings of dim {axis} (size {size}) must be >= 0"
                    + (f" and <= {most}" if self.mode != "CONSTANT" else "")
                    + f", but got {(before, after)}."
                )
        if self.mode == "REFLECT":
            pads = tuple(p for pair in reversed(self.paddings) for p in pair)
            return _mint_functional().pad(x, pads, "reflect")
        if self.mode == "CONSTANT":
            return _mint_functional().pad(x, tuple(p for pair in reversed(self.paddings) for p in pair), "constant")
        out = x
        for axis, (before, after) in enumerate(self.paddings):
            if before or after:
                index = _symmetric_indices(x.shape[axis], before, after).astype(np.int32)
                out = F.gather(out, Tensor(index), axis)
        return out


class ChannelShuffle(Cell):
    """Channels (dim 1) split into `groups` groups and interleaved: (N, g, C / g, ...) transposed to (N, C / g, g,
    ...), then back to x's shape."""

    def __init__(self, groups: int):
        super().__init__()
        if not isinstance(groups, int):
            raise TypeError(f"For ChannelShuffle, the param `groups` must be int, but got {type(groups)}.")
        if groups < 1:
            raise ValueError(f"For ChannelShuffle, the param `groups` must be larger than 0, but got {groups}.")
        self.groups = groups

    def construct(self, x):
        if x.ndim < 3 or x.shape[1] % self.groups:
            raise ValueError(
                f"For ChannelShuffle, x must have at least 3 dims and channels divisible by groups {self.groups}, "
                f"got shape {tuple(x.shape)}."
            )
        batch, channels = x.shape[0], x.shape[1]
        out = F.reshape(x, (batch, self.groups, channels // self.groups, -1))
        return F.reshape(F.transpose(out, (0, 2, 1, 3)), tuple(x.shape))


class PixelShuffle(Cell):
    """(*, C * r^2, H, W) to (*, C, H * r, W * r) for r = upscale_factor."""

    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = upscale_factor

    def construct(self, input):
        _check_factor("pixel_shuffle", "upscale_factor", self.upscale_factor, input)
        return _mint_functional().pixel_shuffle(input, self.upscale_factor)


class PixelUnshuffle(Cell):
    """(*, C, H * r, W * r) to (*, C * r^2, H, W) for r = downscale_factor: PixelShuffle's inverse."""

    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = downscale_factor

    def construct(self, input):
        r = _check_factor("pixel_unshuffle", "downscale_factor", self.downscale_factor, input)
        *batch, channels, height, width = input.shape
        if height % r or width % r:
            raise ValueError(
                f"For 'pixel_unshuffle', the height {height} and width {width} must be divisible by "
                f"downscale_factor {r}."
            )
        lead = len(batch)
        out = F.reshape(input, (*batch, channels, height // r, r, width // r, r))
        perm = (*range(lead), lead, lead + 2, lead + 4, lead + 1, lead + 3)
        return F.reshape(F.transpose(out, perm), (*batch, channels * r * r, height // r, width // r))


def _check_factor(op: str, name: str, factor: Any, input: Any) -> int:
    if isinstance(factor, bool) or not isinstance(factor, int):
        raise TypeError(f"For '{op}', the type of '{name}' must be int, but got {type(factor).__name__}.")
    if factor <= 0:
        raise ValueError(f"For '{op}', the '{name}' must be positive, but got {factor}.")
    if input.ndim < 3:
        raise ValueError(f"For '{op}', the dimension of input must be at least 3, but got {input.ndim}.")
    return factor
