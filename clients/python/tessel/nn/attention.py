"""MindSpore 2.7.0's nn.MultiheadAttention, with its arguments, defaults, parameter names and shapes (so MindSpore
checkpoints load) and its arithmetic (the query and the key are each divided by head_dim ** 0.25 before their
product, as MindSpore's multi_head_attention_forward).

>>> attention = nn.MultiheadAttention(embed_dim=16, num_heads=4)
>>> output, weights = attention(query, key, value)  # (L, N, 16) and (N, L, S)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tessel.common.dtype import DType, ms_name, to_dtype
from tessel.common.initializer import HeUniform, Uniform, XavierNormal, XavierUniform
from tessel.common.support import not_supported_yet
from tessel.common.tracing import current
from tessel.nn.cell import Cell
from tessel.nn.layers import Dense, make_parameter
from tessel.ops import composed as C
from tessel.ops import functional as F
from tessel.ops import nn_functional as NF

__all__ = ["MultiheadAttention"]


def is_float(x: Any) -> bool:
    """Whether a mask is a float one (added to the attention scores) rather than a bool one (masking them)."""
    return x.dtype.is_float


def _check_mask_dtypes(key_padding_mask: Any, attn_mask: Any) -> tuple[Any, Any]:
    """MindSpore's dtype rules for the two masks; a uint8 attn_mask is a bool one. A bool mask beside a float one
    is refused: MindSpore 2.7.0 then ORs the float key_padding_mask's non-zero entries into the bool attn_mask, or
    adds a bool key_padding_mask to a float attn_mask as 1.0 (not -inf), neither a mask's documented meaning."""
    if key_padding_mask is not None and key_padding_mask.dtype != DType.bool_ and not is_float(key_padding_mask):
        raise ValueError(
            f"only bool and floating types of key_padding_mask are supported, got {ms_name(key_padding_mask.dtype)}"
        )
    if attn_mask is not None:
        if attn_mask.dtype == DType.uint8:
            attn_mask = F.cast(attn_mask, DType.bool_)
        elif attn_mask.dtype != DType.bool_ and not is_float(attn_mask):
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
