"""tessel.mint against MindSpore 2.7's mint: mint's argument names and defaults (torch-style), results against numpy,
the same graph traced and eager, the distributed_mint_operator_parallel sample's forward, and NotSupportedYetError for
the names of mint tessel does not map."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from sdk_testkit import log_softmax, rand, softmax

import tessel as ms
from tessel import mint, nn
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.mint import _names
from tessel.mint.nn import functional as F

X = rand(2, 3, 4)
Y = rand(2, 3, 4, seed=1)


def t(array) -> ms.Tensor:
    return ms.Tensor(array)


def close(got, want, rtol=1e-5):
    np.testing.assert_allclose(got.asnumpy() if isinstance(got, ms.Tensor) else got, want, rtol=rtol, atol=1e-6)


# MindSpore 2.7 signatures (inspect.signature on the 2.7.0 wheel; overloaded ones from their documentation).
SIGNATURES = {
    mint.sum: "(input, dim=None, keepdim=False, *, dtype=None)",
    mint.mean: "(input, dim=None, keepdim=False, *, dtype=None)",
    mint.flatten: "(input, start_dim=0, end_dim=-1)",
    mint.matmul: "(input, other)",
    mint.transpose: "(input, dim0, dim1)",
    mint.permute: "(input, dims)",
    mint.squeeze: "(input, dim)",
    mint.cat: "(tensors, dim=0)",
    mint.split: "(tensor, split_size_or_sections, dim=0)",
    mint.argmax: "(input, dim=None, keepdim=False)",
    mint.amax: "(input, dim=(), keepdim=False)",
    mint.gather: "(input, dim, index)",
    mint.index_select: "(input, dim, index)",
    mint.zeros: "(size, *, dtype=None)",
    mint.full: "(size, fill_value, *, dtype=None)",
    mint.softmax: "(input, dim, *, dtype=None)",
    mint.add: "(input, other, *, alpha=1)",
    mint.div: "(input, other, *, rounding_mode=None)",
    mint.round: "(input, *, decimals=0)",
    F.relu: "(input, inplace=False)",
    F.softmax: "(input, dim=None, dtype=None)",
    F.leaky_relu: "(input, negative_slope=0.01)",
    F.linear: "(input, weight, bias=None)",
    F.cross_entropy: "(input, target, weight=None, ignore_index=-100, reduction='mean', label_smoothing=0.0)",
    F.one_hot: "(tensor, num_classes=-1)",
    F.dropout: "(input, p=0.5, training=True, inplace=False)",
}


@pytest.mark.parametrize("fn", list(SIGNATURES), ids=lambda f: f.__name__)
def test_argument_names_and_defaults_are_mints(fn):
    sig = inspect.signature(fn)
    params = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    assert str(sig.replace(parameters=params, return_annotation=sig.empty)) == SIGNATURES[fn]


def test_reductions():
    close(mint.sum(t(X)), X.sum())
    close(mint.sum(t(X), dim=1, keepdim=True), X.sum(1, keepdims=True))
    close(mint.sum(t(X), (0, 2)), X.sum((0, 2)))
    ints = mint.sum(t(np.array([1, 2, 3], np.int32)))
    assert ints.dtype == ms.int64 and int(ints) == 6  # integers sum as int64, as mint (MindSpore 2.7, CPU)
    assert mint.sum(t(np.array([True, True]))).dtype == ms.int64
    assert mint.sum(t(X), dtype=ms.float64).dtype == ms.float64
    close(mint.mean(t(X), dim=-1), X.mean(-1))
    assert mint.mean(t(X), dtype=ms.float16).dtype == ms.float16
    close(mint.amax(t(X)), X.max())
    close(mint.amin(t(X), 1, True), X.min(1, keepdims=True))
    assert int(mint.argmax(t(X))) == X.argmax() and mint.argmax(t(X)).dtype == ms.int64
    close(mint.argmin(t(X), 2), X.argmin(2))


def test_max_and_min_overloads():
    values, indices = mint.max(t(X), 1)
    close(values, X.max(1))
    close(indices, X.argmax(1))
    assert indices.dtype == ms.int64
    assert mint.max(t(X), dim=1, keepdim=True)[0].shape == (2, 1, 4)
    close(mint.max(t(X)), X.max())
    close(mint.max(t(X), t(Y)), np.maximum(X, Y))
    close(mint.min(t(X), other=t(Y)), np.minimum(X, Y))
    close(mint.min(t(X), 0)[0], X.min(0))


def test_elementwise():
    close(mint.add(t(X), t(Y), alpha=2), X + 2 * Y)
    close(mint.sub(t(X), t(Y), alpha=0.5), X - 0.5 * Y)
    close(mint.div(t(X), t(Y)), X / Y, rtol=1e-4)
    a = np.array([-7.0, 7.0, -7.5], np.float32)
    close(mint.div(t(a), 2, rounding_mode="floor"), np.floor(a / 2))
    close(mint.div(t(a), 2, rounding_mode="trunc"), np.trunc(a / 2))
    ints = mint.div(t(np.array([-7, 7], np.int32)), 2, rounding_mode="trunc")
    assert ints.dtype == ms.int32 and ints.asnumpy().tolist() == [-3, 3]
    assert mint.div(t(np.array([7], np.int32)), t(np.array([2], np.int32))).asnumpy().tolist() == [3.5]
    with pytest.raises(ConfigurationError, match="rounding_mode"):
        mint.div(t(a), 2, rounding_mode="ceil")
    close(mint.pow(t(X), 2), X**2)
    close(mint.pow(2.0, t(X)), 2.0**X, rtol=1e-4)
    close(mint.remainder(t(a), 3), np.mod(a, 3))
    close(mint.clamp(t(X), min=-0.5, max=0.5), np.clip(X, -0.5, 0.5))
    close(mint.clamp(t(X), max=0.0), np.minimum(X, 0.0))
    with pytest.raises(ConfigurationError, match="at least one"):
        mint.clamp(t(X))
    close(mint.round(t(np.array([1.2345, -2.5], np.float32)), decimals=2), [1.23, -2.5])
    close(mint.round(t(np.array([0.5, 1.5], np.float32))), [0.0, 2.0])
    assert mint.eq(t(X), t(X)).asnumpy().all() and not mint.ne(t(X), t(X)).asnumpy().any()
    assert mint.greater_equal(t(X), t(Y)).asnumpy().tolist() == (X >= Y).tolist()
    close(mint.neg(t(X)), -X)
    close(mint.exp(t(X)), np.exp(X))


def test_shapes():
    assert mint.flatten(t(X)).shape == (24,)  # mint.flatten flattens all dims by default
    assert mint.flatten(t(X), start_dim=1, end_dim=2).shape == (2, 12)
    assert mint.transpose(t(X), 0, 2).shape == (4, 3, 2)
    close(mint.permute(t(X), (2, 0, 1)), X.transpose(2, 0, 1))
    close(mint.t(t(X[0])), X[0].T)
    assert mint.t(t(X[0, 0])).shape == (4,)
    ones = t(np.zeros((1, 2, 1), np.float32))
    assert mint.squeeze(ones, 0).shape == (2, 1) and mint.squeeze(ones, (0, 2)).shape == (2,)
    assert mint.squeeze(ones, 1).shape == (1, 2, 1)  # a dim longer than 1 stays
    assert mint.unsqueeze(t(X), 1).shape == (2, 1, 3, 4)
    close(mint.cat([t(X), t(Y)], dim=2), np.concatenate([X, Y], 2))
    close(mint.stack([t(X), t(Y)], 1), np.stack([X, Y], 1))
    assert [p.shape for p in mint.split(t(rand(7, 2)), 3)] == [(3, 2), (3, 2), (1, 2)]
    assert [p.shape for p in mint.chunk(t(rand(6, 2)), 4)] == [(2, 2)] * 3  # as MindSpore 2.7 on CPU
    close(mint.reshape(t(X), (4, 6)), X.reshape(4, 6))
    close(mint.broadcast_to(t(X[:, :1]), (2, 3, 4)), np.broadcast_to(X[:, :1], (2, 3, 4)))


def test_indexing_and_creation():
    m = np.array([[1.0, 2.0, 3.0], [4.0, 0.0, -1.0]], np.float32)
    index = np.array([[0, 0], [1, 0]], np.int64)
    close(mint.gather(t(m), 1, t(index)), [[1.0, 1.0], [0.0, 4.0]])  # MindSpore 2.7's value
    close(mint.index_select(t(m), 1, t(np.array([2, 0], np.int64))), m[:, [2, 0]])
    close(mint.where(t(m > 0), t(m), t(-m)), np.abs(m))
    with pytest.raises(NotSupportedYetError, match="where"):
        mint.where(t(m > 0))
    assert mint.zeros((2, 2)).dtype == ms.float32 and mint.ones(3, dtype=ms.int32).dtype == ms.int32
    assert mint.full((2,), 3).dtype == ms.int64 and mint.full((2,), 3.0).dtype == ms.float32
    assert mint.ones_like(t(m), dtype=ms.int32).dtype == ms.int32
    close(mint.zeros_like(t(m)), np.zeros_like(m))
    close(mint.full_like(t(m), 7.0), np.full_like(m, 7.0))
    close(mint.softmax(t(m), 0), softmax(m, 0))
    close(mint.matmul(t(np.ones(3, np.float32)), t(np.ones(3, np.float32))), 3.0)
    with pytest.raises(ConfigurationError, match="2-D"):
        mint.mm(t(X), t(X))


def test_nn_functional():
    x, w, b = rand(5, 4), rand(3, 4, seed=2), rand(3, seed=3)
    close(F.relu(t(x)), np.maximum(x, 0))
    close(F.linear(t(x), t(w), t(b)), x @ w.T + b)
    close(F.linear(t(x), t(w)), x @ w.T)
    close(F.softmax(t(x)), softmax(x, -1))
    close(F.log_softmax(t(x), 1), log_softmax(x, 1))
    close(F.leaky_relu(t(x)), np.where(x > 0, x, 0.01 * x))
    close(F.flatten(t(X)), X.reshape(-1))
    labels = np.array([0, 2, 1, 1, 0], np.int32)
    close(F.cross_entropy(t(rand(5, 3)), t(labels)), -log_softmax(rand(5, 3))[np.arange(5), labels].mean())
    close(F.mse_loss(t(x), t(x * 0)), (x**2).mean())
    close(F.l1_loss(t(x), t(x * 0), reduction="sum"), np.abs(x).sum())
    onehot = F.one_hot(t(np.array([0, 2], np.int64)))
    assert onehot.dtype == ms.int64 and onehot.asnumpy().tolist() == [[1, 0, 0], [0, 0, 1]]
    assert F.one_hot(t(np.array([1], np.int64)), 4).shape == (1, 4)
    close(F.dropout(t(x), training=False), x)
    with pytest.raises(NotSupportedYetError, match="inplace=True"):
        F.relu(t(x), inplace=True)
    with pytest.raises(NotSupportedYetError, match="dim=None"):
        F.log_softmax(t(x))


def test_conv_and_pool_take_torch_padding():
    from sdk_testkit import np_conv2d

    x, w = rand(1, 2, 5, 5), rand(3, 2, 3, 3, seed=4)
    close(F.conv2d(t(x), t(w), padding=1), np_conv2d(x, w, pad=(1, 1, 1, 1)), rtol=1e-4)
    close(F.conv2d(t(x), t(w), padding="same"), np_conv2d(x, w, pad=(1, 1, 1, 1)), rtol=1e-4)
    close(F.conv2d(t(x), t(w)), np_conv2d(x, w), rtol=1e-4)
    assert F.max_pool2d(t(x), 2).shape == (1, 2, 2, 2)
    close(F.avg_pool2d(t(x[:, :, :4, :4]), 2), x[:, :, :4, :4].reshape(1, 2, 2, 2, 2, 2).mean((3, 5)))
    with pytest.raises(ConfigurationError, match="stride=1"):
        F.conv2d(t(x), t(w), stride=2, padding="same")
    with pytest.raises(NotSupportedYetError, match="ceil_mode"):
        F.max_pool2d(t(x), 2, ceil_mode=True)


def test_nn_layers():
    ms.set_seed(3)
    layer = mint.nn.Linear(4, 3)
    assert [(p.name, p.shape) for p in layer.get_parameters()] == [("weight", (3, 4)), ("bias", (3,))]
    assert [p.name for p in mint.nn.Linear(4, 3, bias=False).get_parameters()] == ["weight"]
    assert isinstance(layer, nn.Dense) and layer.in_features == 4 and layer.out_features == 3
    x = rand(2, 4)
    close(layer(t(x)), x @ layer.weight.asnumpy().T + layer.bias.asnumpy())
    assert mint.nn.Flatten()(t(X)).shape == (2, 12)
    close(mint.nn.Softmax()(t(x)), softmax(x, -1))
    close(mint.nn.GELU()(t(x)), F.gelu(t(x)).asnumpy())
    close(mint.nn.ReLU6()(t(x * 10)), np.clip(x * 10, 0, 6))
    drop = mint.nn.Dropout(p=0.5)
    close(drop(t(x)), x)  # not training
    assert isinstance(mint.nn.BCEWithLogitsLoss(reduction="sum"), nn.BCEWithLogitsLoss)


class MintNetwork(nn.Cell):
    """distributed_mint_operator_parallel.py's network without the parallel shard() wrappers."""

    def __init__(self):
        super().__init__()
        self.flatten = mint.flatten
        self.fc1_weight = ms.Parameter(ms.Tensor(rand(784, 16, seed=5) * 0.05), name="fc1_weight")
        self.fc2_weight = ms.Parameter(ms.Tensor(rand(16, 10, seed=6) * 0.05), name="fc2_weight")
        self.matmul1, self.matmul2 = mint.matmul, mint.matmul
        self.relu1 = mint.nn.functional.relu

    def construct(self, x):
        x = self.flatten(x, start_dim=1, end_dim=3)
        return self.matmul2(self.relu1(self.matmul1(x, self.fc1_weight)), self.fc2_weight)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_the_mint_sample_forward_traced_and_eager(mode):
    ms.set_context(mode=mode)
    net = MintNetwork()
    images = rand(8, 1, 28, 28, seed=7)
    logits = net(t(images))
    want = np.maximum(images.reshape(8, 784) @ net.fc1_weight.asnumpy(), 0) @ net.fc2_weight.asnumpy()
    close(logits, want, rtol=1e-4)
    close(float(mint.sum(logits).asnumpy()), want.sum(), rtol=1e-4)


