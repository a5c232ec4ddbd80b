"""Convolution and pooling: Conv2d, Conv1d, Conv2dTranspose, Conv1dTranspose (MindSpore defaults: pad_mode='same', no
bias), MaxPool2d, AvgPool2d. The 1-D cells run the 2-D ops over (N, C, 1, L), as MindSpore's do, so their weights
are 4-D too: (out, in / group, 1, k) and, transposed, (in, out / group, 1, k)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from tessel.common.dtype import DType
from tessel.common.initializer import HeUniform, Uniform
from tessel.common.support import keyword_options
from tessel.common.tracing import apply_op
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


def _conv_weights(cell: Cell, in_channels, out_channels, group, shape, has_bias, weight_init, bias_init, dtype):
    """MindSpore's _Conv parameters: weight HeUniform(sqrt(5)) and bias Uniform(1 / sqrt(fan_in)), fan_in being
    shape[1] * kernel size (so in / group for a convolution and out / group for a transposed one)."""
    name = cell.cls_name
    _positive(name, in_channels=in_channels, out_channels=out_channels, group=group)
    if in_channels % group or out_channels % group:
        raise ConfigurationError(
            f"{name}: in/out channels ({in_channels}, {out_channels}) must divide by group={group}"
        )
    cell.in_channels, cell.out_channels, cell.group, cell.has_bias = in_channels, out_channels, group, has_bias
    cell.weight = make_parameter(
        HeUniform(math.sqrt(5)) if weight_init is None else weight_init, shape, dtype, "weight"
    )
    bias_init = Uniform(1.0 / math.sqrt(math.prod(shape[1:]))) if bias_init is None else bias_init
    cell.bias = make_parameter(bias_init, (out_channels,), dtype, "bias") if has_bias else None


def _int_arg(name: str, owner: str, value: Any, low: int = 1) -> int:
    """An int argument of a 1-D cell: a TypeError for another type (a tuple too), as MindSpore's."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be an int, got {value!r}; the 1-D cells take ints, e.g. {name}=3")
    if value < low:
        raise ConfigurationError(f"{owner}: {name} must be an int >= {low}, got {value}")
    return value


def _require_ndim(cell: Cell, x: Any, ndim: int, form: str) -> None:
    if len(x.shape) != ndim:
        raise ConfigurationError(
            f"{cell.cls_name}: the input must be {ndim}-D {form}, got shape {tuple(x.shape)}; "
            f"add the batch dim with x.expand_dims(0) (MindSpore's cell takes no unbatched input either)"
        )


def _with_bias(cell: Cell, out):
    return cell.bias_add(out, cell.bias) if cell.has_bias else out


