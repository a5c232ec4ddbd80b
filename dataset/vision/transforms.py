"""Image transforms (MindSpore `mindspore.dataset.vision`), vectorized over blocks of rows.

Images are HWC (or HW) per row, as MindSpore decodes them; arithmetic is float32 like MindSpore's CPU kernels.
Random transforms draw their parameters per row from the pipeline's seeded stream, so a run is reproducible from
(seed, epoch).

>>> import numpy as np
>>> image = np.full((28, 28, 1), 255, dtype=np.uint8)
>>> HWC2CHW()(Normalize(mean=(0.5,), std=(0.5,))(Rescale(1 / 255, 0)(image))).shape
(1, 28, 28)
"""

from __future__ import annotations

import enum
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError
from tessel.core.options import check_type
from tessel.dataset.sampling import RowRandom
from tessel.dataset.transforms.base import Transform, register, resolve_dtype


class Inter(enum.Enum):
    """Interpolation modes of Resize (MindSpore `vision.Inter`); BILINEAR is LINEAR. The others are MindSpore's
    names, refused by Resize as not supported yet."""

    LINEAR = "LINEAR"
    BILINEAR = "LINEAR"
    NEAREST = "NEAREST"
    CUBIC = "CUBIC"
    BICUBIC = "CUBIC"
    AREA = "AREA"
    PILCUBIC = "PILCUBIC"
    ANTIALIAS = "ANTIALIAS"


class Border(enum.Enum):
    """Padding modes (MindSpore `vision.Border`), as numpy.pad modes."""

    CONSTANT = "constant"
    EDGE = "edge"
    REFLECT = "reflect"
    SYMMETRIC = "symmetric"


def _enum(enum_type: type[enum.Enum], value: Any, where: str) -> enum.Enum:
    if isinstance(value, enum_type):
        return value
    for member in enum_type:
        if str(value).upper() in (member.name, str(member.value).upper()):
            return member
    raise ConfigurationError(f"{where}: {value!r} is not one of {[m.name for m in enum_type]}")


