"""Conv1d, Conv2dTranspose, Conv1dTranspose, MaxPool1d, AvgPool1d, the adaptive pools, Dropout1d/2d and Unflatten
against MindSpore 2.7.0: outputs and the gradients of sum(y * r) with respect to x and every parameter, measured by
data/make_mindspore_layers.py on the same inputs and weights (set with set_data); argument checks and default
initialisers as MindSpore 2.7.0's; a short GRAPH_MODE Model.train through Conv1d and Conv2dTranspose."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.core.errors import ConfigurationError, NotSupportedYetError

REFERENCE = np.load(Path(__file__).parent / "data" / "mindspore_layers.npz")
CASES = json.loads(str(REFERENCE["cases"]))


def _arguments(kw: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) and k != "unflattened_size" else v for k, v in kw.items()}


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_layer_matches_mindspore_forward_and_gradients(case):
    name, cls, kw, _ = case
    cell = getattr(nn, cls)(**_arguments(kw))
    weights = cell.trainable_params()
    for p in weights:  # MindSpore 2.7.0's parameter names and shapes (Conv1d's weight is (out, in / group, 1, k))
        assert p.shape == REFERENCE[f"{name}.{p.name}"].shape
        p.set_data(ms.Tensor(REFERENCE[f"{name}.{p.name}"]))
    x, r = REFERENCE[f"{name}.x"], REFERENCE[f"{name}.r"]
    y = cell(ms.Tensor(x))
    assert y.dtype == ms.float32
    np.testing.assert_allclose(y.asnumpy(), REFERENCE[f"{name}.y"], rtol=1e-5, atol=1e-5)

    def loss(inp):
        return (cell(inp) * ms.Tensor(r)).sum()

    _, grads = ms.value_and_grad(loss, grad_position=0, weights=weights or None)(ms.Tensor(x))
    dx, dweights = grads if weights else (grads, ())
    np.testing.assert_allclose(dx.asnumpy(), REFERENCE[f"{name}.dx"], rtol=1e-4, atol=1e-4)
    for p, g in zip(weights, dweights):
        np.testing.assert_allclose(g.asnumpy(), REFERENCE[f"{name}.d{p.name}"], rtol=1e-4, atol=1e-4, err_msg=p.name)


@pytest.mark.parametrize("cls, args, fan_in", [
    (nn.Conv1d, (16, 32, 5), 16 * 5),
    (nn.Conv2dTranspose, (16, 32, 3), 32 * 9),
    (nn.Conv1dTranspose, (16, 32, 5), 32 * 5),
    (nn.Conv1dTranspose, (16, 32, 5, 1, "same", 0, 1, 4), 8 * 5),
])  # fmt: skip
def test_default_initialisers_are_mindspores(cls, args, fan_in):
    """MindSpore 2.7.0: weight HeUniform(sqrt(5)) and bias Uniform(1 / sqrt(fan_in)), both bounded by
    1 / sqrt(fan_in), fan_in = weight.shape[1] * kernel size (max |w| 0.1118, 0.0589, 0.0790, 0.1573 measured)."""
    cell = cls(*args, has_bias=True)
    bound = 1 / math.sqrt(fan_in)
    for p in (cell.weight, cell.bias):
        value = p.asnumpy()
        assert np.abs(value).max() <= bound and np.abs(value).max() > 0.8 * bound, p.name
    assert abs(cell.weight.asnumpy().std() - bound / math.sqrt(3)) < 0.1 * bound


def test_argument_checks_are_mindspores():
    """Each raises where MindSpore 2.7.0 raises (TypeError for a wrong type, ValueError otherwise)."""
    x3 = ms.Tensor(rand(2, 4, 5))
    with pytest.raises(TypeError, match="kernel_size"):
        nn.Conv1d(4, 6, (3,))
    with pytest.raises(ConfigurationError, match="pad_mode='pad'"):
        nn.Conv1d(4, 6, 3, padding=1)
    with pytest.raises(ConfigurationError, match="group"):
        nn.Conv1d(4, 6, 3, group=4)
    with pytest.raises(ConfigurationError, match="3-D"):  # MindSpore: Conv2D's x must be 4-D after expand_dims
        nn.Conv1d(4, 6, 3)(ms.Tensor(rand(4, 11)))
    with pytest.raises(ConfigurationError, match="output_padding"):
        nn.Conv2dTranspose(4, 6, 3, output_padding=1)  # needs pad_mode='pad'
    with pytest.raises(ConfigurationError, match="output_padding"):
        nn.Conv2dTranspose(4, 6, 3, stride=2, pad_mode="pad", output_padding=2)  # below max(stride, dilation)
    with pytest.raises(ConfigurationError, match="padding"):
        nn.Conv2dTranspose(4, 6, 3, pad_mode="pad", padding=(1, 1))
    with pytest.raises(ConfigurationError, match="3-D"):
        nn.Conv1dTranspose(4, 6, 3)(ms.Tensor(rand(4, 5)))
    with pytest.raises(ConfigurationError, match="pad_mode='pad'"):
        nn.MaxPool1d(3, 2, padding=1)
    with pytest.raises(TypeError, match="kernel_size"):
        nn.MaxPool1d((3, 3), 2)
    with pytest.raises(NotSupportedYetError, match="return_indices"):
        nn.MaxPool1d(3, 2, pad_mode="pad", return_indices=True)
    with pytest.raises(ConfigurationError, match="divisible"):
        nn.AdaptiveAvgPool1d(5)(ms.Tensor(rand(2, 3, 12)))
    with pytest.raises(ConfigurationError, match="3-D"):
        nn.AdaptiveMaxPool1d(3)(ms.Tensor(rand(3, 12)))
    with pytest.raises(TypeError, match="output_size"):
        nn.AdaptiveAvgPool1d((3,))
    with pytest.raises(ConfigurationError, match="output_size"):
        nn.AdaptiveAvgPool2d((2, 3, 4))  # MindSpore 2.7.0 refuses it at construction
    with pytest.raises(NotSupportedYetError, match="return_indices"):
        nn.AdaptiveMaxPool2d(2, return_indices=True)
    with pytest.raises(TypeError, match="float"):
        nn.Dropout2d(1)
    with pytest.raises(ConfigurationError, match=r"\[0, 1\]"):
        nn.Dropout1d(1.5)
    with pytest.raises(ConfigurationError, match="4-D"):
        nn.Dropout2d(0.5).set_train(True)(x3)
    with pytest.raises(TypeError, match="axis"):
        nn.Unflatten(1.0, (2, 3))
    with pytest.raises(TypeError, match="unflattened_size"):
        nn.Unflatten(1, 6)


def test_adaptive_pool2d_functional_bins():
    """MindSpore 2.7.0: ops.adaptive_avg_pool2d(arange(35).reshape(1, 5, 7), (2, 3)) is [[8, 10, 12], [22, 24, 26]]
    (bins [floor(i L / out), ceil((i + 1) L / out)) overlap); (None, 3) keeps H; output larger than the input works."""
    x = ms.Tensor(np.arange(35, dtype=np.float32).reshape(1, 5, 7))
    np.testing.assert_allclose(ops.adaptive_avg_pool2d(x, (2, 3)).asnumpy(), [[[8, 10, 12], [22, 24, 26]]])
    assert ops.adaptive_avg_pool2d(x, (None, 3)).shape == (1, 5, 3)
    assert ops.adaptive_max_pool2d(ms.Tensor(rand(2, 3, 6, 6)), 9).shape == (2, 3, 9, 9)


@pytest.mark.parametrize(
    "cls, shape", [(nn.Dropout2d, (64, 50, 3, 4)), (nn.Dropout1d, (64, 50, 7)), (nn.Dropout1d, (800, 7))]
)
def test_channel_dropout_zeroes_whole_channels(cls, shape):
    """MindSpore 2.7.0 (Dropout2D): with p=0.25, 25.1% of the (n, c) channels are all zero, the rest are x / 0.75;
    p=1 zeroes everything; eval mode is the identity."""
    x = np.ones(shape, np.float32)
    drop = cls(0.25).set_train(True)
    out = drop(ms.Tensor(x)).asnumpy()
    channels = out.reshape(*shape[: len(shape) - (2 if cls is nn.Dropout2d else 1)], -1)
    assert np.all(channels == channels[..., :1])  # one draw per channel
    dropped = channels[..., 0] == 0
    assert abs(dropped.mean() - 0.25) < 4 * math.sqrt(0.25 * 0.75 / dropped.size)
    assert set(np.unique(out)) == {0.0, np.float32(1 / 0.75)}
    assert not cls(1.0).set_train(True)(ms.Tensor(x)).asnumpy().any()
    assert np.array_equal(cls(0.25).set_train(False)(ms.Tensor(x)).asnumpy(), x)


class _Conv1dNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, stride=2, has_bias=True)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Dense(4, 3)

    def construct(self, x):
        return self.fc(ops.squeeze(self.pool(ops.relu(self.conv(x))), 2))


class _DeconvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up = nn.Conv2dTranspose(2, 3, 3, stride=2, pad_mode="pad", padding=1, output_padding=1, has_bias=True)
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Dense(3, 3)

    def construct(self, x):
        return self.fc(ops.reshape(self.pool(self.up(x)), (-1, 3)))


@pytest.mark.parametrize(
    "make, shape", [(_Conv1dNet, (2, 8)), (_DeconvNet, (2, 3, 3))], ids=["Conv1d", "Conv2dTranspose"]
)
def test_graph_mode_model_train_lowers_the_loss(make, shape):
    ms.set_context(mode=ms.GRAPH_MODE)
    data = rand(32, *shape, seed=3)
    labels = (data.reshape(32, -1).mean(axis=1) > 0).astype(np.int32)
    dataset = ds.NumpySlicesDataset({"data": data, "label": labels}, shuffle=False).batch(8)
    net = make()
    loss = nn.CrossEntropyLoss()
    model = ms.Model(net, loss, nn.Adam(net.trainable_params(), 0.05))
    before = float(loss(net(ms.Tensor(data)), ms.Tensor(labels)).asnumpy())
    model.train(5, dataset)
    after = float(loss(net(ms.Tensor(data)), ms.Tensor(labels)).asnumpy())
    assert after < before
