"""Writes mindspore_mint_nn.npz, which tests/unit/sdk/test_sdk_mint_nn.py reads: python make_mindspore_mint_nn.py
DIR, under MindSpore 2.7.0 (not run by the tests: tessel does not depend on MindSpore).

Each case is a mint.nn constructor call (the same text builds tessel's cell) and an input. MindSpore 2.7.0's CPU
build registers no kernel for most mint.nn layers (Conv2DExt, BatchNormExt, LayerNormExt, FuncMaxPool2D, AvgPool2D,
AdaptiveAvgPool2DExt: "The kernel ... unregistered"; Embedding runs forward in GRAPH_MODE only, with no
EmbeddingDenseBackward kernel). So a case's values come from the mint cell itself where the CPU build runs it
(GroupNorm, AdaptiveMaxPool2d), else from a reference written with MindSpore's CPU ops (ops.pad, ops.Conv2D,
ops.MaxPool, ops.AvgPool, ops.LayerNorm, ops.adaptive_avg_pool2d, ops.gather, ...) computing what mint documents
(PyTorch's semantics) with the mint cell's own initialised parameters.

Stored per case, under "<case>/": the mint cell's parameters ("p.<name>", which tessel copies by name: this checks
names and shapes), the input x, and for each step ("train", then "eval") the output y, the loss sum(y * r) for a
fixed random r, and the gradients of that loss with respect to x ("dx") and each trainable parameter ("d.<name>").
The norm layers' running statistics after the train step are "after.<name>" (numpy float64: running = (1 -
momentum) * running + momentum * batch statistic, the variance unbiased, as mint's documentation). "cases" holds
the case list as JSON."""

import json
import sys

import mindspore as ms
import numpy as np
from mindspore import mint, ops

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_seed(0)

