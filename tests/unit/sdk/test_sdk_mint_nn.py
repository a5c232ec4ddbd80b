"""tessel.mint.nn's convolution, normalisation, embedding and pooling cells against MindSpore 2.7.0's mint.nn:
parameter names, shapes and initialisation, outputs and the gradients of sum(y * r) with respect to the input and
every parameter, in train and eval mode, the running statistics after a train step, in PYNATIVE_MODE and GRAPH_MODE.
The values are data/make_mindspore_mint_nn.py's: the mint cell's own where MindSpore 2.7.0's CPU build runs it, else
MindSpore's CPU ops computing what mint documents (its CPU build has no Conv2DExt, BatchNormExt, ... kernel)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import tessel as ms
from tessel import mint, nn
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.mint.nn import functional as F

REFERENCE = np.load(Path(__file__).parent / "data" / "mindspore_mint_nn.npz")
CASES = json.loads(str(REFERENCE["cases"]))
CALLS = json.loads(str(REFERENCE["calls"]))
INPUTS = {key[len("calls/") :]: REFERENCE[key] for key in REFERENCE.files if key.startswith("calls/")}
MODES = {"pynative": ms.PYNATIVE_MODE, "graph": ms.GRAPH_MODE}


def _build(name: str, ctor: str):
    """The cell of `ctor` with MindSpore's initialised parameters copied in by name (same names and shapes)."""
    cell = eval(ctor, {"mint": mint})
    params = {p.name: p for p in cell.get_parameters()}
    want = {key[len(name) + 3 :] for key in REFERENCE.files if key.startswith(f"{name}/p.")}
    assert set(params) == want
    for key, param in params.items():
        value = REFERENCE[f"{name}/p.{key}"]
        assert tuple(param.shape) == value.shape
        param.set_data(ms.Tensor(value))
    return cell


def _close(got, name: str, key: str) -> float:
    want = REFERENCE[f"{name}/{key}"]
    got = got.asnumpy() if isinstance(got, ms.Tensor) else np.asarray(got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} {key}")
    return float(np.max(np.abs(got - want), initial=0.0))


def _step(cell, name: str, step: str, x):
    r = ms.Tensor(REFERENCE[f"{name}/{step}.r"])
    weights = cell.trainable_params()

    def loss(inp):
        return (cell(inp) * r).sum()

    floats = x.dtype == ms.float32
    value, grads = ms.value_and_grad(loss, 0 if floats else None, weights or None)(x)
    if floats:
        dx, grads = grads if weights else (grads, ())
        _close(dx, name, f"{step}.dx")
    _close(value, name, f"{step}.loss")
    for param, grad in zip(weights, grads):
        _close(grad, name, f"{step}.d.{param.name}")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cell_matches_mindspore(case, mode):
    name, ctor, _, _ = case
    ms.set_context(mode=MODES[mode])
    x = ms.Tensor(REFERENCE[f"{name}/x"])
    stateful = f"{name}/after.running_mean" in REFERENCE.files
    # train: one cell called, another differentiated; each updates its running statistics once
    called, differentiated = _build(name, ctor), _build(name, ctor)
    _close(called(x), name, "train.y")
    _step(differentiated, name, "train", x)
    for cell in (called, differentiated) if stateful else ():
        for key in ("running_mean", "running_var", "num_batches_tracked"):
            _close(getattr(cell, key), name, f"after.{key}")
    called.set_train(False)
    _close(called(x), name, "eval.y")
    _step(called, name, "eval", x)