class Conv1d(Cell):
    """1-D convolution over (N, C, L): Conv2D over (N, C, 1, L) with the weight (out_channels, in_channels / group,
    1, kernel_size), as MindSpore's (whose checkpoints it loads). `padding` pads both ends of L."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        pad_mode: str = "same",
        padding: int = 0,
        dilation: int = 1,
        group: int = 1,
        has_bias: bool = False,
        weight_init: Any = None,
        bias_init: Any = None,
        dtype: Any = DType.float32,
    ):
        super().__init__()
        name = "Conv1d"
        self.kernel_size, self.stride = _int_arg("kernel_size", name, kernel_size), _int_arg("stride", name, stride)
        self.dilation, self.padding = _int_arg("dilation", name, dilation), _int_arg("padding", name, padding, 0)
        self.pad_mode = _pad_mode(pad_mode, padding)
        shape = (out_channels, in_channels // max(group, 1), 1, kernel_size)
        _conv_weights(self, in_channels, out_channels, group, shape, has_bias, weight_init, bias_init, dtype)
        self.conv2d = primitive.Conv2D(
            out_channels,
            (1, kernel_size),
            pad_mode=self.pad_mode,
            pad=(0, 0, padding, padding),
            stride=(1, stride),
            dilation=(1, dilation),
            group=group,
        )
        self.bias_add = primitive.BiasAdd()

    def construct(self, x):
        require_float(self, x)
        _require_ndim(self, x, 3, "(N, C, L)")
        out = _with_bias(self, self.conv2d(F.expand_dims(x, 2), self.weight))
        return F.squeeze(out, 2)

    def extend_repr(self) -> str:
        return (
            f"input_channels={self.in_channels}, output_channels={self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, pad_mode={self.pad_mode}, padding={self.padding}, dilation={self.dilation}, "
            f"group={self.group}, has_bias={self.has_bias}"
        )


def transposed_length(pad_mode: str, length: int, kernel: int, stride: int, dilation: int, padding: int) -> int:
    """The output length of a transposed convolution along one dim (MindSpore's _deconv_output_length); `padding`
    is the sum of both ends'."""
    span = (kernel - 1) * dilation + 1
    if pad_mode == "same":
        return length * stride
    if pad_mode == "valid":
        return length * stride + max(span - stride, 0)
    return length * stride - padding + span - stride


class _ConvTranspose(Cell):
    """The transposed convolution as Conv2DBackpropInput (Conv2D's input gradient): weight (in_channels,
    out_channels / group, kh, kw); MindSpore's 'same' and 'pad' pad the output as a Conv2D over it would."""

    def _setup(self, in_channels, out_channels, group, has_bias, weight_init, bias_init, dtype) -> None:
        shape = (in_channels, out_channels // max(group, 1), *self.kernel_size)
        _conv_weights(self, in_channels, out_channels, group, shape, has_bias, weight_init, bias_init, dtype)
        self.bias_add = primitive.BiasAdd()

    def _transpose(self, x):
        """Conv2DBackpropInput over 4-D x with the cell's kernel_size, stride, dilation and pads (top, bottom, left,
        right), then the bias."""
        pads = self.pads
        hw = [
            transposed_length(self.pad_mode, size, k, s, d, before + after)
            for size, k, s, d, before, after in zip(
                x.shape[2:], self.kernel_size, self.stride, self.dilation, pads[0::2], pads[1::2]
            )
        ]
        out = apply_op(
            "Conv2DBackpropInput",
            x,
            self.weight,
            input_shape=(x.shape[0], self.out_channels, *hw),
            stride=self.stride,
            dilation=self.dilation,
            pad_mode=self.pad_mode,
            pad=pads,
            group=self.group,
        )
        return _with_bias(self, out)


class Conv2dTranspose(_ConvTranspose):
    """2-D transposed convolution over (N, C, H, W); weight (in_channels, out_channels / group, kh, kw). Output
    size per dim: 'same' in * stride, 'valid' in * stride + max(span - stride, 0), 'pad' in * stride - pads + span -
    stride, then `output_padding` zero rows/cols at the bottom/right (after the bias, as MindSpore's)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        pad_mode: str = "same",
        padding: Any = 0,
        output_padding: Any = 0,
        dilation: Any = 1,
        group: int = 1,
        has_bias: bool = False,
        weight_init: Any = None,
        bias_init: Any = None,
        dtype: Any = DType.float32,
    ):
        super().__init__()
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride, self.dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
        self.pad_mode, self.padding = _pad_mode(pad_mode, padding), padding
        self.pads = _four_pads(padding, "Conv2dTranspose")
        self.output_padding = _output_padding(output_padding, self.stride, self.dilation, self.pad_mode)
        self._setup(in_channels, out_channels, group, has_bias, weight_init, bias_init, dtype)

    def construct(self, x):
        require_float(self, x)
        _require_ndim(self, x, 4, "(N, C, H, W)")
        out = self._transpose(x)
        if any(self.output_padding):
            extra_h, extra_w = self.output_padding
            out = apply_op("Pad", out, paddings=((0, 0), (0, 0), (0, extra_h), (0, extra_w)))
        return out

    def extend_repr(self) -> str:
        return (
            f"input_channels={self.in_channels}, output_channels={self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, pad_mode={self.pad_mode}, padding={self.padding}, dilation={self.dilation}, "
            f"group={self.group}, has_bias={self.has_bias}"
        )


def _four_pads(padding: Any, owner: str) -> tuple[int, int, int, int]:
    pads = (padding,) * 4 if isinstance(padding, int) else tuple(padding) if isinstance(padding, tuple) else ()
    if len(pads) != 4 or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pads):
        raise ConfigurationError(
            f"{owner}: padding must be an int >= 0 or a tuple (top, bottom, left, right), got {padding!r}"
        )
    return pads


def _output_padding(value: Any, stride, dilation, pad_mode: str) -> tuple[int, int]:
    """MindSpore's rule: each entry in [0, max(stride, dilation)) of its dim, and nonzero only with pad_mode='pad'."""
    pair = (value, value) if isinstance(value, int) else tuple(value) if isinstance(value, tuple) else ()
    if len(pair) != 2 or not all(isinstance(v, int) and 0 <= v < max(s, d) for v, s, d in zip(pair, stride, dilation)):
        raise ConfigurationError(
            f"Conv2dTranspose: output_padding must be an int or an (h, w) pair, each in [0, max(stride, dilation)) "
            f"of its dim (stride={stride}, dilation={dilation}), got {value!r}"
        )
    if any(pair) and pad_mode != "pad":
        raise ConfigurationError(
            f"Conv2dTranspose: output_padding={value!r} needs pad_mode='pad' (got {pad_mode!r}), as MindSpore's"
        )
    return pair


class Conv1dTranspose(_ConvTranspose):
    """1-D transposed convolution over (N, C, L): Conv2dTranspose's op over (N, C, 1, L) with the weight
    (in_channels, out_channels / group, 1, kernel_size), as MindSpore's."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        pad_mode: str = "same",
        padding: int = 0,
        dilation: int = 1,
        group: int = 1,
        has_bias: bool = False,
        weight_init: Any = None,
        bias_init: Any = None,
        dtype: Any = DType.float32,
    ):
        super().__init__()
        name = "Conv1dTranspose"
        kernel_size, stride = _int_arg("kernel_size", name, kernel_size), _int_arg("stride", name, stride)
        dilation, self.padding = _int_arg("dilation", name, dilation), _int_arg("padding", name, padding, 0)
        self.kernel_size, self.stride, self.dilation = (1, kernel_size), (1, stride), (1, dilation)
        self.pad_mode, self.pads = _pad_mode(pad_mode, padding), (0, 0, padding, padding)
        self._setup(in_channels, out_channels, group, has_bias, weight_init, bias_init, dtype)

    def construct(self, x):
        require_float(self, x)
        _require_ndim(self, x, 3, "(N, C, L)")
        return F.squeeze(self._transpose(F.expand_dims(x, 2)), 2)

    def extend_repr(self) -> str:
        return (
            f"input_channels={self.in_channels}, output_channels={self.out_channels}, "
            f"kernel_size={self.kernel_size[1]}, stride={self.stride[1]}, pad_mode={self.pad_mode}, "
            f"padding={self.padding}, dilation={self.dilation[1]}, group={self.group}, has_bias={self.has_bias}"
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
