"""nn.MultiheadAttention and the transformer layers against MindSpore 2.7.0: outputs (attn_output and
attn_weights) and the gradients of sum(out_i * r_i) with respect to the float inputs and every parameter, measured
by data/make_mindspore_transformer.py on the same inputs and weights (MindSpore's parameter names and shapes, loaded
with load_param_into_net); MindSpore's argument checks; dropout in training; one graph for every batch size; a
small encoder classifier trained with TrainOneStepCell."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
from tessel import nn, ops
from tessel.core.errors import NotSupportedYetError

REFERENCE = np.load(Path(__file__).parent / "data" / "mindspore_transformer.npz")
CASES = json.loads(str(REFERENCE["cases"]))
_NOT_PARAMETER = re.compile(r"(in|dx|d)\.|(out|r)\d$")  # the stored inputs, outputs, cotangents and gradients


def _build(cls: str, kw: dict) -> nn.Cell:
    """The case's cell; an encoder case names its layer's arguments plus num_layers and has_norm."""
    if cls == "TransformerEncoder":
        kw = dict(kw)
        layers, has_norm = kw.pop("num_layers"), kw.pop("has_norm")
        norm = nn.LayerNorm((kw["d_model"],), epsilon=1e-5) if has_norm else None
        return nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), layers, norm)
    return getattr(nn, cls)(**kw)


def _assert_close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Equal to 1e-5 of the reference's largest magnitude (measured: 2.2e-6 at worst, the Transformer's
    parameter gradients)."""
    assert actual.shape == expected.shape, what
    scale = max(float(np.max(np.abs(expected))), 1e-6)
    assert float(np.max(np.abs(actual - expected))) <= 1e-5 * scale, what


def _check_case(case) -> None:
    name, cls, kw, args, kwargs, values = case
    cell = _build(cls, kw)
    cell.set_train(False)
    weights = cell.trainable_params()
    stored = {key[len(name) + 1 :] for key in REFERENCE.files if key.startswith(f"{name}.")}
    assert {p.name for p in weights} == {key for key in stored if not _NOT_PARAMETER.match(key)}
    checkpoint = {p.name: ms.Parameter(ms.Tensor(REFERENCE[f"{name}.{p.name}"]), name=p.name) for p in weights}
    assert ms.load_param_into_net(cell, checkpoint) == ([], [])
    inputs = {
        key[len(name) + 4 :]: ms.Tensor(REFERENCE[key]) for key in REFERENCE.files if key.startswith(f"{name}.in.")
    }
    diff = sorted({a for a in args if a.startswith("x")})

    def call(*xs):
        given = dict(inputs, **dict(zip(diff, xs)))
        result = cell(*(given[a] for a in args), **{k: given[v] for k, v in kwargs.items()}, **values)
        return result if isinstance(result, tuple) else (result,)

    outputs = call(*(inputs[k] for k in diff))
    count = sum(f"{name}.out{i}" in REFERENCE.files for i in range(3))
    assert len(outputs) == count  # need_weights=False: MindSpore's 1-tuple (attn_output,)
    for i, out in enumerate(outputs):
        _assert_close(out.asnumpy(), REFERENCE[f"{name}.out{i}"], f"{name} output {i}")
    cotangents = [ms.Tensor(REFERENCE[f"{name}.r{i}"]) for i in range(count)]

    def loss(*xs):
        terms = [(out * r).sum() for out, r in zip(call(*xs), cotangents)]
        return terms[0] if len(terms) == 1 else terms[0] + terms[1]

    _, (dxs, dweights) = ms.value_and_grad(loss, grad_position=tuple(range(len(diff))), weights=weights)(
        *(inputs[k] for k in diff)
    )
    for k, g in zip(diff, dxs if isinstance(dxs, tuple) else (dxs,)):
        _assert_close(g.asnumpy(), REFERENCE[f"{name}.dx.{k}"], f"{name} d{k}")
    for p, g in zip(weights, dweights):
        _assert_close(g.asnumpy(), REFERENCE[f"{name}.d.{p.name}"], f"{name} d{p.name}")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_mindspore_in_graph_mode(case):
    """MindSpore 2.7.0's outputs and gradients (data/make_mindspore_transformer.py), GRAPH_MODE."""
    _check_case(case)


