"""MindSpore 2.7.0's transformer layers: TransformerEncoderLayer, TransformerDecoderLayer, TransformerEncoder,
TransformerDecoder and Transformer, on nn.MultiheadAttention (attention.py), with MindSpore's arguments, defaults,
parameter names and shapes (so MindSpore checkpoints load).

>>> layer = nn.TransformerEncoderLayer(d_model=16, nhead=4)
>>> out = layer(src)  # (S, N, 16)
"""

from __future__ import annotations

import copy
import math
from typing import Any

from tessel.common.dtype import DType
from tessel.common.initializer import HeUniform, Uniform, initializer
from tessel.nn.attention import MultiheadAttention, is_float
from tessel.nn.cell import Cell
from tessel.nn.container import CellList
from tessel.nn.layers import Dense, Dropout
from tessel.nn.norm import LayerNorm
from tessel.ops import nn_functional as NF


def _activation(activation: Any) -> Any:
    """MindSpore 2.7.0's check of a transformer layer's activation: "relu" or "gelu" (ops.relu, ops.gelu with its
    exact erf form), or the functions ops.relu and ops.gelu themselves. MindSpore documents nn.ReLU() and nn.GELU()
    too but refuses them (a Cell is callable and is not ops.relu); tessel refuses them alike."""
    if isinstance(activation, str):
        functions = {"relu": NF.relu, "gelu": NF.gelu}
        if activation not in functions:
            raise ValueError(f"The activation must be relu/gelu, but get {activation}")
        return functions[activation]
    if not callable(activation):
        raise ValueError(f"The argument 'activation' must be str, callable or Cell instance, but get {activation}.")
    if isinstance(activation, Cell):
        from tessel.nn.layers import GELU, ReLU

        if not isinstance(activation, (ReLU, GELU)):
            raise ValueError(f"The argument 'activation' must be nn.ReLU or nn.GELU instance, but get {activation}.")
    if activation is not NF.relu and activation is not NF.gelu:
        raise ValueError(f"The argument 'activation' must be ops.relu or ops.gelu instance, but get {activation}.")
    return activation


def _check_padding_mask(mask: Any) -> None:
    if mask is not None and mask.dtype != DType.bool_ and not is_float(mask):
        raise AssertionError("only bool and floating types of key_padding_mask are supported")


class _TransformerLayer(Cell):
    """What the encoder and decoder layers share: self-attention, the feed-forward block (dense1, activation,
    dropout, dense2) and its dropouts, with MindSpore's initialisers and attribute names."""

    def __init__(self, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first,
                 dtype, cross_attention):  # fmt: skip
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=batch_first, dtype=dtype)
        if cross_attention:  # made here to keep MindSpore's parameter order
            self.multihead_attn = MultiheadAttention(
                d_model, nhead, dropout=dropout, batch_first=batch_first, dtype=dtype
            )
        self.dense1 = Dense(
            d_model, dim_feedforward, HeUniform(math.sqrt(5)), Uniform(1 / math.sqrt(d_model)), dtype=dtype
        )
        self.dropout = Dropout(p=dropout)
        self.dense2 = Dense(
            dim_feedforward, d_model, HeUniform(math.sqrt(5)), Uniform(1 / math.sqrt(dim_feedforward)), dtype=dtype
        )
        self.activation1 = activation
        self.activation = _activation(activation)
        self.d_model, self.nhead, self.dim_feedforward = d_model, nhead, dim_feedforward
        self.dropout_num, self.layernorm_eps = dropout, layer_norm_eps
        self.batch_first, self.norm_first, self.dtype = batch_first, norm_first, dtype

    def _norms_and_dropouts(self, count: int) -> None:
        for i in range(1, count + 1):
            setattr(self, f"norm{i}", LayerNorm((self.d_model,), epsilon=self.layernorm_eps, dtype=self.dtype))
        for i in range(1, count + 1):
            setattr(self, f"dropout{i}", Dropout(p=self.dropout_num))

    def _sa_block(self, x, attn_mask, key_padding_mask):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False)[0]
        return self.dropout1(x)

    def _ff_block(self, x, dropout):
        return dropout(self.dense2(self.dropout(self.activation(self.dense1(x)))))


