"""Tensor methods in MindSpore 2.7's argument forms, both the new (dim=, keepdim=) and the old (axis=, keepdims=).

Expected values are MindSpore 2.7.0's (CPU, PYNATIVE) printed outputs on the same inputs, except where a comment
says numpy float64.
"""

from __future__ import annotations

import numpy as np

import tessel as ms

SIGNS = np.array([1, -1, 1, -1], np.float32)


def a_tensor() -> ms.Tensor:
    """[[0, -1, 2, -3], [4, -5, 6, -7], [8, -9, 10, -11]]."""
    return ms.Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) * SIGNS)


def check(got, dtype, values) -> None:
    assert got.dtype == dtype
    np.testing.assert_allclose(got.asnumpy(), np.array(values), rtol=1e-6)


def test_sum_into_a_narrow_int_dtype_wraps_as_mindspore():
    """MindSpore 2.7.0: int32 [100, 100, 3].sum(dtype=ms.int8) is int8 -53 (203 wrapped)."""
    x = ms.Tensor(np.array([100, 100, 3], np.int32))
    check(x.sum(dtype=ms.int8), ms.int8, -53)
    check(x.sum(axis=0, dtype=ms.int8), ms.int8, -53)
    check(ms.Tensor(np.array([[100, 100, 3]], np.int32)).sum(1, ms.int8), ms.int8, [-53])
    check(ms.Tensor(np.array([100, 100, 3], np.int8)).sum(dtype=ms.int32), ms.int32, 203)