@pytest.mark.parametrize("name", ["self", "both_bool", "enc_pre_gelu", "transformer"])
def test_matches_mindspore_in_pynative_mode(name):
    """The same MindSpore 2.7.0 values run eagerly."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    _check_case(next(c for c in CASES if c[0] == name))


def test_constructor_checks_are_mindspores():
    """MindSpore 2.7.0: embed_dim must divide by num_heads; a layer's activation is "relu", "gelu", ops.relu or
    ops.gelu, and it refuses nn.ReLU() and nn.GELU() too (ValueError, though its docs list them)."""
    with pytest.raises(ValueError, match="divisible by 'num_heads'"):
        nn.MultiheadAttention(8, 3)
    for activation in ("tanh", nn.ReLU(), nn.GELU(), ops.tanh, 3):
        with pytest.raises(ValueError, match="activation"):
            nn.TransformerEncoderLayer(8, 2, 16, activation=activation)
    assert nn.TransformerEncoderLayer(8, 2, 16, activation=ops.gelu).activation is ops.gelu
    assert nn.TransformerDecoderLayer(8, 2, 16, activation="gelu").activation is ops.gelu


def test_mask_dtypes_are_checked():
    """MindSpore 2.7.0 refuses an int key_padding_mask and an int attn_mask (ValueError). A bool mask with a float
    one is refused too: MindSpore then adds a bool key_padding_mask to a float attn_mask as 1.0 (measured)."""
    attention = nn.MultiheadAttention(8, 2)
    x = ms.Tensor(rand(4, 3, 8))
    with pytest.raises(ValueError, match="key_padding_mask"):
        attention(x, x, x, key_padding_mask=ms.Tensor(np.zeros((3, 4), np.int32)))
    with pytest.raises(ValueError, match="attn_mask"):
        attention(x, x, x, attn_mask=ms.Tensor(np.zeros((4, 4), np.int32)))
    with pytest.raises(NotSupportedYetError, match="bool mask and a float mask"):
        attention(
            x,
            x,
            x,
            key_padding_mask=ms.Tensor(np.zeros((3, 4), bool)),
            attn_mask=ms.Tensor(np.zeros((4, 4), np.float32)),
        )
    with pytest.raises(ValueError, match="attn_mask"):
        attention(x, x, x, attn_mask=ms.Tensor(np.zeros((4, 5), bool)))
    with pytest.raises(ValueError, match="kdim and vdim"):
        nn.MultiheadAttention(8, 2, kdim=4)(x, x, x)


def test_dropout_applies_in_training_only():
    """With dropout=0.5 in training about half the attention weights are zeroed and the rest doubled; in eval
    mode the weights are a softmax (rows sum to 1)."""
    attention = nn.MultiheadAttention(16, 2, dropout=0.5, batch_first=True)
    x = ms.Tensor(rand(8, 32, 16))
    attention.set_train(True)
    output, weights = attention(x, x, x, average_attn_weights=False)
    assert output.shape == (8, 32, 16)
    w = weights.asnumpy()
    assert 0.4 < np.mean(w == 0) < 0.6
    np.testing.assert_allclose(np.mean(np.sum(w, -1)), 1.0, atol=0.02)
    attention.set_train(False)
    np.testing.assert_allclose(np.sum(attention(x, x, x)[1].asnumpy(), -1), 1.0, rtol=1e-5)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.5)
    layer.set_train(True)
    assert not np.allclose(layer(x).asnumpy(), layer(x).asnumpy())  # a new mask per call
    layer.set_train(False)
    np.testing.assert_array_equal(layer(x).asnumpy(), layer(x).asnumpy())


def test_one_graph_for_every_batch_size():
    """A batch-first MultiheadAttention with a key_padding_mask is traced once with a symbolic batch dim."""
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    for batch in (3, 5):
        x = ms.Tensor(rand(batch, 4, 8, seed=batch))
        output, weights = attention(x, x, x, key_padding_mask=ms.Tensor(np.zeros((batch, 4), bool)))
        assert output.shape == (batch, 4, 8) and weights.shape == (batch, 4, 4)
    assert not attention._compiled_function().static


class _Classifier(nn.Cell):
    def __init__(self):
        super().__init__()
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2)
        self.head = nn.Dense(8, 2)

    def construct(self, x):
        return self.head(self.encoder(x).mean(1))


def test_small_encoder_classifier_trains():
    """TrainOneStepCell over a 2-layer encoder: the label is the sign of the sequence's first feature's mean."""
    x = rand(32, 6, 8, seed=1)
    y = (x[:, :, 0].mean(1) > 0).astype(np.int32)
    net = nn.WithLossCell(_Classifier(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    train = nn.TrainOneStepCell(net, nn.Adam(net.trainable_params(), learning_rate=0.01))
    train.set_train(True)
    losses = [float(train(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]


def test_initial_values_are_mindspores():
    """MindSpore 2.7.0: a TransformerEncoder's layers are copies of one new layer (equal values, measured), and
    nn.Transformer draws every parameter of more than one dim again from XavierUniform, U(-b, b) with
    b = sqrt(6 / (fan_in + fan_out))."""
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 2)
    first, second = (encoder.layers[i].self_attn.in_proj_weight.asnumpy() for i in (0, 1))
    np.testing.assert_array_equal(first, second)
    model = nn.Transformer(16, 2, 1, 1, 64)
    for p in model.trainable_params():
        values = p.asnumpy()
        if p.ndim > 1:
            bound = np.sqrt(6.0 / sum(p.shape))
            assert np.max(np.abs(values)) <= bound and np.max(np.abs(values)) > 0.8 * bound, p.name
    assert not model.encoder.layers[0].self_attn.in_proj_bias.asnumpy().any()  # zeros, as MindSpore's


def test_mindspore_checkpoint_loads():
    """transformer_encoder.ckpt, saved by MindSpore 2.7.0 from a batch-first 2-layer gelu TransformerEncoder with a
    final LayerNorm and its own initial values, loads into tessel's with every parameter matched, and gives
    MindSpore's output on the stored input."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, activation="gelu", batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, nn.LayerNorm((8,), epsilon=1e-5))
    encoder.set_train(False)
    checkpoint = ms.load_checkpoint(str(Path(__file__).parent / "data" / "transformer_encoder.ckpt"))
    assert ms.load_param_into_net(encoder, checkpoint) == ([], [])
    _assert_close(encoder(ms.Tensor(REFERENCE["ckpt.x"])).asnumpy(), REFERENCE["ckpt.y"], "encoder output")
