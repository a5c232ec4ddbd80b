"""tessel.nn's CellDict, PReLU, Threshold, CELU, GLU, Softmax2d, OneHot, InstanceNorm1d/2d, the padding cells,
nn.Pad, PixelShuffle / PixelUnshuffle, the losses of loss_more.py and the deprecated Tril, Triu, Roll, Norm, Range,
MatMul, Moments, ClipByNorm cells against MindSpore 2.7.0's mindspore.nn: outputs and the gradients of sum(y * r)
with respect to the inputs and the parameters, in PYNATIVE_MODE and GRAPH_MODE (the values are
data/make_mindspore_nn_more.py's, MindSpore 2.7.0 CPU), and MindSpore's argument checks (error type and when).
Where MindSpore's CPU build has no kernel (InstanceNorm, SoftMarginLoss, TripletMarginLoss, Roll) or a wrong one
(ClipByNorm with an axis), the reference is the documented formula in NumPy float64."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tessel as ms
from tessel import nn

REFERENCE = np.load(Path(__file__).parent / "data" / "mindspore_nn_more.npz")
CASES = sorted({key.split("/")[0] for key in REFERENCE.files if key.endswith("/expr")})
MODES = {"pynative": ms.PYNATIVE_MODE, "graph": ms.GRAPH_MODE}


def _close(got, want) -> None:
    got = got.asnumpy() if isinstance(got, ms.Tensor) else np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class Stacked(nn.Cell):
    """A cell of several outputs as one: its outputs flattened and concatenated."""

    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def construct(self, *xs):
        return ms.ops.cat([y.reshape(-1) for y in self.cell(*xs)])


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", CASES)
def test_cell_matches_mindspore(name, mode):
    ms.set_context(mode=MODES[mode])
    cell = eval(str(REFERENCE[f"{name}/expr"]), {"nn": nn, "ms": ms, "np": np})
    inputs = [REFERENCE[key] for key in sorted(k for k in REFERENCE.files if k.startswith(f"{name}/x"))]
    tensors = [ms.Tensor(x) for x in inputs]
    out = cell(*tensors)
    if isinstance(out, tuple):  # Moments: (mean, variance), stored as one flat tensor
        cell = Stacked(cell)
        out = cell(*tensors)
    _close(out, REFERENCE[f"{name}/out"])
    floats = tuple(int(i) for i in REFERENCE[f"{name}/floats"])
    if not floats:
        return
    cot = ms.Tensor(REFERENCE[f"{name}/cot"])
    params = cell.trainable_params()

    def loss(*xs):
        return (cell(*xs) * cot).sum()

    _, grads = ms.value_and_grad(loss, floats, params or None)(*tensors)
    input_grads, param_grads = grads if params else (grads, ())
    input_grads = input_grads if isinstance(input_grads, tuple) else (input_grads,)
    for i, grad in zip(floats, input_grads):
        _close(grad, REFERENCE[f"{name}/dx{i}"])
    assert len(param_grads) == len(params)
    for param, grad in zip(params, param_grads):
        _close(grad, REFERENCE[f"{name}/dp_{param.name}"])


def test_celldict_names_parameters_by_key_as_mindspore():
    class Heads(nn.Cell):
        def __init__(self):
            super().__init__()
            self.stem = nn.Dense(2, 2)
            self.heads = nn.CellDict({"cls": nn.Dense(2, 3), "box": nn.Dense(2, 4, has_bias=False)})

    net = Heads()
    net.heads["extra"] = nn.Dense(2, 1)
    net.heads.update([("cls", nn.Dense(2, 5))])
    # MindSpore 2.7.0 gives ['stem.weight', 'stem.bias', 'heads.cls.weight', 'heads.cls.bias', 'heads.box.weight',
    # 'heads.extra.weight', 'heads.extra.bias'] and keys ['cls', 'box', 'extra']
    assert [p.name for p in net.get_parameters()] == list(REFERENCE["celldict/names"])
    assert list(net.heads.keys()) == list(REFERENCE["celldict/keys"])
    assert net.heads["cls"].out_channels == 5 and "box" in net.heads and len(net.heads) == 3
    loose = nn.CellDict({"a": nn.Dense(2, 3)})
    assert [p.name for p in loose.get_parameters()] == list(REFERENCE["celldict/loose_names"])
    popped = net.heads.pop("box")
    assert isinstance(popped, nn.Dense) and list(net.heads) == ["cls", "extra"]
    net.heads.clear()
    assert len(net.heads) == 0


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda: nn.CellDict({1: nn.ReLU()}), TypeError),
        (lambda: nn.CellDict({"a.b": nn.ReLU()}), KeyError),
        (lambda: nn.CellDict({"": nn.ReLU()}), KeyError),
        (lambda: nn.CellDict({"training": nn.ReLU()}), KeyError),
        (lambda: nn.CellDict({"a": None}), TypeError),
        (lambda: nn.CellDict({"a": nn.CellList()}), TypeError),
        (lambda: nn.CellDict([("a", nn.ReLU(), 1)]), ValueError),
        (lambda: nn.CellDict(3), TypeError),
        (lambda: nn.CellDict(auto_prefix=False), KeyError),  # MindSpore 2.7.0 reads kwargs["auto_preifx"]
        (lambda: nn.PReLU(0), ValueError),
        (lambda: nn.PReLU(2, 1), TypeError),
        (lambda: nn.PReLU(2, [0.1]), ValueError),
        (lambda: nn.ZeroPad2d([1, 1]), TypeError),
        (lambda: nn.ConstantPad1d((1, 2, 3, 4), 0.0), ValueError),
        (lambda: nn.ReflectionPad1d(-1), ValueError),
        (lambda: nn.Pad(((1, 1),), "FOO"), ValueError),
        (lambda: nn.Pad([[1, 1]]), TypeError),
        (lambda: nn.InstanceNorm2d(3, eps=1), TypeError),
        (lambda: nn.InstanceNorm2d(3, momentum=2.0), ValueError),
        (lambda: nn.InstanceNorm2d(3, affine=1), TypeError),
        (lambda: nn.InstanceNorm2d(3, eps=1.0), ValueError),  # ops.InstanceNorm's epsilon in [0, 1)
        (lambda: nn.MultiMarginLoss(p=3), ValueError),
        (lambda: nn.MultiMarginLoss(margin=1), TypeError),
        (lambda: nn.HingeEmbeddingLoss(reduction="x"), ValueError),
        (lambda: nn.CosineEmbeddingLoss(1), TypeError),
        (lambda: nn.CosineEmbeddingLoss(2.0), ValueError),
        (lambda: nn.GaussianNLLLoss(eps=0.0), ValueError),
        (lambda: nn.GaussianNLLLoss(eps=1), TypeError),
        (lambda: nn.GaussianNLLLoss(full=1), TypeError),
        (lambda: nn.DiceLoss(1), TypeError),
        (lambda: nn.FocalLoss(gamma=2), TypeError),
        (lambda: nn.FocalLoss(weight=[1.0]), TypeError),
        (lambda: nn.PoissonNLLLoss(reduction="x"), ValueError),
        (lambda: nn.MultiClassDiceLoss(activation="gelu"), ValueError),
        (lambda: nn.Norm(keep_dims=1), TypeError),
        (lambda: nn.Moments(axis=[1]), TypeError),
        (lambda: nn.MatMul(1), TypeError),
        (lambda: nn.Roll(1.5, 0), TypeError),
        (lambda: nn.Roll([1, 2], [0]), ValueError),
        (lambda: nn.Range(1, 5, 0), ValueError),
        (lambda: nn.ChannelShuffle(0), ValueError),
        (lambda: nn.ChannelShuffle(2.0), TypeError),
    ],
)
def test_constructor_checks_as_mindspore(make, error):
    """MindSpore 2.7.0 raises these errors when the cell is built."""
    with pytest.raises(error):
        make()


X = ms.Tensor(np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32))


@pytest.mark.parametrize(
    "cell, x, error",
    [
        (nn.CELU(1), X, TypeError),  # MindSpore 2.7.0 accepts CELU(1) and fails when it runs
        (nn.CELU(0.0), X, ValueError),
        (nn.Threshold("a", 2), X, TypeError),
        (nn.GLU(), ms.Tensor(np.ones((2, 3), np.float32)), ValueError),
        (nn.PReLU(2), X, ValueError),
        (nn.OneHot(depth=3), ms.Tensor(np.array([0.0, 1.0], np.float32)), TypeError),
        (nn.PixelShuffle(2), X, ValueError),
        (nn.PixelUnshuffle(3), X, ValueError),
        (nn.PixelShuffle(1.5), X, TypeError),
        (nn.ReflectionPad1d((4, 0)), X, ValueError),
        (nn.Pad(((0, 0), (3, 0), (0, 0)), "REFLECT"), X, ValueError),
        (nn.Pad(((1, 1),), "REFLECT"), X, ValueError),
        (nn.ConstantPad1d((-5, 0), 1.0), X, ValueError),
        (nn.Softmax2d(), X[0], ValueError),
        (nn.InstanceNorm2d(3), X, ValueError),
        (nn.SoftMarginLoss("foo"), (X, X), ValueError),  # MindSpore 2.7.0 accepts it until the loss runs
        (nn.MarginRankingLoss(1), (X, X, X), TypeError),
        (nn.DiceLoss(), (X, X[:1]), ValueError),
        (nn.Tril(), X[0, 0], ValueError),
        (nn.ClipByNorm(axis=1), (X, 0.5), TypeError),
    ],
)
def test_call_checks_as_mindspore(cell, x, error):
    """MindSpore 2.7.0 raises these errors when the cell runs."""
    with pytest.raises(error):
        cell(*x) if isinstance(x, tuple) else cell(x)


def test_replication_pad_crops_with_negative_padding():
    # MindSpore 2.7.0 gives shape (2, 3, 5) for ReplicationPad1d((-1, 2)) of a (2, 3, 4) input
    out = nn.ReplicationPad1d((-1, 2))(X).asnumpy()
    x = X.asnumpy()
    np.testing.assert_array_equal(out, np.concatenate([x[..., 1:], x[..., -1:], x[..., -1:]], -1))


def test_onehot_dtype_follows_its_argument():
    # MindSpore 2.7.0 gives Float32 by default and Int32 for dtype=ms.int32
    ids = ms.Tensor(np.array([0, 1], np.int32))
    assert nn.OneHot(depth=3)(ids).dtype == ms.float32
    assert nn.OneHot(depth=3, dtype=ms.int32)(ids).dtype == ms.int32


def _instance_norm64(x, gamma, beta, eps):
    axes = tuple(range(2, x.ndim))
    x = x.astype(np.float64)
    mean = x.mean(axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean) / np.sqrt(x.var(axes, keepdims=True) + eps) * gamma.reshape(shape) + beta.reshape(shape)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("rank", [3, 4, 5])
def test_instance_norm_matches_its_formula_in_numpy(rank, mode):
    """NumPy float64 of (x - mean) / sqrt(var + eps) * gamma + beta over each sample's channel: MindSpore 2.7.0's
    CPU build has no InstanceNorm kernel. Same output in train and eval; gradients by central differences."""
    ms.set_context(mode=MODES[mode])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 3, 2)[:rank]).astype(np.float32)
    cell = {3: nn.InstanceNorm1d, 4: nn.InstanceNorm2d, 5: nn.InstanceNorm3d}[rank](3, eps=1e-3)
    assert [p.name for p in cell.get_parameters()] == ["mean", "variance", "gamma", "beta"]
    assert [p.name for p in cell.trainable_params()] == ["gamma", "beta"]
    gamma, beta = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    cell.gamma.set_data(ms.Tensor(gamma))
    cell.beta.set_data(ms.Tensor(beta))
    want = _instance_norm64(x, gamma, beta, 1e-3)
    for training in (True, False):
        cell.set_train(training)
        np.testing.assert_allclose(cell(ms.Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-5)
    half = cell(ms.Tensor(x.astype(np.float16)))
    assert half.dtype == ms.float16
    np.testing.assert_allclose(half.asnumpy(), want, rtol=1e-2, atol=1e-2)
    cot = rng.standard_normal(x.shape)

    def loss64(x, gamma, beta):
        return float((_instance_norm64(x, gamma, beta, 1e-3) * cot).sum())

    def numeric(index, arrays):
        arrays = [a.astype(np.float64) for a in arrays]
        grad = np.zeros_like(arrays[index])
        for i in np.ndindex(grad.shape):
            up, down = [a.copy() for a in arrays], [a.copy() for a in arrays]
            up[index][i] += 1e-6
            down[index][i] -= 1e-6
            grad[i] = (loss64(*up) - loss64(*down)) / 2e-6
        return grad

    _, (dx, (dgamma, dbeta)) = ms.value_and_grad(
        lambda t: (cell(t) * ms.Tensor(cot.astype(np.float32))).sum(), 0, cell.trainable_params()
    )(ms.Tensor(x))
    for got, index in ((dx, 0), (dgamma, 1), (dbeta, 2)):
        np.testing.assert_allclose(got.asnumpy(), numeric(index, [x, gamma, beta]), rtol=1e-4, atol=2e-4)