# (name, constructor call, input shape, input kind: "f" normal floats, "i<n>" ints in [0, n))
CASES = [
    ("conv2d_pad", "mint.nn.Conv2d(3, 4, 3, padding=1)", (2, 3, 5, 5), "f"),
    (
        "conv2d_groups",
        "mint.nn.Conv2d(4, 6, (3, 2), stride=2, padding=(1, 0), dilation=(1, 2), groups=2)",
        (2, 4, 7, 8),
        "f",
    ),
    ("conv2d_same_even", "mint.nn.Conv2d(3, 4, 4, padding='same', bias=False)", (2, 3, 6, 5), "f"),
    ("conv2d_valid", "mint.nn.Conv2d(3, 2, (2, 3), padding='valid', dilation=2)", (1, 3, 7, 7), "f"),
    ("conv1d_pad", "mint.nn.Conv1d(3, 4, 3, padding=1)", (2, 3, 9), "f"),
    ("conv1d_groups", "mint.nn.Conv1d(4, 6, 2, stride=2, dilation=2, groups=2)", (2, 4, 11), "f"),
    ("conv1d_same", "mint.nn.Conv1d(3, 4, 4, padding='same', bias=False)", (2, 3, 9), "f"),
    ("convtranspose2d", "mint.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)", (2, 3, 4, 5), "f"),
    (
        "convtranspose2d_groups",
        "mint.nn.ConvTranspose2d(4, 6, (3, 2), stride=(2, 3), padding=(0, 1), groups=2, dilation=(1, 2), bias=False)",
        (2, 4, 3, 4),
        "f",
    ),
    ("bn1d_2d", "mint.nn.BatchNorm1d(3)", (5, 3), "f"),
    ("bn1d_3d", "mint.nn.BatchNorm1d(3, eps=1e-3, momentum=0.3)", (4, 3, 5), "f"),
    ("bn2d", "mint.nn.BatchNorm2d(3)", (4, 3, 2, 3), "f"),
    ("bn2d_no_affine", "mint.nn.BatchNorm2d(3, affine=False)", (4, 3, 2, 3), "f"),
    ("bn2d_no_stats", "mint.nn.BatchNorm2d(3, track_running_stats=False)", (4, 3, 2, 3), "f"),
    ("bn3d", "mint.nn.BatchNorm3d(2)", (2, 2, 3, 2, 2), "f"),
    ("layernorm", "mint.nn.LayerNorm(5)", (2, 3, 5), "f"),
    ("layernorm_2d_no_bias", "mint.nn.LayerNorm([3, 5], eps=1e-3, bias=False)", (2, 3, 5), "f"),
    ("layernorm_no_affine", "mint.nn.LayerNorm((5,), elementwise_affine=False)", (2, 3, 5), "f"),
    ("groupnorm", "mint.nn.GroupNorm(2, 4)", (2, 4, 3, 3), "f"),
    ("groupnorm_no_affine", "mint.nn.GroupNorm(1, 3, eps=1e-3, affine=False)", (2, 3, 5), "f"),
    ("embedding", "mint.nn.Embedding(10, 4)", (2, 3), "i10"),
    ("embedding_padding", "mint.nn.Embedding(10, 4, padding_idx=1)", (3, 4), "i4"),
    ("embedding_negative_padding", "mint.nn.Embedding(6, 3, padding_idx=-1)", (8,), "i6"),
    ("maxpool2d", "mint.nn.MaxPool2d(2)", (2, 3, 6, 6), "f"),
    ("maxpool2d_pad", "mint.nn.MaxPool2d(3, stride=2, padding=1)", (2, 3, 7, 6), "f"),
    ("avgpool2d", "mint.nn.AvgPool2d(2)", (2, 3, 6, 6), "f"),
    ("avgpool2d_pad", "mint.nn.AvgPool2d(3, 2, 1)", (2, 3, 7, 6), "f"),
    ("avgpool2d_exclude_pad", "mint.nn.AvgPool2d(3, 2, 1, count_include_pad=False)", (2, 3, 7, 6), "f"),
    ("adaptive_avg2d", "mint.nn.AdaptiveAvgPool2d((2, 3))", (2, 3, 5, 7), "f"),
    ("adaptive_avg2d_int", "mint.nn.AdaptiveAvgPool2d(3)", (3, 5, 7), "f"),
    ("adaptive_avg1d", "mint.nn.AdaptiveAvgPool1d(3)", (2, 3, 7), "f"),
    ("adaptive_max1d", "mint.nn.AdaptiveMaxPool1d(3)", (2, 3, 7), "f"),
    ("adaptive_max2d", "mint.nn.AdaptiveMaxPool2d((2, 3))", (2, 3, 5, 7), "f"),
]


