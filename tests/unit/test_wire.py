"""Tensors on the wire (core/wire.py): byte order, shapes and reduce ops a peer may send are decoded or refused
with a clear error, never an internal one."""

from __future__ import annotations

import numpy as np
import pytest

from tessel.core.errors import ConfigurationError
from tessel.core.wire import from_proto, reduce_op_name, to_proto
from tessel.v1 import common_pb2


def test_a_big_endian_array_travels_as_its_little_endian_value():
    array = np.arange(4, dtype=">f4")
    back = from_proto(to_proto(array))
    assert back.dtype == np.float32 and back.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_what_no_array_can_be_is_a_clear_error():
    many = common_pb2.TensorProto(dtype=to_proto(np.zeros(1, np.float32)).dtype, shape=[1] * 65, data=b"\0" * 4)
    with pytest.raises(ConfigurationError, match="65 dimensions; an array has at most 64"):
        from_proto(many)
    with pytest.raises(ConfigurationError, match="unknown reduce op 42 on the wire"):
        reduce_op_name(42)