def test_names_of_mint_that_are_not_mapped_are_not_supported_yet():
    for module, names in [
        (mint, _names.MINT),
        (mint.nn, _names.MINT_NN),
        (mint.nn.functional, _names.MINT_NN_FUNCTIONAL),
        (mint.optim, _names.MINT_OPTIM),
        (mint.linalg, _names.MINT_LINALG),
        (mint.special, _names.MINT_SPECIAL),
        (mint.distributed, _names.MINT_DISTRIBUTED),
    ]:
        for name in sorted(names):
            try:
                getattr(module, name)
            except NotSupportedYetError as err:
                assert str(err).startswith(f"not supported yet: mindspore.{module.__name__[7:]}.{name}, ")
    with pytest.raises(NotSupportedYetError, match=r"mindspore\.mint\.unique"):
        mint.unique  # noqa: B018
    assert set(mint.optim.__all__) == _names.MINT_OPTIM  # every name of mindspore.mint.optim is mapped
    with pytest.raises(AttributeError):
        mint.no_such_function  # noqa: B018
    mapped = set(mint.__all__) - {"distributed", "linalg", "nn", "optim", "special"}
    assert {"matmul", "flatten", "sum"} <= mapped <= _names.MINT
    assert {"relu", "linear"} <= set(mint.nn.functional.__all__) and "Linear" in mint.nn.__all__