# Functions and activation / loss cells: (name, mint call on the inputs of _inputs, the inputs differentiated, a
# reference written with MindSpore's CPU ops where its CPU build has no kernel for the mint call, else None)
# mish as x * tanh(softplus(x)) with tanh(log(1 + e^x)) = ((1 + e^x)^2 - 1) / ((1 + e^x)^2 + 1): MindSpore 2.7.0's
# CPU Tanh is off by 6e-5 relative near 4.7 (tanh(4.7326) gives 0.999909, float64 0.999845)
MISH = "x * ((1 + ops.exp(x)) ** 2 - 1) / ((1 + ops.exp(x)) ** 2 + 1)"
CALLS = [
    ("elu", "F.elu(x, 0.7)", "x", "ops.select(x > 0, x, 0.7 * (ops.exp(x) - 1))"),
    ("elu_cell", "mint.nn.ELU(alpha=0.7)(x)", "x", "ops.select(x > 0, x, 0.7 * (ops.exp(x) - 1))"),
    ("selu", "F.selu(x)", "x", "1.0507009873554805 * ops.select(x > 0, x, 1.6732632423543772 * (ops.exp(x) - 1))"),
    (
        "selu_cell",
        "mint.nn.SELU()(x)",
        "x",
        "1.0507009873554805 * ops.select(x > 0, x, 1.6732632423543772 * (ops.exp(x) - 1))",
    ),
    ("mish", "F.mish(x)", "x", MISH),
    ("mish_cell", "mint.nn.Mish()(x)", "x", MISH),
    ("glu", "F.glu(x)", "x", None),
    ("glu_cell", "mint.nn.GLU(dim=1)(e)", "e", None),
    ("hardtanh", "F.hardtanh(x, -1.5, 0.5)", "x", "ops.clamp(x, -1.5, 0.5)"),
    ("hardtanh_cell", "mint.nn.Hardtanh()(x)", "x", "ops.clamp(x, -1.0, 1.0)"),
    ("hardswish", "F.hardswish(x)", "x", None),
    ("hardswish_cell", "mint.nn.Hardswish()(x)", "x", None),
    ("hardsigmoid", "F.hardsigmoid(x)", "x", None),
    ("hardsigmoid_cell", "mint.nn.Hardsigmoid()(x)", "x", None),
    ("hardshrink", "F.hardshrink(x, 0.7)", "x", None),
    ("hardshrink_cell", "mint.nn.Hardshrink()(x)", "x", None),
    ("softshrink", "F.softshrink(x, 0.7)", "x", None),
    ("softshrink_cell", "mint.nn.Softshrink()(x)", "x", None),
    ("softplus", "F.softplus(x, 2, 3)", "x", "ops.select(2 * x > 3, x, ops.log(1 + ops.exp(2 * x)) / 2)"),
    ("logsigmoid", "F.logsigmoid(x)", "x", "ops.log(ops.sigmoid(x))"),
    ("logsigmoid_cell", "mint.nn.LogSigmoid()(x)", "x", "ops.log(ops.sigmoid(x))"),
    ("threshold", "F.threshold(x, 0.1, 2.0)", "x", "ops.select(x > 0.1, x, ops.ones_like(x) * 2.0)"),
    ("threshold_cell", "mint.nn.Threshold(0.1, 2.0)(x)", "x", "ops.select(x > 0.1, x, ops.ones_like(x) * 2.0)"),
    ("prelu", "F.prelu(x, w)", "xw", None),
    ("prelu_cell", "mint.nn.PReLU(3, 0.2)(x)", "x", None),
    ("kl_div", "F.kl_div(x, p)", "x", "(p * (ops.log(p) - x)).mean()"),
    ("kl_div_batchmean", "F.kl_div(x, p, 'batchmean')", "x", "(p * (ops.log(p) - x)).sum() / 2"),
    ("kl_div_log_target", "F.kl_div(x, lp, 'sum', True)", "x", "(ops.exp(lp) * (lp - x)).sum()"),
    ("kl_div_cell", "mint.nn.KLDivLoss(reduction='none')(x, p)", "x", "p * (ops.log(p) - x)"),
    ("smooth_l1", "F.smooth_l1_loss(x, t)", "x", None),
    ("smooth_l1_cell", "mint.nn.SmoothL1Loss(reduction='sum', beta=0.5)(x, t)", "x", None),
    ("bce", "F.binary_cross_entropy(p, q)", "p", None),
    ("bce_cell", "mint.nn.BCELoss(weight=q, reduction='none')(p, q)", "p", None),
    ("soft_margin", "F.soft_margin_loss(x, s)", "x", "ops.log(1 + ops.exp(-s * x)).mean()"),
    ("pad_constant", "F.pad(v, (1, 2, 0, 1), value=0.5)", "v", "ops.pad(v, (1, 2, 0, 1), value=0.5)"),
    ("pad_crop", "F.pad(v, (-1, 2, 1, -2))", "v", "ops.pad(v, (-1, 2, 1, -2))"),
    ("pad_reflect", "F.pad(v, (2, 1, 3, 0), mode='reflect')", "v", "ops.pad(v, (2, 1, 3, 0), mode='reflect')"),
    ("pad_replicate", "F.pad(v, (2, 3, 1, 4), 'replicate')", "v", "ops.pad(v, (2, 3, 1, 4), mode='replicate')"),
    ("pad_circular", "F.pad(v, (2, 1, 1, 3), 'circular')", "v", None),
    ("zeropad2d", "mint.nn.ZeroPad2d((1, 0, 2, 1))(v)", "v", "ops.pad(v, (1, 0, 2, 1))"),
    ("constantpad1d", "mint.nn.ConstantPad1d(2, -1.5)(x)", "x", "ops.pad(x, (2, 2), value=-1.5)"),
    (
        "constantpad3d",
        "mint.nn.ConstantPad3d((1, 0, 0, 1, 1, 1), 2.0)(v)",
        "v",
        "ops.pad(v, (1, 0, 0, 1, 1, 1), value=2.0)",
    ),
    ("reflectionpad1d", "mint.nn.ReflectionPad1d(3)(x)", "x", "ops.pad(x, (3, 3), mode='reflect')"),
    ("reflectionpad2d", "mint.nn.ReflectionPad2d((1, 2, 3, 1))(v)", "v", "ops.pad(v, (1, 2, 3, 1), mode='reflect')"),
    ("replicationpad2d", "mint.nn.ReplicationPad2d(2)(v)", "v", "ops.pad(v, (2, 2, 2, 2), mode='replicate')"),
    (
        "replicationpad3d",
        "mint.nn.ReplicationPad3d((1, 1, 0, 2, 1, 0))(z)",
        "z",
        "ops.pad(z, (1, 1, 0, 2, 1, 0), mode='replicate')",
    ),
    ("pixel_shuffle", "F.pixel_shuffle(u, 2)", "u", None),
    ("pixel_shuffle_cell", "mint.nn.PixelShuffle(2)(u)", "u", None),
    ("normalize", "F.normalize(v)", "v", "v / ops.maximum(ops.sqrt((v * v).sum(1, keepdims=True)), 1e-12)"),
    ("normalize_p1", "F.normalize(v, 1.0, -1)", "v", "v / ops.maximum(ops.abs(v).sum(-1, keepdims=True), 1e-12)"),
    ("avg_pool1d", "F.avg_pool1d(x, 3, 2, 1)", "x", "ops.avg_pool1d(x, 3, 2, 1)"),
    ("avg_pool1d_cell", "mint.nn.AvgPool1d(2, count_include_pad=False)(x)", "x", "ops.avg_pool1d(x, 2, 2)"),
    ("interpolate_nearest_scale", "F.interpolate(v, scale_factor=(1.5, 0.7))", "v", None),
    ("interpolate_nearest_size", "F.interpolate(v, size=(7, 3))", "v", None),
    ("interpolate_nearest_1d", "F.interpolate(x, size=7)", "x", None),
    ("interpolate_nearest_3d", "F.interpolate(z, scale_factor=2.0)", "z", None),
    (
        "interpolate_bilinear",
        "F.interpolate(v, size=(6, 8), mode='bilinear')",
        "v",
        "ops.ResizeBilinearV2(False, True)(v, (6, 8))",
    ),
    (
        "interpolate_bilinear_corners",
        "F.interpolate(v, size=(3, 9), mode='bilinear', align_corners=True)",
        "v",
        "ops.ResizeBilinearV2(True, False)(v, (3, 9))",
    ),
    (
        "interpolate_linear",
        "F.interpolate(x, size=7, mode='linear')",
        "x",
        "ops.ResizeBilinearV2(False, True)(x.expand_dims(2), (1, 7)).squeeze(2)",
    ),
    ("upsample_cell", "mint.nn.Upsample(scale_factor=2.0)(v)", "v", None),
    ("upsampling_nearest2d_cell", "mint.nn.UpsamplingNearest2d(size=(5, 7))(v)", "v", None),
    (
        "upsampling_bilinear2d_cell",
        "mint.nn.UpsamplingBilinear2d(size=(6, 8))(v)",
        "v",
        "ops.ResizeBilinearV2(True, False)(v, (6, 8))",
    ),
    ("soft_margin_cell", "mint.nn.SoftMarginLoss(reduction='sum')(x, s)", "x", "ops.log(1 + ops.exp(-s * x)).sum()"),
]


