"""Neural-network functional ops: activations, dropout, dense/conv/pooling, normalisation and losses.

The losses follow MindSpore 2.x (`ops.cross_entropy`, `ops.nll_loss`, …): class indices or probabilities as
targets, `weight`, `ignore_index` (default -100), `reduction` in {'mean', 'sum', 'none'}, label smoothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessel.common import seed as _seed
from tessel.common.dtype import DType
from tessel.common.tensor import Tensor
from tessel.common.tracing import apply_op, current
from tessel.core.errors import ConfigurationError

__all__ = [
    "avg_pool2d",
    "batch_norm",
    "bias_add",
    "binary_cross_entropy_with_logits",
    "conv2d",
    "cross_entropy",
    "dense",
    "dropout",
    "dropout1d",
    "dropout2d",
    "gelu",
    "group_norm",
    "l1_loss",
    "layer_norm",
    "leaky_relu",
    "log_softmax",
    "max_pool2d",
    "mse_loss",
    "nll_loss",
    "relu",
    "relu6",
    "sigmoid",
    "silu",
    "softmax",
    "tanh",
]


def relu(input: Any) -> Tensor:
    return apply_op("ReLU", input)


def relu6(x: Any) -> Tensor:
    # min(relu(x), 6) whose slope at 6 is 1, as MindSpore's ReLU6Grad (a Minimum would halve it at the tie)
    return apply_op("Select", apply_op("LessEqual", x, 6.0), apply_op("ReLU", x), 6.0)


def sigmoid(input: Any) -> Tensor:
    return apply_op("Sigmoid", input)


def tanh(input: Any) -> Tensor:
    return apply_op("Tanh", input)


def silu(input: Any) -> Tensor:
    return apply_op("Mul", input, apply_op("Sigmoid", input))


def gelu(input: Any, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        raise ConfigurationError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return apply_op("GELU", input, approximate=approximate)


def leaky_relu(input: Any, alpha: float = 0.2) -> Tensor:
    """x, alpha * x below 0; the slope at exactly 0 is (1 + alpha) / 2, as MindSpore's (its gradient splits the tie
    of maximum(alpha * x, x))."""
    return apply_op("LeakyReLU", input, alpha=float(alpha), zero_slope=(1.0 + float(alpha)) / 2.0)


def softmax(input: Any, axis: Any = -1, *, dtype: Any = None) -> Tensor:
    """exp(x) / sum(exp(x)) over `axis`, an int or a tuple of ints (the softmax over those dims jointly)."""
    from tessel.ops.functional import cast

    return softmax_over(input if dtype is None else cast(input, dtype), axis, "ops.softmax")


def softmax_over(x: Any, axis: Any, where: str) -> Tensor:
    """Softmax over one axis (the Softmax op) or over several jointly: exp(x - max) / sum(exp(x - max)), where the
    max over the axes only keeps exp in range (the result does not depend on it, so no gradient flows through it)."""
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    if not axes or any(isinstance(a, bool) or not isinstance(a, int) for a in axes):
        raise ConfigurationError(f"{where}: axis must be an int or a non-empty tuple of ints, got {axis!r}; e.g. -1")
    if len(axes) == 1:
        return apply_op("Softmax", x, axis=axes[0])
    ndim = len(x.shape) if isinstance(x, Tensor) else np.ndim(x)
    if len({a % ndim for a in axes if -ndim <= a < ndim}) != len(axes):
        raise ConfigurationError(
            f"{where}: axis {axis!r} must name distinct dims in [-{ndim}, {ndim}) of the {ndim}-D input"
        )
    peak = apply_op("StopGradient", apply_op("ReduceMax", x, axis=axes, keep_dims=True))
    e = apply_op("Exp", apply_op("Sub", x, peak))
    return apply_op("Div", e, apply_op("ReduceSum", e, axis=axes, keep_dims=True))


def log_softmax(logits: Any, axis: int = -1) -> Tensor:
    return apply_op("LogSoftmax", logits, axis=int(axis))


def seeded_stream(seed: int, shared: bool = True) -> np.random.Generator:
    """The eager stream of op seed `seed` under the global seed: the one all callers share (restarted by set_seed),
    or a new one."""
    if shared:
        return _seed.op_stream(seed)
    return np.random.default_rng([_seed.DEFAULT_SEED if _seed.get_seed() is None else _seed.get_seed(), seed])


def eager_dropout(input: Any, p: float, rng: np.random.Generator) -> Tensor:
    """Dropout computed now, its mask drawn from `rng`."""
    x = input.asnumpy() if isinstance(input, Tensor) else np.asarray(input)
    keep = rng.random(x.shape) >= p
    return Tensor._wrap((x * keep / (1.0 - p)).astype(x.dtype))


def dropout(input: Any, p: float = 0.5, training: bool = True, seed: int | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) (identity when not training).

    With `seed` the masks come from that seed's own stream (under the global seed of `set_seed`): the n-th call
    with a seed draws the same mask in every run. Without it each call draws the next stream of `set_seed`."""
    if not 0.0 <= p < 1.0:
        raise ConfigurationError(f"dropout: p={p} must be in [0, 1)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ConfigurationError(f"ops.dropout: seed must be None or an int >= 0, got {seed!r}; e.g. seed=1")
    if not training or p == 0.0:
        return input
    if current() is None:  # eager: draw the mask here
        return eager_dropout(input, p, _seed.next_stream() if seed is None else seeded_stream(int(seed)))
    op_seed = _seed.next_op_seed() if seed is None else int(seed)
    return apply_op("Dropout", input, p=float(p), seed=op_seed, training=True)[0]


def check_channel_p(where: str, p: Any) -> float:
    """MindSpore's rule for the channel dropouts' p: a float (an int is a TypeError) in [0, 1]."""
    if isinstance(p, bool) or not isinstance(p, float):
        raise TypeError(f"{where}: p must be a float, got {p!r}; e.g. p=0.5")
    if not 0.0 <= p <= 1.0:
        raise ConfigurationError(f"{where}: p must be a number in [0, 1], got {p}")
    return p


def channel_dropout(input: Any, p: float, seed: int | None = None) -> Tensor:
    """Zero whole channels (dim 1 of (N, C, ...)) with probability p and scale the rest by 1 / (1 - p): MindSpore's
    Dropout2D, whose mask is one draw per (n, c). p = 1 zeroes everything, as MindSpore's."""
    if p == 1.0:
        return apply_op("ZerosLike", input)
    ndim = len(input.shape)
    first = ((None, None) + (0,) * (ndim - 2), (None, None) + (1,) * (ndim - 2))
    one_per_channel = apply_op("StridedSlice", input, begin=first[0], end=first[1], strides=(1,) * ndim)
    return input * dropout(apply_op("OnesLike", one_per_channel), p, training=True, seed=seed)


def _check_rank(where: str, input: Any, ranks: tuple[int, ...]) -> None:
    if len(input.shape) not in ranks:
        forms = " or ".join(f"{r}-D" for r in ranks)
        raise ConfigurationError(f"{where}: the input must be {forms}, got shape {tuple(input.shape)}")


def dropout1d(input: Any, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero whole channels of an (N, C, L) or (C, L) input with probability p while training (MindSpore's
    ops.dropout1d); the kept channels are scaled by 1 / (1 - p)."""
    check_channel_p("ops.dropout1d", p)
    _check_rank("ops.dropout1d", input, (2, 3))
    if not training:
        return input
    if len(input.shape) == 2:  # MindSpore treats (C, L) as one sample's channels
        batch = apply_op("ExpandDims", input, axis=0)
        return apply_op("Squeeze", channel_dropout(batch, p), axis=(0,))
    return channel_dropout(input, p)


def dropout2d(input: Any, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero whole channels of an (N, C, H, W) input with probability p while training (MindSpore's ops.dropout2d);
    the kept channels are scaled by 1 / (1 - p)."""
    check_channel_p("ops.dropout2d", p)
    _check_rank("ops.dropout2d", input, (4,))
    return channel_dropout(input, p) if training else input


def bias_add(input_x: Any, bias: Any) -> Tensor:
    return apply_op("BiasAdd", input_x, bias)


def dense(input: Any, weight: Any, bias: Any = None) -> Tensor:
    """input @ weight.T + bias (weight is (out, in), as nn.Dense); input (*, in_channels), as MindSpore's."""
    shape = tuple(np.shape(input) if not isinstance(input, Tensor) else input.shape)
    if len(shape) == 2:
        out = apply_op("MatMul", input, weight, transpose_b=True)
        return out if bias is None else apply_op("BiasAdd", out, bias)
    if not shape:
        raise ConfigurationError("ops.dense: input must have at least 1 dim (its last is in_channels), got a scalar")
    if any(isinstance(d, str) for d in shape[:-1]):  # symbolic dims: merge them with -1
        rows = (-1, shape[-1])
    else:
        rows = (int(np.prod(shape[:-1], dtype=np.int64)), shape[-1])
    out = apply_op("MatMul", apply_op("Reshape", input, shape=rows), weight, transpose_b=True)
    out = out if bias is None else apply_op("BiasAdd", out, bias)
    return apply_op("Reshape", out, shape=(*shape[:-1], out.shape[-1]))


def conv2d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    pad_mode: str = "valid",
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """2-D convolution over NCHW; pad_mode 'valid', 'same' or 'pad' (with `padding`, which the other modes refuse,
    as MindSpore)."""
    if pad_mode not in ("valid", "same", "pad"):
        raise ConfigurationError(f"ops.conv2d: pad_mode must be 'valid', 'same' or 'pad', got {pad_mode!r}")
    if pad_mode != "pad" and padding not in (0, (0, 0, 0, 0), [0, 0, 0, 0]):
        raise ConfigurationError(
            f"ops.conv2d: padding={padding!r} needs pad_mode='pad' (got pad_mode={pad_mode!r}); MindSpore refuses "
            "padding in the other modes too"
        )
    out = apply_op(
        "Conv2D",
        input,
        weight,
        stride=stride,
        dilation=dilation,
        pad_mode=pad_mode,
        pad=_window_pads(padding, "ops.conv2d", (2,)),  # MindSpore's forms: an int or (top/bottom, left/right)
        group=int(groups),
    )
    return out if bias is None else apply_op("BiasAdd", out, bias)


def _window_pads(padding: Any, where: str, lengths: tuple[int, ...]) -> Any:
    """MindSpore's pooling or convolution `padding` (an int, or a tuple of one of `lengths`: (h, w) or (top, bottom,
    left, right)) as the window ops' `pad`: an int or (top, bottom, left, right)."""
    if isinstance(padding, int) and not isinstance(padding, bool) and padding >= 0:
        return padding
    pads = tuple(padding) if isinstance(padding, (tuple, list)) else None
    if pads is None or len(pads) not in lengths or any(not isinstance(q, int) or q < 0 for q in pads):
        forms = " or ".join({2: "(pad_h, pad_w)", 4: "(top, bottom, left, right)"}[n] for n in lengths)
        raise ConfigurationError(f"{where}: padding must be an int >= 0 or {forms}, got {padding!r}; e.g. padding=1")
    return (pads[0], pads[0], pads[1], pads[1]) if len(pads) == 2 else pads


def _pool_mode(padding: Any, pad_mode: str) -> str:
    return "pad" if padding != 0 and pad_mode == "valid" else pad_mode


def pool2d(op: str, x: Any, kernel_size: Any, stride: Any, padding: Any, pad_mode: str, where: str, **attrs) -> Any:
    """The MaxPool / AvgPool op over NCHW x with tessel's padding (an int, (pad_h, pad_w) or (top, bottom, left,
    right)) and pad_mode ('valid', 'same', 'pad'): what ops.max_pool2d / avg_pool2d, nn.MaxPool2d / AvgPool2d and
    mint's pools come down to once each has checked its own arguments. stride None = kernel_size."""
    return apply_op(
        op,
        x,
        kernel_size=kernel_size,
        strides=kernel_size if stride is None else stride,
        pad_mode=_pool_mode(padding, pad_mode),
        pad=_window_pads(padding, where, (2, 4)),
        **attrs,
    )


def max_pool2d(
    x: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    return_indices: bool = False,
    ceil_mode: bool = False,
) -> Tensor:
    """Max over kernel_size windows of NCHW x (MindSpore `ops.max_pool2d`); stride None = kernel_size, padding an
    int or (pad_h, pad_w)."""
    from tessel.common.support import not_supported_yet

    if dilation not in (1, (1, 1), [1, 1]):
        raise not_supported_yet(f"ops.max_pool2d(dilation={dilation!r})", "tessel's MaxPool has no dilation")
    if return_indices:
        raise not_supported_yet("ops.max_pool2d(return_indices=True)", "tessel's ops.max_pool2d returns the maxima")
    if ceil_mode:
        raise not_supported_yet(
            "ops.max_pool2d(ceil_mode=True)", "output sizes round down; pad the input (padding=...) to cover the edge"
        )
    _window_pads(padding, "ops.max_pool2d", (2,))  # MindSpore's forms: an int or (pad_h, pad_w)
    return pool2d("MaxPool", x, kernel_size, stride, padding, "valid", "ops.max_pool2d")


def avg_pool2d(
    input_x: Any,
    kernel_size: Any = 1,
    stride: Any = 1,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = 0,
) -> Tensor:
    """Mean over kernel_size windows of NCHW input_x (MindSpore `ops.avg_pool2d`); padding an int or (top, bottom,
    left, right); stride None = kernel_size."""
    from tessel.common.support import not_supported_yet

    if ceil_mode:
        raise not_supported_yet(
            "ops.avg_pool2d(ceil_mode=True)", "output sizes round down; pad the input (padding=...) to cover the edge"
        )
    if divisor_override not in (0, None):
        raise not_supported_yet(
            f"ops.avg_pool2d(divisor_override={divisor_override!r})",
            "tessel's AvgPool divides by the window's size; multiply the result by size / divisor instead",
        )
    _window_pads(padding, "ops.avg_pool2d", (4,))  # MindSpore's forms: an int or (top, bottom, left, right)
    include = bool(count_include_pad)
    return pool2d(
        "AvgPool", input_x, kernel_size, stride, padding, "valid", "ops.avg_pool2d", count_include_pad=include
    )


def layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Tensor:
    from tessel.ops.functional import ones, zeros

    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    axis = len(input.shape) - len(shape)
    weight = ones(shape, input.dtype) if weight is None else weight
    bias = zeros(shape, input.dtype) if bias is None else bias
    return apply_op("LayerNorm", input, weight, bias, begin_norm_axis=axis, begin_params_axis=axis, epsilon=eps)[0]


def batch_norm(
    input_x: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any,
    bias: Any,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Batch normalisation over channel dim 1; in training the running statistics (Parameters) are updated:
    new = (1 - momentum) * running + momentum * batch (variance unbiased)."""
    from tessel.ops.functional import assign

    if not training:
        return apply_op("BatchNorm", input_x, weight, bias, running_mean, running_var, epsilon=eps)
    y, new_mean, new_var, _, _ = apply_op(
        "BatchNorm",
        input_x,
        weight,
        bias,
        running_mean,
        running_var,
        is_training=True,
        epsilon=eps,
        momentum=momentum,
    )
    assign(running_mean, new_mean)
    assign(running_var, new_var)
    return y


def group_norm(input: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Tensor:
    """Normalise each of `num_groups` channel groups of an (N, C, *) input over its channels and positions (biased
    variance, eps inside the square root), then scale by weight and shift by bias per channel (MindSpore's)."""
    from tessel.ops.functional import cast, mean, reshape, sqrt, square

    shape = tuple(input.shape)
    if len(shape) < 2 or shape[1] % num_groups:
        raise ConfigurationError(
            f"group_norm: expects an (N, C, ...) input whose C divides by num_groups={num_groups}, got shape {shape}"
        )
    # The statistics are taken in float32 at least (MindSpore's CPU kernel takes them in float64); weight and bias
    # are cast to the input's dtype and the output has it, as MindSpore's
    wide = input if input.dtype.itemsize >= 4 else cast(input, DType.float32)
    grouped = reshape(wide, (shape[0], num_groups, -1))
    centered = grouped - mean(grouped, 2, True)
    # Subtract the residuals' mean too (corrected two-pass): the float32 mean of an input like 1000 + 0.01 * noise
    # is off by about an ulp of 1000, a large error against a spread of 0.01, while the residuals are small enough
    # for their mean to be close to exact
    centered = centered - mean(centered, 2, True)
    var = mean(square(centered), 2, True)
    out = reshape(centered / sqrt(var + eps), shape)
    view = (1, shape[1]) + (1,) * (len(shape) - 2)
    if weight is not None:
        out = out * reshape(cast(cast(weight, input.dtype), wide.dtype), view)
    if bias is not None:
        out = out + reshape(cast(cast(bias, input.dtype), wide.dtype), view)
    return cast(out, input.dtype)


# --- losses ---------------------------------------------------------------------------------------------------------

_REDUCTIONS = ("mean", "sum", "none")


def reduce_loss(loss: Any, reduction: str) -> Tensor:
    from tessel.ops.functional import mean, sum

    check_reduction(reduction)
    return mean(loss) if reduction == "mean" else sum(loss) if reduction == "sum" else loss


def check_data_format(call: str, data_format: str) -> None:
    """MindSpore's `data_format` is 'NCHW' or 'NHWC'; tessel's convolution, pooling and batch norm run NCHW only."""
    from tessel.common.support import not_supported_yet

    if data_format == "NHWC":
        raise not_supported_yet(
            f"{call}(data_format='NHWC')",
            "only data_format='NCHW' runs (channels on dim 1): transpose the input with ops.transpose(x, (0, 3, 1, 2))",
        )
    if data_format != "NCHW":
        raise ConfigurationError(f"{call}: data_format must be 'NCHW' or 'NHWC', got {data_format!r}; only 'NCHW' runs")


def check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ConfigurationError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _class_last(x: Any) -> Any:
    """Move MindSpore's class axis 1 of an (N, C, d1, ...) input last."""
    from tessel.ops.functional import transpose

    ndim = len(x.shape)
    return x if ndim <= 2 else transpose(x, (0, *range(2, ndim), 1))


def cross_entropy(
    input: Any,
    target: Any,
    weight: Any = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Softmax cross-entropy of logits (class axis 1) with class indices or class probabilities."""
    from tessel.ops.functional import sum

    check_reduction(reduction)
    logits = _class_last(input)
    classes = logits.shape[-1]
    if target.dtype.is_float:  # probabilities
        if tuple(target.shape) != tuple(input.shape):  # MindSpore: class probabilities have the logits' shape
            raise ConfigurationError(
                f"cross_entropy: a float target holds class probabilities and must have the input's shape "
                f"{tuple(input.shape)}, got {tuple(target.shape)}; for class indices pass an int target "
                "(target.astype(ms.int32))"
            )
        target = _class_last(target)
        if label_smoothing:
            target = target * (1.0 - label_smoothing) + label_smoothing / classes
        log_p = log_softmax(logits, -1)
        terms = target * log_p if weight is None else target * log_p * weight
        return reduce_loss(-sum(terms, -1), reduction)
    keep, safe = _kept_targets(target, ignore_index)
    nll = apply_op("SparseSoftmaxCrossEntropy", logits, safe)
    log_p = log_softmax(logits, -1) if label_smoothing else None
    return _class_index_loss(nll, log_p, keep, safe, weight, reduction, label_smoothing)


def nll_loss(
    inputs: Any,
    target: Any,
    weight: Any = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Negative log-likelihood of log-probabilities `inputs` (class axis 1) at class indices `target`."""
    from tessel.ops.functional import expand_dims, gather_elements, squeeze

    check_reduction(reduction)
    log_p = _class_last(inputs)
    keep, safe = _kept_targets(target, ignore_index)
    nll = -squeeze(gather_elements(log_p, -1, expand_dims(safe, -1)), -1)
    return _class_index_loss(nll, log_p, keep, safe, weight, reduction, label_smoothing)


def _kept_targets(target: Any, ignore_index: int) -> tuple[Tensor, Tensor]:
    """The mask of targets that count and the targets with ignored ones replaced by class 0 (any valid index)."""
    from tessel.ops.functional import select

    keep = target != ignore_index
    return keep, select(keep, target, 0)


def _class_index_loss(
    nll: Tensor, log_p: Tensor | None, keep: Tensor, safe: Tensor, weight: Any, reduction: str, label_smoothing: float
) -> Tensor:
    """MindSpore's `_nll_loss` (2.3 on) from each target's negative log-likelihood `nll`: the class term is weighted
    by `weight[target]`, the smoothing term `-sum_c weight[c] log_p[c] / C` (`log_p`: the class-last
    log-probabilities) by the class weights; both are zero where a target is ignored and, under 'mean', both are
    divided by the kept targets' weights."""
    from tessel.ops.functional import gather, mean, sum

    kept = apply_op("Cast", keep, dtype=nll.dtype)
    weights = kept if weight is None else kept * gather(weight, safe, 0)
    per = nll * weights
    loss = per if reduction == "none" else sum(per)
    if reduction == "mean":
        loss = loss / sum(weights)
    if not label_smoothing:
        return loss
    smooth = -mean(log_p if weight is None else log_p * weight, -1) * kept
    smooth = smooth if reduction == "none" else sum(smooth)
    if reduction == "mean":
        smooth = smooth / sum(weights)
    return loss * (1.0 - label_smoothing) + smooth * label_smoothing


def mse_loss(input: Any, target: Any, reduction: str = "mean") -> Tensor:
    """(input - target)^2, reduced; integer inputs in float32, as MindSpore gives it."""
    diff = apply_op("Sub", input, target)
    if not diff.dtype.is_float:
        diff = apply_op("Cast", diff, dtype=DType.float32)
    return reduce_loss(apply_op("Square", diff), reduction)


def l1_loss(input: Any, target: Any, reduction: str = "mean") -> Tensor:
    return reduce_loss(apply_op("Abs", apply_op("Sub", input, target)), reduction)


def binary_cross_entropy_with_logits(
    input: Any, target: Any, weight: Any = None, pos_weight: Any = None, reduction: str = "mean"
) -> Tensor:
    """Sigmoid cross-entropy, computed stably: (1 - y) x + log(1 + exp(-x)) (pos_weight scales the y terms). The
    second term is Softplus(-x), stable at both ends, whose gradient is -sigmoid(-x) everywhere; written as
    log(1 + exp(-|x|)) + max(-x, 0) it had the wrong gradient at x = 0 (Abs and Maximum's tie: -1, not -0.5)."""
    shapes = tuple(getattr(input, "shape", ())), tuple(getattr(target, "shape", ()))
    if shapes[0] != shapes[1]:  # MindSpore's BCEWithLogitsLoss infer: the two must be equal, not broadcast
        raise ConfigurationError(
            f"binary_cross_entropy_with_logits: input {shapes[0]} and target {shapes[1]} must have the same shape "
            "(a (N, 1) output against (N,) labels would broadcast to (N, N)); reshape one to the other's shape"
        )
    x, label = input, target
    softplus_neg = apply_op("Softplus", apply_op("Neg", x))  # log(1 + exp(-x))
    if pos_weight is None:
        per = (1.0 - label) * x + softplus_neg
    else:
        per = (1.0 - label) * x + (1.0 + (pos_weight - 1.0) * label) * softplus_neg
    if weight is not None:
        per = per * weight
    return reduce_loss(per, reduction)