@pytest.mark.parametrize("ctor, fan_in", [
    ("mint.nn.Conv2d(16, 32, 3)", 16 * 9),
    ("mint.nn.Conv2d(16, 32, (3, 5), groups=4)", 4 * 15),
    ("mint.nn.Conv1d(16, 32, 5)", 16 * 5),
    ("mint.nn.ConvTranspose2d(16, 32, 3)", 32 * 9),  # fan_in of the (in, out / groups, kH, kW) weight: out * kH * kW
])  # fmt: skip
def test_conv_initialisation_is_mints(ctor, fan_in):
    """MindSpore 2.7.0's mint.nn.Conv2d / Conv1d: weight HeUniform(sqrt(5)) and bias Uniform(1 / sqrt(fan_in)), both
    within 1 / sqrt(fan_in) (Conv2d(16, 32, 3) gives max |weight| 0.0833, weight std 0.0481, max |bias| 0.0795 for
    the bound 0.0833)."""
    cell = eval(ctor, {"mint": mint})
    bound = 1 / math.sqrt(fan_in)
    for param in (cell.weight, cell.bias):
        values = param.asnumpy()
        assert np.abs(values).max() <= bound and np.abs(values).max() > 0.9 * bound
        # a uniform draw on [-bound, bound] has standard deviation bound / sqrt(3)
        assert abs(values.std() - bound / math.sqrt(3)) < 0.2 * bound
    assert mint.nn.Conv2d(2, 3, 1, bias=False).bias is None


def test_embedding_and_norm_initialisation_is_mints():
    """MindSpore 2.7.0: Embedding's weight is Normal(0, 1) with the padding row zero (Embedding(1000, 64) gives mean
    -0.0011, std 0.998); the norm layers' weight ones,
    bias zeros, running_mean zeros, running_var ones, num_batches_tracked an int64 0."""
    table = mint.nn.Embedding(1000, 64, padding_idx=3).weight.asnumpy()
    assert abs(table.mean()) < 0.02 and abs(table.std() - 1) < 0.02 and not table[3].any()
    bn = mint.nn.BatchNorm2d(4)
    assert [p.name for p in bn.get_parameters()] == [
        "weight", "bias", "running_mean", "running_var", "num_batches_tracked"
    ]  # fmt: skip
    assert bn.num_batches_tracked.dtype == ms.int64 and bn.running_var.asnumpy().tolist() == [1.0] * 4
    assert [p.name for p in bn.trainable_params()] == ["weight", "bias"]
    assert mint.nn.BatchNorm1d(3, affine=False).weight is None
    assert mint.nn.BatchNorm1d(3, track_running_stats=False).running_mean is None
    assert [p.name for p in mint.nn.GroupNorm(2, 4, affine=False).trainable_params()] == []
    assert mint.nn.LayerNorm(4, bias=False).bias is None


def test_functional_forms_match_the_cells():
    x = ms.Tensor(REFERENCE["conv1d_groups/x"])
    weight = ms.Tensor(REFERENCE["conv1d_groups/p.weight"])
    bias = ms.Tensor(REFERENCE["conv1d_groups/p.bias"])
    _close(F.conv1d(x, weight, bias, 2, 0, 2, 2), "conv1d_groups", "train.y")
    x = ms.Tensor(REFERENCE["groupnorm/x"])
    _close(F.group_norm(x, 2, None, None), "groupnorm", "train.y")  # weight ones, bias zeros there
    ids = ms.Tensor(REFERENCE["embedding/x"])
    _close(F.embedding(ids, ms.Tensor(REFERENCE["embedding/p.weight"])), "embedding", "train.y")
    x = ms.Tensor(REFERENCE["bn2d_no_stats/x"])
    _close(F.batch_norm(x, None, None, training=True), "bn2d_no_stats", "train.y")  # weight ones, bias zeros
    _close(F.adaptive_avg_pool1d(ms.Tensor(REFERENCE["adaptive_avg1d/x"]), 3), "adaptive_avg1d", "train.y")
    _close(F.adaptive_max_pool1d(ms.Tensor(REFERENCE["adaptive_max1d/x"]), 3), "adaptive_max1d", "train.y")


