"""`tessel.mint.nn.functional` — MindSpore's `mindspore.mint.nn.functional` (PyTorch-style names and defaults)
mapped onto `tessel.ops`. Other names of MindSpore's module raise NotSupportedYetError.

    >>> from tessel.mint.nn import functional as F
    >>> y = F.relu(F.linear(x, weight, bias))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel.common.dtype import DType
from tessel.common.support import not_supported_yet, unsupported_names
from tessel.common.tensor import Tensor
from tessel.common.tracing import apply_op
from tessel.core.errors import ConfigurationError
from tessel.mint._names import MINT_NN_FUNCTIONAL
from tessel.ops import adaptive
from tessel.ops import composed as C
from tessel.ops import functional as ops
from tessel.ops.nn_functional import pool2d, reduce_loss

_WHY = "tessel has no mapping for it yet; use the tessel.ops equivalent if there is one"


def _no_inplace(name: str, inplace: bool, module: str = "mindspore.mint.nn.functional") -> None:
    if inplace:
        raise not_supported_yet(
            f"{module}.{name}(inplace=True)",
            "tessel does not overwrite input tensors; use the returned tensor (inplace=False)",
        )


def relu(input: Any, inplace: bool = False) -> Tensor:
    """max(input, 0); an int tensor keeps its dtype and a bool one comes back as it is, as MindSpore 2.7's."""
    _no_inplace("relu", inplace)
    dtype = ops.dtype_of(input)
    if dtype == DType.bool_:
        return input
    if dtype.is_int:
        return ops.maximum(input, ops.zeros_like(input))
    return ops.relu(input)


def relu6(input: Any, inplace: bool = False) -> Tensor:
    _no_inplace("relu6", inplace)
    return ops.relu6(input)


def sigmoid(input: Any) -> Tensor:
    return ops.sigmoid(input)


def tanh(input: Any) -> Tensor:
    return ops.tanh(input)


def silu(input: Any, inplace: bool = False) -> Tensor:
    _no_inplace("silu", inplace)
    return ops.silu(input)


def gelu(input: Any, approximate: str = "none") -> Tensor:
    return ops.gelu(input, approximate)


def leaky_relu(input: Any, negative_slope: float = 0.01) -> Tensor:
    """torch's leaky_relu, whose slope at exactly 0 is negative_slope."""
    slope = float(negative_slope)
    return apply_op("LeakyReLU", input, alpha=slope, zero_slope=slope)


def softmax(input: Any, dim: int | None = None, dtype: Any = None) -> Tensor:
    """Softmax along `dim` (the last dim when None, as MindSpore's mint)."""
    return ops.softmax(input, -1 if dim is None else dim, dtype=dtype)


def log_softmax(input: Any, dim: int | None = None, *, dtype: Any = None) -> Tensor:
    if dim is None:
        raise not_supported_yet(
            "mindspore.mint.nn.functional.log_softmax with dim=None",
            "MindSpore does not document which dim it then uses; pass dim (e.g. dim=-1)",
        )
    return ops.log_softmax(input if dtype is None else ops.cast(input, dtype), dim)


