"""1-D and adaptive pooling cells, MindSpore's: MaxPool1d and AvgPool1d run the 2-D pools over (N, C, 1, L);
AdaptiveAvgPool1d / AdaptiveMaxPool1d need L divisible by output_size (one window of L / output_size, as
MindSpore's); AdaptiveAvgPool2d / AdaptiveMaxPool2d take any sizes (ops.adaptive_avg_pool2d's bins)."""

from __future__ import annotations

from typing import Any

from tessel.common.support import not_supported_yet
from tessel.core.errors import ConfigurationError
from tessel.nn.cell import Cell
from tessel.nn.conv import _int_arg
from tessel.ops import composed as C
from tessel.ops import functional as F
from tessel.ops.adaptive import adaptive_avg_pool2d, adaptive_max_pool2d, check_output_size
from tessel.ops.nn_functional import pool2d


def _pool_size(owner: str, name: str, value: Any) -> int:
    """kernel_size / stride of a 1-D pool: an int, or a one-element tuple of one (MindSpore unwraps it)."""
    return _int_arg(name, owner, value[0] if isinstance(value, tuple) and len(value) == 1 else value)


def _pad_mode(owner: str, pad_mode: Any) -> str:
    if not isinstance(pad_mode, str) or pad_mode.lower() not in ("valid", "same", "pad"):
        raise ConfigurationError(f"{owner}: pad_mode must be 'valid', 'same' or 'pad', got {pad_mode!r}")
    return pad_mode.lower()


def _padding(owner: str, padding: Any) -> int:
    """MindSpore's 1-D padding: an int >= 0 or a one-element tuple/list of one, both ends of L."""
    value = padding[0] if isinstance(padding, (tuple, list)) and len(padding) == 1 else padding
    return _int_arg("padding", owner, value, 0)


class _Pool1d(Cell):
    def __init__(self, kernel_size: Any, stride: Any, pad_mode: Any, padding: Any):
        super().__init__()
        owner = self.cls_name
        self.kernel_size, self.stride = (
            _pool_size(owner, "kernel_size", kernel_size),
            _pool_size(owner, "stride", stride),
        )
        self.pad_mode, self.padding = _pad_mode(owner, pad_mode), _padding(owner, padding)

    def _pool(self, x, kind: str, **attrs: Any):
        """The 2-D pool over x as (N, C, 1, L); a (C, L) input is one sample, as MindSpore's."""
        unbatched = len(x.shape) == 2
        if len(x.shape) not in (2, 3):
            raise ConfigurationError(f"{self.cls_name}: the input must be (N, C, L) or (C, L), got shape {x.shape}")
        x = F.expand_dims(x, 0) if unbatched else x
        out = pool2d(
            kind,
            F.expand_dims(x, 2),
            (1, self.kernel_size),
            (1, self.stride),
            (0, 0, self.padding, self.padding),
            self.pad_mode,
            self.cls_name,
            **attrs,
        )
        out = F.squeeze(out, 2)
        return F.squeeze(out, 0) if unbatched else out

    def extend_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, pad_mode={self.pad_mode.upper()}"


class MaxPool1d(_Pool1d):
    """Max over kernel_size windows of L, moving by stride; input (N, C, L) or (C, L). `padding` (both ends, never
    chosen) needs pad_mode='pad', as MindSpore's."""

    def __init__(
        self,
        kernel_size: Any = 1,
        stride: Any = 1,
        pad_mode: str = "valid",
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ):
        super().__init__(kernel_size, stride, pad_mode, padding)
        options = {"dilation": dilation not in (1, (1,)), "return_indices": return_indices, "ceil_mode": ceil_mode}
        if self.pad_mode != "pad" and (self.padding or any(options.values())):
            raise ConfigurationError(
                f"MaxPool1d: padding, dilation, return_indices and ceil_mode need pad_mode='pad' (got "
                f"pad_mode={self.pad_mode!r}), as MindSpore's; drop them or pass pad_mode='pad'"
            )
        for name, given in options.items():
            if given:
                raise not_supported_yet(f"MaxPool1d({name}=...)", "tessel's MaxPool1d takes the default; drop it")

    def construct(self, x):
        return self._pool(x, "MaxPool")


