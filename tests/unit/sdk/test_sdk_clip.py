"""ops.clip_by_value / clip_by_norm / clip_by_global_norm: MindSpore's documented examples, float64 references, both
modes, and the errors."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import ops
from tessel.core.errors import ConfigurationError, NotSupportedYetError

MODES = pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
X1 = np.array([[2.0, 3.0], [1.0, 2.0]], np.float32)
X2 = np.array([[1.0, 4.0], [3.0, 1.0]], np.float32)
X = np.array([[0.8748, 0.1425, 0.0076], [0.7721, 0.4084, 0.0552], [4.6376, 0.2914, 2.1120]], np.float32)


@MODES
def test_clip_by_global_norm_gives_mindspores_example_and_the_float64_reference(mode):
    ms.set_context(mode=getattr(ms, mode))
    clip = ms.jit(lambda a, b: ops.clip_by_global_norm((a, b), 1.0)) if mode == "GRAPH_MODE" else None
    out = clip(ms.Tensor(X1), ms.Tensor(X2)) if clip else ops.clip_by_global_norm((ms.Tensor(X1), ms.Tensor(X2)))
    norm = np.sqrt((X1.astype(np.float64) ** 2).sum() + (X2.astype(np.float64) ** 2).sum())
    np.testing.assert_allclose(out[0].asnumpy(), X1 / norm, rtol=1e-6)
    np.testing.assert_allclose(out[1].asnumpy(), X2 / norm, rtol=1e-6)
    np.testing.assert_allclose(out[0].asnumpy()[0], [2.98142403e-01, 4.47213590e-01], rtol=1e-6)  # MindSpore's print
    kept = ops.clip_by_global_norm([ms.Tensor(X1)], clip_norm=100)  # the norm below clip_norm: unchanged
    np.testing.assert_array_equal(kept[0].asnumpy(), X1)


@MODES
def test_clip_by_norm_and_clip_by_value_give_mindspores_examples(mode):
    ms.set_context(mode=getattr(ms, mode))
    out = ops.clip_by_norm(ms.Tensor(X), max_norm=1)
    expected = [[0.16650201, 0.02712224, 0.00144652], [0.14695495, 0.07773139, 0.0105063],
                [0.8826814, 0.0554626, 0.40198016]]  # fmt: skip
    np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-6)
    np.testing.assert_array_equal(ops.clip_by_norm(ms.Tensor(X), max_norm=100).asnumpy(), X)
    both = ops.clip_by_norm((ms.Tensor(X), ms.Tensor(X)), 1, norm_type=float("inf"))
    assert isinstance(both, tuple)
    np.testing.assert_allclose(both[1].asnumpy(), X / (np.abs(X).max() + 1e-6), rtol=1e-6)
    x = ms.Tensor(np.array([[1.0, 25.0, 5.0, 7.0], [4.0, 11.0, 6.0, 21.0]], np.float32))
    bounded = [[5.0, 20.0, 5.0, 7.0], [5.0, 11.0, 6.0, 20.0]]
    assert ops.clip_by_value(x, ms.Tensor(np.float32(5)), ms.Tensor(np.float32(20))).asnumpy().tolist() == bounded
    listed = ops.clip_by_value([x, x], 5, 20)
    assert isinstance(listed, list) and listed[1].asnumpy().tolist() == bounded
    ints = ops.clip_by_value(ms.Tensor(np.array([1, 7, 30], np.int32)), 2.5, 20.7)  # bounds cast to x's dtype
    assert ints.dtype == ms.int32 and ints.asnumpy().tolist() == [2, 7, 20]


def test_clip_errors_name_the_rule():
    with pytest.raises(ConfigurationError, match="clip_norm must be a number > 0"):
        ops.clip_by_global_norm((ms.Tensor(X1),), 0)
    with pytest.raises(ConfigurationError, match="use_norm only supports None"):
        ops.clip_by_global_norm((ms.Tensor(X1),), 1.0, use_norm=2.0)
    with pytest.raises(ConfigurationError, match="must be a tuple or list of Tensors"):
        ops.clip_by_global_norm(ms.Tensor(X1))
    with pytest.raises(ConfigurationError, match="give clip_value_min, clip_value_max or both"):
        ops.clip_by_value(ms.Tensor(X1))
    ms.set_context(mode=ms.PYNATIVE_MODE)
    with pytest.raises(RuntimeError, match=r"total norm of order 2\.0 of the input is not finite"):
        ops.clip_by_norm(ms.Tensor(np.array([np.inf, 1.0], np.float32)), 1.0, error_if_nonfinite=True)
    with pytest.raises(NotSupportedYetError, match="error_if_nonfinite=True inside a graph"):
        ms.jit(lambda t: ops.clip_by_norm(t, 1.0, error_if_nonfinite=True))(ms.Tensor(X))


def test_clip_by_norm_gradient_where_it_does_not_clip_is_the_upstream_one():
    """MindSpore 2.7.0: grad of (clip_by_norm(x, 1.0) * [1, 2, 3]).sum() at x = 0 is [1, 2, 3] (x comes back
    unchanged), for norm_type 2, 1 and inf; at x = [1, 0, 2] with max_norm 1 it is [-0.17889, 0.89443, 0.08944]."""
    weights = ms.Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    zero = ms.Tensor(np.zeros(3, np.float32))
    for norm_type in (2.0, 1.0, float("inf")):
        grad = ms.grad(lambda a, p=norm_type: (ops.clip_by_norm(a, 1.0, p) * weights).sum())(zero)
        assert grad.asnumpy().tolist() == [1.0, 2.0, 3.0]
    x = ms.Tensor(np.array([1.0, 0.0, 2.0], np.float32))
    clipped = ms.grad(lambda a: (ops.clip_by_norm(a, 1.0) * weights).sum())(x)
    np.testing.assert_allclose(clipped.asnumpy(), [-0.17889, 0.89443, 0.08944], atol=1e-5)
