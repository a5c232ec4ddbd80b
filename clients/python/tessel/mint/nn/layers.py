"""mint.nn's PyTorch-style cells as tessel Cells: convolution, normalisation, embedding, pooling and upsampling,
with MindSpore 2.7's argument names, checks, parameter names and initialisation (mindspore/mint/nn/layer/*.py and
mint/nn/__init__.py), computed by tessel's ops through mint.nn.functional."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tessel import nn as _nn
from tessel.common.dtype import DType
from tessel.common.initializer import HeUniform, Normal, Uniform
from tessel.common.parameter import Parameter
from tessel.common.support import not_supported_yet
from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError
from tessel.mint.nn import functional
from tessel.nn.layers import make_parameter, require_float
from tessel.ops import functional as F

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AvgPool1d",
    "AvgPool2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv1d",
    "Conv2d",
    "ConvTranspose2d",
    "Dropout2d",
    "Embedding",
    "GroupNorm",
    "LayerNorm",
    "MaxPool2d",
    "Upsample",
    "UpsamplingBilinear2d",
    "UpsamplingNearest2d",
]


def _tuple(value: Any, n: int, name: str, owner: str) -> tuple[int, ...]:
    values = (value,) * n if isinstance(value, int) else tuple(value)
    if len(values) != n or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConfigurationError(f"mint.nn.{owner}: {name} must be an int or {n} ints, got {value!r}")
    return values


def _padding_mode(owner: str, padding_mode: str) -> None:
    if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
        raise ConfigurationError(
            f"mint.nn.{owner}: padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got {padding_mode!r}"
        )
    if padding_mode != "zeros":
        raise not_supported_yet(
            f"mindspore.mint.nn.{owner}(padding_mode={padding_mode!r})",
            "tessel pads convolutions with zeros only; pad the input yourself and use padding=0",
        )


class Conv2d(_nn.Conv2d):
    """2-D convolution of (N, C, H, W) inputs; weight (out_channels, in_channels / groups, kH, kW) drawn from
    HeUniform(sqrt(5)) and bias (out_channels,) from Uniform(1 / sqrt(fan_in)), as MindSpore's mint.nn.Conv2d.
    padding is an int, (pad_h, pad_w), 'valid' or 'same' (stride 1 only)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        dtype: Any = None,
    ):
        _padding_mode("Conv2d", padding_mode)
        if not isinstance(bias, bool):
            raise TypeError(f"mint.nn.Conv2d: bias must be a bool, got {bias!r}")
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ConfigurationError(f"mint.nn.Conv2d: padding must be 'valid', 'same' or ints, got {padding!r}")
            if padding == "same" and _tuple(stride, 2, "stride", "Conv2d") != (1, 1):
                raise ConfigurationError("mint.nn.Conv2d: padding='same' is not supported for strided convolutions")
            pad_mode, pads = padding, 0
        else:
            pad_h, pad_w = _tuple(padding, 2, "padding", "Conv2d")
            pad_mode, pads = "pad", (pad_h, pad_h, pad_w, pad_w)
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            pad_mode,
            pads,
            dilation,
            groups,
            bias,
            dtype=dtype or DType.float32,
        )
        # mint's attributes: padding as given (an int, a pair or a string)
        self.groups, self.padding, self.padding_mode = groups, padding, padding_mode


