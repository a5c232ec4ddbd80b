"""Every nn layer against a numpy reference (forward), and gradients through value_and_grad against float64
central differences of that reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sdk_testkit import finite_difference, log_softmax, np_conv2d, rand, softmax

import tessel as ms
from tessel import nn, ops
from tessel.core.errors import ConfigurationError


def run(cell, *arrays):
    return cell(*(ms.Tensor(a) for a in arrays)).asnumpy()


def np_pool(x, k, s, reduce):
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::s, ::s]
    return reduce(windows, axis=(-2, -1))


def test_dense_and_activations():
    dense = nn.Dense(5, 3, activation="relu")
    x = rand(4, 5)
    w, b = dense.weight.asnumpy(), dense.bias.asnumpy()
    np.testing.assert_allclose(run(dense, x), np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-6)
    x3 = rand(2, 4, 5, seed=1)  # leading dims are kept
    np.testing.assert_allclose(
        run(nn.Dense(5, 3, weight_init="ones", bias_init="zeros"), x3),
        x3.sum(-1, keepdims=True).repeat(3, -1),
        rtol=1e-5,
    )
    z = rand(3, 6, seed=2)
    cases = [
        (nn.ReLU(), np.maximum(z, 0)),
        (nn.Sigmoid(), 1 / (1 + np.exp(-z))),
        (nn.Tanh(), np.tanh(z)),
        (nn.Softmax(), softmax(z)),
        (nn.Softmax(0), softmax(z, 0)),
        (nn.LogSoftmax(), log_softmax(z)),
        (nn.LeakyReLU(0.1), np.where(z > 0, z, 0.1 * z)),
        (nn.GELU(approximate=False), 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))),
        (nn.GELU(), 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))),
        (nn.SiLU(), z / (1 + np.exp(-z))),
        (nn.ReLU6(), np.clip(z, 0, 6)),
        (nn.Flatten(), z),
        (nn.Identity(), z),
    ]
    for cell, want in cases:
        np.testing.assert_allclose(run(cell, z), want, rtol=1e-5, atol=1e-6, err_msg=cell.cls_name)
    np.testing.assert_array_equal(run(nn.Flatten(), rand(2, 3, 4)), rand(2, 3, 4).reshape(2, 12))


def test_sequential_and_cell_list():
    seq = nn.SequentialCell([nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2)])
    x = rand(3, 4)
    w0, b0, w1, b1 = (p.asnumpy() for p in seq.trainable_params())
    np.testing.assert_allclose(run(seq, x), np.maximum(x @ w0.T + b0, 0) @ w1.T + b1, rtol=1e-5, atol=1e-6)
    assert len(seq) == 3 and isinstance(seq[1], nn.ReLU) and len(seq[1:]) == 2
    layers = nn.CellList([nn.ReLU(), nn.Tanh()])
    layers.append(nn.Sigmoid())
    assert [c.cls_name for c in layers] == ["ReLU", "Tanh", "Sigmoid"]


@pytest.mark.parametrize(("pad_mode", "padding", "stride", "pads"), [
    ("same", 0, 1, (1, 1, 1, 1)), ("valid", 0, 2, (0, 0, 0, 0)), ("pad", 2, 1, (2, 2, 2, 2)),
])  # fmt: skip
def test_conv2d(pad_mode, padding, stride, pads):
    conv = nn.Conv2d(3, 4, 3, stride=stride, pad_mode=pad_mode, padding=padding, has_bias=True)
    x = rand(2, 3, 7, 7)
    want = np_conv2d(x, conv.weight.asnumpy(), conv.bias.asnumpy(), stride, pads)
    np.testing.assert_allclose(run(conv, x), want, rtol=1e-4, atol=1e-5)


def test_pooling():
    x = rand(2, 3, 6, 6)
    np.testing.assert_allclose(run(nn.MaxPool2d(2, 2), x), np_pool(x, 2, 2, np.max), rtol=1e-6)
    np.testing.assert_allclose(run(nn.AvgPool2d(3, 1), x), np_pool(x, 3, 1, np.mean), rtol=1e-5, atol=1e-6)


def test_layer_norm():
    norm = nn.LayerNorm((6,), epsilon=1e-5)
    norm.gamma.set_data(rand(6, seed=1))
    norm.beta.set_data(rand(6, seed=2))
    x = rand(4, 6)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-5) * norm.gamma.asnumpy() + norm.beta.asnumpy()
    np.testing.assert_allclose(run(norm, x), want, rtol=1e-4, atol=1e-5)


def test_batch_norm_train_updates_moving_statistics_and_eval_uses_them():
    bn = nn.BatchNorm2d(3, momentum=0.9)
    x = rand(4, 3, 2, 2) * 2 + 1
    bn.set_train(True)
    out = run(bn, x)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    want = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    unbiased = var * 16 / 15
    np.testing.assert_allclose(bn.moving_mean.asnumpy(), 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(bn.moving_variance.asnumpy(), 0.9 + 0.1 * unbiased, rtol=1e-5)
    bn.set_train(False)
    m, v = bn.moving_mean.asnumpy(), bn.moving_variance.asnumpy()
    want = (x - m[None, :, None, None]) / np.sqrt(v[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(run(bn, x), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(run(nn.BatchNorm1d(3), x[:, :, 0, 0]), x[:, :, 0, 0] / np.sqrt(1 + 1e-5), rtol=1e-5)


def test_embedding_and_dropout():
    emb = nn.Embedding(10, 4, padding_idx=0)
    ids = np.array([[1, 0], [9, 3]], np.int32)
    np.testing.assert_array_equal(run(emb, ids), emb.embedding_table.asnumpy()[ids])
    assert not emb.embedding_table.asnumpy()[0].any()
    drop = nn.Dropout(p=0.25)
    x = np.ones((200, 50), np.float32)
    assert np.array_equal(run(drop, x), x)  # eval mode: identity
    drop.set_train(True)
    out = run(drop, x)
    kept = out != 0
    assert abs(kept.mean() - 0.75) < 0.02 and np.allclose(out[kept], 1 / 0.75)


def _check_gradients(cell, x, atol=2e-3):
    """value_and_grad of sum(cell(x) * r) with respect to x and the cell's weights, vs float64 differences of the
    same function computed through the (float32) cell; both x and weights perturbed in float64 copies."""
    r = rand(*run(cell, x).shape, seed=9).astype(np.float64)
    weights = cell.trainable_params()

    def loss(inp):
        return (cell(inp) * ms.Tensor(r.astype(np.float32))).sum()

    grad_fn = ms.value_and_grad(loss, grad_position=0, weights=weights)
    _, (dx, dweights) = grad_fn(ms.Tensor(x))
    x64 = x.astype(np.float64)
    reference = lambda: float((run(cell, x64.astype(np.float32)).astype(np.float64) * r).sum())  # noqa: E731
    np.testing.assert_allclose(dx.asnumpy(), finite_difference(reference, x64, eps=1e-2), atol=atol, rtol=1e-2)
    for p, g in zip(weights, dweights):
        value = p.asnumpy().astype(np.float64)

        def reference_w(p=p, value=value):
            p.set_data(value.astype(np.float32))
            return float((run(cell, x).astype(np.float64) * r).sum())

        numeric = finite_difference(reference_w, value, eps=1e-2)
        p.set_data(value.astype(np.float32))
        np.testing.assert_allclose(g.asnumpy(), numeric, atol=atol, rtol=1e-2, err_msg=p.name)


@pytest.mark.parametrize("make", [
    lambda: (nn.Dense(4, 3), rand(5, 4)),
    lambda: (nn.Conv2d(2, 3, 3, has_bias=True), rand(2, 2, 5, 5)),
    lambda: (nn.LayerNorm((4,)), rand(3, 4)),
    lambda: (nn.BatchNorm2d(2).set_train(True), rand(3, 2, 2, 2)),
], ids=["Dense", "Conv2d", "LayerNorm", "BatchNorm2d"])  # fmt: skip
def test_layer_gradients_match_finite_differences(make):
    cell, x = make()
    _check_gradients(cell, x)


def test_ops_functional_forms_match_numpy():
    a, b = rand(3, 4), rand(4, 2, seed=1)
    x, y = ms.Tensor(a), ms.Tensor(b)
    np.testing.assert_allclose(ops.matmul(x, y).asnumpy(), a @ b, rtol=1e-5)
    np.testing.assert_allclose(ops.MatMul(transpose_b=True)(x, ms.Tensor(b.T)).asnumpy(), a @ b, rtol=1e-5)
    np.testing.assert_allclose(ops.ReduceSum(keep_dims=True)(x, 1).asnumpy(), a.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(ops.relu(x).asnumpy(), np.maximum(a, 0))
    np.testing.assert_allclose(ops.concat((x, x), 1).asnumpy(), np.concatenate([a, a], 1))
    np.testing.assert_allclose(ops.stack((x, x)).asnumpy(), np.stack([a, a]))
    parts = ops.split(x, 2, axis=1)
    assert [p.shape for p in parts] == [(3, 2), (3, 2)]
    hot = ops.one_hot(ms.Tensor(np.array([2, 0])), 3)  # MindSpore: on_value=1 is Tensor(1), int64
    assert hot.dtype == ms.int64
    np.testing.assert_array_equal(hot.asnumpy(), np.eye(3)[[2, 0]])
    assert ops.one_hot(ms.Tensor(np.array([1])), 2, 1.0, 0.0).dtype == ms.float32
    assert ops.one_hot(ms.Tensor(np.array([1])), 2, True, False).asnumpy().tolist() == [[False, True]]
    half = ops.one_hot(ms.Tensor(np.array([1])), 2, ms.Tensor(np.float16(2)), ms.Tensor(np.float16(-1)))
    assert half.dtype == ms.float16 and half.asnumpy().tolist() == [[-1.0, 2.0]]
    assert ops.one_hot(ms.Tensor(np.array([1])), 2, np.int32(1), np.int32(0)).dtype == ms.int32
    with pytest.raises(ConfigurationError, match=r"on_value \(.*int64\) and off_value \(.*float32\) must have one"):
        ops.one_hot(ms.Tensor(np.array([1])), 2, 1, 0.5)  # MindSpore refuses Tensor(1) with Tensor(0.5)
    np.testing.assert_allclose(ops.where(x > 0, x, 0.0).asnumpy(), np.where(a > 0, a, 0))
    np.testing.assert_allclose(ops.Add()(x, 1.0).asnumpy(), a + 1)
    assert ops.Shape()(x) == (3, 4) and ops.cast(x, ms.int32).dtype == ms.int32
