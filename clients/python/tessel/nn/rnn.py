"""Recurrent layers as MindSpore 2.7.0's: RNN, GRU, LSTM (stacked, optionally bidirectional, with per-sample
`seq_length`) and the single-step cells RNNCell, GRUCell, LSTMCell.

The time loop is unrolled in Python over the static sequence length, so a traced construct holds one matmul pair
per step and layer and is differentiated like any other graph. Parameters carry MindSpore's names and shapes
(weight_ih_l0, bias_hh_l1_reverse, ...; the cells' weight_ih, weight_hh, bias_ih, bias_hh) and its gate order
(LSTM: input, forget, cell, output; GRU: reset, update, new), so MindSpore checkpoints load either way.

    >>> net = nn.LSTM(10, 16, num_layers=2, batch_first=True)
    >>> output, (h_n, c_n) = net(ms.Tensor(np.ones((3, 5, 10), np.float32)))   # (3, 5, 16), (2, 3, 16) twice
"""

from __future__ import annotations

import math
from typing import Any

from tessel.common.dtype import DType, ms_name
from tessel.common.initializer import Uniform
from tessel.common.parameter import ParameterTuple
from tessel.common.support import log_once
from tessel.core.errors import ConfigurationError
from tessel.nn.cell import Cell
from tessel.nn.layers import Dropout, make_parameter
from tessel.ops import functional as F
from tessel.ops.nn_functional import relu, sigmoid, tanh

__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "RNNCell"]

_FLOATS = (DType.float32, DType.float16)


def _rnn_tanh_cell(x, h, w_ih, w_hh, b_ih, b_hh):
    return tanh(_affine(x, w_ih, b_ih) + _affine(h, w_hh, b_hh))


def _rnn_relu_cell(x, h, w_ih, w_hh, b_ih, b_hh):
    return relu(_affine(x, w_ih, b_ih) + _affine(h, w_hh, b_hh))


def _gru_cell(x, h, w_ih, w_hh, b_ih, b_hh):
    """MindSpore's _gru_cell: gates (reset, update, new); the reset gate scales the hidden part of the new gate."""
    i_r, i_z, i_n = F.chunk(_affine(x, w_ih, b_ih), 3, 1)
    h_r, h_z, h_n = F.chunk(_affine(h, w_hh, b_hh), 3, 1)
    reset, update = sigmoid(i_r + h_r), sigmoid(i_z + h_z)
    new = tanh(i_n + reset * h_n)
    return new + update * (h - new)


def _lstm_cell(x, state, w_ih, w_hh, b_ih, b_hh):
    """MindSpore's _lstm_cell: gates (input, forget, cell, output); returns (h, c)."""
    h, c = state
    gates = _affine(x, w_ih, b_ih) + _affine(h, w_hh, b_hh)
    in_gate, forget_gate, cell_gate, out_gate = F.chunk(gates, 4, 1)
    c = sigmoid(forget_gate) * c + sigmoid(in_gate) * tanh(cell_gate)
    return sigmoid(out_gate) * tanh(c), c


def _affine(x, weight, bias):
    out = F.matmul(x, weight, transpose_b=True)
    return out if bias is None else out + bias


_CELLS = {"RNN_TANH": _rnn_tanh_cell, "RNN_RELU": _rnn_relu_cell, "GRU": _gru_cell, "LSTM": _lstm_cell}
_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "GRU": 3, "LSTM": 4}


def _check_type(owner: str, name: str, value: Any, kind: type) -> None:
    """MindSpore's validator: a TypeError unless `value` is exactly a `kind` (a bool is no int)."""
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise TypeError(f"For '{owner}', the type of '{name}' must be '{kind.__name__}', got {value!r}")


def _check_positive(owner: str, name: str, value: Any) -> None:
    _check_type(owner, name, value, int)
    if value <= 0:
        raise ConfigurationError(f"For '{owner}', the '{name}' must be an int > 0, got {value}")


def _check_float_input(owner: str, name: str, value: Any) -> None:
    dtype = getattr(value, "dtype", None)
    if dtype is None or not hasattr(value, "shape"):
        raise TypeError(f"For '{owner}', the '{name}' must be a Tensor, got {type(value).__name__}")
    if dtype not in _FLOATS:
        raise TypeError(
            f"For '{owner}', the dtype of '{name}' must be float32 or float16, got {ms_name(dtype)}; cast it first, "
            f"e.g. {name}.astype(ms.float32)"
        )