def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) while training."""
    _no_inplace("dropout", inplace)
    return ops.dropout(input, p, training)


def linear(input: Any, weight: Any, bias: Any = None) -> Tensor:
    """input @ weight.T + bias; weight is (out_features, in_features)."""
    return ops.dense(input, weight, bias)


def flatten(input: Any, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return ops.flatten(input, start_dim=start_dim, end_dim=end_dim)


def cross_entropy(
    input: Any,
    target: Any,
    weight: Any = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    return ops.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)


def nll_loss(input: Any, target: Any, weight: Any = None, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    return ops.nll_loss(input, target, weight, ignore_index, reduction)


def mse_loss(input: Any, target: Any, reduction: str = "mean") -> Tensor:
    return ops.mse_loss(input, target, reduction)


def l1_loss(input: Any, target: Any, reduction: str = "mean") -> Tensor:
    return ops.l1_loss(input, target, reduction)


def binary_cross_entropy_with_logits(
    input: Any, target: Any, weight: Any = None, reduction: str = "mean", pos_weight: Any = None
) -> Tensor:
    return ops.binary_cross_entropy_with_logits(input, target, weight, pos_weight, reduction)


def layer_norm(
    input: Any, normalized_shape: int | Sequence[int], weight: Any = None, bias: Any = None, eps: float = 1e-5
) -> Tensor:
    return ops.layer_norm(input, normalized_shape, weight, bias, eps)


def one_hot(tensor: Any, num_classes: int = -1) -> Tensor:
    """int64 one-hot vectors along a new last dim; num_classes=-1 takes max(tensor) + 1 (eager tensors only)."""
    if num_classes == -1:
        if not isinstance(tensor, Tensor) or tensor._sym is not None:
            raise ConfigurationError(
                "mint.nn.functional.one_hot: num_classes=-1 reads the data, which a compiled graph cannot; pass "
                "num_classes"
            )
        num_classes = int(np.max(tensor.asnumpy())) + 1
    on = Tensor(np.array(1, np.int64))
    return ops.one_hot(tensor, num_classes, on, 0, -1)


def _pair(value: Any, name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2:
        raise ConfigurationError(f"mint.nn.functional: {name} must be an int or two ints, got {value!r}")
    return int(pair[0]), int(pair[1])


def _torch_padding(padding: Any, where: str) -> tuple[str, Any]:
    """PyTorch's padding (int, (pad_h, pad_w), 'valid', 'same') as tessel's (pad_mode, padding)."""
    if isinstance(padding, str):
        if padding not in ("valid", "same"):
            raise ConfigurationError(f"{where}: padding must be 'valid', 'same', an int or two ints, got {padding!r}")
        return padding, 0
    pad_h, pad_w = _pair(padding, "padding")
    return ("pad", (pad_h, pad_w)) if pad_h or pad_w else ("valid", 0)


def conv2d(
    input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1
) -> Tensor:
    """2-D convolution of NCHW input with (out, in/groups, kH, kW) weights; padding as PyTorch."""
    pad_mode, pads = _torch_padding(padding, "mint.nn.functional.conv2d")
    if pad_mode == "same" and _pair(stride, "stride") != (1, 1):
        raise ConfigurationError("mint.nn.functional.conv2d: padding='same' needs stride=1")
    return ops.conv2d(input, weight, bias, stride, pad_mode, pads, dilation, groups)


def check_max_pool2d(dilation: Any, ceil_mode: bool, return_indices: bool) -> None:
    if _pair(dilation, "dilation") != (1, 1) or ceil_mode or return_indices:
        raise not_supported_yet(
            "mindspore.mint.nn.functional.max_pool2d with dilation, ceil_mode or return_indices",
            "tessel's MaxPool has none of them",
        )


def max_pool2d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor:
    check_max_pool2d(dilation, ceil_mode, return_indices)
    pad_mode, pads = _torch_padding(padding, "mint.nn.functional.max_pool2d")
    return pool2d("MaxPool", input, kernel_size, stride, pads, pad_mode, "mint.nn.functional.max_pool2d")


def check_avg_pool2d(ceil_mode: bool, divisor_override: Any) -> None:
    if ceil_mode or divisor_override is not None:
        raise not_supported_yet(
            "mindspore.mint.nn.functional.avg_pool2d with ceil_mode or divisor_override",
            "tessel's AvgPool has neither",
        )


def avg_pool2d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    check_avg_pool2d(ceil_mode, divisor_override)
    pad_mode, pads = _torch_padding(padding, "mint.nn.functional.avg_pool2d")
    where = "mint.nn.functional.avg_pool2d"
    return pool2d(
        "AvgPool", input, kernel_size, stride, pads, pad_mode, where, count_include_pad=bool(count_include_pad)
    )


def conv1d(
    input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1
) -> Tensor:
    """1-D convolution of (N, C, L) input with (out, in/groups, k) weights: conv2d over (N, C, 1, L)."""
    if not isinstance(padding, str):
        padding = (0, _single(padding, "padding"))
    out = conv2d(
        ops.expand_dims(input, 2),
        ops.expand_dims(weight, 2),
        bias,
        (1, _single(stride, "stride")),
        padding,
        (1, _single(dilation, "dilation")),
        groups,
    )
    return ops.squeeze(out, 2)


def _single(value: Any, name: str) -> int:
    values = (value,) if isinstance(value, int) else tuple(value)
    if len(values) != 1:
        raise ConfigurationError(f"mint.nn.functional: {name} must be an int or one int, got {value!r}")
    return int(values[0])


def batch_norm(
    input: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-05,
) -> Tensor:
    """Batch normalisation over channel dim 1 of (N, C, ...) inputs. Training normalises by the batch statistics and
    updates running_mean / running_var (Parameters, when given) as (1 - momentum) * running + momentum * batch, the
    variance unbiased; otherwise it normalises by the running statistics."""
    channels = input.shape[1]
    ones, zeros = ops.ones((channels,), input.dtype), ops.zeros((channels,), input.dtype)
    weight = ones if weight is None else weight
    bias = zeros if bias is None else bias
    if training and running_mean is None:
        return apply_op("BatchNorm", input, weight, bias, zeros, ones, is_training=True, epsilon=eps)[0]
    return ops.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def group_norm(input: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-05) -> Tensor:
    return ops.group_norm(input, num_groups, weight, bias, eps)


def embedding(
    input: Any,
    weight: Any,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
) -> Tensor:
    """The rows of weight at the integer ids in input; positions whose id is padding_idx get no gradient."""
    if max_norm is not None or scale_grad_by_freq:
        raise not_supported_yet(
            "mindspore.mint.nn.functional.embedding with max_norm or scale_grad_by_freq",
            "tessel neither renormalises rows nor scales the gradient by id frequency; drop them",
        )
    if not ops.dtype_of(input).is_int:
        raise ConfigurationError("mint.nn.functional.embedding: input must be an int tensor of ids")
    out = ops.gather(weight, input, 0)
    if padding_idx is None:
        return out
    padding_idx = padding_idx % weight.shape[0]
    padded = ops.expand_dims(ops.equal(input, padding_idx), -1)
    return ops.select(ops.broadcast_to(padded, out.shape), ops.stop_gradient(out), out)


def adaptive_avg_pool1d(input: Any, output_size: int) -> Tensor:
    """The mean of each of output_size bins of the last dim of a 2-D or 3-D input."""
    return ops.squeeze(adaptive_avg_pool2d(ops.expand_dims(input, -2), (1, output_size)), -2)


def adaptive_avg_pool2d(input: Any, output_size: Any) -> Tensor:
    return adaptive.adaptive_avg_pool2d(input, output_size)


def check_adaptive_max(name: str, return_indices: bool) -> None:
    if return_indices:
        raise not_supported_yet(
            f"mindspore.mint.nn.{name}(return_indices=True)", "tessel returns the maxima only; drop return_indices"
        )


def adaptive_max_pool1d(input: Any, output_size: int, return_indices: bool = False) -> Tensor:
    """The maximum of each of output_size bins of the last dim of a 2-D or 3-D input."""
    check_adaptive_max("functional.adaptive_max_pool1d", return_indices)
    return ops.squeeze(adaptive.adaptive_max_pool2d(ops.expand_dims(input, -2), (1, output_size)), -2)


def adaptive_max_pool2d(input: Any, output_size: Any, return_indices: bool = False) -> Tensor:
    check_adaptive_max("functional.adaptive_max_pool2d", return_indices)
    return adaptive.adaptive_max_pool2d(input, output_size)


# --- activations and losses -------------------------------------------------------------------------------------

# SELU's constants (Klambauer et al.), as MindSpore's
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def elu(input: Any, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x where x > 0, alpha * (e^x - 1) elsewhere."""
    _no_inplace("elu", inplace)
    return C.elu(input, alpha)