def test_what_tessel_cannot_do_is_refused():
    with pytest.raises(NotSupportedYetError, match="padding_mode='reflect'"):
        mint.nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
    with pytest.raises(ConfigurationError, match="padding_mode"):
        mint.nn.Conv2d(3, 4, 3, padding_mode="mirror")
    with pytest.raises(ConfigurationError, match="strided"):
        mint.nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(NotSupportedYetError, match="momentum=None"):
        mint.nn.BatchNorm2d(3, momentum=None)
    with pytest.raises(NotSupportedYetError, match="max_norm"):
        mint.nn.Embedding(5, 2, max_norm=1.0)
    with pytest.raises(NotSupportedYetError, match="scale_grad_by_freq"):
        mint.nn.Embedding(5, 2, scale_grad_by_freq=True)
    with pytest.raises(ConfigurationError, match="sparse"):
        mint.nn.Embedding(5, 2, sparse=True)
    with pytest.raises(NotSupportedYetError, match="ceil_mode"):
        mint.nn.MaxPool2d(2, ceil_mode=True)
    with pytest.raises(NotSupportedYetError, match="divisor_override"):
        mint.nn.AvgPool2d(2, divisor_override=3)
    with pytest.raises(NotSupportedYetError, match="return_indices"):
        mint.nn.AdaptiveMaxPool2d(2, return_indices=True)
    with pytest.raises(ConfigurationError, match="4-D input"):
        mint.nn.BatchNorm2d(3)(ms.Tensor(np.ones((2, 3, 4), np.float32)))


class _Call(nn.Cell):
    """The generator's call text on the inputs, as a cell (so GRAPH_MODE traces it); a cell call's cell is built
    here, outside the traced construct."""

    def __init__(self, text: str):
        super().__init__()
        match = re.fullmatch(r"(mint\.nn\.\w+\(.*?\))\((.*)\)", text)
        scope = {"mint": mint, **{k: ms.Tensor(v) for k, v in INPUTS.items()}}
        self.inner = eval(match[1], scope) if match else None
        self.text = f"({match[2]},)" if match else text

    def construct(self, *values):
        scope = {"F": F, "mint": mint, **dict(zip(INPUTS, values))}
        return eval(self.text, scope) if self.inner is None else self.inner(*eval(self.text, scope))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("call", CALLS, ids=[c[0] for c in CALLS])
def test_activation_or_loss_matches_mindspore(call, mode):
    name, text, wrt, _ = call
    ms.set_context(mode=MODES[mode])
    cell, tensors = _Call(text), [ms.Tensor(v) for v in INPUTS.values()]
    _close(cell(*tensors), name, "y")
    r = ms.Tensor(REFERENCE[f"{name}/r"])
    positions = (
        tuple(list(INPUTS).index(v) for v in ("x", "w") if v in wrt) if wrt == "xw" else (list(INPUTS).index(wrt),)
    )
    grads = ms.grad(lambda *values: (cell(*values) * r).sum(), grad_position=positions)(*tensors)
    for position, grad in zip(positions, grads if isinstance(grads, tuple) else (grads,)):
        _close(grad, name, f"d{list(INPUTS)[position]}")


def test_activation_and_loss_arguments_are_mints():
    """MindSpore 2.7.0's: PReLU's weight (num_parameters,) filled with init; inplace=True is refused (tessel
    never overwrites inputs); glu needs an even dim."""
    prelu = mint.nn.PReLU(3, 0.2)
    assert [p.name for p in prelu.get_parameters()] == ["weight"]
    np.testing.assert_array_equal(prelu.weight.asnumpy(), np.full(3, 0.2, np.float32))
    with pytest.raises(NotSupportedYetError, match="inplace=True"):
        mint.nn.ELU(inplace=True)
    with pytest.raises(NotSupportedYetError, match="inplace=True"):
        F.threshold(ms.Tensor(INPUTS["x"]), 0.0, 0.0, inplace=True)
    with pytest.raises(ConfigurationError, match="odd length"):
        F.glu(ms.Tensor(INPUTS["x"]), 1)
    with pytest.raises(ConfigurationError, match="reduction"):
        mint.nn.SmoothL1Loss(reduction="batchmean")


@pytest.mark.parametrize("shape", [(4, 16, 3, 3), (16, 3, 3)])
def test_dropout2d_zeroes_whole_channels(shape):
    """MindSpore 2.7.0's mint.nn.Dropout2d / functional.dropout2d: each channel of an (N, C, H, W) or unbatched
    (C, H, W) input is zeroed with probability p, the others scaled by 1 / (1 - p); eval mode is the identity."""
    x = ms.Tensor(np.ones(shape, np.float32))
    cell = mint.nn.Dropout2d(0.5)
    cell.set_train()
    for y in (cell(x).asnumpy(), F.dropout2d(x, 0.5).asnumpy()):
        per_channel = y.reshape(-1, 9)
        assert set(np.unique(per_channel)) <= {0.0, 2.0} and (per_channel == per_channel[:, :1]).all()
        assert 0 < (per_channel[:, 0] == 0).sum() < per_channel.shape[0]
    cell.set_train(False)
    assert (cell(x).asnumpy() == 1).all() and (F.dropout2d(x, 0.5, False).asnumpy() == 1).all()