def _check_state(owner: str, hx: Any, is_lstm: bool) -> tuple:
    """The initial state's tensors, checked as MindSpore checks them: a Tensor, or for an LSTM a tuple (h, c)."""
    if not is_lstm:
        _check_float_input(owner, "hx", hx)
        return (hx,)
    if not isinstance(hx, tuple) or len(hx) != 2:
        raise TypeError(f"For '{owner}', 'hx' must be a tuple (h_0, c_0) of two Tensors, got {type(hx).__name__}")
    _check_float_input(owner, "hx[0]", hx[0])
    _check_float_input(owner, "hx[1]", hx[1])
    return hx


def _uniform(bound: float, shape: tuple, dtype: Any, name: str):
    return make_parameter(Uniform(bound), shape, dtype, name)


class _RNNBase(Cell):
    """MindSpore's _RNNBase: `num_layers` stacked recurrent layers, each one or two directions; dropout (training
    only) on the outputs of every layer but the last."""

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        has_bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        dtype: Any = DType.float32,
    ):
        super().__init__()
        owner = self.cls_name
        for name, value in (("hidden_size", hidden_size), ("input_size", input_size), ("num_layers", num_layers)):
            _check_positive(owner, name, value)
        _check_type(owner, "dropout", dropout, float)
        for name, value in (("has_bias", has_bias), ("batch_first", batch_first), ("bidirectional", bidirectional)):
            _check_type(owner, name, value, bool)
        if not 0 <= dropout < 1:
            raise ConfigurationError(
                f"For '{owner}', the 'dropout' must be a number in range [0, 1) representing the probability of an "
                f"element being zeroed, but got {dropout}"
            )
        if dropout > 0 and num_layers == 1:
            log_once(
                f"{owner}.dropout",
                f"{owner}: dropout={dropout} is applied after every recurrent layer but the last, so it has no "
                "effect with num_layers=1",
            )
        self.mode, self.cell = mode, _CELLS[mode]
        self.is_lstm = mode == "LSTM"
        self.hidden_size, self.num_layers, self.has_bias = hidden_size, num_layers, has_bias
        self.batch_first, self.bidirectional, self.dropout = batch_first, bidirectional, dropout
        self.dropout_op = Dropout(p=float(dropout))
        num_directions = 2 if bidirectional else 1
        gate_size, bound = _GATES[mode] * hidden_size, 1 / math.sqrt(hidden_size)
        w_ih, w_hh, b_ih, b_hh = [], [], [], []
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else hidden_size * num_directions
            for direction in range(num_directions):
                suffix = f"l{layer}{'_reverse' if direction else ''}"
                w_ih.append(_uniform(bound, (gate_size, layer_input), dtype, f"weight_ih_{suffix}"))
                w_hh.append(_uniform(bound, (gate_size, hidden_size), dtype, f"weight_hh_{suffix}"))
                if has_bias:
                    b_ih.append(_uniform(bound, (gate_size,), dtype, f"bias_ih_{suffix}"))
                    b_hh.append(_uniform(bound, (gate_size,), dtype, f"bias_hh_{suffix}"))
        # MindSpore's order: every weight_ih, then every weight_hh, bias_ih, bias_hh (checkpoints list them so)
        self.w_ih_list, self.w_hh_list = ParameterTuple(w_ih), ParameterTuple(w_hh)
        self.b_ih_list, self.b_hh_list = ParameterTuple(b_ih), ParameterTuple(b_hh)

    def construct(self, x, hx=None, seq_length=None):
        owner = self.cls_name
        _check_float_input(owner, "x", x)
        if len(x.shape) != 3:
            raise ConfigurationError(f"For '{owner}', 'x' must be 3-D, got shape {tuple(x.shape)}")
        if self.batch_first:
            x = F.transpose(x, (1, 0, 2))
        steps, batch = x.shape[0], x.shape[1]
        if not isinstance(steps, int):
            # a symbolic time dim (dim 0 of a batch_first=False input): the loop needs its length, so this trace
            # fails and the cell is compiled again with exact shapes
            raise ConfigurationError(f"For '{owner}', the sequence length must be static to unroll the time loop")
        num_states = self.num_layers * (2 if self.bidirectional else 1)
        if hx is None:
            zeros = F.zeros((num_states, batch, self.hidden_size), x.dtype)
            states = (zeros, zeros) if self.is_lstm else (zeros,)
        else:
            states = _check_state(owner, hx, self.is_lstm)
            if any(s.dtype != x.dtype for s in states):
                raise TypeError(f"For '{owner}', 'hx' must have the dtype of 'x' ({ms_name(x.dtype)})")
        masks = None if seq_length is None else self._step_masks(seq_length, steps, batch)
        inputs = [x[t] for t in range(steps)]
        finals = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(2 if self.bidirectional else 1):
                index = layer * (2 if self.bidirectional else 1) + direction
                state = tuple(s[index] for s in states)
                out, state = self._direction(inputs, state, index, masks, reverse=direction == 1)
                outputs.append(out)
                finals.append(state)
            inputs = [F.concat([o[t] for o in outputs], 1) if len(outputs) > 1 else outputs[0][t] for t in range(steps)]
            if self.dropout and layer < self.num_layers - 1:
                dropped = self.dropout_op(F.stack(inputs, 0))
                inputs = [dropped[t] for t in range(steps)]
        output = F.stack(inputs, 0)
        if self.batch_first:
            output = F.transpose(output, (1, 0, 2))
        h_n = F.stack([s[0] for s in finals], 0)
        if self.is_lstm:
            return output, (h_n, F.stack([s[1] for s in finals], 0))
        return output, h_n

    def _step_masks(self, seq_length, steps, batch):
        """Per step t, a (batch, 1) bool mask: True where t < seq_length[b]."""
        owner = self.cls_name
        if getattr(seq_length, "dtype", None) not in (DType.int32, DType.int64):
            raise TypeError(f"For '{owner}', 'seq_length' must be an int32 or int64 Tensor, got {seq_length!r}")
        length = seq_length.shape[0] if len(seq_length.shape) == 1 else None
        if length is None or (isinstance(length, int) and isinstance(batch, int) and length != batch):
            raise ConfigurationError(
                f"For '{owner}', batch size of x and seq_length must be equal, but got {batch} of x and "
                f"{tuple(seq_length.shape)} for seq_length"
            )
        lengths = F.reshape(seq_length, (-1, 1))
        return [F.greater(lengths, t) for t in range(steps)]

    def _direction(self, inputs, state, index, masks, reverse):
        """One layer and direction over all steps (backwards when `reverse`). With a length mask, as MindSpore's
        variable_recurrent on the reverse_sequence'd input: steps past a sample's length output zeros and keep its
        state, so the final state is the one at its last valid step (the first step, backwards)."""
        w_ih, w_hh = self.w_ih_list[index], self.w_hh_list[index]
        b_ih, b_hh = (self.b_ih_list[index], self.b_hh_list[index]) if self.has_bias else (None, None)
        dtype = inputs[0].dtype
        if w_ih.dtype != dtype:
            w_ih, w_hh = F.cast(w_ih, dtype), F.cast(w_hh, dtype)
            b_ih, b_hh = (F.cast(b_ih, dtype), F.cast(b_hh, dtype)) if self.has_bias else (None, None)
        steps = range(len(inputs) - 1, -1, -1) if reverse else range(len(inputs))
        outputs = [None] * len(inputs)
        for t in steps:
            new = self.cell(inputs[t], state if self.is_lstm else state[0], w_ih, w_hh, b_ih, b_hh)
            new = new if self.is_lstm else (new,)
            if masks is None:
                state, outputs[t] = new, new[0]
            else:  # MindSpore's Select: what a step past the length computes never reaches the result
                state = tuple(F.select(masks[t], n, s) for n, s in zip(new, state))
                outputs[t] = F.select(masks[t], new[0], F.zeros_like(new[0]))
        return outputs, state

    def extend_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_layers={self.num_layers}, has_bias={self.has_bias}, "
            f"batch_first={self.batch_first}, dropout={self.dropout}, bidirectional={self.bidirectional}"
        )