class Conv1d(_nn.Cell):
    """1-D convolution of (N, C, L) inputs; weight (out_channels, in_channels / groups, kernel_size), initialised
    as mint.nn.Conv2d's. It runs the 2-D convolution over (N, C, 1, L)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        dtype: Any = None,
    ):
        super().__init__()
        (kernel,) = _tuple(kernel_size, 1, "kernel_size", "Conv1d")
        (self.stride,) = _tuple(stride, 1, "stride", "Conv1d")
        (self.dilation,) = _tuple(dilation, 1, "dilation", "Conv1d")
        _padding_mode("Conv1d", padding_mode)
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ConfigurationError(f"mint.nn.Conv1d: padding must be 'valid', 'same' or an int, got {padding!r}")
            if padding == "same" and self.stride != 1:
                raise ConfigurationError("mint.nn.Conv1d: padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            (self.padding,) = _tuple(padding, 1, "padding", "Conv1d")
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value % groups:
                raise ConfigurationError(
                    f"mint.nn.Conv1d: {name} must be an int >= 1 dividing by groups, got {value!r}"
                )
        self.kernel_size, self.groups, self.padding_mode = kernel, groups, padding_mode
        self.in_channels, self.out_channels = in_channels, out_channels
        dtype = dtype or DType.float32
        shape = (out_channels, in_channels // groups, kernel)
        self.weight = make_parameter(HeUniform(math.sqrt(5)), shape, dtype, "weight")
        bound = 1.0 / math.sqrt(in_channels // groups * kernel)
        self.bias = make_parameter(Uniform(bound), (out_channels,), dtype, "bias") if bias else None

    def construct(self, input):
        require_float(self, input)
        return functional.conv1d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _BatchNorm(_nn.Cell):
    """mint's BatchNorm: weight/bias (ones/zeros, when affine), running_mean/running_var and num_batches_tracked
    (when track_running_stats); running = (1 - momentum) * running + momentum * batch, the variance unbiased."""

    _ndims: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        dtype: Any = None,
    ):
        super().__init__()
        # mint's norm layers start in training mode (its _NormBase calls set_train()), unlike other cells
        self.set_train()
        if momentum is None:
            raise not_supported_yet(
                f"mindspore.mint.nn.{self.cls_name}(momentum=None)",
                "tessel's running statistics are exponential averages; pass a momentum such as 0.1",
            )
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        dtype = dtype or DType.float32
        shape = (num_features,)
        self.weight = make_parameter("ones", shape, dtype, "weight") if affine else None
        self.bias = make_parameter("zeros", shape, dtype, "bias") if affine else None
        if track_running_stats:
            self.running_mean = make_parameter("zeros", shape, dtype, "running_mean", requires_grad=False)
            self.running_var = make_parameter("ones", shape, dtype, "running_var", requires_grad=False)
            self.num_batches_tracked = Parameter(
                Tensor(np.array(0, np.int64)), name="num_batches_tracked", requires_grad=False
            )
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def construct(self, input):
        if input.ndim not in self._ndims:
            raise ConfigurationError(
                f"mint.nn.{self.cls_name}: expected a {' or '.join(map(str, self._ndims))}-D input, "
                f"got shape {tuple(input.shape)}"
            )
        if self.training and self.track_running_stats:
            F.assign_add(self.num_batches_tracked, Tensor(np.array(1, np.int64)))
        return functional.batch_norm(
            input,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or self.running_mean is None,
            self.momentum,
            self.eps,
        )

    def extend_repr(self) -> str:
        return (
            f"num_features={self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats}"
        )


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of (N, C) or (N, C, L) inputs over all dims but C."""

    _ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of (N, C, H, W) inputs over N, H and W."""

    _ndims = (4,)


class BatchNorm3d(_BatchNorm):
    """Batch normalisation of (N, C, D, H, W) inputs over N, D, H and W."""

    _ndims = (5,)


class LayerNorm(_nn.Cell):
    """Normalise over the last len(normalized_shape) dims, then scale by weight (ones) and shift by bias (zeros)."""

    def __init__(
        self,
        normalized_shape: Any,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        dtype: Any = None,
    ):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        if not isinstance(shape, (tuple, list)):
            raise TypeError(f"mint.nn.LayerNorm: normalized_shape must be an int or ints, got {normalized_shape!r}")
        if not shape:
            raise ConfigurationError("mint.nn.LayerNorm: normalized_shape must have at least one dim")
        self.normalized_shape, self.eps, self.elementwise_affine = tuple(shape), eps, elementwise_affine
        dtype = dtype or DType.float32
        affine = elementwise_affine
        self.weight = make_parameter("ones", self.normalized_shape, dtype, "weight") if affine else None
        self.bias = make_parameter("zeros", self.normalized_shape, dtype, "bias") if affine and bias else None

    def construct(self, input):
        return functional.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extend_repr(self) -> str:
        return f"normalized_shape={self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(_nn.Cell):
    """Normalise each of num_groups channel groups of (N, C, *) inputs; weight (ones) and bias (zeros) per channel,
    trained only when affine."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, dtype: Any = None):
        super().__init__()
        for name, value in (("num_groups", num_groups), ("num_channels", num_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"mint.nn.GroupNorm: {name} must be an int >= 1, got {value!r}")
        if num_channels % num_groups:
            raise ConfigurationError(
                f"mint.nn.GroupNorm: num_channels {num_channels} must divide by num_groups {num_groups}"
            )
        if not isinstance(eps, float):
            raise TypeError(f"mint.nn.GroupNorm: eps must be a float, got {eps!r}")
        if not isinstance(affine, bool):
            raise TypeError(f"mint.nn.GroupNorm: affine must be a bool, got {affine!r}")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        dtype = dtype or DType.float32
        self.weight = make_parameter("ones", (num_channels,), dtype, "weight", requires_grad=affine)
        self.bias = make_parameter("zeros", (num_channels,), dtype, "bias", requires_grad=affine)

    def construct(self, input):
        require_float(self, input)
        return functional.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extend_repr(self) -> str:
        return f"num_groups={self.num_groups}, num_channels={self.num_channels}, eps={self.eps}, affine={self.affine}"


class Embedding(_nn.Cell):
    """Rows of weight (num_embeddings, embedding_dim), drawn from Normal(0, 1), at integer ids; the padding_idx row
    starts at zero and gets no gradient."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: Any = None,
        _freeze: bool = False,
        dtype: Any = None,
    ):
        super().__init__()
        if sparse:
            raise ConfigurationError("mint.nn.Embedding: sparse=True is not supported (MindSpore's neither)")
        for name, value in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"mint.nn.Embedding: {name} must be an int, got {value!r}")
        _embedding_options("mindspore.mint.nn.Embedding", max_norm, scale_grad_by_freq)
        if padding_idx is not None and not -num_embeddings <= padding_idx < num_embeddings:
            raise ConfigurationError(
                f"mint.nn.Embedding: padding_idx must be in [-{num_embeddings}, {num_embeddings}), got {padding_idx}"
            )
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.max_norm, self.norm_type, self.scale_grad_by_freq = max_norm, norm_type, scale_grad_by_freq
        shape = (num_embeddings, embedding_dim)
        if _weight is None:
            table = make_parameter(Normal(1.0, 0.0), shape, dtype or DType.float32, "weight").asnumpy().copy()
            if padding_idx is not None:
                table[padding_idx] = 0
        else:
            table = _weight.asnumpy() if isinstance(_weight, Tensor) else np.asarray(_weight)
            if tuple(table.shape) != shape:
                raise ConfigurationError(f"mint.nn.Embedding: _weight must have shape {shape}, got {table.shape}")
        self.weight = Parameter(table, name="weight", requires_grad=not _freeze)

    def construct(self, input):
        return functional.embedding(input, self.weight, self.padding_idx)

    def extend_repr(self) -> str:
        return (
            f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}, padding_idx={self.padding_idx}"
        )


def _embedding_options(owner: str, max_norm: Any, scale_grad_by_freq: bool) -> None:
    if max_norm is not None:
        raise not_supported_yet(
            f"{owner}(max_norm=...)", "tessel does not renormalise embedding rows; clip the weight after each step"
        )
    if scale_grad_by_freq:
        raise not_supported_yet(
            f"{owner}(scale_grad_by_freq=True)", "tessel does not scale the gradient by id frequency; pass False"
        )


class MaxPool2d(_nn.Cell):
    """The maximum of each kernel_size window of (N, C, H, W) inputs, moved by stride (kernel_size when None)."""

    def __init__(
        self,
        kernel_size: Any = 1,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, kernel_size if stride is None else stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode
        functional.check_max_pool2d(dilation, ceil_mode, return_indices)

    def construct(self, input):
        return functional.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation)


class AvgPool2d(_nn.Cell):
    """The mean of each kernel_size window of (N, C, H, W) inputs, moved by stride (kernel_size when None)."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ):
        super().__init__()
        functional.check_avg_pool2d(ceil_mode, divisor_override)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def construct(self, input):
        return functional.avg_pool2d(input, self.kernel_size, self.stride, self.padding, False, self.count_include_pad)


class _Adaptive(_nn.Cell):
    _fn: Any = None

    def __init__(self, output_size: Any):
        super().__init__()
        self.output_size = output_size

    def construct(self, input):
        return type(self)._fn(input, self.output_size)


class AdaptiveAvgPool1d(_Adaptive):
    """The mean of each of output_size bins of the last dim."""

    _fn = staticmethod(functional.adaptive_avg_pool1d)


class AdaptiveAvgPool2d(_Adaptive):
    """The mean of each of output_size (h, w) bins of the last two dims."""

    _fn = staticmethod(functional.adaptive_avg_pool2d)


class AdaptiveMaxPool1d(_nn.Cell):
    """The maximum of each of output_size bins of the last dim."""

    def __init__(self, output_size: int, return_indices: bool = False):
        super().__init__()
        functional.check_adaptive_max("AdaptiveMaxPool1d", return_indices)
        self.output_size, self.return_indices = output_size, return_indices

    def construct(self, input):
        return functional.adaptive_max_pool1d(input, self.output_size)


class AdaptiveMaxPool2d(_nn.Cell):
    """The maximum of each of output_size (h, w) bins of the last two dims."""

    def __init__(self, output_size: Any, return_indices: bool = False):
        super().__init__()
        functional.check_adaptive_max("AdaptiveMaxPool2d", return_indices)
        self.output_size, self.return_indices = output_size, return_indices

    def construct(self, input):
        return functional.adaptive_max_pool2d(input, self.output_size)


class AvgPool1d(_nn.Cell):
    """The mean of each kernel_size window of the last dim of (N, C, L) inputs."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ):
        super().__init__()
        functional.check_avg_pool2d(ceil_mode, None)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def construct(self, input):
        return functional.avg_pool1d(input, self.kernel_size, self.stride, self.padding, False, self.count_include_pad)


class Dropout2d(_nn.Dropout2d):
    """Zero whole channels of (N, C, H, W) or unbatched (C, H, W) inputs with probability p while training."""

    def construct(self, x):
        if len(x.shape) == 3:
            return F.squeeze(super().construct(F.expand_dims(x, 0)), 0)
        return super().construct(x)


class ConvTranspose2d(_nn.Cell):
    """2-D transposed convolution of (N, C, H, W) inputs; weight (in_channels, out_channels / groups, kH, kW) from
    HeUniform(sqrt(5)) and bias from Uniform(1 / sqrt(fan_in)), fan_in = out_channels / groups * kH * kW, as
    MindSpore's mint.nn.ConvTranspose2d."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: Any = 1,
        padding_mode: str = "zeros",
        dtype: Any = None,
    ):
        super().__init__()
        _padding_mode("ConvTranspose2d", padding_mode)
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value % groups:
                raise ConfigurationError(f"mint.nn.ConvTranspose2d: {name} must be an int >= 1 dividing by groups")
        self.kernel_size = _tuple(kernel_size, 2, "kernel_size", "ConvTranspose2d")
        self.stride = _tuple(stride, 2, "stride", "ConvTranspose2d")
        self.padding = _tuple(padding, 2, "padding", "ConvTranspose2d")
        self.output_padding = _tuple(output_padding, 2, "output_padding", "ConvTranspose2d")
        self.dilation = _tuple(dilation, 2, "dilation", "ConvTranspose2d")
        self.in_channels, self.out_channels, self.groups, self.padding_mode = in_channels, out_channels, groups, "zeros"
        dtype = dtype or DType.float32
        shape = (in_channels, out_channels // groups, *self.kernel_size)
        self.weight = make_parameter(HeUniform(math.sqrt(5)), shape, dtype, "weight")
        bound = 1.0 / math.sqrt(math.prod(shape[1:]))
        self.bias = make_parameter(Uniform(bound), (out_channels,), dtype, "bias") if bias else None

    def construct(self, input, output_size=None):
        require_float(self, input)
        extra = self.output_padding
        if output_size is not None:
            wanted = tuple(output_size)[-2:]
            least = [
                functional._transposed_size(*args, 0)
                for args in zip(input.shape[2:], self.kernel_size, self.stride, self.padding, self.dilation)
            ]
            extra = tuple(w - n for w, n in zip(wanted, least))
        return functional.conv_transpose2d(
            input, self.weight, self.bias, self.stride, self.padding, extra, self.groups, self.dilation
        )


class Upsample(_nn.Cell):
    """mint.nn.functional.interpolate with the cell's size or scale_factor, mode and align_corners."""

    def __init__(
        self,
        size: Any = None,
        scale_factor: Any = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
    ):
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def construct(self, input):
        return functional.interpolate(
            input, self.size, self.scale_factor, self.mode, self.align_corners, self.recompute_scale_factor
        )


class UpsamplingNearest2d(Upsample):
    """Nearest-neighbour resizing of (N, C, H, W) inputs to size or by scale_factor."""

    def __init__(self, size: Any = None, scale_factor: Any = None):
        super().__init__(size, scale_factor)


class UpsamplingBilinear2d(_nn.Cell):
    """Bilinear resizing of (N, C, H, W) inputs with the corners aligned, to size or by scale_factor (the output
    size floor(in * scale_factor))."""

    def __init__(self, size: Any = None, scale_factor: Any = None):
        super().__init__()
        self.size, self.scale_factor = size, scale_factor

    def construct(self, input):
        size = self.size
        if self.scale_factor is not None:  # with aligned corners only the output size matters
            size, _ = functional._resize_sizes(input, None, self.scale_factor, 2)
            if self.size is not None:
                raise ConfigurationError("mint.nn.UpsamplingBilinear2d: give size or scale_factor, not both")
        return functional.interpolate(input, size, None, "bilinear", True)
