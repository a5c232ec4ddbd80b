"""Element types: one `DType` per element type, with its numpy and ONNX equivalents and promotion rules.

Promotion follows MindSpore's implicit type conversion: bool < integers < floats, and within a kind the wider
type wins. Python scalars are "weak": `x * 2.0` keeps x's float dtype, an int tensor times a float scalar becomes
float32 (MindSpore's default float).
"""

from __future__ import annotations

import enum

import numpy as np
from onnx import TensorProto


class DType(enum.Enum):
    """An element type. `DType.float32.numpy` is the numpy dtype, `.onnx` the ONNX TensorProto code."""

    bool_ = "bool"
    int8 = "int8"
    int16 = "int16"
    int32 = "int32"
    int64 = "int64"
    uint8 = "uint8"
    float16 = "float16"
    float32 = "float32"
    float64 = "float64"

    def __repr__(self) -> str:
        return f"tessel.{self.value}"

    def __str__(self) -> str:
        """MindSpore's printed name: Float32, Int64, UInt8, Bool (print(ms.float32) shows Float32 there)."""
        return "Bool" if self.value == "bool" else self.value.capitalize().replace("Uint", "UInt")

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)  # f"{dtype}" in messages stays numpy's name ("float32")

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(self.value)

    @property
    def onnx(self) -> int:
        return _ONNX[self]

    @property
    def short(self) -> str:
        """The compact name used in graph dumps: f32, i64, bool."""
        return _SHORT[self]

    @property
    def is_float(self) -> bool:
        return self.numpy.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.numpy.kind in "iu"

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


_ONNX = {
    DType.bool_: TensorProto.BOOL,
    DType.int8: TensorProto.INT8,
    DType.int16: TensorProto.INT16,
    DType.int32: TensorProto.INT32,
    DType.int64: TensorProto.INT64,
    DType.uint8: TensorProto.UINT8,
    DType.float16: TensorProto.FLOAT16,
    DType.float32: TensorProto.FLOAT,
    DType.float64: TensorProto.DOUBLE,
}
_SHORT = {
    DType.bool_: "bool",
    DType.int8: "i8",
    DType.int16: "i16",
    DType.int32: "i32",
    DType.int64: "i64",
    DType.uint8: "u8",
    DType.float16: "f16",
    DType.float32: "f32",
    DType.float64: "f64",
}
_BY_NUMPY = {d.numpy: d for d in DType}
# Promotion priority, MindSpore's: bool < uint8 < int8 < int16 < int32 < int64 < float16 < float32 < float64 (a
# higher rank wins), with uint8 and int8 meeting in int16, which holds both.
_ORDER = ("bool_", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
_RANK = {DType[name]: i for i, name in enumerate(_ORDER)}

DEFAULT_FLOAT = DType.float32
DEFAULT_INT = DType.int64


def as_dtype(value: DType | str | np.dtype | type) -> DType:
    """Accept a DType, a name ('float32', 'bool') or a numpy dtype; raise a clear error for anything else."""
    if isinstance(value, DType):
        return value
    try:
        return _BY_NUMPY[np.dtype(value)]
    except (TypeError, KeyError):
        supported = ", ".join(d.value for d in DType)
        raise TypeError(f"{value!r} is not a tessel dtype; supported: {supported}") from None


def promote(a: DType, b: DType) -> DType:
    """The dtype two tensors combine into (MindSpore: bool < int < float, wider wins within a kind)."""
    if a == b:
        return a
    if {a, b} == {DType.uint8, DType.int8}:
        return DType.int16
    return a if _RANK[a] >= _RANK[b] else b


def scalar_dtype(value: bool | int | float, partner: DType | None) -> DType:
    """The dtype a Python scalar takes next to a tensor of dtype `partner` (weak scalar promotion)."""
    if isinstance(value, bool):
        return partner or DType.bool_
    if isinstance(value, int):
        return partner if partner is not None and partner != DType.bool_ else DEFAULT_INT
    if partner is not None and partner.is_float:
        return partner
    return DEFAULT_FLOAT