class RNN(_RNNBase):
    """Stacked Elman RNN: h_t = nonlinearity(x_t W_ih^T + b_ih + h_(t-1) W_hh^T + b_hh), nonlinearity 'tanh' or
    'relu' (a keyword, as in MindSpore). `net(x, hx=None, seq_length=None)` returns (output, h_n)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        has_bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        dtype: Any = DType.float32,
        *,
        nonlinearity: str = "tanh",
    ):
        if nonlinearity not in ("tanh", "relu"):
            raise ConfigurationError(f"For 'RNN', the 'nonlinearity' must be in ['tanh', 'relu'], got {nonlinearity!r}")
        mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
        super().__init__(
            mode, input_size, hidden_size, num_layers, has_bias, batch_first, dropout, bidirectional, dtype
        )


class GRU(_RNNBase):
    """Stacked GRU, gates (reset r, update z, new n) as MindSpore's: n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),
    h' = n + z * (h - n). `net(x, hx=None, seq_length=None)` returns (output, h_n)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        has_bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        dtype: Any = DType.float32,
    ):
        super().__init__(
            "GRU", input_size, hidden_size, num_layers, has_bias, batch_first, dropout, bidirectional, dtype
        )


class LSTM(_RNNBase):
    """Stacked LSTM, gates (input, forget, cell, output) as MindSpore's. `net(x, hx=None, seq_length=None)` with hx
    a tuple (h_0, c_0) returns (output, (h_n, c_n))."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        has_bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        dtype: Any = DType.float32,
    ):
        super().__init__(
            "LSTM", input_size, hidden_size, num_layers, has_bias, batch_first, dropout, bidirectional, dtype
        )


class _RNNCellBase(Cell):
    """MindSpore's RNNCellBase: weight_ih (gates * hidden, input), weight_hh (gates * hidden, hidden) and, with
    has_bias, bias_ih and bias_hh, all Uniform(1 / sqrt(hidden_size))."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, has_bias: bool, dtype: Any):
        super().__init__()
        owner = self.cls_name
        _check_type(owner, "has_bias", has_bias, bool)
        _check_positive(owner, "hidden_size", hidden_size)
        _check_positive(owner, "input_size", input_size)
        self.input_size, self.hidden_size, self.has_bias = input_size, hidden_size, has_bias
        self.mode, self.cell, self.is_lstm = mode, _CELLS[mode], mode == "LSTM"
        gate_size, bound = _GATES[mode] * hidden_size, 1 / math.sqrt(hidden_size)
        self.weight_ih = _uniform(bound, (gate_size, input_size), dtype, "weight_ih")
        self.weight_hh = _uniform(bound, (gate_size, hidden_size), dtype, "weight_hh")
        self.bias_ih = _uniform(bound, (gate_size,), dtype, "bias_ih") if has_bias else None
        self.bias_hh = _uniform(bound, (gate_size,), dtype, "bias_hh") if has_bias else None

    def construct(self, x, hx):
        _check_float_input(self.cls_name, "x", x)
        state = _check_state(self.cls_name, hx, self.is_lstm)
        weights = [self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh]
        weights = [w if w is None or w.dtype == x.dtype else F.cast(w, x.dtype) for w in weights]
        return self.cell(x, state if self.is_lstm else state[0], *weights)

    def extend_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}, has_bias={self.has_bias}"


class RNNCell(_RNNCellBase):
    """One Elman RNN step: `cell(x, hx)` returns nonlinearity(x W_ih^T + b_ih + hx W_hh^T + b_hh)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        has_bias: bool = True,
        nonlinearity: str = "tanh",
        dtype: Any = DType.float32,
    ):
        _check_type("RNNCell", "nonlinearity", nonlinearity, str)
        if nonlinearity not in ("tanh", "relu"):
            raise ConfigurationError(f"For 'RNNCell', 'nonlinearity' must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size, has_bias, dtype)
        self.nonlinearity = nonlinearity


class GRUCell(_RNNCellBase):
    """One GRU step: `cell(x, hx)` returns the next hidden state (gates as nn.GRU's)."""

    def __init__(self, input_size: int, hidden_size: int, has_bias: bool = True, dtype: Any = DType.float32):
        super().__init__("GRU", input_size, hidden_size, has_bias, dtype)


class LSTMCell(_RNNCellBase):
    """One LSTM step: `cell(x, (h, c))` returns (h', c') (gates as nn.LSTM's)."""

    def __init__(self, input_size: int, hidden_size: int, has_bias: bool = True, dtype: Any = DType.float32):
        super().__init__("LSTM", input_size, hidden_size, has_bias, dtype)
