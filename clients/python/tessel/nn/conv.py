"""Convolution and pooling over NCHW: Conv2d (MindSpore defaults: pad_mode='same', no bias), MaxPool2d, AvgPool2d."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from tessel.common.dtype import DType
from tessel.common.initializer import HeUniform, Uniform
from tessel.common.support import keyword_options
from tessel.core.errors import ConfigurationError
from tessel.nn.cell import Cell
from tessel.nn.layers import _positive, make_parameter, require_float
from tessel.ops import functional as F
from tessel.ops import primitive
from tessel.ops.nn_functional import check_data_format, pool2d


def _pair(value: Any, name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 1 for v in pair):
        raise ConfigurationError(f"{name} must be a positive int or a pair of them, got {value!r}")
    return pair


def _pad_mode(pad_mode: str, padding: Any) -> str:
    pad_mode = pad_mode.lower()
    if pad_mode not in ("same", "valid", "pad"):
        raise ConfigurationError(f"pad_mode must be 'same', 'valid' or 'pad', got {pad_mode!r}")
    if pad_mode != "pad" and padding not in (0, (0, 0, 0, 0)):
        raise ConfigurationError(f"padding={padding!r} needs pad_mode='pad' (got {pad_mode!r})")
    return pad_mode


class Conv2d(Cell):
    """2-D convolution; weight (out_channels, in_channels / group, kh, kw).

    As in MindSpore, the convolution and the bias are the primitives `self.conv2d` (Conv2D) and `self.bias_add`
    (BiasAdd), so semi-auto parallelism shards them: `net.conv.conv2d.shard(((2, 1, 1, 1), (1, 1, 1, 1)))`.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        pad_mode: str = "same",
        padding: Any = 0,
        dilation: Any = 1,
        group: int = 1,
        has_bias: bool = False,
        weight_init: Any = None,
        bias_init: Any = None,
        data_format: str = "NCHW",
        dtype: Any = DType.float32,
    ):
        super().__init__()
        _positive("Conv2d", in_channels=in_channels, out_channels=out_channels, group=group)
        if in_channels % group or out_channels % group:
            raise ConfigurationError(f"Conv2d: in/out channels ({in_channels}, {out_channels}) must divide by group")
        check_data_format("nn.Conv2d", data_format)
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride, self.dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
        self.pad_mode, self.padding, self.group = _pad_mode(pad_mode, padding), padding, group
        self.in_channels, self.out_channels, self.has_bias = in_channels, out_channels, has_bias
        shape = (out_channels, in_channels // group, *self.kernel_size)
        self.weight = make_parameter(
            HeUniform(math.sqrt(5)) if weight_init is None else weight_init, shape, dtype, "weight"
        )
        fan_in = in_channels // group * math.prod(self.kernel_size)
        bias_init = Uniform(1.0 / math.sqrt(fan_in)) if bias_init is None else bias_init
        self.bias = make_parameter(bias_init, (out_channels,), dtype, "bias") if has_bias else None
        pad = padding if isinstance(padding, int) else tuple(int(p) for p in padding)
        self.conv2d = primitive.Conv2D(
            out_channels,
            self.kernel_size,
            pad_mode=self.pad_mode,
            pad=pad,
            stride=self.stride,
            dilation=self.dilation,
            group=group,
        )
        self.bias_add = primitive.BiasAdd()

    def construct(self, x):
        require_float(self, x)
        out = self.conv2d(x, self.weight)
        return self.bias_add(out, self.bias) if self.has_bias else out

    def extend_repr(self) -> str:
        return (
            f"input_channels={self.in_channels}, output_channels={self.out_channels}, "
            f"kernel_size={self.kernel_size}, stride={self.stride}, pad_mode={self.pad_mode}"
        )


class _Pool2d(Cell):
    _unsupported: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {}  # MindSpore's other options, "off" values

    def __init__(self, kernel_size: Any, stride: Any, pad_mode: str, padding: Any, data_format: str, options: dict):
        super().__init__()
        name = type(self).__name__
        check_data_format(f"nn.{name}", data_format)
        keyword_options(name, options, unsupported=self._unsupported)
        # MindSpore's pooling cells take a one-element tuple as its element: MaxPool2d((2,), (2,)) is MaxPool2d(2, 2)
        unwrap = lambda v: v[0] if isinstance(v, tuple) and len(v) == 1 else v  # noqa: E731
        self.kernel_size, self.stride = _pair(unwrap(kernel_size), "kernel_size"), _pair(unwrap(stride), "stride")
        self.pad_mode, self.padding = _pad_mode(pad_mode, padding), padding
        self.options = options

    def _pool(self, x, kind: str, **attrs: Any):
        # MindSpore takes an unbatched (C, H, W) input too: it pools it as a batch of one
        unbatched = len(x.shape) == 3
        if unbatched:
            x = F.expand_dims(x, 0)
        out = pool2d(kind, x, self.kernel_size, self.stride, self.padding, self.pad_mode, type(self).__name__, **attrs)
        return F.squeeze(out, 0) if unbatched else out


class MaxPool2d(_Pool2d):
    """Max over kernel_size windows, moving by stride; input (N, C, H, W) or (C, H, W). MindSpore's arguments, in
    its order."""

    _unsupported: ClassVar = {
        "dilation": ((1, (1, 1)), "tessel pools over adjacent elements; drop dilation"),
        "return_indices": ((False,), "MaxPool2d returns the maxima only"),
        "ceil_mode": ((False,), "output sizes round down; pad the input with pad_mode='pad' instead"),
    }

    def __init__(
        self,
        kernel_size: Any = 1,
        stride: Any = 1,
        pad_mode: str = "valid",
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
        data_format: str = "NCHW",
    ):
        options = {"dilation": dilation, "return_indices": return_indices, "ceil_mode": ceil_mode}
        super().__init__(kernel_size, stride, pad_mode, padding, data_format, options)

    def construct(self, x):
        return self._pool(x, "MaxPool")


class AvgPool2d(_Pool2d):
    """Mean over kernel_size windows (count_include_pad=True by default, as MindSpore); input (N, C, H, W) or
    (C, H, W). With pad_mode='same' the padding never counts, whatever count_include_pad says: MindSpore runs that
    case as the AvgPool primitive (or AvgPool3D with its 'same' padding), whose mean is over the window's input
    elements only."""

    _unsupported: ClassVar = {
        "count_include_pad": ((True, False), ""),  # both work
        "ceil_mode": ((False,), "output sizes round down; pad the input with pad_mode='pad' instead"),
        "divisor_override": ((None, 0), "AvgPool2d divides by the window's size"),
    }

    def __init__(
        self,
        kernel_size: Any = 1,
        stride: Any = 1,
        pad_mode: str = "valid",
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: Any = None,
        data_format: str = "NCHW",
    ):
        options = {"ceil_mode": ceil_mode, "count_include_pad": count_include_pad, "divisor_override": divisor_override}
        super().__init__(kernel_size, stride, pad_mode, padding, data_format, options)

    def construct(self, x):
        include = self.options["count_include_pad"] and self.pad_mode != "same"
        return self._pool(x, "AvgPool", count_include_pad=include)
