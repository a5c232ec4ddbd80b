"""`tessel.mint.nn` — MindSpore's `mindspore.mint.nn`: PyTorch-style layers as tessel Cells.

    >>> from tessel import mint
    >>> layer = mint.nn.Linear(784, 10)                   # weight (10, 784), bias (10,), as nn.Dense
    >>> logits = layer(mint.flatten(images, start_dim=1))

Where a `tessel.nn` cell already has mint's arguments it is the same class (Flatten, MSELoss, CrossEntropyLoss, ...).
The convolution, normalisation, embedding, pooling and upsampling cells (layers.py) take mint's arguments and have
its parameter names and initialisation; the activations, losses and padding (elementwise.py) call
mint.nn.functional. The other names of MindSpore's mint.nn raise NotSupportedYetError.
"""

from __future__ import annotations

from typing import Any

from tessel import nn as _nn
from tessel.common.dtype import DType
from tessel.common.support import unsupported_names
from tessel.core.errors import ConfigurationError
from tessel.mint._names import MINT_NN
from tessel.mint.nn import functional
from tessel.mint.nn.elementwise import *  # noqa: F403 - the cells of elementwise.__all__
from tessel.mint.nn.layers import *  # noqa: F403 - the cells of layers.__all__

_WHY = "tessel has no mapping for it yet; use the tessel.nn equivalent if there is one"

# Same arguments and behaviour as mint's. MindSpore's mint.nn.ReLU, Sigmoid and Tanh are its nn cells, which take no
# arguments (no `inplace`): anything passed is a TypeError, as there.
Identity = _nn.Identity
ReLU = _nn.ReLU
Sigmoid = _nn.Sigmoid
Tanh = _nn.Tanh
Flatten = _nn.Flatten
MSELoss = _nn.MSELoss
L1Loss = _nn.L1Loss
CrossEntropyLoss = _nn.CrossEntropyLoss
NLLLoss = _nn.NLLLoss


class Linear(_nn.Dense):
    """y = x @ weight.T + bias with weight (out_features, in_features); default init as MindSpore's mint.nn.Linear
    (HeUniform(sqrt(5)) weight, Uniform(1/sqrt(in_features)) bias). Shardable like nn.Dense (`self.matmul`)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        weight_init: Any = None,
        bias_init: Any = None,
        dtype: Any = None,
    ):
        super().__init__(in_features, out_features, weight_init, bias_init, has_bias=bias, dtype=dtype or DType.float32)
        self.in_features, self.out_features = in_features, out_features


class _Activation(_nn.Cell):
    def __init__(self, **attrs: Any):
        super().__init__()
        for name, value in attrs.items():
            setattr(self, name, value)


def _check_dim(cell: str, dim: Any) -> None:
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
        raise TypeError(f"mint.nn.{cell}: dim must be an int or None, got {dim!r}")


class ReLU6(_Activation):
    def __init__(self, inplace: bool = False):
        functional._no_inplace("ReLU6", inplace, "mindspore.mint.nn")
        super().__init__(inplace=inplace)

    def construct(self, input):
        return functional.relu6(input, self.inplace)


class SiLU(_Activation):
    def __init__(self, inplace: bool = False):
        functional._no_inplace("SiLU", inplace, "mindspore.mint.nn")
        super().__init__(inplace=inplace)

    def construct(self, input):
        return functional.silu(input, self.inplace)


class GELU(_Activation):
    """GELU, exact ('none', the default) or with the tanh approximation ('tanh')."""

    def __init__(self, approximate: str = "none"):
        if approximate not in ("none", "tanh"):
            raise ConfigurationError(f"mint.nn.GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        super().__init__(approximate=approximate)

    def construct(self, input):
        return functional.gelu(input, self.approximate)


class Softmax(_Activation):
    def __init__(self, dim: int | None = None):
        _check_dim("Softmax", dim)
        super().__init__(dim=dim)

    def construct(self, input):
        return functional.softmax(input, self.dim)


class LogSoftmax(_Activation):
    def __init__(self, dim: int | None = None):
        _check_dim("LogSoftmax", dim)
        super().__init__(dim=dim)

    def construct(self, input):
        return functional.log_softmax(input, self.dim)


class Dropout(_Activation):
    """Zero each element with probability p while training (set_train), scaling the rest by 1/(1-p)."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        functional._no_inplace("Dropout", inplace, "mindspore.mint.nn")
        super().__init__(p=p, inplace=inplace)

    def construct(self, input):
        return functional.dropout(input, self.p, self.training, self.inplace)


class BCEWithLogitsLoss(_nn.BCEWithLogitsLoss):
    def __init__(self, weight: Any = None, reduction: str = "mean", pos_weight: Any = None):
        super().__init__(reduction, weight, pos_weight)


__getattr__ = unsupported_names("mindspore.mint.nn", MINT_NN, _WHY)
__all__ = sorted({name for name in MINT_NN if name in globals()} | {"functional"})
