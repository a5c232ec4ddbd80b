"""nn.RNN (tanh, relu), nn.GRU, nn.LSTM and nn.RNNCell, nn.GRUCell, nn.LSTMCell against MindSpore 2.7.0: outputs,
final states and the gradients of sum(out_i * r_i) with respect to x, the initial state and every parameter, as
measured by data/make_mindspore_rnn.py under MindSpore 2.7.0 on the same inputs and weights (set with set_data),
in PYNATIVE_MODE and GRAPH_MODE; MindSpore's checkpoint loading by parameter name; argument checks; dropout between
layers; one graph for every batch size; a sequence classifier that trains."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import tessel as ms
from tessel import nn
from tessel.core.errors import ConfigurationError

DATA = Path(__file__).parent / "data"
REFERENCE = np.load(DATA / "mindspore_rnn.npz")
CASES = json.loads(str(REFERENCE["cases"]))


def _relative(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def _run(cell, is_cell: bool, is_lstm: bool, seq_length, x, *hx):
    """The case's output tensors, flattened: a cell's new state, or a layer's output and final state(s)."""
    state = (tuple(hx) if is_lstm else hx[0]) if hx else None
    if is_cell:
        out = cell(x, state)
        return list(out) if is_lstm else [out]
    out, final = cell(x, state, seq_length)
    return [out, *(final if is_lstm else (final,))]


@pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_recurrent_layer_matches_mindspore_forward_and_gradients(case, mode):
    """Past a sample's seq_length MindSpore 2.7.0 outputs zeros and returns the state at its last valid step (the
    reverse direction runs over its reversed valid steps only); tessel gives the same. Tolerance: MindSpore 2.7.0's
    CPU Tanh is off by up to 1.3e-5 (rnncell_tanh: 1.28e-5 from float64, tessel's 1e-7), which a tanh RNN carries
    through its steps to 8e-5 relative (rnn_tanh); every other case agrees to 3e-5 (at most 2.3e-5, lstm_len, where
    MindSpore runs its Python loop with that Tanh instead of its fused LSTM kernel)."""
    ms.set_context(mode=getattr(ms, mode))
    name, cls, kw, _, has_hx, lengths = case
    cell = getattr(nn, cls)(**kw)
    weights = cell.trainable_params()
    for p in weights:
        assert p.shape == REFERENCE[f"{name}.{p.name}"].shape, p.name
        p.set_data(ms.Tensor(REFERENCE[f"{name}.{p.name}"]))
    is_cell, is_lstm = cls.endswith("Cell"), cls.startswith("LSTM")
    seq_length = None if lengths is None else ms.Tensor(np.array(lengths, np.int32))
    inputs = [ms.Tensor(REFERENCE[f"{name}.x"])]
    inputs += [ms.Tensor(REFERENCE[f"{name}.h{i}"]) for i in range(2 if is_lstm else 1)] if has_hx else []
    tolerance = 1e-4 if "tanh" in name else 3e-5

    outs = _run(cell, is_cell, is_lstm, seq_length, *inputs)
    for i, out in enumerate(outs):
        assert out.dtype == ms.float32
        assert _relative(out.asnumpy(), REFERENCE[f"{name}.y{i}"]) < tolerance, f"output {i}"
    if lengths is not None:  # zeros past each length, as MindSpore's
        output = outs[0].asnumpy() if not kw.get("batch_first") else outs[0].asnumpy().transpose(1, 0, 2)
        assert all(not output[length:, b].any() for b, length in enumerate(lengths))

    def loss(*args):
        outs = _run(cell, is_cell, is_lstm, seq_length, *args)
        return sum((out * ms.Tensor(REFERENCE[f"{name}.r{i}"])).sum() for i, out in enumerate(outs))

    _, (dinputs, dweights) = ms.value_and_grad(loss, grad_position=tuple(range(len(inputs))), weights=weights)(*inputs)
    dinputs = dinputs if isinstance(dinputs, tuple) else (dinputs,)
    assert _relative(dinputs[0].asnumpy(), REFERENCE[f"{name}.dx"]) < tolerance
    for i, d in enumerate(dinputs[1:]):
        assert _relative(d.asnumpy(), REFERENCE[f"{name}.dh{i}"]) < tolerance, f"hx {i}"
    for p, g in zip(weights, dweights):
        assert _relative(g.asnumpy(), REFERENCE[f"{name}.d{p.name}"]) < tolerance, p.name


