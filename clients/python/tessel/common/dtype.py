"""Element types under MindSpore's names: `tessel.float32`, `tessel.int32`, … are the compiler's `DType` values.

>>> import tessel as ms
>>> ms.float32, ms.dtype_to_nptype(ms.int32)
(tessel.float32, <class 'numpy.int32'>)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessel.compiler.dtypes import DType, as_dtype

bool_ = DType.bool_
int8 = DType.int8
int16 = DType.int16
int32 = DType.int32
int64 = DType.int64
uint8 = DType.uint8
float16 = DType.float16
float32 = DType.float32
float64 = DType.float64
half, single, double = float16, float32, float64

# MindSpore's printed names (Tensor reprs, error messages): Float32, Int64, Bool, ...
_MS_NAMES = {d: d.value.replace("uint", "UInt").capitalize().replace("Uint", "UInt") for d in DType}
_MS_NAMES[DType.bool_] = "Bool"


def ms_name(dtype: DType) -> str:
    """MindSpore's name of a dtype ("Float32")."""
    return _MS_NAMES[dtype]


def to_dtype(value: Any) -> DType:
    """A DType from a DType, numpy dtype/type, name ('float32'), or Python type (float → float32, int → int64)."""
    if isinstance(value, DType):
        return value
    if value is float:
        return DType.float32
    if value is int:
        return DType.int64
    if value is bool:
        return DType.bool_
    if isinstance(value, str) and value.strip().lower() in ("bool", "bool_"):
        return DType.bool_
    return as_dtype(value.strip().lower() if isinstance(value, str) else value)


def dtype_to_nptype(dtype: DType) -> type:
    """The numpy scalar type of a dtype (MindSpore `dtype_to_nptype`)."""
    return to_dtype(dtype).numpy.type


def pytype_to_dtype(obj: Any) -> DType:
    """The dtype of a Python or numpy type (MindSpore `pytype_to_dtype`)."""
    return to_dtype(obj)


def default_dtype_of(data: Any) -> np.dtype | None:
    """MindSpore's dtype for data given without one: Python floats → float32, ints → int64; arrays keep theirs."""
    if isinstance(data, bool):
        return np.dtype(np.bool_)
    if isinstance(data, int):
        return np.dtype(np.int64)
    if isinstance(data, float):
        return np.dtype(np.float32)
    if isinstance(data, (list, tuple)):
        arr = np.asarray(data)
        return np.dtype(np.float32) if arr.dtype == np.float64 else arr.dtype
    return None


__all__ = [
    "bool_",
    "double",
    "dtype_to_nptype",
    "float16",
    "float32",
    "float64",
    "half",
    "int8",
    "int16",
    "int32",
    "int64",
    "ms_name",
    "pytype_to_dtype",
    "single",
    "to_dtype",
    "uint8",
]