def _inputs(rng) -> dict:
    """x normal with scale 2 (beyond hardswish's -3..3 too), e (2, 4, 3), p and q probabilities, lp log
    probabilities, t targets, s signs, w PReLU's per-channel slopes, v (2, 3, 4, 5), u (2, 8, 2, 3) and z
    (1, 2, 3, 4, 5) normal."""
    return {
        "x": (2 * rng.standard_normal((2, 3, 4))).astype(np.float32),
        "e": rng.standard_normal((2, 4, 3)).astype(np.float32),
        "p": rng.uniform(0.05, 0.95, (2, 3, 4)).astype(np.float32),
        "q": rng.uniform(0.05, 0.95, (2, 3, 4)).astype(np.float32),
        "lp": np.log(rng.uniform(0.05, 0.95, (2, 3, 4))).astype(np.float32),
        "t": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "s": rng.choice([-1.0, 1.0], (2, 3, 4)).astype(np.float32),
        "w": rng.uniform(0.1, 0.5, (3,)).astype(np.float32),
        "v": rng.standard_normal((2, 3, 4, 5)).astype(np.float32),
        "u": rng.standard_normal((2, 8, 2, 3)).astype(np.float32),
        "z": rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32),
    }


def _calls(rng, arrays: dict) -> None:
    inputs = _inputs(rng)
    for key, value in inputs.items():
        arrays[f"calls/{key}"] = value
    names = list(inputs)
    for name, call, wrt, reference in CALLS:
        text = call if reference is None else reference
        positions = tuple(names.index(v) for v in wrt)  # one-letter input names

        def forward(*values, text=text):
            return eval(text, {"F": mint.nn.functional, "mint": mint, "ops": ops, **dict(zip(names, values))})

        tensors = [ms.Tensor(inputs[n]) for n in names]
        y = forward(*tensors)
        r = rng.standard_normal(y.shape).astype(np.float32)

        def loss(*values, r=r, forward=forward):
            return (forward(*values) * ms.Tensor(r)).sum()

        grads = ms.grad(loss, grad_position=positions)(*tensors)
        grads = grads if isinstance(grads, tuple) else (grads,)
        arrays[f"{name}/y"], arrays[f"{name}/r"] = y.asnumpy(), r
        for position, grad in zip(positions, grads):
            arrays[f"{name}/d{names[position]}"] = grad.asnumpy()