class AvgPool1d(_Pool1d):
    """Mean over kernel_size windows of L, moving by stride; input (N, C, L) or (C, L). As MindSpore's: padding
    counts in the mean unless count_include_pad=False; and without padding, an input of at most kernel_size +
    stride - 1 elements gives one window, the mean of its first kernel_size elements, even with pad_mode='same'."""

    def __init__(
        self,
        kernel_size: Any = 1,
        stride: Any = 1,
        pad_mode: str = "valid",
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ):
        super().__init__(kernel_size, stride, pad_mode, padding)
        if ceil_mode:
            raise not_supported_yet("AvgPool1d(ceil_mode=True)", "output sizes round down; pad with padding instead")
        if self.padding and self.pad_mode != "pad":
            raise ConfigurationError(f"AvgPool1d: padding={padding!r} needs pad_mode='pad', got {pad_mode!r}")
        self.count_include_pad = bool(count_include_pad)
        # MindSpore's AvgPool path (no padding of any kind asked for) has the one-window shortcut
        self.one_window_shortcut = self.pad_mode != "pad" and self.count_include_pad

    def construct(self, x):
        if self.one_window_shortcut and x.shape[-1] - self.kernel_size < self.stride:
            return F.mean(C.narrow(x, -1, 0, self.kernel_size), -1, keep_dims=True)
        include = self.count_include_pad and self.pad_mode != "same"
        return self._pool(x, "AvgPool", count_include_pad=include)


def _adaptive_1d(cell: Cell, x: Any, kind: str):
    """MindSpore's rule: (N, C, L) float input, L divisible by output_size; one window of L / output_size."""
    shape, out = tuple(x.shape), cell.output_size
    if len(shape) != 3:
        raise ConfigurationError(f"{cell.cls_name}: the input must be 3-D (N, C, L), got shape {shape}")
    if shape[2] % out:
        raise ConfigurationError(
            f"{cell.cls_name}: the input's last dim {shape[2]} must be divisible by output_size {out}, as "
            f"MindSpore's; use AdaptiveAvgPool2d on x.expand_dims(2) for uneven bins"
        )
    if not x.dtype.is_float:
        raise TypeError(f"{cell.cls_name}: the input must be a float tensor, got {x.dtype}")
    size = shape[2] // out
    return F.squeeze(pool2d(kind, F.expand_dims(x, 2), (1, size), (1, size), 0, "valid", cell.cls_name), 2)


class AdaptiveAvgPool1d(Cell):
    """Mean over output_size equal windows of L (L divisible by output_size, as MindSpore's); input (N, C, L)."""

    def __init__(self, output_size: int):
        super().__init__()
        self.output_size = _int_arg("output_size", "AdaptiveAvgPool1d", output_size)

    def construct(self, input):
        return _adaptive_1d(self, input, "AvgPool")


class AdaptiveMaxPool1d(Cell):
    """Max over output_size equal windows of L (L divisible by output_size, as MindSpore's); input (N, C, L)."""

    def __init__(self, output_size: int):
        super().__init__()
        self.output_size = _int_arg("output_size", "AdaptiveMaxPool1d", output_size)

    def construct(self, x):
        return _adaptive_1d(self, x, "MaxPool")


class AdaptiveAvgPool2d(Cell):
    """ops.adaptive_avg_pool2d of an (N, C, H, W) or (C, H, W) input: output_size an int or an (h, w) pair whose
    None entries keep the input's size."""

    def __init__(self, output_size: Any):
        super().__init__()
        check_output_size("AdaptiveAvgPool2d", output_size)
        self.output_size = output_size

    def construct(self, input):
        return adaptive_avg_pool2d(input, self.output_size)


class AdaptiveMaxPool2d(Cell):
    """ops.adaptive_max_pool2d of an (N, C, H, W) or (C, H, W) input: output_size an int or an (h, w) pair whose
    None entries keep the input's size. return_indices=True is not supported yet."""

    def __init__(self, output_size: Any, return_indices: bool = False):
        super().__init__()
        if return_indices:
            raise not_supported_yet("AdaptiveMaxPool2d(return_indices=True)", "it returns the maxima only")
        check_output_size("AdaptiveMaxPool2d", output_size)
        self.output_size, self.return_indices = output_size, return_indices

    def construct(self, input):
        return adaptive_max_pool2d(input, self.output_size)