def test_parameter_names_order_and_initialisation_are_mindspores():
    """MindSpore 2.7.0's nn.RNN(3, 4, num_layers=2, bidirectional=True) lists every weight_ih, then weight_hh,
    bias_ih, bias_hh, each layer forward then _reverse; layer 1 reads both directions (4, 8); the cells have
    weight_ih, weight_hh, bias_ih, bias_hh. All draw from Uniform(1 / sqrt(hidden_size))."""
    net = nn.RNN(3, 4, num_layers=2, bidirectional=True)
    names = [
        f"{kind}_l{layer}{suffix}"
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        for layer in (0, 1)
        for suffix in ("", "_reverse")
    ]
    assert [p.name for p in net.trainable_params()] == names
    assert net.weight_ih_l1_reverse.shape == (4, 8) and net.bias_hh_l0.shape == (4,)
    assert [(p.name, p.shape) for p in nn.LSTMCell(3, 4).trainable_params()] == [
        ("weight_ih", (16, 3)),
        ("weight_hh", (16, 4)),
        ("bias_ih", (16,)),
        ("bias_hh", (16,)),
    ]
    assert [p.name for p in nn.GRU(3, 4, has_bias=False).trainable_params()] == ["weight_ih_l0", "weight_hh_l0"]
    assert nn.RNNCell(3, 4, has_bias=False).bias_ih is None
    bound = 1 / math.sqrt(64)
    for p in nn.LSTM(16, 64).trainable_params() + nn.GRUCell(16, 64).trainable_params():
        value = np.abs(p.asnumpy())
        assert bound * 0.9 < value.max() <= bound, p.name