def selu(input: Any) -> Tensor:
    """scale * elu(x, alpha) with SELU's fixed scale and alpha."""
    return C.elu(input, _SELU_ALPHA) * _SELU_SCALE


def mish(input: Any) -> Tensor:
    return C.mish(input)


def glu(input: Any, dim: int = -1) -> Tensor:
    """a * sigmoid(b) for the two halves a, b of `input` along dim (whose length must be even)."""
    size = input.shape[dim]
    if size % 2:
        raise ConfigurationError(f"mint.nn.functional.glu: dim {dim} has odd length {size}; it must split in halves")
    first, second = ops.split(input, size // 2, dim)
    return first * ops.sigmoid(second)


def hardtanh(input: Any, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """input limited to [min_val, max_val]."""
    _no_inplace("hardtanh", inplace)
    if min_val > max_val:
        raise ConfigurationError(f"mint.nn.functional.hardtanh: min_val {min_val} must not exceed max_val {max_val}")
    return ops.minimum(ops.maximum(input, float(min_val)), float(max_val))


def hardswish(input: Any) -> Tensor:
    return C.hardswish(input)


def hardsigmoid(input: Any) -> Tensor:
    return C.hardsigmoid(input)


def hardshrink(input: Any, lambd: float = 0.5) -> Tensor:
    """x where |x| > lambd, else 0."""
    return ops.select(ops.greater(ops.abs(input), float(lambd)), input, ops.zeros_like(input))


def softshrink(input: Any, lambd: float = 0.5) -> Tensor:
    """x - lambd where x > lambd, x + lambd where x < -lambd, else 0."""
    if lambd < 0:
        raise ConfigurationError(f"mint.nn.functional.softshrink: lambd must be >= 0, got {lambd}")
    lambd = float(lambd)
    inner = ops.select(ops.less(input, -lambd), input + lambd, ops.zeros_like(input))
    return ops.select(ops.greater(input, lambd), input - lambd, inner)


def softplus(input: Any, beta: float = 1, threshold: float = 20) -> Tensor:
    return C.softplus(input, beta, threshold)


def logsigmoid(input: Any) -> Tensor:
    """log(sigmoid(x)), as -softplus(-x): finite for large negative x."""
    return -C.softplus(-input)


def threshold(input: Any, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """x where x > threshold, else value."""
    _no_inplace("threshold", inplace)
    return ops.select(ops.greater(input, float(threshold)), input, ops.zeros_like(input) + value)


def prelu(input: Any, weight: Any) -> Tensor:
    """x where x > 0, else weight * x, weight holding one slope or one per channel (dim 1)."""
    shape = tuple(input.shape)
    if len(shape) >= 2 and weight.shape[0] != 1:
        weight = ops.reshape(weight, (1, -1) + (1,) * (len(shape) - 2))
    return ops.select(ops.greater(input, 0.0), input, input * weight)


def kl_div(input: Any, target: Any, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """target * (log target - input) for log-probabilities `input` (exp(target) * (target - input) when target is
    a log-probability too); reduction 'mean' over every element, 'batchmean' the sum over the batch size, 'sum',
    'none'."""
    if not log_target:
        return C.kl_div(input, target, reduction)
    if reduction not in ("none", "mean", "batchmean", "sum"):
        raise ConfigurationError(f"kl_div: reduction must be 'none', 'mean', 'batchmean' or 'sum', got {reduction!r}")
    per = ops.exp(target) * (target - input)
    return ops.sum(per) / float(input.shape[0]) if reduction == "batchmean" else reduce_loss(per, reduction)


def smooth_l1_loss(input: Any, target: Any, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    return C.smooth_l1_loss(input, target, beta, reduction)


def binary_cross_entropy(input: Any, target: Any, weight: Any = None, reduction: str = "mean") -> Tensor:
    return C.binary_cross_entropy(input, target, weight, reduction)


def soft_margin_loss(input: Any, target: Any, reduction: str = "mean") -> Tensor:
    """log(1 + e^(-target * input)), reduced."""
    return reduce_loss(C.softplus(-target * input), reduction)


def _transposed_size(size: int, kernel: int, stride: int, padding: int, dilation: int, extra: int) -> int:
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + extra + 1


def conv_transpose2d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Tensor:
    """2-D transposed convolution (the input gradient of conv2d) of (N, C_in, H, W) input with (C_in, C_out / groups,
    kH, kW) weights; output size (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1."""
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    dilation, extra = _pair(dilation, "dilation"), _pair(output_padding, "output_padding")
    if not all(0 <= e < max(s, d) for e, s, d in zip(extra, stride, dilation)):
        raise ConfigurationError(
            f"mint.nn.functional.conv_transpose2d: output_padding {extra} must be smaller than stride {stride} or "
            f"dilation {dilation}"
        )
    n, _, *hw = input.shape
    sizes = [_transposed_size(*args) for args in zip(hw, weight.shape[2:], stride, padding, dilation, extra)]
    out = apply_op(
        "Conv2DBackpropInput",
        input,
        weight,
        input_shape=(n, weight.shape[1] * groups, *sizes),
        stride=stride,
        dilation=dilation,
        pad_mode="pad",
        pad=(padding[0], padding[0], padding[1], padding[1]),
        group=groups,
    )
    return out if bias is None else ops.bias_add(out, bias)


# --- interpolation --------------------------------------------------------------------------------------------------

_LINEAR_MODES = {"linear": 3, "bilinear": 4}


def _resize_sizes(input: Any, size: Any, scale_factor: Any, spatial: int) -> tuple[list[int], list[float | None]]:
    """The output sizes and, where scale_factor gave them, the scales that map output positions back (1 / factor)."""
    shape = input.shape[2:]
    if (size is None) == (scale_factor is None):
        raise ConfigurationError("mint.nn.functional.interpolate: give exactly one of size and scale_factor")
    if size is not None:
        sizes = [size] * spatial if isinstance(size, int) else list(size)
        if len(sizes) != spatial:
            raise ConfigurationError(f"interpolate: size needs {spatial} ints for a {len(input.shape)}-D input")
        return [int(v) for v in sizes], [None] * spatial
    factors = [scale_factor] * spatial if isinstance(scale_factor, (int, float)) else list(scale_factor)
    if len(factors) != spatial:
        raise ConfigurationError(f"interpolate: scale_factor needs {spatial} numbers for a {len(input.shape)}-D input")
    return [int(np.floor(n * float(f))) for n, f in zip(shape, factors)], [1.0 / float(f) for f in factors]


def _along(x: Any, axis: int, index: np.ndarray) -> Tensor:
    return ops.gather(x, Tensor(index.astype(np.int32)), axis)


def interpolate(
    input: Any,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
) -> Tensor:
    """Resize the spatial dims (all after N, C): 'nearest' (3-D to 5-D input: source floor(dst * in / out)),
    'linear' (3-D) and 'bilinear' (4-D, by size only, as MindSpore's), with align_corners as PyTorch's."""
    where = "mint.nn.functional.interpolate"
    if mode not in ("nearest", *_LINEAR_MODES):
        raise not_supported_yet(
            f"{where}(mode={mode!r})", "tessel interpolates with 'nearest', 'linear' and 'bilinear'; use one of them"
        )
    if mode == "nearest" and align_corners is not None:
        raise ConfigurationError(f"{where}: align_corners is for the linear modes only, got it with mode='nearest'")
    if mode == "bilinear" and scale_factor is not None:
        raise ConfigurationError(f"{where}: mode='bilinear' takes size, not scale_factor (MindSpore's rule)")
    ndim = len(input.shape)
    if ndim not in (3, 4, 5) or _LINEAR_MODES.get(mode, ndim) != ndim:
        raise ConfigurationError(f"{where}: mode={mode!r} does not take a {ndim}-D input")
    sizes, scales = _resize_sizes(input, size, scale_factor, ndim - 2)
    if recompute_scale_factor:
        scales = [None] * len(scales)
    out = input
    for axis, (n_in, n_out, scale) in enumerate(zip(input.shape[2:], sizes, scales), start=2):
        dst = np.arange(n_out, dtype=np.float32)
        ratio = np.float32(n_in / n_out if scale is None else scale)
        if mode == "nearest":
            out = _along(out, axis, np.minimum(np.floor(dst * ratio), n_in - 1))
            continue
        if align_corners:
            src = dst * np.float32((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros_like(dst)
        else:
            src = np.maximum((dst + np.float32(0.5)) * ratio - np.float32(0.5), 0)
        low = np.minimum(np.floor(src), n_in - 1)
        high = np.minimum(low + 1, n_in - 1)
        view = [1] * ndim
        view[axis] = n_out
        weight = Tensor((src - low).astype(input.dtype.numpy).reshape(view))
        out = _along(out, axis, low) * (1 - weight) + _along(out, axis, high) * weight
    return out


def upsample(
    input: Any,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
) -> Tensor:
    return interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor)


# --- padding, reshuffling, normalising -------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_indices(mode: str, size: int, before: int, after: int) -> np.ndarray:
    """The source position of each output position along a dim padded by `mode` (reflect, replicate, circular)."""
    positions = np.arange(-before, size + after)
    if mode == "replicate":
        return np.clip(positions, 0, size - 1)
    if mode == "circular":
        return positions % size
    period = 2 * (size - 1)  # reflect: mirrored at the edges, the edges themselves not repeated
    folded = np.abs(positions) % period if period else np.zeros_like(positions)
    return np.where(folded < size, folded, period - folded)


def pad(input: Any, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """Pad the last len(pad) // 2 dims: pad is (last_before, last_after, second_last_before, ...) as PyTorch's;
    'constant' fills with value (0 when None), 'reflect' mirrors without repeating the edge, 'replicate' repeats
    the edge, 'circular' wraps around. Negative constant pads crop."""
    where = "mint.nn.functional.pad"
    if mode not in _PAD_MODES:
        raise ConfigurationError(f"{where}: mode must be one of {_PAD_MODES}, got {mode!r}")
    pads = tuple(pad)
    if len(pads) % 2 or len(pads) // 2 > len(input.shape) or not all(isinstance(p, int) for p in pads):
        raise ConfigurationError(f"{where}: pad must be an even number of ints, at most 2 per dim, got {pad!r}")
    if mode != "constant" and value is not None:
        raise ConfigurationError(f"{where}: value is only for mode='constant', got value={value!r} with {mode!r}")
    ndim = len(input.shape)
    pairs = [(0, 0)] * ndim
    for i in range(len(pads) // 2):
        pairs[ndim - 1 - i] = (pads[2 * i], pads[2 * i + 1])
    if mode == "constant":
        grown = tuple((max(b, 0), max(a, 0)) for b, a in pairs)
        out = apply_op("Pad", input, paddings=grown, value=float(value or 0.0)) if any(map(any, grown)) else input
        if not any(b < 0 or a < 0 for b, a in pairs):
            return out
        begin = tuple(-b if b < 0 else None for b, _ in pairs)
        end = tuple(a if a < 0 else None for _, a in pairs)
        return apply_op("StridedSlice", out, begin=begin, end=end, strides=(1,) * ndim)
    out = input
    for axis, (before, after) in enumerate(pairs):
        if before or after:
            size = input.shape[axis]
            if min(before, after) < 0 or (mode == "reflect" and max(before, after) >= size):
                raise ConfigurationError(
                    f"{where}: {mode} pads must be >= 0 (and < the dim's size {size} for reflect), got {pad!r}"
                )
            index = Tensor(_pad_indices(mode, size, before, after).astype(np.int32))
            out = ops.gather(out, index, axis)
    return out


def pixel_shuffle(input: Any, upscale_factor: int) -> Tensor:
    """(*, C * r^2, H, W) to (*, C, H * r, W * r): each block of r^2 channels becomes an r x r patch."""
    r = int(upscale_factor)
    *batch, channels, height, width = input.shape
    if channels % (r * r):
        raise ConfigurationError(f"pixel_shuffle: channels {channels} must divide by upscale_factor^2 = {r * r}")
    lead = len(batch)
    out = ops.reshape(input, (*batch, channels // (r * r), r, r, height, width))
    perm = (*range(lead), lead, lead + 3, lead + 1, lead + 4, lead + 2)
    return ops.reshape(ops.transpose(out, perm), (*batch, channels // (r * r), height * r, width * r))


def normalize(input: Any, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """input / max(||input||_p along dim, eps)."""
    if p == 2.0:
        norm = ops.sqrt(ops.sum(ops.square(input), dim, True))
    elif p == 1.0:
        norm = ops.sum(ops.abs(input), dim, True)
    else:
        raise not_supported_yet(
            f"mindspore.mint.nn.functional.normalize(p={p})", "tessel normalises by the 1- and 2-norms; pass p=1 or 2"
        )
    return input / ops.maximum(norm, float(eps))


def avg_pool1d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    """The mean of each kernel_size window of the last dim of an (N, C, L) input."""
    kernel = _single(kernel_size, "kernel_size")
    stride = kernel if stride is None else _single(stride, "stride")
    x = ops.expand_dims(input, -2)
    return ops.squeeze(
        avg_pool2d(x, (1, kernel), (1, stride), (0, _single(padding, "padding")), ceil_mode, count_include_pad), -2
    )


def dropout2d(input: Any, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero whole channels of an (N, C, H, W) or unbatched (C, H, W) input with probability p while training, the
    kept ones scaled by 1 / (1 - p)."""
    if len(input.shape) == 3:
        return ops.squeeze(ops.dropout2d(ops.expand_dims(input, 0), p, training), 0)
    return ops.dropout2d(input, p, training)


__getattr__ = unsupported_names("mindspore.mint.nn.functional", MINT_NN_FUNCTIONAL, _WHY)
__all__ = sorted(name for name in MINT_NN_FUNCTIONAL if name in globals())