def _conv(cell, p, x, training):
    one_d = x.ndim == 3
    padded = ops.pad(x, tuple(cell._reversed_padding))
    weight, stride, dilation = p["weight"], cell.stride, cell.dilation
    if one_d:
        padded, weight = padded.expand_dims(2), weight.expand_dims(2)
        stride, dilation = (1, *stride), (1, *dilation)
    conv = ops.Conv2D(
        cell.out_channels, weight.shape[2:], pad_mode="valid", stride=stride, dilation=dilation, group=cell.groups
    )
    y = conv(padded, weight)
    if "bias" in p:
        y = y + p["bias"].reshape(1, -1, 1, 1)
    return y.squeeze(2) if one_d else y


def _conv_transpose(cell, p, x, training):
    """Conv2DTranspose (Conv2D's input gradient) with PyTorch's output size, output_padding included."""
    sizes = [
        (n - 1) * s - 2 * pad + d * (k - 1) + extra + 1
        for n, k, s, pad, d, extra in zip(
            x.shape[2:], cell.kernel_size, cell.stride, cell.padding, cell.dilation, cell.output_padding
        )
    ]
    (ph, pw), weight = cell.padding, p["weight"]
    conv = ops.Conv2DTranspose(
        cell.in_channels,  # the out_channel of the Conv2D whose input gradient this is
        tuple(weight.shape[2:]),
        pad_mode="pad",
        pad=(ph, ph, pw, pw),
        stride=cell.stride,
        dilation=cell.dilation,
        group=cell.groups,
    )
    y = conv(x, weight, (x.shape[0], cell.out_channels, *sizes))
    return y + p["bias"].reshape(1, -1, 1, 1) if "bias" in p else y