def test_pad_arguments_are_checked():
    v = ms.Tensor(INPUTS["v"])
    with pytest.raises(ConfigurationError, match="mode"):
        F.pad(v, (1, 1), mode="edge")
    with pytest.raises(ConfigurationError, match="value"):
        F.pad(v, (1, 1), mode="reflect", value=1.0)
    with pytest.raises(ConfigurationError, match="reflect"):
        F.pad(v, (5, 5), mode="reflect")  # reflect pads must be shorter than the dim (5)
    with pytest.raises(ConfigurationError, match="4 ints"):
        mint.nn.ZeroPad2d((1, 2))
    with pytest.raises(NotSupportedYetError, match="p=3"):
        F.normalize(v, 3.0)


def test_conv_transpose2d_output_size_picks_the_output_padding():
    """PyTorch's rule, as mint's: output_size selects output_padding = size - ((H - 1) * stride - 2 * padding +
    dilation * (k - 1) + 1) (here 1 row and 1 column, as the case with output_padding=1)."""
    cell = _build("convtranspose2d", "mint.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1)")
    x = ms.Tensor(REFERENCE["convtranspose2d/x"])
    _close(cell(x, output_size=(8, 10)), "convtranspose2d", "train.y")


def test_interpolate_arguments_are_mints():
    """MindSpore 2.7.0's interpolate: one of size and scale_factor, align_corners only with the linear modes,
    bilinear by size only; the modes tessel lacks are refused."""
    v = ms.Tensor(INPUTS["v"])
    with pytest.raises(ConfigurationError, match="exactly one"):
        F.interpolate(v)
    with pytest.raises(ConfigurationError, match="align_corners"):
        F.interpolate(v, size=(2, 2), align_corners=True)
    with pytest.raises(ConfigurationError, match="scale_factor"):
        F.interpolate(v, scale_factor=2.0, mode="bilinear")
    with pytest.raises(NotSupportedYetError, match="bicubic"):
        F.interpolate(v, size=(2, 2), mode="bicubic")


@pytest.mark.parametrize("fn, signature", [
    (F.max_pool2d, "(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False)"),
    (F.conv_transpose2d, "(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1)"),
    (
        F.batch_norm,
        "(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-05)",
    ),
    (F.pad, "(input, pad, mode='constant', value=None)"),
    (
        F.interpolate,
        "(input, size=None, scale_factor=None, mode='nearest', align_corners=None, recompute_scale_factor=None)",
    ),
    (F.kl_div, "(input, target, reduction='mean', log_target=False)"),
    (F.smooth_l1_loss, "(input, target, reduction='mean', beta=1.0)"),
])  # fmt: skip
def test_functional_signatures_are_mints(fn, signature):
    """inspect.signature on MindSpore 2.7.0's mint.nn.functional (max_pool2d's ceil_mode is positional there)."""
    import inspect

    sig = inspect.signature(fn)
    params = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    assert str(sig.replace(parameters=params, return_annotation=sig.empty)) == signature


def test_nn_names_that_are_mint_classes_in_mindspore_are_the_same_classes():
    from tessel import mint

    # MindSpore 2.7.0: nn.Linear is mint.nn.Linear, nn.DropoutExt is mint.nn.Dropout, ... (measured with `is`)
    pairs = {"Linear": "Linear", "DropoutExt": "Dropout", "EmbeddingExt": "Embedding", "LayerNormExt": "LayerNorm"}
    pairs.update(MaxPool2dExt="MaxPool2d", AvgPool2dExt="AvgPool2d", PReLUExt="PReLU", L1LossExt="L1Loss")
    pairs.update(LogSoftmaxExt="LogSoftmax")
    for nn_name, mint_name in pairs.items():
        assert getattr(ms.nn, nn_name) is getattr(mint.nn, mint_name), nn_name
    assert ms.nn.Linear(3, 2).weight.shape == (2, 3)
