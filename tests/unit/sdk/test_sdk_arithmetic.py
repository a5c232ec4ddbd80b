"""Tensor arithmetic as MindSpore 2.7.0 gives it (its outputs measured on its CPU backend for these inputs): float
// and % floor like numpy's FloorDiv/FloorMod (not float32's rounding of x / y), ops.remainder computes in the
operands' dtype, bools and integers divide as float32, mixed integer widths promote, and 7 % t works."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import ops

T = ms.Tensor
A = np.array([1.0, -1.2, 1e8 + 1, 123456.7], np.float32)
B = np.array([0.1, 0.2, 3, 0.1], np.float32)

MINDSPORE = {
    "a % b": (ms.float32, [0.09999998658895493, 0.19999997317790985, 1.0, 0.001285351812839508]),
    "a // b": (ms.float32, [9.0, -7.0, 33333332.0, 1234567.0]),
    "remainder(a, b)": (ms.float32, [0.09999996423721313, 0.19999992847442627, 0.0, 0.0]),
    "bool / 2": (ms.float32, [0.5, 0.0, 0.5]),
    "int32 / True": (ms.float32, [1.0, 2.0]),
    "int32 // int64": (ms.int64, [3, -4]),
    "int32 ** int64": (ms.int64, [9, 8]),
    "float % negative": (ms.float32, [0.5, -0.5]),
    "int32 % 3": (ms.int32, [2, 1]),
    "float16 % 2": (ms.float16, [1.5, 0.75]),
    "7 % int32": (ms.int32, [1, -2, 3]),
    "7.5 % float32": (ms.float32, [1.5, -1.5]),
}
CALLS = {
    "a % b": lambda: T(A) % T(B),
    "a // b": lambda: T(A) // T(B),
    "remainder(a, b)": lambda: ops.remainder(T(A), T(B)),
    "bool / 2": lambda: T(np.array([True, False, True])) / 2,
    "int32 / True": lambda: T(np.array([1, 2], np.int32)) / True,
    "int32 // int64": lambda: T(np.array([7, -7], np.int32)) // T(np.array([2, 2], np.int64)),
    "int32 ** int64": lambda: T(np.array([3, 2], np.int32)) ** T(np.array([2, 3], np.int64)),
    "float % negative": lambda: T(np.array([-7.5, 7.5], np.float32)) % T(np.array([2.0, -2.0], np.float32)),
    "int32 % 3": lambda: T(np.array([-7, 7], np.int32)) % 3,
    "float16 % 2": lambda: T(np.array([5.5, -3.25], np.float16)) % 2,
    "7 % int32": lambda: 7 % T(np.array([2, -3, 4], np.int32)),
    "7.5 % float32": lambda: 7.5 % T(np.array([2.0, -3.0], np.float32)),
}


@pytest.mark.parametrize("name", list(MINDSPORE))
def test_arithmetic_gives_mindsporess_values_and_dtypes(name):
    out = CALLS[name]()
    dtype, values = MINDSPORE[name]
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.asnumpy(), np.array(values, dtype.numpy))


def test_float_floor_mod_agrees_with_numpy_on_random_pairs_and_in_a_graph():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(2000) * 10.0 ** rng.integers(-2, 6, 2000)).astype(np.float32)
    y = (rng.standard_normal(2000) * 10.0 ** rng.integers(-2, 3, 2000)).astype(np.float32)
    np.testing.assert_array_equal((T(x) % T(y)).asnumpy(), np.mod(x, y))
    # the exact floor, rounded to float32 (MindSpore's 1e8 // 3 is 33333332; numpy's float32 algorithm differs
    # from both once the quotient passes 2**24)
    exact = np.floor(x.astype(np.float64) / y.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal((T(x) // T(y)).asnumpy(), exact)
    ms.set_context(mode=ms.GRAPH_MODE)
    np.testing.assert_array_equal(ms.jit(lambda a, b: a % b)(T(x), T(y)).asnumpy(), np.mod(x, y))
