"""Ops whose dtypes, edge values or slopes differed from MindSpore 2.7.0's (each expectation below is MindSpore's
own output for the same input, measured on its CPU backend)."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import nn, ops

T = ms.Tensor
I32 = T(np.array([[1, 2, 3], [4, 5, 6]], np.int32))


def test_dtypes_and_shapes():
    assert ops.sum(I32).dtype == ms.int64 and I32.sum().dtype == ms.int64 and ops.sum(I32, 1).tolist() == [6, 15]
    assert ops.ReduceSum()(I32).dtype == ms.int32  # the primitive keeps the input's
    full = ops.full((2,), 3.5)
    assert full.dtype == ms.int64 and full.tolist() == [3, 3] and ms.mint.full((2,), 3.5).dtype == ms.float32
    clamped = ops.clamp(T(np.array([-3, 0, 5], np.int32)), -1.5, 2.5)
    assert clamped.dtype == ms.int32 and clamped.tolist() == [-1, 0, 2]
    assert ops.squeeze(I32, 0).shape == (2, 3) and ops.stack(I32).shape == (1, 2, 3)
    assert ops.hardswish(T(np.array([-4, 1, 5], np.int32))).tolist() == [0, 0, 5]
    mse = ops.mse_loss(T(np.array([1, 2], np.int32)), T(np.array([3, 5], np.int32)))
    assert mse.dtype == ms.float32 and float(mse.asnumpy()) == 6.5


def test_logic_on_numbers_and_order_of_bools():
    assert ops.logical_and(T(np.array([0.0, 1.5])), T(np.array([2.0, 0.0]))).tolist() == [False, False]
    assert ops.logical_not(T(np.array([0, 3], np.int32))).tolist() == [True, False]
    assert (~T(np.array([0, 3], np.int32))).tolist() == [True, False]
    assert (T(np.array([True, False])) < T(np.array([True, True]))).tolist() == [False, True]
    assert ops.abs(T(np.array([True, False]))).tolist() == [True, False]
    assert int(ops.argmax(T(np.array([False, True, True]))).asnumpy()) == 1


def test_tensor_max_and_min_with_a_positional_dim_give_values_and_indices():
    values, index = I32.max(0)
    assert values.tolist() == [4, 5, 6] and index.dtype == ms.int64 and index.tolist() == [1, 1, 1]
    values, index = I32.min(1, keepdim=True)
    assert values.tolist() == [[1], [4]] and index.tolist() == [[0], [0]]
    assert I32.max(axis=0).tolist() == [4, 5, 6] and int(I32.max().asnumpy()) == 6
    with pytest.raises(TypeError, match="keepdim goes with a dim"):
        I32.max(axis=0, keepdim=True)


def test_log1p_at_infinity_and_near_float16s_limit():
    assert ops.log1p(T(np.array([np.inf], np.float32))).tolist() == [np.inf]
    np.testing.assert_allclose(ops.log1p(T(np.array([65000.0], np.float16))).asnumpy(), [11.078125])


@pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
def test_slopes_at_ties(mode):
    """maximum / minimum halve the slope between equal inputs, clip_by_value too (built on them); clamp keeps 1 at
    its bounds, ops.max gives it all to the index it returns, ReLU6 is 1 at 6."""
    ms.set_context(mode=getattr(ms, mode))
    x = T(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], np.float32))
    y = T(np.array([[1.0, 2.0, 3.0], [3.0, 0.0, 1.0]], np.float32))
    dx, dy = ms.grad(lambda a, b: ops.maximum(a, b).sum(), grad_position=(0, 1))(x, y)
    assert dx.tolist() == [[0.5, 1.0, 0.5], [0.0, 0.5, 1.0]] and dy.tolist() == [[0.5, 0.0, 0.5], [1.0, 0.5, 0.0]]
    cases = {
        "clip_by_value": (lambda a: ops.clip_by_value(a, 1.0, 3.0).sum(), [[0.5, 0.5, 0.5], [1.0, 0.0, 1.0]]),
        "clamp": (lambda a: ops.clamp(a, 1.0, 2.0).sum(), [[1.0, 0.0, 0.0], [1.0, 0.0, 1.0]]),
        "max(axis)": (lambda a: ops.max(a, 1)[0].sum(), [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
        "amax": (lambda a: ops.amax(a, 1).sum(), [[0.0, 0.5, 0.5], [0.5, 0.0, 0.5]]),
    }
    for name, (fn, want) in cases.items():
        assert ms.grad(fn)(x).tolist() == want, name
    relu6 = ms.grad(lambda a: nn.ReLU6()(a).sum())(T(np.array([0.0, 6.0, 7.0, 3.0], np.float32)))
    assert relu6.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert float(ms.grad(lambda a: ops.softplus(a).sum())(T(np.array([0.0], np.float32))).asnumpy()[0]) == 0.5