class TransformerEncoderLayer(_TransformerLayer):
    """One encoder layer: self-attention and a feed-forward block, each with a residual and a LayerNorm (after
    them, or before them with norm_first), MindSpore 2.7.0's nn.TransformerEncoderLayer."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: Any = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        dtype: Any = DType.float32,
    ):
        super().__init__(
            d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, dtype, False
        )
        self._norms_and_dropouts(2)

    def construct(self, src, src_mask=None, src_key_padding_mask=None):
        _check_padding_mask(src_key_padding_mask)
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask)
            return x + self._ff_block(self.norm2(x), self.dropout2)
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask))
        return self.norm2(x + self._ff_block(x, self.dropout2))


class TransformerDecoderLayer(_TransformerLayer):
    """One decoder layer: self-attention, attention over the encoder's memory and a feed-forward block, each with
    a residual and a LayerNorm, MindSpore 2.7.0's nn.TransformerDecoderLayer."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: Any = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        dtype: Any = DType.float32,
    ):
        super().__init__(
            d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, dtype, True
        )
        self._norms_and_dropouts(3)

    def construct(
        self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None
    ):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask)
            return x + self._ff_block(self.norm3(x), self.dropout3)
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask))
        return self.norm3(x + self._ff_block(x, self.dropout3))

    def _mha_block(self, x, memory, attn_mask, key_padding_mask):
        x = self.multihead_attn(
            x, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False
        )[0]
        return self.dropout2(x)


def _copies(layer_class: type, layer: Cell, num_layers: int) -> CellList:
    """MindSpore's stack: a new layer with `layer`'s settings (not its parameters), deep-copied num_layers times,
    so every layer starts with the same values."""
    fresh = layer_class(
        layer.d_model,
        layer.nhead,
        layer.dim_feedforward,
        layer.dropout_num,
        layer.activation1,
        layer.layernorm_eps,
        layer.batch_first,
        layer.norm_first,
        dtype=layer.dtype,
    )
    return CellList([copy.deepcopy(fresh) for _ in range(num_layers)])


class TransformerEncoder(Cell):
    """num_layers TransformerEncoderLayers, then `norm` if given, MindSpore 2.7.0's nn.TransformerEncoder. As
    MindSpore's, the layers are copies of a new layer built with encoder_layer's settings, not of encoder_layer."""

    def __init__(self, encoder_layer: Cell, num_layers: int, norm: Cell | None = None):
        super().__init__()
        self.layers = _copies(TransformerEncoderLayer, encoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def construct(self, src, src_mask=None, src_key_padding_mask=None):
        _check_padding_mask(src_key_padding_mask)
        output = src
        for layer in self.layers:
            output = layer(output, src_mask=src_mask, src_key_padding_mask=src_key_padding_mask)
        return output if self.norm is None else self.norm(output)


class TransformerDecoder(Cell):
    """num_layers TransformerDecoderLayers, then `norm` if given, MindSpore 2.7.0's nn.TransformerDecoder (the
    layers are copies of a new layer with decoder_layer's settings, as MindSpore's)."""

    def __init__(self, decoder_layer: Cell, num_layers: int, norm: Cell | None = None):
        super().__init__()
        self.layers = _copies(TransformerDecoderLayer, decoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def construct(
        self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None
    ):
        output = tgt
        for layer in self.layers:
            output = layer(
                output,
                memory,
                tgt_mask=tgt_mask,
                memory_mask=memory_mask,
                tgt_key_padding_mask=tgt_key_padding_mask,
                memory_key_padding_mask=memory_key_padding_mask,
            )
        return output if self.norm is None else self.norm(output)


class Transformer(Cell):
    """An encoder and a decoder (each ending in a LayerNorm), MindSpore 2.7.0's nn.Transformer; every parameter
    of more than one dim is then drawn again from XavierUniform, as MindSpore's."""

    def __init__(
        self,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: Any = "relu",
        custom_encoder: Cell | None = None,
        custom_decoder: Cell | None = None,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        dtype: Any = DType.float32,
    ):
        super().__init__()
        settings = (dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, *settings, dtype=dtype)
            norm = LayerNorm((d_model,), epsilon=layer_norm_eps, dtype=dtype)
            self.encoder = TransformerEncoder(layer, num_encoder_layers, norm)
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, *settings, dtype=dtype)
            norm = LayerNorm((d_model,), epsilon=layer_norm_eps, dtype=dtype)
            self.decoder = TransformerDecoder(layer, num_decoder_layers, norm)
        for _, parameter in self.parameters_and_names():
            if parameter.ndim > 1:
                parameter.set_data(initializer("xavier_uniform", parameter.shape, parameter.dtype))
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def construct(
        self,
        src,
        tgt,
        src_mask=None,
        tgt_mask=None,
        memory_mask=None,
        src_key_padding_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
    ):
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ValueError("The number of features for 'src' and 'tgt' must be equal to `d_model`.")
        memory = self.encoder(src, src_mask=src_mask, src_key_padding_mask=src_key_padding_mask)
        return self.decoder(
            tgt,
            memory,
            tgt_mask=tgt_mask,
            memory_mask=memory_mask,
            tgt_key_padding_mask=tgt_key_padding_mask,
            memory_key_padding_mask=memory_key_padding_mask,
        )
