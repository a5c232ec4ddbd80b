"""`tessel.mint.nn` — MindSpore's `mindspore.mint.nn`: PyTorch-style layers as tessel Cells.

    >>> from tessel import mint
    >>> layer = mint.nn.Linear(784, 10)                   # weight (10, 784), bias (10,), as nn.Dense
    >>> logits = layer(mint.flatten(images, start_dim=1))

Where a `tessel.nn` cell already has mint's arguments it is the same class (Flatten, MSELoss, CrossEntropyLoss, ...).
The other names of MindSpore's mint.nn raise NotSupportedYetError.
"""

from __future__ import annotations

from typing import Any

from tessel import nn as _nn
from tessel.common.dtype import DType
from tessel.common.support import unsupported_names
from tessel.mint._names import MINT_NN
from tessel.mint.nn import functional

_WHY = "tessel has no mapping for it yet; use the tessel.nn equivalent if there is one"

# Same arguments and behaviour as mint's.
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


class ReLU6(_Activation):
    def __init__(self, inplace: bool = False):
        super().__init__(inplace=inplace)

    def construct(self, input):
        return functional.relu6(input, self.inplace)


class SiLU(_Activation):
    def __init__(self, inplace: bool = False):
        super().__init__(inplace=inplace)

    def construct(self, input):
        return functional.silu(input, self.inplace)


class GELU(_Activation):
    """GELU, exact ('none', the default) or with the tanh approximation ('tanh')."""

    def __init__(self, approximate: str = "none"):
        super().__init__(approximate=approximate)

    def construct(self, input):
        return functional.gelu(input, self.approximate)


class Softmax(_Activation):
    def __init__(self, dim: int | None = None):
        super().__init__(dim=dim)

    def construct(self, input):
        return functional.softmax(input, self.dim)


class LogSoftmax(_Activation):
    def __init__(self, dim: int | None = None):
        super().__init__(dim=dim)

    def construct(self, input):
        return functional.log_softmax(input, self.dim)


class Dropout(_Activation):
    """Zero each element with probability p while training (set_train), scaling the rest by 1/(1-p)."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__(p=p, inplace=inplace)

    def construct(self, input):
        return functional.dropout(input, self.p, self.training, self.inplace)


class BCEWithLogitsLoss(_nn.BCEWithLogitsLoss):
    def __init__(self, weight: Any = None, reduction: str = "mean", pos_weight: Any = None):
        super().__init__(reduction, weight, pos_weight)


__getattr__ = unsupported_names("mindspore.mint.nn", MINT_NN, _WHY)
__all__ = sorted({name for name in MINT_NN if name in globals()} | {"functional"})
