"""ops.topk / sort / argsort / max / min, ops.TopK / Sort / ArgMaxWithValue / ArgMinWithValue and the Tensor
methods: the values and indices MindSpore 2.7.0 gives for the same input (measured on its CPU backend, ties
included), in both modes; gradients reach the picked elements."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import ops
from tessel.core.errors import ConfigurationError, NotSupportedYetError

MODES = pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
X = np.array([[1.0, 3.0, 3.0, 2.0, 1.0], [5.0, 4.0, 4.0, 6.0, 0.0]], np.float32)

# MindSpore 2.7.0 (values, indices); its indices are int32 for topk/sort/argsort and int64 for max/min
MINDSPORE = {
    "topk(3)": ([[3, 3, 2], [6, 5, 4]], [[1, 2, 3], [3, 0, 1]]),
    "topk(2, dim=0)": ([[5, 4, 4, 6, 1], [1, 3, 3, 2, 0]], [[1, 1, 1, 1, 0], [0, 0, 0, 0, 1]]),
    "topk(3, largest=False)": ([[1, 1, 2], [0, 4, 4]], [[0, 4, 3], [4, 1, 2]]),
    "sort()": ([[1, 1, 2, 3, 3], [0, 4, 4, 5, 6]], [[0, 4, 3, 1, 2], [4, 1, 2, 0, 3]]),
    "sort(descending=True)": ([[3, 3, 2, 1, 1], [6, 5, 4, 4, 0]], [[1, 2, 3, 0, 4], [3, 0, 1, 2, 4]]),
    "max(1)": ([3, 6], [1, 3]),
    "max()": (6, 0),  # MindSpore's ops.max gives index 0 when axis is None
    "min(0, keepdims=True)": ([[1, 3, 3, 2, 0]], [[0, 0, 0, 0, 1]]),
}
CALLS = {
    "topk(3)": lambda t: ops.topk(t, 3),
    "topk(2, dim=0)": lambda t: ops.topk(t, 2, dim=0),
    "topk(3, largest=False)": lambda t: ops.topk(t, 3, largest=False),
    "sort()": lambda t: ops.sort(t),
    "sort(descending=True)": lambda t: ops.sort(t, descending=True),
    "max(1)": lambda t: ops.max(t, 1),
    "max()": lambda t: ops.max(t),
    "min(0, keepdims=True)": lambda t: ops.min(t, 0, keepdims=True),
}


@MODES
@pytest.mark.parametrize("name", list(MINDSPORE))
def test_values_and_indices_are_mindsporess(mode, name):
    ms.set_context(mode=getattr(ms, mode))
    call = ms.jit(CALLS[name]) if mode == "GRAPH_MODE" else CALLS[name]
    values, indices = call(ms.Tensor(X))
    want_values, want_indices = MINDSPORE[name]
    np.testing.assert_array_equal(values.asnumpy(), np.array(want_values, np.float32))
    np.testing.assert_array_equal(indices.asnumpy(), want_indices)
    assert indices.dtype == (ms.int64 if name.startswith(("max", "min")) else ms.int32)


@MODES
def test_primitives_and_tensor_methods(mode):
    ms.set_context(mode=getattr(ms, mode))
    x = ms.Tensor(X)
    np.testing.assert_array_equal(ops.TopK()(x, 2)[1].asnumpy(), [[1, 2], [3, 0]])
    _, indices = ops.Sort(axis=0, descending=True)(x)
    np.testing.assert_array_equal(indices.asnumpy(), [[1, 1, 1, 1, 0], [0, 0, 0, 0, 1]])
    index, value = ops.ArgMaxWithValue(axis=1)(x)
    assert index.asnumpy().tolist() == [1, 3] and value.asnumpy().tolist() == [3.0, 6.0]
    index, value = ops.ArgMinWithValue(axis=0, keep_dims=True)(x)
    assert index.asnumpy().tolist() == [[0, 0, 0, 0, 1]] and value.asnumpy().tolist() == [[1, 3, 3, 2, 0]]
    np.testing.assert_array_equal(x.argsort(descending=True).asnumpy(), [[1, 2, 3, 0, 4], [3, 0, 1, 2, 4]])
    np.testing.assert_array_equal(x.topk(1)[0].asnumpy(), [[3], [6]])
    np.testing.assert_array_equal(x.sort(axis=0)[0].asnumpy(), np.sort(X, axis=0))


@MODES
def test_gradients_reach_the_picked_elements(mode):
    ms.set_context(mode=getattr(ms, mode))
    weights = ms.Tensor(np.array([[1.0, 10.0], [100.0, 1000.0]], np.float32))
    grad = ms.grad(lambda t: ops.sum(ops.topk(t, 2)[0] * weights))(ms.Tensor(X)).asnumpy()
    np.testing.assert_array_equal(grad, [[0, 1, 10, 0, 0], [1000, 0, 0, 100, 0]])
    grad = ms.grad(lambda t: ops.sum(ops.sort(t, descending=True)[0][:, :1]))(ms.Tensor(X)).asnumpy()
    np.testing.assert_array_equal(grad, [[0, 1, 0, 0, 0], [0, 0, 0, 1, 0]])


def test_errors():
    with pytest.raises(ConfigurationError, match="k=6 exceeds the 5 elements of axis 1"):
        ops.topk(ms.Tensor(X), 6)
    with pytest.raises(ConfigurationError, match=r"ops\.topk: k must be an int"):
        ops.topk(ms.Tensor(X), 2.0)
    with pytest.raises(NotSupportedYetError, match=r"ops.max\(initial=..., where=...\)"):
        ops.max(ms.Tensor(X), 1, initial=0.0)