def _batch_norm(cell, p, x, training):
    view = (1, -1) + (1,) * (x.ndim - 2)
    axes = tuple(i for i in range(x.ndim) if i != 1)
    if training or not cell.track_running_stats:
        mean = x.mean(axes, keep_dims=True)
        var = ((x - mean) ** 2).mean(axes, keep_dims=True)
    else:
        mean, var = p["running_mean"].reshape(view), p["running_var"].reshape(view)
    y = (x - mean) / ops.sqrt(var + cell.eps)
    if cell.affine:
        y = y * p["weight"].reshape(view) + p["bias"].reshape(view)
    return y


def _running_stats(cell, x: np.ndarray, stats: dict) -> dict:
    axes = tuple(i for i in range(x.ndim) if i != 1)
    wide, m, n = x.astype(np.float64), cell.momentum, x.size // x.shape[1]
    return {
        "running_mean": (1 - m) * stats["running_mean"] + m * wide.mean(axes),
        "running_var": (1 - m) * stats["running_var"] + m * wide.var(axes) * n / (n - 1),
        "num_batches_tracked": stats["num_batches_tracked"] + 1,
    }


def _layer_norm(cell, p, x, training):
    axis = x.ndim - len(cell.normalized_shape)
    shape = cell.normalized_shape
    weight = p.get("weight", ms.Tensor(np.ones(shape, np.float32)))
    bias = p.get("bias", ms.Tensor(np.zeros(shape, np.float32)))
    return ops.LayerNorm(axis, axis, cell.eps)(x, weight, bias)[0]


def _pairs(value):
    return (value, value) if isinstance(value, int) else tuple(value)


def _pool_pads(cell):
    ph, pw = _pairs(cell.padding)
    return (pw, pw, ph, ph)


def _max_pool(cell, p, x, training):
    padded = ops.pad(x, _pool_pads(cell), value=float("-inf"))
    return ops.MaxPool(_pairs(cell.kernel_size), _pairs(cell.stride), "VALID")(padded)


def _avg_pool(cell, p, x, training):
    pool = ops.AvgPool(_pairs(cell.kernel_size), _pairs(cell.stride or cell.kernel_size), "VALID")
    y = pool(ops.pad(x, _pool_pads(cell)))
    if cell.count_include_pad:
        return y
    return y / pool(ops.pad(ops.ones_like(x), _pool_pads(cell)))


def _embedding(cell, p, x, training):
    # the padding row is zero from the start, so masking it changes no value and stops its gradient, as mint's
    mask = np.ones((cell.num_embeddings, 1), np.float32)
    if cell.padding_idx is not None:
        mask[cell.padding_idx] = 0
    return ops.gather(p["weight"] * ms.Tensor(mask), x, 0)


REFERENCES = {
    "EmbeddingExt": _embedding,
    "Conv1d": _conv,
    "Conv2d": _conv,
    "ConvTranspose2d": _conv_transpose,
    "BatchNorm1d": _batch_norm,
    "BatchNorm2d": _batch_norm,
    "BatchNorm3d": _batch_norm,
    "LayerNormExt": _layer_norm,
    "MaxPool2dExt": _max_pool,
    "AvgPool2dExt": _avg_pool,
    "AdaptiveAvgPool2d": lambda cell, p, x, training: ops.adaptive_avg_pool2d(x, cell.output_size),
    # ops.adaptive_avg_pool1d / adaptive_max_pool1d need a length that divides by output_size: pool (1, L) rows
    "AdaptiveAvgPool1d": lambda cell, p, x, training: ops.adaptive_avg_pool2d(
        x.expand_dims(-2), (1, cell.output_size)
    ).squeeze(-2),
    "AdaptiveMaxPool1d": lambda cell, p, x, training: ops.adaptive_max_pool2d(
        x.expand_dims(-2), (1, cell.output_size)
    ).squeeze(-2),
}
# the mint cells that MindSpore 2.7.0's CPU build runs (in PYNATIVE_MODE, forward and backward)
MINT_RUNS = ("GroupNorm", "AdaptiveMaxPool2d")


