"""mint's bitwise functions, composed from `tessel.ops` (tessel has no bitwise op).

bool operands are the logical functions. Integer operands of up to 32 bits are taken apart into their two's
complement bits in float64, where every step is exact, and put back together; bitwise_not is -x - 1 for any integer.
int64 operands of and/or/xor may not fit float64 exactly, so they are not supported yet.
"""

from __future__ import annotations

from typing import Any

from tessel.common.dtype import DType
from tessel.common.support import not_supported_yet
from tessel.common.tensor import Tensor
from tessel.compiler.dtypes import promote
from tessel.core.errors import ConfigurationError
from tessel.ops import composed as C
from tessel.ops import functional as F

_WIDTH = {DType.int8: 8, DType.uint8: 8, DType.int16: 16, DType.int32: 32}


def _dtype(who: str, input: Any, other: Any) -> DType:
    kinds = [F.dtype_of(v) for v in (input, other) if isinstance(v, Tensor)]
    out = kinds[0] if len(kinds) == 1 else promote(*kinds)
    if out.is_float:
        raise ConfigurationError(f"mint.{who}: the operands must be bool or integer tensors, got {out}")
    return out


def _bits(who: str, input: Any, other: Any, combine) -> Tensor:
    out = _dtype(who, input, other)
    if out == DType.bool_:
        return combine(F.cast(input, DType.bool_), F.cast(other, DType.bool_))
    if out not in _WIDTH:
        raise not_supported_yet(
            f"mindspore.mint.{who} of {out} tensors", "cast them to int32 (their values must fit 32 bits)"
        )
    width, signed = _WIDTH[out], out != DType.uint8
    a, b = (F.cast(v, DType.float64) if isinstance(v, Tensor) else float(v) for v in (input, other))
    total = None
    for k in range(width):
        bit_a = F.floor_mod(F.floor(a / float(2**k)), 2.0) if isinstance(a, Tensor) else (a // 2**k) % 2
        bit_b = F.floor_mod(F.floor(b / float(2**k)), 2.0) if isinstance(b, Tensor) else (b // 2**k) % 2
        weight = -float(2**k) if signed and k == width - 1 else float(2**k)
        term = F.cast(combine(F.equal(bit_a, 1.0), F.equal(bit_b, 1.0)), DType.float64) * weight
        total = term if total is None else total + term
    return F.cast(total, out)


def bitwise_and(input: Any, other: Any) -> Tensor:
    """input & other, element-wise (bool: logical and)."""
    return _bits("bitwise_and", input, other, F.logical_and)


def bitwise_or(input: Any, other: Any) -> Tensor:
    """input | other, element-wise (bool: logical or)."""
    return _bits("bitwise_or", input, other, F.logical_or)


def bitwise_xor(input: Any, other: Any) -> Tensor:
    """input ^ other, element-wise (bool: logical xor)."""
    return _bits("bitwise_xor", input, other, C.logical_xor)


def bitwise_not(input: Any) -> Tensor:
    """~input, element-wise: logical not for bool, -input - 1 for integers (two's complement)."""
    kind = F.dtype_of(input)
    if kind == DType.bool_:
        return F.logical_not(input)
    if kind.is_float:
        raise ConfigurationError(f"mint.bitwise_not: input must be a bool or integer tensor, got {kind}")
    return F.sub(F.neg(input), F.cast(F.ones_like(input), kind))