def _size_pair(size: int | Sequence[int], where: str) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0 for v in pair):
        raise ConfigurationError(f"{where}: size must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


def _float32_result(x: np.ndarray) -> np.ndarray | None:
    """`x` itself when a float32 result may overwrite it: the pipeline's own block (it owns its memory)."""
    return x if x.dtype == np.float32 and x.flags.owndata and x.flags.writeable else None


def _check_image(transform: Transform, x: np.ndarray) -> None:
    if x.ndim not in (3, 4) or x.dtype.kind not in "uifb":
        raise transform.reject(
            x, "numeric images of shape <H, W> or <H, W, C>", "apply it before batch() and to the image column"
        )


@register
class Rescale(Transform):
    """`x * rescale + shift` in float32 (uint8 pixels to [0, 1] with Rescale(1.0 / 255.0, 0))."""

    def __init__(self, rescale: float, shift: float):
        check_type(rescale, numbers.Number, "vision.Rescale", "rescale")
        check_type(shift, numbers.Number, "vision.Rescale", "shift")
        self.rescale, self.shift = np.float32(rescale), np.float32(shift)
        self._params = {"rescale": float(rescale), "shift": float(shift)}

    def apply_rows(self, x: np.ndarray, rng: RowRandom) -> np.ndarray:
        if x.dtype.kind not in "uifb":
            raise self.reject(x, "numeric rows", "decode the images first")
        out = np.multiply(x, self.rescale, out=_float32_result(x), dtype=np.float32)
        if self.shift:
            out += self.shift
        return out


@register
class Normalize(Transform):
    """`(x - mean) / std` per channel in float32; `is_hwc` says whether channels are last (HWC) or first (CHW).
    Leading axes (a batch of images) are kept, as MindSpore."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], is_hwc: bool = True):
        for name, values in (("mean", mean), ("std", std)):  # MindSpore 2.7.0's types: a list or tuple of numbers
            check_type(values, (list, tuple), "vision.Normalize", name)
            for i, value in enumerate(values):
                check_type(value, (int, float), "vision.Normalize", f"{name}[{i}]")
        check_type(is_hwc, bool, "vision.Normalize", "is_hwc")
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if not mean or len(mean) != len(std):
            raise ConfigurationError(
                f"vision.Normalize: mean {mean} and std {std} need one value per channel, the same number of each"
            )
        if any(not 0 < s <= 255 for s in std) or any(not 0 <= m <= 255 for m in mean):  # MindSpore's check
            raise ConfigurationError(
                f"vision.Normalize: mean values must be in [0, 255] and std values in (0, 255], got {mean}, {std}"
            )
        self.is_hwc = bool(is_hwc)
        self.mean, self.std = np.float32(mean), np.float32(std)
        self._params = {"mean": mean, "std": std, "is_hwc": self.is_hwc}

    def apply_rows(self, x: np.ndarray, rng: RowRandom) -> np.ndarray:
        # MindSpore 2.7.0 normalizes <H, W> and any <..., H, W, C> (or <..., C, H, W>): batched images too.
        if x.ndim < 3 or x.dtype.kind not in "uifb":
            raise self.reject(x, "numeric images <H, W>, <..., H, W, C> or <..., C, H, W>", "map it over images")
        channels = 1 if x.ndim == 3 else x.shape[-1] if self.is_hwc else x.shape[-3]
        mean, std = self.mean, self.std
        if len(mean) == 1 and channels > 1:  # MindSpore copies one mean/std to every channel
            mean, std = np.repeat(mean, channels), np.repeat(std, channels)
        if channels != len(mean):
            layout = "HWC" if self.is_hwc else "CHW"
            raise self.reject(
                x,
                f"{len(self.mean)} channel(s) in {layout} layout to match mean/std",
                "give one mean/std per channel or set is_hwc to the image layout",
            )
        if x.ndim > 3 and not self.is_hwc:
            mean, std = mean[:, None, None], std[:, None, None]
        out = np.subtract(x, mean, out=_float32_result(x), dtype=np.float32)
        out /= std
        return out


@register
class HWC2CHW(Transform):
    """<H, W, C> to <C, H, W>; <H, W> stays unchanged (MindSpore's rule)."""

    def __init__(self):
        self._params = {}

    def apply_rows(self, x: np.ndarray, rng: RowRandom) -> np.ndarray:
        _check_image(self, x)
        return x if x.ndim == 3 else np.ascontiguousarray(np.moveaxis(x, 3, 1))


@register
class ToTensor(Transform):
    """HWC pixels in [0, 255] to CHW in [0, 1] of `output_type` (float32); <H, W> becomes <1, H, W>."""

    def __init__(self, output_type: Any = np.float32):
        self.dtype = resolve_dtype(output_type, "vision.ToTensor")
        self._params = {"output_type": self.dtype.name}

    def apply_rows(self, x: np.ndarray, rng: RowRandom) -> np.ndarray:
        _check_image(self, x)
        chw = x[:, None] if x.ndim == 3 else np.moveaxis(x, 3, 1)
        out = np.divide(chw, np.float32(255.0), dtype=np.float32)
        return out.astype(self.dtype, copy=False)


def _linear_weights(out_len: int, in_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Pixel centres aligned as in OpenCV's INTER_LINEAR: src = (dst + 0.5) * in/out - 0.5, clamped to the image.
    src = np.clip((np.arange(out_len) + 0.5) * (in_len / out_len) - 0.5, 0, in_len - 1)
    low = np.floor(src).astype(np.intp)
    return low, np.minimum(low + 1, in_len - 1), (src - low).astype(np.float32)


_COEF_ONE = 2048  # OpenCV's INTER_RESIZE_COEF_SCALE: 11-bit fixed-point weights


def _fixed_weights(out_len: int, in_len: int, clamp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(first source index, second, their 11-bit weights) per output index, as OpenCV's INTER_LINEAR computes them
    for 8-bit images: f = (float)((d + 0.5) * scale - 0.5), weights round(2048 (1 - frac)) and round(2048 frac).
    Columns (`clamp`) pin an outside position to the edge pixel with weights (2048, 0); rows keep their fraction
    and read the edge row twice."""
    position = ((np.arange(out_len) + 0.5) * (1.0 / (out_len / in_len)) - 0.5).astype(np.float32)
    first = np.floor(position).astype(np.intp)
    frac = (position - first).astype(np.float32)
    if clamp:
        outside = (first < 0) | (first >= in_len - 1)
        frac[outside] = 0.0
        first = np.clip(first, 0, in_len - 1)
    w0 = np.rint((np.float32(1.0) - frac) * _COEF_ONE).astype(np.int32)
    w1 = np.rint(frac * _COEF_ONE).astype(np.int32)
    return np.clip(first, 0, in_len - 1), np.clip(first + 1, 0, in_len - 1), w0, w1


def _resize_linear_uint8(x: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """OpenCV's fixed-point INTER_LINEAR on uint8 images, bit for bit (what MindSpore's Resize gives: measured equal
    on 17 shapes, 27,285 values): rows of integer products along x, then each output row from two of them as its
    vectorized kernel rounds them: ((s0 >> 4) * b0 >> 16) + ((s1 >> 4) * b1 >> 16), + 2, >> 2."""
    in_h, in_w = x.shape[1:3]
    y0, y1, b0, b1 = _fixed_weights(out_h, in_h, clamp=False)
    x0, x1, a0, a1 = _fixed_weights(out_w, in_w, clamp=True)
    trailing = (1,) * (x.ndim - 3)
    a0, a1 = a0.reshape((1, 1, -1, *trailing)), a1.reshape((1, 1, -1, *trailing))
    b0, b1 = b0.reshape((1, -1, 1, *trailing)), b1.reshape((1, -1, 1, *trailing))
    image = x.astype(np.int32)
    rows = image[:, :, x0] * a0 + image[:, :, x1] * a1
    summed = ((rows[:, y0] >> 4) * b0 >> 16) + ((rows[:, y1] >> 4) * b1 >> 16)
    return np.clip((summed + 2) >> 2, 0, 255).astype(np.uint8)


@register
class Resize(Transform):
    """Resize to (height, width), or the shorter side to `size` keeping the aspect ratio; LINEAR or NEAREST."""

    def __init__(self, size: int | Sequence[int], interpolation: Inter | str = Inter.LINEAR):
        self.size = size if isinstance(size, int) else _size_pair(size, "vision.Resize")
        _size_pair(size, "vision.Resize")
        self.interpolation = _enum(Inter, interpolation, "vision.Resize interpolation")
        if self.interpolation not in (Inter.LINEAR, Inter.NEAREST):
            from tessel.core.options import not_supported_yet

            raise not_supported_yet(
                f"mindspore.dataset.vision.Resize(interpolation=Inter.{self.interpolation.name})",
                "tessel resizes with Inter.LINEAR (BILINEAR) or Inter.NEAREST",
            )
        self._params = {"size": self.size, "interpolation": self.interpolation.name}

    def _target(self, height: int, width: int) -> tuple[int, int]:
        if not isinstance(self.size, int):
            return self.size
        # (int)((float)long_side / short_side * size): MindSpore 2.7.0 truncates (measured: 375x500 to 224 gives
        # 224x298, 2x3 to 3 gives 3x4)
        if height <= width:
            return self.size, max(1, int(np.float32(width) / np.float32(height) * np.float32(self.size)))
        return max(1, int(np.float32(height) / np.float32(width) * np.float32(self.size))), self.size

    def apply_rows(self, x: np.ndarray, rng: RowRandom) -> np.ndarray:
        _check_image(self, x)
        out_h, out_w = self._target(x.shape[1], x.shape[2])
        in_h, in_w = x.shape[1:3]
        if self.interpolation is Inter.NEAREST:
            rows = np.minimum((np.arange(out_h) * (in_h / out_h)).astype(np.intp), in_h - 1)
            cols = np.minimum((np.arange(out_w) * (in_w / out_w)).astype(np.intp), in_w - 1)
            return x[:, rows][:, :, cols]
        if x.dtype == np.uint8:
            return _resize_linear_uint8(x, out_h, out_w)
        y0, y1, wy = _linear_weights(out_h, in_h)
        x0, x1, wx = _linear_weights(out_w, in_w)
        image = x.astype(np.float32, copy=False)
        wy = wy.reshape((1, -1) + (1,) * (x.ndim - 2))
        wx = wx.reshape((1, 1, -1) + (1,) * (x.ndim - 3))
        top, bottom = image[:, y0], image[:, y1]
        rows = top + (bottom - top) * wy
        left, right = rows[:, :, x0], rows[:, :, x1]
        out = left + (right - left) * wx
        if x.dtype.kind in "iub":  # integers other than uint8: to the nearest, halves up
            info = np.iinfo(x.dtype) if x.dtype.kind != "b" else None
            rounded = np.floor(out + 0.5)
            out = rounded if info is None else np.clip(rounded, info.min, info.max)
        return out.astype(x.dtype, copy=False)


def _padding_widths(padding: int | Sequence[int] | None, where: str) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) from MindSpore's 1-, 2- or 4-value padding."""
    if padding is None:
        return 0, 0, 0, 0
    values = (padding,) if isinstance(padding, int) else tuple(padding)
    if len(values) not in (1, 2, 4) or any(not isinstance(v, (int, np.integer)) or v < 0 for v in values):
        raise ConfigurationError(f"{where}: padding must be one, two or four ints >= 0, got {padding!r}")
    if len(values) == 1:
        return (int(values[0]),) * 4
    if len(values) == 2:
        return int(values[0]), int(values[1]), int(values[0]), int(values[1])
    return tuple(int(v) for v in values)  # type: ignore[return-value]


@register
class RandomCrop(Transform):
    """Crop a random (height, width) window per row, after optional padding (MindSpore's RandomCrop)."""

    random = True

    def __init__(
        self,
        size: int | Sequence[int],
        padding: int | Sequence[int] | None = None,
        pad_if_needed: bool = False,
        fill_value: int | Sequence[int] = 0,
        padding_mode: Border | str = Border.CONSTANT,
    ):
        self.height, self.width = _size_pair(size, "vision.RandomCrop")
        self.padding = _padding_widths(padding, "vision.RandomCrop")
        self.pad_if_needed = bool(pad_if_needed)
        self.fill_value = fill_value if isinstance(fill_value, int) else tuple(int(v) for v in fill_value)
        self.padding_mode = _enum(Border, padding_mode, "vision.RandomCrop padding_mode")
        self._params = {
            "size": (self.height, self.width),
            "padding": self.padding,
            "pad_if_needed": self.pad_if_needed,
            "fill_value": self.fill_value,
            "padding_mode": self.padding_mode.name,
        }

    def _pad(self, x: np.ndarray) -> np.ndarray:
        left, top, right, bottom = self.padding
        if self.pad_if_needed:  # MindSpore's RandomCropOp::ImagePadding: each side by the whole shortfall
            extra_h = max(0, self.height - (x.shape[1] + top + bottom))
            extra_w = max(0, self.width - (x.shape[2] + left + right))
            top, bottom = top + extra_h, bottom + extra_h
            left, right = left + extra_w, right + extra_w
        if not any((left, top, right, bottom)):
            return x
        widths = [(0, 0), (top, bottom), (left, right)] + [(0, 0)] * (x.ndim - 3)
        if self.padding_mode is not Border.CONSTANT:
            return np.pad(x, widths, mode=self.padding_mode.value)
        out = np.pad(x, widths, mode="constant")
        fill = self.fill_value
        if not isinstance(fill, int) and (x.ndim == 3 or x.shape[3] != 3):
            fill = fill[0]  # MindSpore pads an image of one channel (or none) with the first of the three values
        if np.any(fill):
            mask = np.ones(out.shape[1:3], dtype=bool)
            mask[top : top + x.shape[1], left : left + x.shape[2]] = False
            out[:, mask] = fill
        return out

    def apply_rows(self, x: np.ndarray, rng: RowRandom) -> np.ndarray:
        _check_image(self, x)
        x = self._pad(x)
        rows, height, width = x.shape[:3]
        if height < self.height or width < self.width:
            raise self.reject(
                x,
                f"images of at least {self.height}x{self.width} after padding {self.padding}",
                "pass a smaller size, padding, or pad_if_needed=True",
            )
        tops = rng.integers(0, height - self.height + 1)
        lefts = rng.integers(0, width - self.width + 1)
        row_index = (tops[:, None] + np.arange(self.height))[:, :, None]
        col_index = (lefts[:, None] + np.arange(self.width))[:, None, :]
        return x[np.arange(rows)[:, None, None], row_index, col_index]


@register
class RandomHorizontalFlip(Transform):
    """Mirror each row left-right with probability `prob`."""

    random = True

    def __init__(self, prob: float = 0.5):
        if not 0.0 <= float(prob) <= 1.0:
            raise ConfigurationError(f"vision.RandomHorizontalFlip: prob must be in [0, 1], got {prob!r}")
        self.prob = float(prob)
        self._params = {"prob": self.prob}

    def apply_rows(self, x: np.ndarray, rng: RowRandom) -> np.ndarray:
        _check_image(self, x)
        flip = rng.random() < self.prob
        return np.where(flip.reshape((-1,) + (1,) * (x.ndim - 1)), x[:, :, ::-1], x)


class SliceMode(enum.Enum):
    """What SlicePatches does with rows or columns left over when H or W is not a multiple of the patch count
    (MindSpore `vision.SliceMode`): PAD pads the bottom and right with fill_value, DROP drops them."""

    PAD = 0
    DROP = 1


# Element types MindSpore's SlicePatches (an OpenCV kernel) takes; bool images come back as uint8.
_OPENCV_KINDS = {"uint8", "int8", "uint16", "int16", "int32", "float16", "float32", "float64", "bool"}
_OPENCV_MAX_CHANNELS = 512


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"vision.SlicePatches: {name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= 2**31 - 1:
        raise ConfigurationError(f"vision.SlicePatches: {name} must be in [1, 2147483647], got {value}")
    return int(value)


@register
class SlicePatches(Transform):
    """Cut each <H, W> or <H, W, C> image into num_height x num_width patches, returned row by row (patch i * num_width
    + j covers rows i*h.. and columns j*w..), one output column per patch. With SliceMode.PAD the patch size is
    ceil(H / num_height) x ceil(W / num_width) and the image is padded at the bottom and right with fill_value; with
    SliceMode.DROP it is floor(...) and the remainder is dropped. 1 x 1 returns the image unchanged.

    A <C, H, W> image is read as <H, W, C>, as MindSpore does: SlicePatches(1, 4) on a (1, 28, 28) image gives four
    (1, 7, 28) patches (its rows 7k..7k+6).

    >>> import numpy as np
    >>> top, bottom = SlicePatches(2, 1)(np.arange(6, dtype=np.uint8).reshape(3, 2))
    >>> bottom.tolist()
    [[4, 5], [0, 0]]
    """

    def __init__(
        self,
        num_height: int = 1,
        num_width: int = 1,
        slice_mode: SliceMode | str = SliceMode.PAD,
        fill_value: int = 0,
    ):
        self.num_height, self.num_width = _count(num_height, "num_height"), _count(num_width, "num_width")
        if not isinstance(slice_mode, (SliceMode, str)):
            raise TypeError(f"vision.SlicePatches: slice_mode must be a SliceMode, got {type(slice_mode).__name__}")
        self.slice_mode = _enum(SliceMode, slice_mode, "vision.SlicePatches slice_mode")
        if isinstance(fill_value, bool) or not isinstance(fill_value, (int, np.integer)):
            raise TypeError(f"vision.SlicePatches: fill_value must be an int, got {type(fill_value).__name__}")
        if not 0 <= fill_value <= 255:
            raise ConfigurationError(f"vision.SlicePatches: fill_value must be in [0, 255], got {fill_value}")
        self.fill_value = int(fill_value)
        self._params = {
            "num_height": self.num_height,
            "num_width": self.num_width,
            "slice_mode": self.slice_mode.name,
            "fill_value": self.fill_value,
        }

    def apply(self, arrays: Sequence[np.ndarray], rng: RowRandom) -> tuple[np.ndarray, ...]:
        if len(arrays) != 1:
            raise ConfigurationError(f"{self!r} takes 1 input column (the image), got {len(arrays)}")
        x = arrays[0]
        if x.ndim < 3:
            raise self.reject(x, "images of rank 2 or more (<H, W> or <H, W, C>)", "map it over the image column")
        if self.num_height == 1 and self.num_width == 1:
            return (x,)
        self._check(x)
        if x.dtype == np.bool_:
            x = x.astype(np.uint8)
        height, width = x.shape[1:3]
        if self.slice_mode is SliceMode.PAD:
            patch_h, patch_w = -(-height // self.num_height), -(-width // self.num_width)
            x = self._pad(x, patch_h * self.num_height - height, patch_w * self.num_width - width)
        else:
            patch_h, patch_w = height // self.num_height, width // self.num_width
        return tuple(
            np.ascontiguousarray(x[:, i * patch_h : (i + 1) * patch_h, j * patch_w : (j + 1) * patch_w])
            for i in range(self.num_height)
            for j in range(self.num_width)
        )

    def _check(self, x: np.ndarray) -> None:
        if x.ndim > 4:
            raise self.reject(x, "images of shape <H, W> or <H, W, C>", "map it over the image column, before batch()")
        if x.dtype.name not in _OPENCV_KINDS:
            raise self.reject(
                x, f"images of dtype {sorted(_OPENCV_KINDS)} (as MindSpore's OpenCV kernel)", "cast the image first"
            )
        if x.ndim == 4 and x.shape[3] > _OPENCV_MAX_CHANNELS:
            raise self.reject(x, f"at most {_OPENCV_MAX_CHANNELS} channels (OpenCV's limit)", "slice fewer channels")
        for axis, count, name in ((1, self.num_height, "height"), (2, self.num_width, "width")):
            if count > x.shape[axis]:
                raise self.reject(
                    x, f"a {name} of at least num_{name}={count}", f"use at most {x.shape[axis]} patches along {name}"
                )

    def _pad(self, x: np.ndarray, bottom: int, right: int) -> np.ndarray:
        if not bottom and not right:
            return x
        fill: Any = self.fill_value
        if x.dtype.kind in "iu":  # saturate as OpenCV does (int8: 200 -> 127)
            info = np.iinfo(x.dtype)
            fill = min(max(fill, info.min), info.max)
        widths = [(0, 0), (0, bottom), (0, right)] + [(0, 0)] * (x.ndim - 3)
        return np.pad(x, widths, mode="constant", constant_values=np.asarray(fill).astype(x.dtype))