def test_a_mindspore_checkpoint_loads_by_name_and_saves_back(tmp_path):
    """data/mindspore_lstm.ckpt is MindSpore 2.7.0's save_checkpoint of the "lstm" case's nn.LSTM(4, 5, 2,
    bidirectional=True): every parameter loads, the output is MindSpore's, and tessel's checkpoint of it holds the
    same names and values (MindSpore 2.7.0 loads it back: load_param_into_net leaves nothing out)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = nn.LSTM(4, 5, num_layers=2, bidirectional=True)
    params = ms.load_checkpoint(str(DATA / "mindspore_lstm.ckpt"))
    assert ms.load_param_into_net(net, params) == ([], [])
    state = (ms.Tensor(REFERENCE["lstm.h0"]), ms.Tensor(REFERENCE["lstm.h1"]))
    out, _ = net(ms.Tensor(REFERENCE["lstm.x"]), state)
    np.testing.assert_allclose(out.asnumpy(), REFERENCE["lstm.y0"], rtol=1e-5, atol=1e-6)
    ms.save_checkpoint(net, str(tmp_path / "lstm.ckpt"))
    saved = ms.load_checkpoint(str(tmp_path / "lstm.ckpt"))
    assert sorted(saved) == sorted(params)
    for name, value in params.items():
        np.testing.assert_array_equal(saved[name].asnumpy(), value.asnumpy())


def test_argument_checks_are_mindspores():
    """Each raises where MindSpore 2.7.0 raises: a TypeError for a wrong type, a ValueError otherwise."""
    with pytest.raises(ConfigurationError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(ConfigurationError, match="nonlinearity"):
        nn.RNNCell(3, 4, nonlinearity="sigmoid")
    with pytest.raises(TypeError, match="dropout"):
        nn.GRU(3, 4, dropout=1)
    with pytest.raises(ConfigurationError, match="dropout"):
        nn.GRU(3, 4, dropout=1.0)
    with pytest.raises(ConfigurationError, match="num_layers"):
        nn.LSTM(3, 4, num_layers=0)
    for name in ("has_bias", "batch_first", "bidirectional"):
        with pytest.raises(TypeError, match=name):
            nn.GRU(3, 4, **{name: 1})
    with pytest.raises(TypeError, match="has_bias"):
        nn.GRUCell(3, 4, has_bias=1)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x = ms.Tensor(np.ones((5, 3, 3), np.float32))
    with pytest.raises(TypeError, match="float32 or float16"):
        nn.GRU(3, 4)(ms.Tensor(np.ones((5, 3, 3), np.int32)))
    with pytest.raises(TypeError, match="'hx' must be a tuple"):
        nn.LSTM(3, 4)(x, ms.Tensor(np.zeros((1, 3, 4), np.float32)))
    with pytest.raises(TypeError, match="seq_length"):
        nn.GRU(3, 4)(x, None, ms.Tensor(np.ones(3, np.float32)))
    with pytest.raises(ConfigurationError, match="batch size of x and seq_length"):
        nn.GRU(3, 4)(x, None, ms.Tensor(np.ones(2, np.int32)))
    with pytest.raises(TypeError, match="dtype of 'x'"):
        nn.RNN(3, 4)(x, ms.Tensor(np.zeros((1, 3, 4), np.float16)))


def test_dropout_acts_between_layers_in_training_only():
    """MindSpore 2.7.0 applies Dropout(p=dropout) to the output of each layer but the last while training: in eval
    mode the layer is the one without dropout; in training the result differs but keeps its shapes; one layer has
    nothing to drop. Measured on MindSpore 2.7.0 with these shapes: training output off eval's by 0.12, layer 0's
    h_n equal, a one-layer GRU's training output equal to its eval output."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(3)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((6, 4, 3)).astype(np.float32))
    plain, dropped = nn.LSTM(3, 8, num_layers=2), nn.LSTM(3, 8, num_layers=2, dropout=0.5)
    ms.load_param_into_net(dropped, {p.name: p for p in plain.trainable_params()})
    expected, (h, c) = plain(x)
    dropped.set_train(False)
    out, (h_eval, _) = dropped(x)
    np.testing.assert_array_equal(out.asnumpy(), expected.asnumpy())
    np.testing.assert_array_equal(h_eval.asnumpy(), h.asnumpy())
    dropped.set_train(True)
    out, (h_train, c_train) = dropped(x)
    assert out.shape == expected.shape and h_train.shape == h.shape and c_train.shape == c.shape
    assert np.abs(out.asnumpy() - expected.asnumpy()).max() > 1e-3
    np.testing.assert_array_equal(h_train.asnumpy()[0], h.asnumpy()[0])  # layer 0's state is before any dropout
    single = nn.GRU(3, 8, dropout=0.5)
    reference = single(x)[0].asnumpy()
    single.set_train(True)
    np.testing.assert_array_equal(single(x)[0].asnumpy(), reference)


def test_graph_mode_compiles_one_graph_for_every_batch_size():
    """batch_first=True puts the batch first, where GRAPH_MODE's symbolic batch dim is: one graph serves batches
    of 7 and 2, seq_length included. With batch_first=False dim 0 is the time the loop unrolls over, so that cell
    compiles for exact shapes instead."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = nn.GRU(3, 4, num_layers=2, batch_first=True, bidirectional=True)
    for batch in (7, 2):
        lengths = ms.Tensor(np.full(batch, 4, np.int32))
        out, h = net(ms.Tensor(np.ones((batch, 5, 3), np.float32)), None, lengths)
        assert out.shape == (batch, 5, 8) and h.shape == (4, batch, 4)
        assert not out.asnumpy()[:, 4].any()
    assert not net.__dict__["_compiled"].static
    time_first = nn.LSTM(3, 4)
    for steps in (5, 6):
        out, (h, c) = time_first(ms.Tensor(np.ones((steps, 2, 3), np.float32)))
        assert out.shape == (steps, 2, 4) and h.shape == c.shape == (1, 2, 4)


class _Classifier(nn.Cell):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 8, num_layers=2, batch_first=True, dropout=0.1, bidirectional=True)
        self.head = nn.Dense(16, 2)

    def construct(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


@pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
def test_a_sequence_classifier_trains(mode):
    ms.set_context(mode=getattr(ms, mode))
    ms.set_seed(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 6, 3)).astype(np.float32)
    y = (x[:, :, 0].sum(1) > 0).astype(np.int32)
    net = _Classifier()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), nn.Adam(net.trainable_params(), 0.02))
    step.set_train()
    losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for _ in range(25)]
    assert losses[-1] < 0.2 * losses[0], losses
