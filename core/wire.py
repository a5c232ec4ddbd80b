"""The wire contracts' tables, derived once from the proto enums, and numpy <-> protobuf tensors.

Every part reads its names from here: dtypes (`common.proto` DType), reduce ops and collective kinds
(`collective.proto` ReduceOp and CollectiveKind). Raw bytes on the wire, never pickle.

    >>> REDUCE_OPS["mean"] == collective_pb2.MEAN
    True
    >>> COLLECTIVE_KINDS[collective_pb2.ALL_GATHER]
    'all_gather'
"""

from __future__ import annotations

import math

import numpy as np

from tessel.core.errors import ConfigurationError
from tessel.v1 import collective_pb2, common_pb2

_UNSPECIFIED = "_UNSPECIFIED"

# Reduce op name (lower case, as the Python APIs spell it) -> wire enum value, in the proto's order.
REDUCE_OPS: dict[str, int] = {name.lower(): value for name, value in collective_pb2.ReduceOp.items()}
REDUCE_OP_NAMES: dict[int, str] = {value: name for name, value in REDUCE_OPS.items()}

# Collective kind wire value -> name ("all_reduce", ...); the unspecified kind has none.
COLLECTIVE_KINDS: dict[int, str] = {
    value: name.lower() for name, value in collective_pb2.CollectiveKind.items() if not name.endswith(_UNSPECIFIED)
}
COLLECTIVE_KIND_CODES: dict[str, int] = {name: value for value, name in COLLECTIVE_KINDS.items()}

_NUMPY_NAMES = {"BOOL": "bool"}  # wire names whose numpy spelling differs
_NO_NUMPY = {"BFLOAT16"}  # wire dtypes numpy has no type for: they never leave a device as numpy
_TO_WIRE: dict[np.dtype, int] = {
    np.dtype(_NUMPY_NAMES.get(name, name.lower())): value
    for name, value in common_pb2.DType.items()
    if not name.endswith(_UNSPECIFIED) and name not in _NO_NUMPY
}
_FROM_WIRE = {v: k for k, v in _TO_WIRE.items()}

# The dtypes every collective carries on every plugin (a subset of the wire's).
COLLECTIVE_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t) for t in ("float16", "float32", "float64", "int32", "int64", "bool")
)


def wire_dtype(dtype: np.dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype not in _TO_WIRE:
        raise ConfigurationError(
            f"dtype {dtype} cannot travel to a daemon; supported: {sorted(str(d) for d in _TO_WIRE)}. Cast it first."
        )
    return _TO_WIRE[dtype]


def numpy_dtype(wire: int) -> np.dtype:
    if wire not in _FROM_WIRE:
        known = {v.number: v.name for v in common_pb2.DType.DESCRIPTOR.values}
        raise ConfigurationError(f"unknown or unsupported wire dtype {known.get(wire, wire)}")
    return _FROM_WIRE[wire]


def reduce_op_name(wire: int) -> str:
    if wire not in REDUCE_OP_NAMES:
        raise ConfigurationError(f"unknown reduce op {wire} on the wire; known: {sorted(REDUCE_OPS)}")
    return REDUCE_OP_NAMES[wire]


def to_proto(array: np.ndarray) -> common_pb2.TensorProto:
    array = np.asarray(array)
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    data = np.ascontiguousarray(array, dtype=dtype).tobytes()
    return common_pb2.TensorProto(dtype=wire_dtype(dtype), shape=array.shape, data=data)


def from_proto(tensor: common_pb2.TensorProto, name: str = "tensor") -> np.ndarray:
    """Decode a TensorProto; a byte count that does not match dtype x shape is a clear ConfigurationError."""
    dtype = numpy_dtype(tensor.dtype)
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise ConfigurationError(f"{name}: negative dimension in shape {shape}")
    if len(shape) > 64:
        raise ConfigurationError(f"{name}: {len(shape)} dimensions; an array has at most 64")
    if math.prod(d for d in shape if d) * dtype.itemsize >= 1 << 62:  # numpy cannot even describe it
        raise ConfigurationError(f"{name}: shape {shape} is too large for any array")
    expected = math.prod(shape) * dtype.itemsize  # Python ints: an absurd shape cannot wrap around to a match
    if len(tensor.data) != expected:
        raise ConfigurationError(
            f"{name}: {len(tensor.data)} data bytes do not match dtype {dtype} x shape {shape} ({expected} bytes)"
        )
    # A writable copy: the store owns it, and collectives/updates write in place.
    return np.frombuffer(tensor.data, dtype=dtype).reshape(shape).copy()
