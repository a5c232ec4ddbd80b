"""MindSpore 2.7.0's attention and transformer layers: MultiheadAttention, TransformerEncoderLayer,
TransformerDecoderLayer, TransformerEncoder, TransformerDecoder and Transformer, with MindSpore's arguments,
defaults, parameter names and shapes (so MindSpore checkpoints load) and its arithmetic (the query and the key are
each divided by head_dim ** 0.25 before their product, as MindSpore's multi_head_attention_forward).

>>> attention = nn.MultiheadAttention(embed_dim=16, num_heads=4)
>>> output, weights = attention(query, key, value)  # (L, N, 16) and (N, L, S)
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from tessel.common.dtype import DType, ms_name, to_dtype
from tessel.common.initializer import HeUniform, Uniform, XavierNormal, XavierUniform, initializer
from tessel.common.support import not_supported_yet
from tessel.common.tracing import current
from tessel.nn.cell import Cell
from tessel.nn.container import CellList
from tessel.nn.layers import Dense, Dropout, make_parameter
from tessel.nn.norm import LayerNorm
from tessel.ops import composed as C
from tessel.ops import functional as F
from tessel.ops import nn_functional as NF


def _is_float(x: Any) -> bool:
    return x.dtype.is_float


def _check_mask_dtypes(key_padding_mask: Any, attn_mask: Any) -> tuple[Any, Any]:
    """MindSpore's dtype rules for the two masks; a uint8 attn_mask is a bool one. A bool mask beside a float one
    is refused: MindSpore 2.7.0 then ORs the float key_padding_mask's non-zero entries into the bool attn_mask, or
    adds a bool key_padding_mask to a float attn_mask as 1.0 (not -inf), neither a mask's documented meaning."""
    if key_padding_mask is not None and key_padding_mask.dtype != DType.bool_ and not _is_float(key_padding_mask):
        raise ValueError(
            f"only bool and floating types of key_padding_mask are supported, got {ms_name(key_padding_mask.dtype)}"
        )
    if attn_mask is not None:
        if attn_mask.dtype == DType.uint8:
            attn_mask = F.cast(attn_mask, DType.bool_)
        elif attn_mask.dtype != DType.bool_ and not _is_float(attn_mask):
            raise ValueError(
                f"`attn_mask` only support float, byte, and bool types, but got not {ms_name(attn_mask.dtype)}."
            )
    mixed = key_padding_mask is not None and attn_mask is not None
    if mixed and (key_padding_mask.dtype == DType.bool_) != (attn_mask.dtype == DType.bool_):
        raise not_supported_yet(
            "MultiheadAttention with a bool mask and a float mask together (key_padding_mask "
            f"{ms_name(key_padding_mask.dtype)}, attn_mask {ms_name(attn_mask.dtype)})",
            "MindSpore 2.7.0 combines them against their documented meaning; pass both bool or both float "
            "(a float mask holds -inf where a bool one holds True)",
        )
    return key_padding_mask, attn_mask


def _additive(mask: Any, dtype: DType) -> Any:
    """A bool mask as 0 where False and -inf where True (MindSpore's masked_fill); a float mask as it is."""
    if mask.dtype != DType.bool_:
        return mask
    return C.masked_fill(F.zeros_like(mask, dtype=dtype), mask, float("-inf"))


def _linear(x: Any, weight: Any, bias: Any) -> Any:
    """x @ weight.T + bias over the last dim of a 3-D x, a BatchMatMul rather than a reshape to 2-D, whose -1 a
    graph traced for any batch size cannot resolve."""
    out = F.matmul(x, weight, transpose_b=True)
    return out if bias is None else out + bias


def _known(*dims: Any) -> bool:
    """Whether every dim has a value: a graph traced for any batch size has a symbolic batch dim, not checked."""
    return all(isinstance(d, int) for d in dims)


