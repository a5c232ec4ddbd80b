"""Basic layers: Dense, Flatten, Unflatten, Dropout, Dropout1d/2d, Embedding, Identity and the activation cells, with
MindSpore's defaults
(Dense: weight HeUniform(sqrt(5)), bias Uniform(1/sqrt(in_channels)); "normal" = Normal(sigma=0.01))."""

from __future__ import annotations

import inspect
import logging
import math
from typing import Any

import numpy as np

from tessel.common.dtype import DType, ms_name, to_dtype
from tessel.common.initializer import HeUniform, Uniform, init_array
from tessel.common.parameter import Parameter
from tessel.common.support import log_once, not_supported_yet
from tessel.common.tracing import current
from tessel.core.errors import ConfigurationError
from tessel.nn.activation import PReLU, Softmax2d
from tessel.nn.cell import Cell
from tessel.ops import composed as C
from tessel.ops import functional as F
from tessel.ops import primitive
from tessel.ops.nn_functional import channel_dropout, check_channel_p


def require_float(cell: Cell, x: Any, name: str = "x") -> None:
    """Raise a clear error unless input `name` of `cell` is a float tensor."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or not dtype.is_float:
        got = ms_name(dtype) if dtype is not None else type(x).__name__
        shape = tuple(getattr(x, "shape", ()))
        raise ConfigurationError(
            f"{cell.cls_name} input {name!r} must be a float tensor, got {got} of shape {shape}; "
            f"cast it first, e.g. {name}.astype(ms.float32) or a dataset TypeCast(ms.float32)"
        )


def _positive(cell: str, **values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{cell}: {name} must be a positive int, got {value!r}")


def positive_int(owner: str, name: str, value: Any) -> int:
    """`value` if it is an int > 0 (not a bool); else a ConfigurationError naming `owner` and `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{owner}: {name} must be an int > 0, got {value!r}")
    return value


def make_parameter(init: Any, shape: tuple, dtype: Any, name: str, requires_grad: bool = True) -> Parameter:
    return Parameter(init_array(init, shape, dtype), name=name, requires_grad=requires_grad)


class Dense(Cell):
    """y = activation(x @ weight.T + bias); weight is (out_channels, in_channels).

    As in MindSpore, the product and the bias are the primitives `self.matmul` (MatMul(transpose_b=True)) and
    `self.bias_add` (BiasAdd), so semi-auto parallelism shards them: `net.fc1.matmul.shard(((2, 1), (4, 1)))`.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        weight_init: Any = None,
        bias_init: Any = None,
        has_bias: bool = True,
        activation: Any = None,
        dtype: Any = DType.float32,
    ):
        super().__init__()
        _positive("Dense", in_channels=in_channels, out_channels=out_channels)
        self.in_channels, self.out_channels, self.has_bias = in_channels, out_channels, has_bias
        weight_init = HeUniform(math.sqrt(5)) if weight_init is None else weight_init
        self.weight = make_parameter(weight_init, (out_channels, in_channels), dtype, "weight")
        bias_init = Uniform(1.0 / math.sqrt(in_channels)) if bias_init is None else bias_init
        self.bias = make_parameter(bias_init, (out_channels,), dtype, "bias") if has_bias else None
        self.activation = get_activation(activation) if isinstance(activation, str) else activation
        self.matmul = primitive.MatMul(transpose_b=True)
        self.bias_add = primitive.BiasAdd()

    def construct(self, x):
        require_float(self, x)
        lead = x.shape[:-1]
        if x.ndim != 2:
            x = F.reshape(x, (-1, x.shape[-1]))
        out = self.matmul(x, self.weight)
        if self.has_bias:
            out = self.bias_add(out, self.bias)
        if self.activation is not None:
            out = self.activation(out)
        return out if len(lead) == 1 else F.reshape(out, (*lead, self.out_channels))

    def extend_repr(self) -> str:
        return f"input_channels={self.in_channels}, output_channels={self.out_channels}, has_bias={self.has_bias}"


class Flatten(Cell):
    """Merge dims start_dim..end_dim (default: all but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def construct(self, x):
        return F.flatten(x, start_dim=self.start_dim, end_dim=self.end_dim)


class Identity(Cell):
    """Returns its input. As MindSpore's nn.Identity(*args, **kwargs), it takes any arguments and, being a
    placeholder, uses none of them."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__()

    def construct(self, x):
        return x


class Dropout(Cell):
    """Zero elements with probability p while training (or 1 - keep_prob when p is None); the identity in eval mode.

    As MindSpore's: p wins when both are given; `.p` is None when only keep_prob was, and `.keep_prob` keeps its
    value (0.5 by default) either way."""

    def __init__(self, keep_prob: float = 0.5, p: float | None = None, dtype: Any = DType.float32):
        super().__init__()
        if p is None:
            if not isinstance(keep_prob, float):
                raise TypeError(f"Dropout: keep_prob must be a float, got {keep_prob!r}; e.g. keep_prob=0.9, or p=0.1")
            if not 0.0 < keep_prob <= 1.0:
                raise ConfigurationError(f"Dropout: keep_prob must be in (0, 1], got {keep_prob}")
        else:
            if isinstance(p, bool) or not isinstance(p, (int, float)):
                raise TypeError(f"Dropout: p must be a float or an int, got {p!r}; e.g. p=0.1")
            if not 0.0 <= p < 1.0:
                raise ConfigurationError(f"Dropout: p must be in [0, 1), got {p}")
        if to_dtype(dtype) != DType.float32:
            log_once(
                "Dropout.dtype",
                f"Dropout: dtype={ms_name(to_dtype(dtype))} has no effect (MindSpore deprecates the argument); "
                "the output has the input's dtype",
                logging.INFO,
            )
        from tessel.common import seed

        self.p, self.keep_prob, self.seed = p, keep_prob, seed.next_op_seed()

    def construct(self, x):
        # MindSpore's test, keep_prob == 1 included even when p is given
        if not self.training or self.keep_prob == 1 or self.p == 0:
            return x
        rate = 1.0 - self.keep_prob if self.p is None else float(self.p)
        trace = current()
        seed = self.seed if trace is None else trace.call_seed(self, self.seed)  # a new mask per call in a graph
        return F.dropout(x, rate, training=True, seed=seed)

    def extend_repr(self) -> str:
        return f"keep_prob={self.keep_prob}" if self.p is None else f"p={self.p}"


class _ChannelDropout(Cell):
    """Zero whole channels with probability p while training (MindSpore's Dropout2D: one draw per (n, c), the kept
    channels scaled by 1 / (1 - p)); the identity in eval mode or when p is 0."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        from tessel.common import seed

        self.p, self.seed = check_channel_p(self.cls_name, p), seed.next_op_seed()

    def _drop(self, x):
        trace = current()
        seed = self.seed if trace is None else trace.call_seed(self, self.seed)  # a new mask per call in a graph
        return channel_dropout(x, self.p, seed=seed)

    def extend_repr(self) -> str:
        return f"p={self.p}"


class Dropout1d(_ChannelDropout):
    """Channel dropout of an (N, C, L) or (C, L) input (a (C, L) input is one sample)."""

    def construct(self, x):
        if not self.training or self.p == 0:
            return x
        if len(x.shape) == 2:
            return F.squeeze(self._drop(F.expand_dims(x, 0)), 0)
        if len(x.shape) != 3:
            raise ConfigurationError(f"Dropout1d: the input must be 2-D (C, L) or 3-D (N, C, L), got {x.shape}")
        return self._drop(x)


class Dropout2d(_ChannelDropout):
    """Channel dropout of an (N, C, H, W) input."""

    def construct(self, x):
        if not self.training or self.p == 0:
            return x
        if len(x.shape) != 4:
            raise ConfigurationError(f"Dropout2d: the input must be 4-D (N, C, H, W), got shape {x.shape}")
        return self._drop(x)


class Unflatten(Cell):
    """Split dim `axis` into `unflattened_size` (a tuple or list; one entry may be -1): MindSpore's nn.Unflatten."""

    def __init__(self, axis: int, unflattened_size: Any):
        super().__init__()
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TypeError(f"Unflatten: axis must be an int, got {axis!r}")
        if not isinstance(unflattened_size, (tuple, list)):
            raise TypeError(f"Unflatten: unflattened_size must be a tuple or list, got {unflattened_size!r}")
        self.axis, self.unflattened_size = axis, tuple(unflattened_size)

    def construct(self, input_x):
        shape = tuple(input_x.shape)
        axis = self.axis % len(shape)
        return F.reshape(input_x, (*shape[:axis], *self.unflattened_size, *shape[axis + 1 :]))


class Embedding(Cell):
    """Rows of embedding_table (vocab_size, embedding_size) at integer ids."""

    def __init__(
        self,
        vocab_size: int,
        embedding_size: int,
        use_one_hot: bool = False,
        embedding_table: Any = "normal",
        dtype: Any = DType.float32,
        padding_idx: int | None = None,
    ):
        super().__init__()
        _positive("Embedding", vocab_size=vocab_size, embedding_size=embedding_size)
        self.vocab_size, self.embedding_size, self.use_one_hot = vocab_size, embedding_size, use_one_hot
        table = init_array(embedding_table, (vocab_size, embedding_size), DType.float32)
        if padding_idx is not None:
            if not 0 <= padding_idx < vocab_size:
                raise ConfigurationError(f"Embedding: padding_idx {padding_idx} is outside [0, {vocab_size})")
            if not isinstance(table, np.ndarray):  # drawn later (no_init_parameters): MindSpore draws it first too
                table = table.full()
            table[padding_idx] = 0
        self.embedding_table = Parameter(table, name="embedding_table")
        # MindSpore's dtype (default float32) is the dtype of the one-hot path's on/off values; the ids are ints
        self.dtype = to_dtype(dtype)
        if not (self.dtype.is_int or self.dtype.is_float):
            raise ConfigurationError(f"Embedding: dtype must be a number type (default float32), got {dtype!r}")

    def construct(self, ids):
        if not ids.dtype.is_int:
            raise ConfigurationError(
                f"Embedding input 'ids' must be an int tensor, got {ms_name(ids.dtype)}; cast with ids.astype(ms.int32)"
            )
        if self.use_one_hot:
            on, off = np.array(1, self.dtype.numpy), np.array(0, self.dtype.numpy)  # MindSpore's on/off values
            hot = F.one_hot(ids, self.vocab_size, on, off)
            return F.matmul(F.reshape(hot, (-1, self.vocab_size)), self.embedding_table).reshape(
                (*ids.shape, self.embedding_size)
            )
        return F.gather(self.embedding_table, ids, 0)

    def extend_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, embedding_size={self.embedding_size}"


def _activation_cell(name: str, fn, doc: str, check=None, **defaults):
    """A Cell class whose constructor takes exactly MindSpore's arguments for nn.`name` (`defaults`, in order): an
    unknown keyword or one argument too many is a TypeError, as Python's; `check` validates the values."""
    signature = inspect.Signature([inspect.Parameter(k, _KEYWORD, default=v) for k, v in defaults.items()])
    takes = f"takes {signature}" if defaults else "takes no arguments"

    def __init__(self, *args, **kwargs):
        Cell.__init__(self)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{name}() {error}; MindSpore's nn.{name} {takes}") from None
        bound.apply_defaults()
        for key, value in bound.arguments.items():
            object.__setattr__(self, key, value)
        if check is not None:
            check(self)

    def construct(self, x):
        return fn(self, x)

    def extend_repr(self) -> str:
        return ", ".join(f"{key}={getattr(self, key)!r}" for key in defaults)

    self_param = inspect.Parameter("self", _KEYWORD)
    __init__.__signature__ = signature.replace(parameters=[self_param, *signature.parameters.values()])
    namespace = {"__init__": __init__, "construct": construct, "extend_repr": extend_repr, "__doc__": doc}
    return type(name, (Cell,), namespace)


_KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD


def _check_gelu(cell: Cell) -> None:
    if not isinstance(cell.approximate, bool):
        raise TypeError(
            f"GELU: approximate must be a bool (True: the tanh approximation, False: the exact erf form), "
            f"got {cell.approximate!r}"
        )


def _check_alpha(cell: Cell) -> None:
    if isinstance(cell.alpha, bool) or not isinstance(cell.alpha, (int, float)):
        raise TypeError(f"{cell.cls_name}: alpha must be an int or a float, got {cell.alpha!r}")


def _int_axis(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: axis must be an int, got {value!r}")
    return value


def _one_axis(name: str):
    """The check of nn.`name`'s axis: an int or a one-element tuple of it (a longer tuple is not supported yet)."""

    def check(cell: Cell) -> None:
        axis = cell.axis
        if isinstance(axis, (tuple, list)):
            if len(axis) != 1:
                raise not_supported_yet(
                    f"mindspore.nn.{name}(axis={axis!r})",
                    f"tessel's {name.lower()} runs over one axis; pass a single int",
                )
            axis = axis[0]
        object.__setattr__(cell, "axis", _int_axis(name, axis))

    return check


ReLU = _activation_cell("ReLU", lambda c, x: F.relu(x), "max(x, 0).")
ReLU6 = _activation_cell("ReLU6", lambda c, x: F.relu6(x), "min(max(x, 0), 6).")
Sigmoid = _activation_cell("Sigmoid", lambda c, x: F.sigmoid(x), "1 / (1 + e^-x).")
Tanh = _activation_cell("Tanh", lambda c, x: F.tanh(x), "tanh x.")
SiLU = _activation_cell("SiLU", lambda c, x: F.silu(x), "x * sigmoid(x).")
GELU = _activation_cell(
    "GELU",
    lambda c, x: F.gelu(x, "tanh" if c.approximate else "none"),
    "GELU: the tanh approximation when approximate (the default), else the exact x * Phi(x).",
    _check_gelu,
    approximate=True,
)
LeakyReLU = _activation_cell(
    "LeakyReLU", lambda c, x: F.leaky_relu(x, c.alpha), "x where x >= 0, else alpha * x.", _check_alpha, alpha=0.2
)
Softmax = _activation_cell(
    "Softmax", lambda c, x: F.softmax(x, c.axis), "softmax over axis.", _one_axis("Softmax"), axis=-1
)
LogSoftmax = _activation_cell(
    "LogSoftmax",
    lambda c, x: F.log_softmax(x, c.axis),
    "log-softmax over axis.",
    lambda c: _int_axis("LogSoftmax", c.axis),
    axis=-1,
)
ELU = _activation_cell(
    "ELU", lambda c, x: C.elu(x, c.alpha), "x where x > 0, else alpha * (e^x - 1).", _check_alpha, alpha=1.0
)
Softplus = _activation_cell(
    "Softplus",
    lambda c, x: C.softplus(x, c.beta, c.threshold),
    "log(1 + e^(beta x)) / beta; x where beta * x > threshold.",
    beta=1,
    threshold=20,
)
Mish = _activation_cell("Mish", lambda c, x: C.mish(x), "x * tanh(softplus(x)).")
HSwish = _activation_cell("HSwish", lambda c, x: C.hardswish(x), "x * relu6(x + 3) / 6.")
HSigmoid = _activation_cell("HSigmoid", lambda c, x: C.hardsigmoid(x), "relu6(x + 3) / 6.")


def _check_hardtanh(cell: Cell) -> None:
    if not cell.min_val < cell.max_val:
        raise ConfigurationError(f"Hardtanh: min_val must be less than max_val, got {cell.min_val} and {cell.max_val}")


def _check_lambd(cell: Cell) -> None:
    if cell.lambd < 0:
        raise ConfigurationError(f"{cell.cls_name}: lambd must be >= 0, got {cell.lambd}")


def _soft_shrink(x, lambd: float):
    return F.select(F.greater(x, lambd), x - lambd, F.select(F.less(x, -lambd), x + lambd, F.zeros_like(x)))


Softsign = _activation_cell("Softsign", lambda c, x: x / (1 + F.abs(x)), "x / (1 + |x|).")
Tanhshrink = _activation_cell("Tanhshrink", lambda c, x: x - F.tanh(x), "x - tanh x.")
# MindSpore's formula, log(1 / (1 + e^-x)): -inf below about -88 in float32, as MindSpore's
LogSigmoid = _activation_cell(
    "LogSigmoid", lambda c, x: F.log(F.reciprocal(1 + F.exp(-x))), "log(sigmoid x), as log(1 / (1 + e^-x))."
)
# maximum and minimum, not clamp's selects: MindSpore's gradient is halved at x == min_val or max_val
Hardtanh = _activation_cell(
    "Hardtanh",
    lambda c, x: F.minimum(F.maximum(x, c.min_val), c.max_val),
    "x limited to [min_val, max_val].",
    _check_hardtanh,
    min_val=-1.0,
    max_val=1.0,
)
SoftShrink = _activation_cell(
    "SoftShrink",
    lambda c, x: _soft_shrink(x, c.lambd),
    "x - lambd where x > lambd, x + lambd where x < -lambd, else 0.",
    _check_lambd,
    lambd=0.5,
)
HShrink = _activation_cell(
    "HShrink",
    lambda c, x: F.select(F.greater(F.abs(x), c.lambd), x, F.zeros_like(x)),
    "x where |x| > lambd, else 0.",
    lambd=0.5,
)
Softmin = _activation_cell(
    "Softmin", lambda c, x: F.softmax(-x, c.axis), "softmax of -x over axis.", _one_axis("Softmin"), axis=-1
)

# MindSpore 2.7.0's nn.get_activation names (nn/layer/activation.py _activation), case and underscores as they are
_ACTIVATIONS = {
    "softmin": Softmin,
    "softmax": Softmax,
    "softmax2d": Softmax2d,
    "logsoftmax": LogSoftmax,
    "logsoftmaxExt": None,
    "relu": ReLU,
    "relu6": ReLU6,
    "rrelu": None,
    "silu": SiLU,
    "tanh": Tanh,
    "tanhshrink": Tanhshrink,
    "hardtanh": Hardtanh,
    "gelu": GELU,
    "fast_gelu": None,
    "elu": ELU,
    "sigmoid": Sigmoid,
    "softsign": Softsign,
    "prelu": PReLU,
    "preluExt": None,
    "leakyrelu": LeakyReLU,
    "hswish": HSwish,
    "hsigmoid": HSigmoid,
    "logsigmoid": LogSigmoid,
    "softshrink": SoftShrink,
    "hshrink": HShrink,
    "threshold": None,
    "mish": Mish,
}


def get_activation(name: str | None, prim_name: str | None = None) -> Cell | None:
    """The activation cell called `name` ("relu", "gelu", ...), one of MindSpore's names exactly (a KeyError
    otherwise, as MindSpore's); None for None. `prim_name` names the caller in the error."""
    if name is None:
        return None
    prefix = f"For '{prim_name}', the" if prim_name else "The"
    if not isinstance(name, str) or name not in _ACTIVATIONS:
        raise KeyError(f"{prefix} 'name' must be in {list(_ACTIVATIONS)}, but got {name}.")
    if name == "threshold":
        # MindSpore's get_activation calls nn.Threshold() without its required threshold and value
        raise TypeError(
            "get_activation('threshold') fails in MindSpore 2.7.0 as well: nn.Threshold needs its threshold and "
            "value arguments; pass an activation Cell instead"
        )
    cell = _ACTIVATIONS[name]
    if cell is None:
        raise not_supported_yet(
            f"activation {name!r} (mindspore.nn.get_activation, Dense(activation=...))",
            "tessel lacks this activation; pass one of "
            f"{[key for key, value in _ACTIVATIONS.items() if value is not None]} or a Cell of your own",
        )
    return cell()