def _forward(cell, trainable: list, consts: dict, training: bool):
    """The mint cell's call where MindSpore's CPU build runs it, else its reference, of (x, *trainable weights)."""
    cls = type(cell).__name__

    def forward(inp, *weights):
        if cls in MINT_RUNS:
            return cell(inp)
        return REFERENCES[cls](cell, {**consts, **dict(zip(trainable, weights))}, inp, training)

    return forward


def main(out_dir: str) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for name, ctor, shape, kind in CASES:
        cell = eval(ctor)
        if kind == "f":
            x = rng.standard_normal(shape).astype(np.float32)
        else:
            x = rng.integers(0, int(kind[1:]), shape).astype(np.int64)
        arrays[f"{name}/x"] = x
        params = {param.name: param.asnumpy() for param in cell.get_parameters()}
        for key, value in params.items():
            arrays[f"{name}/p.{key}"] = value
        trainable = [param.name for param in cell.trainable_params()]
        for step, training in (("train", True), ("eval", False)):
            cell.set_train(training)
            consts = {k: ms.Tensor(v) for k, v in params.items() if k not in trainable}

            forward = _forward(cell, trainable, consts, training)

            y = forward(ms.Tensor(x), *(ms.Tensor(params[k]) for k in trainable))
            r = rng.standard_normal(y.shape).astype(np.float32)
            arrays[f"{name}/{step}.r"] = r

            def loss(inp, *weights, r=r, forward=forward):
                return (forward(inp, *weights) * ms.Tensor(r)).sum()

            if type(cell).__name__ in MINT_RUNS:
                weights = cell.trainable_params()
                value, grads = ms.value_and_grad(loss, 0, weights or None)(ms.Tensor(x))
                dx, grads = grads if weights else (grads, ())
                arrays[f"{name}/{step}.dx"] = dx.asnumpy()
            else:
                positions = tuple(range(1 + len(trainable)))
                if kind != "f":  # integer ids have no gradient
                    positions = positions[1:]
                value, grads = ms.value_and_grad(loss, grad_position=positions)(
                    ms.Tensor(x), *(ms.Tensor(params[k]) for k in trainable)
                )
                grads = list(grads) if isinstance(grads, tuple) else [grads]  # one position: a bare Tensor
                if kind == "f":
                    dx, *grads = grads
                    arrays[f"{name}/{step}.dx"] = dx.asnumpy()
            arrays[f"{name}/{step}.y"] = y.asnumpy()
            arrays[f"{name}/{step}.loss"] = value.asnumpy()
            for key, grad in zip(trainable, grads):
                arrays[f"{name}/{step}.d.{key}"] = grad.asnumpy()
            if training and "running_mean" in params:
                for key, value in _running_stats(cell, x, params).items():
                    params[key] = np.asarray(value, arrays[f"{name}/p.{key}"].dtype)
                    arrays[f"{name}/after.{key}"] = params[key]
    _calls(rng, arrays)
    arrays["cases"] = np.array(json.dumps(CASES))
    arrays["calls"] = np.array(json.dumps(CALLS))
    np.savez_compressed(f"{out_dir}/mindspore_mint_nn.npz", **arrays)
    print(len(CASES), "cases,", len(arrays), "arrays")


if __name__ == "__main__":
    main(sys.argv[1])