class MultiheadAttention(Cell):
    """Multi-head attention (Attention Is All You Need), MindSpore 2.7.0's nn.MultiheadAttention.

    Parameters as MindSpore's: in_proj_weight (3 * embed_dim, embed_dim), or q_proj_weight, k_proj_weight and
    v_proj_weight when kdim or vdim differ from embed_dim; in_proj_bias (3 * embed_dim,); out_proj (a Dense);
    bias_k and bias_v (1, 1, embed_dim) with add_bias_kv. Returns (attn_output, attn_weights), or the 1-tuple
    (attn_output,) when need_weights is False, as MindSpore's.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        has_bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        dtype: Any = DType.float32,
    ):
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads, self.dropout, self.batch_first = num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise ValueError("The init argument 'embed_dim' must be divisible by 'num_heads'.")
        dtype = DType.float32 if dtype is None else to_dtype(dtype)
        self.dtype = dtype
        if self._qkv_same_embed_dim:
            self.in_proj_weight = make_parameter(XavierUniform(), (3 * embed_dim, embed_dim), dtype, "in_proj_weight")
            self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
        else:
            self.q_proj_weight = make_parameter(XavierUniform(), (embed_dim, embed_dim), dtype, "q_proj_weight")
            self.k_proj_weight = make_parameter(XavierUniform(), (embed_dim, self.kdim), dtype, "k_proj_weight")
            self.v_proj_weight = make_parameter(XavierUniform(), (embed_dim, self.vdim), dtype, "v_proj_weight")
            self.in_proj_weight = None
        self.in_proj_bias = make_parameter("zeros", (3 * embed_dim,), dtype, "in_proj_bias") if has_bias else None
        bound = 1 / math.sqrt(embed_dim)
        self.out_proj = Dense(
            embed_dim, embed_dim, HeUniform(math.sqrt(5)), Uniform(bound), has_bias=has_bias, dtype=dtype
        )
        if add_bias_kv:
            self.bias_k = make_parameter(XavierNormal(), (1, 1, embed_dim), dtype, "bias_k")
            self.bias_v = make_parameter(XavierNormal(), (1, 1, embed_dim), dtype, "bias_v")
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        from tessel.common import seed

        self._dropout_seed = seed.next_op_seed()

    def construct(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        average_attn_weights: bool = True,
    ):
        key_padding_mask, attn_mask = _check_mask_dtypes(key_padding_mask, attn_mask)
        batched = self._check_ranks(query, key, value, key_padding_mask, attn_mask)
        # the work is done batch first: (N, L, E)
        if not batched:
            query, key, value = (F.expand_dims(x, 0) for x in (query, key, value))
            key_padding_mask = None if key_padding_mask is None else F.expand_dims(key_padding_mask, 0)
        elif not self.batch_first:
            query, key, value = (F.transpose(x, (1, 0, 2)) for x in (query, key, value))
        if query.shape[-1] != self.embed_dim:
            raise ValueError(f"The `embed_dim` should be {self.embed_dim}, but got {query.shape[-1]}.")
        q, k, v = self._in_projection(query, key, value)
        mask = self._mask(query, key, key_padding_mask, attn_mask, q.dtype)
        if self.bias_k is not None:
            k = F.concat([k, F.broadcast_to(F.cast(self.bias_k, k.dtype), (k.shape[0], 1, self.embed_dim))], 1)
            v = F.concat([v, F.broadcast_to(F.cast(self.bias_v, v.dtype), (v.shape[0], 1, self.embed_dim))], 1)
            mask = None if mask is None else F.concat([mask, F.zeros_like(mask[:, :, :, :1])], 3)
        if self.add_zero_attn:
            k = F.concat([k, F.zeros_like(k[:, :1])], 1)
            v = F.concat([v, F.zeros_like(v[:, :1])], 1)
            mask = None if mask is None else F.concat([mask, F.zeros_like(mask[:, :, :, :1])], 3)
        output, weights = self._attend(q, k, v, mask)
        output = _linear(output, self.out_proj.weight, self.out_proj.bias)
        if average_attn_weights:
            weights = F.sum(weights, 1) / self.num_heads
        if not batched:
            output, weights = F.squeeze(output, 0), F.squeeze(weights, 0)
        elif not self.batch_first:
            output = F.transpose(output, (1, 0, 2))
        return (output, weights) if need_weights else (output,)

    def _check_ranks(self, query, key, value, key_padding_mask, attn_mask) -> bool:
        """MindSpore's rank checks; whether the input is batched (3-D)."""
        if query.ndim not in (2, 3):
            raise ValueError(
                f"The `query` should be unbatched 2D or batched 3D tensor, but got `query` with {query.ndim}D."
            )
        if key.ndim != query.ndim or value.ndim != query.ndim:
            kind = "batched" if query.ndim == 3 else "unbatched"
            raise ValueError(
                f"For {kind} `query`, the `key` and `value` must be {query.ndim}D tensor, "
                f"but got `key` with {key.ndim}D and `value` with {value.ndim}D."
            )
        if key_padding_mask is not None and key_padding_mask.ndim != query.ndim - 1:
            raise ValueError(
                f"The `key_padding_mask` must be `None` or {query.ndim - 1}D for a {query.ndim}D `query`, "
                f"but got `key_padding_mask` with {key_padding_mask.ndim}D."
            )
        if attn_mask is not None and attn_mask.ndim not in (2, 3):
            raise ValueError(f"The `attn_mask` must be `None`, 2-D or 3-D, but got `attn_mask` with{attn_mask.ndim}D.")
        if key.shape[-1] != self.kdim or value.shape[-1] != self.vdim:
            raise ValueError(
                f"MultiheadAttention: `key` and `value` must have {self.kdim} and {self.vdim} features (kdim and "
                f"vdim), got shapes {key.shape} and {value.shape}"
            )
        if self._qkv_same_embed_dim and key.shape != value.shape:
            raise ValueError(f"The shape of `key` {key.shape} does not match `value` {value.shape}.")
        return query.ndim == 3

    def _in_projection(self, query, key, value):
        """q, k, v: the inputs through their projections, (N, L or S, embed_dim)."""
        bias = self.in_proj_bias
        b_q, b_k, b_v = (None, None, None) if bias is None else F.split(bias, self.embed_dim)
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = F.split(self.in_proj_weight, self.embed_dim)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return _linear(query, w_q, b_q), _linear(key, w_k, b_k), _linear(value, w_v, b_v)

    def _mask(self, query, key, key_padding_mask, attn_mask, dtype):
        """The additive mask, broadcastable to the scores (N, num_heads, L, S), or None."""
        target, source = query.shape[1], key.shape[1]
        mask = None
        if attn_mask is not None:
            if attn_mask.ndim == 2:
                if _known(target, source, *attn_mask.shape) and tuple(attn_mask.shape) != (target, source):
                    raise ValueError(
                        f"The shape of the `attn_mask` should be {(target, source)}, but got {attn_mask.shape}."
                    )
                mask = F.reshape(_additive(attn_mask, dtype), (1, 1, *attn_mask.shape))
            else:
                batch = query.shape[0]
                expected = (batch * self.num_heads, target, source) if _known(batch) else None
                if expected is not None and _known(*expected, *attn_mask.shape) and attn_mask.shape != expected:
                    raise ValueError(f"The shape of the `attn_mask` should be {expected}, but got {attn_mask.shape}.")
                mask = F.reshape(_additive(attn_mask, dtype), (-1, self.num_heads, *attn_mask.shape[1:]))
        if key_padding_mask is not None:
            shape = tuple(key_padding_mask.shape)
            if _known(*shape, query.shape[0], source) and shape != (query.shape[0], source):
                raise ValueError(
                    f"The shape of `key_padding_mask` should be {(query.shape[0], source)}, but got {shape}."
                )
            padding = F.reshape(_additive(key_padding_mask, dtype), (-1, 1, 1, shape[-1]))
            mask = padding if mask is None else mask + padding
        return mask

    def _attend(self, q, k, v, mask):
        """Scaled dot-product attention over the heads: the output (N, L, embed_dim) and weights (N, h, L, S)."""
        heads, head_dim = self.num_heads, self.head_dim
        q, k, v = (F.transpose(F.reshape(x, (*x.shape[:2], heads, head_dim)), (0, 2, 1, 3)) for x in (q, k, v))
        # MindSpore divides both q and k by head_dim ** 0.25, computed in float32 as sqrt(sqrt(head_dim))
        scale = float(np.sqrt(np.sqrt(np.float32(head_dim))))
        scores = F.matmul(q / scale, F.transpose(k, (0, 1, 3, 2)) / scale)
        if mask is not None:
            scores = scores + mask
        weights = NF.softmax(scores, -1)
        if self.training and self.dropout > 0.0:
            trace = current()
            seed = self._dropout_seed if trace is None else trace.call_seed(self, self._dropout_seed)
            weights = NF.dropout(weights, self.dropout, training=True, seed=seed)
        output = F.transpose(F.matmul(weights, v), (0, 2, 1, 3))
        return F.reshape(output, (*output.shape[:2], self.embed_dim)), weights

    def extend_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


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
    if mask is not None and mask.dtype != DType.bool_ and not _is_float(mask):
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
