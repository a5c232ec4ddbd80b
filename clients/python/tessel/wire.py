"""numpy <-> wire (protobuf) conversions shared by the SDK and the daemon. Raw bytes, never pickle."""

from __future__ import annotations

import numpy as np

from tessel.errors import ConfigurationError
from tessel.v1 import common_pb2

_TO_WIRE = {
    np.dtype("float16"): common_pb2.FLOAT16,
    np.dtype("float32"): common_pb2.FLOAT32,
    np.dtype("float64"): common_pb2.FLOAT64,
    np.dtype("int8"): common_pb2.INT8,
    np.dtype("int16"): common_pb2.INT16,
    np.dtype("int32"): common_pb2.INT32,
    np.dtype("int64"): common_pb2.INT64,
    np.dtype("uint8"): common_pb2.UINT8,
    np.dtype("bool"): common_pb2.BOOL,
}
_FROM_WIRE = {v: k for k, v in _TO_WIRE.items()}


def wire_dtype(dtype: np.dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype not in _TO_WIRE:
        raise ConfigurationError(
            f"dtype {dtype} cannot travel to a daemon; supported: {sorted(str(d) for d in _TO_WIRE)}. Cast it first."
        )
    return _TO_WIRE[dtype]


def numpy_dtype(wire: int) -> np.dtype:
    if wire not in _FROM_WIRE:
        raise ConfigurationError(f"unknown or unsupported wire dtype {common_pb2.DType.Name(wire)}")
    return _FROM_WIRE[wire]


def to_proto(array: np.ndarray) -> common_pb2.TensorProto:
    array = np.asarray(array)
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    data = np.ascontiguousarray(array, dtype=dtype).tobytes()
    return common_pb2.TensorProto(dtype=wire_dtype(array.dtype), shape=array.shape, data=data)


def from_proto(tensor: common_pb2.TensorProto, name: str = "tensor") -> np.ndarray:
    """Decode a TensorProto; a byte count that does not match dtype x shape is a clear ConfigurationError."""
    dtype = numpy_dtype(tensor.dtype)
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise ConfigurationError(f"{name}: negative dimension in shape {shape}")
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(tensor.data) != expected:
        raise ConfigurationError(
            f"{name}: {len(tensor.data)} data bytes do not match dtype {dtype} x shape {shape} ({expected} bytes)"
        )
    # A writable copy: the store owns it, and collectives/updates write in place.
    return np.frombuffer(tensor.data, dtype=dtype).reshape(shape).copy()
