"""Writes mindspore_rnn.npz, which tests/unit/sdk/test_sdk_rnn.py reads: python make_mindspore_rnn.py DIR, under
MindSpore 2.7.0 (not run by the tests: tessel does not depend on MindSpore). For each case: the cell's parameters
(random, set with set_data), the input x, the initial state (when the case has one), seq_length (when it has one),
the outputs, random cotangents r0, r1, ... (one per output tensor) and the gradients of sum(out_i * r_i) with respect
to x ("dx"), each initial state tensor ("dh0", "dh1") and each parameter ("d<name>"); "cases" holds the case list
as JSON: (name, nn class, keyword arguments, x shape, has an initial state, seq_length or null). It also writes
mindspore_lstm.ckpt, MindSpore's checkpoint of the "lstm" case's weights."""

import json
import sys

import mindspore as ms
import numpy as np
from mindspore import nn

ms.set_context(mode=ms.PYNATIVE_MODE)

BI2 = dict(num_layers=2, bidirectional=True)
LENGTHS = [5, 2, 3]
CASES = [
    ("rnn_tanh", "RNN", dict(input_size=4, hidden_size=5, **BI2), (5, 3, 4), False, None),
    ("rnn_tanh_hx_bf", "RNN", dict(input_size=4, hidden_size=5, batch_first=True, **BI2), (3, 5, 4), True, None),
    ("rnn_relu", "RNN", dict(input_size=4, hidden_size=5, nonlinearity="relu", **BI2), (5, 3, 4), True, None),
    ("rnn_relu_len", "RNN", dict(input_size=4, hidden_size=5, nonlinearity="relu", **BI2), (5, 3, 4), True, LENGTHS),
    ("rnn_tanh_len_bf", "RNN", dict(input_size=4, hidden_size=5, batch_first=True, **BI2), (3, 5, 4), False, LENGTHS),
    ("gru", "GRU", dict(input_size=4, hidden_size=5, **BI2), (5, 3, 4), True, None),
    ("gru_bf", "GRU", dict(input_size=4, hidden_size=5, batch_first=True, **BI2), (3, 5, 4), False, None),
    ("gru_len", "GRU", dict(input_size=4, hidden_size=5, **BI2), (5, 3, 4), True, LENGTHS),
    ("gru_nobias_1l", "GRU", dict(input_size=4, hidden_size=5, has_bias=False), (5, 3, 4), False, None),
    ("lstm", "LSTM", dict(input_size=4, hidden_size=5, **BI2), (5, 3, 4), True, None),
    ("lstm_bf", "LSTM", dict(input_size=4, hidden_size=5, batch_first=True, **BI2), (3, 5, 4), False, None),
    ("lstm_len", "LSTM", dict(input_size=4, hidden_size=5, **BI2), (5, 3, 4), True, LENGTHS),
    ("lstm_len_bf", "LSTM", dict(input_size=4, hidden_size=5, batch_first=True, **BI2), (3, 5, 4), False, LENGTHS),
    ("lstm_1l_nobias", "LSTM", dict(input_size=4, hidden_size=5, has_bias=False), (5, 3, 4), True, None),
    ("rnncell_tanh", "RNNCell", dict(input_size=4, hidden_size=5), (3, 4), True, None),
    ("rnncell_relu", "RNNCell", dict(input_size=4, hidden_size=5, nonlinearity="relu"), (3, 4), True, None),
    ("grucell", "GRUCell", dict(input_size=4, hidden_size=5), (3, 4), True, None),
    ("lstmcell", "LSTMCell", dict(input_size=4, hidden_size=5), (3, 4), True, None),
    ("lstmcell_nobias", "LSTMCell", dict(input_size=4, hidden_size=5, has_bias=False), (3, 4), True, None),
]


def flat(value):
    return list(value) if isinstance(value, tuple) else [value]


out = {"cases": np.array(json.dumps(CASES))}
for name, cls, kw, shape, has_hx, lengths in CASES:
    rng = np.random.default_rng(sum(map(ord, name)) * 7)
    cell = getattr(nn, cls)(**kw)
    for p in cell.trainable_params():
        value = (rng.standard_normal(p.shape) * 0.5).astype(np.float32)
        p.set_data(ms.Tensor(value))
        out[f"{name}.{p.name}"] = value
    x = rng.standard_normal(shape).astype(np.float32)
    is_cell, is_lstm = cls.endswith("Cell"), cls.startswith("LSTM")
    batch = shape[0] if is_cell or kw.get("batch_first") else shape[1]
    state_shape = (batch, 5) if is_cell else (kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1), batch, 5)
    states = [rng.standard_normal(state_shape).astype(np.float32) for _ in range(2 if is_lstm else 1)] if has_hx else []
    seq_length = None if lengths is None else ms.Tensor(np.array(lengths, np.int32))

    def run(inp, *hx, cell=cell, is_cell=is_cell, is_lstm=is_lstm, seq_length=seq_length):
        state = (tuple(hx) if is_lstm else hx[0]) if hx else None
        if is_cell:
            return flat(cell(inp, state))
        result, final = cell(inp, state, seq_length)
        return [result, *flat(final)]

    ys = run(ms.Tensor(x), *(ms.Tensor(s) for s in states))
    rs = [rng.standard_normal(y.shape).astype(np.float32) for y in ys]
    weights = cell.trainable_params()

    def loss(*inputs, run=run, rs=rs):
        return sum((y * ms.Tensor(r)).sum() for y, r in zip(run(*inputs), rs))

    positions = tuple(range(1 + len(states)))
    _, (dinputs, dweights) = ms.value_and_grad(loss, grad_position=positions, weights=weights)(
        ms.Tensor(x), *(ms.Tensor(s) for s in states)
    )
    dinputs = dinputs if isinstance(dinputs, tuple) else (dinputs,)
    out.update({f"{name}.x": x, f"{name}.dx": dinputs[0].asnumpy()})
    out.update({f"{name}.h{i}": s for i, s in enumerate(states)})
    out.update({f"{name}.dh{i}": d.asnumpy() for i, d in enumerate(dinputs[1:])})
    out.update({f"{name}.y{i}": y.asnumpy() for i, y in enumerate(ys)})
    out.update({f"{name}.r{i}": r for i, r in enumerate(rs)})
    out.update({f"{name}.d{p.name}": g.asnumpy() for p, g in zip(weights, dweights)})
    if name == "lstm":  # a MindSpore checkpoint of this case's weights, which tessel must load by name
        ms.save_checkpoint(cell, f"{sys.argv[1]}/mindspore_lstm.ckpt")
np.savez_compressed(f"{sys.argv[1]}/mindspore_rnn.npz", **out)
