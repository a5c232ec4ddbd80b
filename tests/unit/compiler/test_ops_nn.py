"""NN ops (activations, softmax, losses, normalisation, dropout, convolution, pooling) vs numpy references."""

from __future__ import annotations

import numpy as np
import pytest
from compiler_testkit import check_forward, check_grad, erf, feeds_of, op_graph, run_graph

from tessel.compiler.autodiff import grad_graph
from tessel.compiler.builder import apply_all
from tessel.compiler.lower_onnx import to_onnx
from tessel.compiler.tracer import TensorSpec, trace
from tessel.plugins.cpu.compute import CpuCompute

rng = np.random.default_rng(7)


def rand(*shape, low=-2.0, high=2.0):
    return np.asarray(rng.uniform(low, high, shape), dtype=np.float32)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    return np.log(softmax(x, axis))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize(
    "op,attrs,fn,f64",
    [
        ("ReLU", {}, lambda x: np.maximum(x, 0), True),
        ("Sigmoid", {}, lambda x: 1 / (1 + np.exp(-x)), True),
        ("Tanh", {}, np.tanh, True),
        ("Softplus", {}, lambda x: np.log1p(np.exp(x)), True),
        ("LeakyReLU", {"alpha": 0.1}, lambda x: np.where(x > 0, x, 0.1 * x), True),
        ("GELU", {"approximate": "tanh"}, gelu_tanh, True),
        ("GELU", {"approximate": "none"}, lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))), False),
        ("Softmax", {"axis": -1}, softmax, True),
        ("Softmax", {"axis": 0}, lambda x: softmax(x, 0), True),
        ("LogSoftmax", {"axis": -1}, log_softmax, True),
    ],
)
def test_activations(op, attrs, fn, f64):
    x = rand(3, 4)
    x[np.abs(x) < 0.05] = 0.3  # keep away from ReLU's kink
    check_forward(op, [x], attrs, fn, rtol=1e-5, atol=1e-6)
    kwargs = {} if f64 else {"dtype": np.float32, "rtol": 2e-3, "atol": 2e-4}
    check_grad(op, [x], attrs, fn, **kwargs)


def test_softmax_cross_entropy_dense_and_sparse():
    logits = rand(4, 5)
    labels = softmax(rand(4, 5)).astype(np.float32)
    dense = lambda z, p: -(p * log_softmax(z)).sum(-1)  # noqa: E731
    check_forward("SoftmaxCrossEntropy", [logits, labels], {}, dense)
    check_grad("SoftmaxCrossEntropy", [logits, labels], {}, dense)
    index = rng.integers(0, 5, 4).astype(np.int32)
    sparse = lambda z, y: -log_softmax(z)[np.arange(len(y)), y]  # noqa: E731
    check_forward("SparseSoftmaxCrossEntropy", [logits, index], {}, sparse)
    check_grad("SparseSoftmaxCrossEntropy", [logits, index], {}, sparse)


def layer_norm(x, gamma, beta, axis=-1, eps=1e-7):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axes, keepdims=True)
    rstd = 1 / np.sqrt(x.var(axes, keepdims=True) + eps)
    return (x - mean) * rstd * gamma + beta, mean, rstd


@pytest.mark.parametrize("norm_axis,params_axis", [(-1, -1), (1, 1), (1, 2)])
def test_layer_norm(norm_axis, params_axis):
    x = rand(2, 3, 4)
    gamma, beta = rand(*x.shape[params_axis:]), rand(*x.shape[params_axis:])
    attrs = {"begin_norm_axis": norm_axis, "begin_params_axis": params_axis, "epsilon": 1e-5}
    fn = lambda x, g, b: layer_norm(x, g, b, norm_axis, 1e-5)  # noqa: E731
    check_forward("LayerNorm", [x, gamma, beta], attrs, fn, rtol=1e-4, atol=1e-5)
    check_grad("LayerNorm", [x, gamma, beta], attrs, lambda *a: fn(*a)[0], rtol=1e-5, atol=1e-7)


def batch_norm_train(x, scale, bias, mean, var, eps=1e-5, momentum=0.1):
    axes = (0, *range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    m, v = x.mean(axes), x.var(axes)
    rstd = 1 / np.sqrt(v + eps)
    y = (x - m.reshape(shape)) * rstd.reshape(shape) * scale.reshape(shape) + bias.reshape(shape)
    count = x.size // x.shape[1]
    return y, (1 - momentum) * mean + momentum * m, (1 - momentum) * var + momentum * v * count / (count - 1), m, rstd


def batch_norm_eval(x, scale, bias, mean, var, eps=1e-5):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2, 2)])
def test_batch_norm_training_and_inference(shape):
    x = rand(*shape)
    c = shape[1]
    scale, bias, mean, var = rand(c), rand(c), rand(c), rand(c, low=0.5, high=2.0)
    inputs = [x, scale, bias, mean, var]
    check_forward("BatchNorm", inputs, {"is_training": True}, batch_norm_train, rtol=1e-4, atol=1e-5)
    check_grad("BatchNorm", inputs, {"is_training": True}, lambda *a: batch_norm_train(*a)[0], wrt=[0, 1, 2])
    check_forward("BatchNorm", inputs, {"is_training": False}, batch_norm_eval, rtol=1e-5, atol=1e-5)
    check_grad("BatchNorm", inputs, {"is_training": False}, batch_norm_eval, wrt=[0, 1, 2])


def test_dropout_is_seeded_scaled_and_its_gradient_uses_the_mask():
    x = rand(64, 32)
    y, mask = run_graph(op_graph("Dropout", [x], {"p": 0.25, "seed": 5}), feeds_of([x]))
    np.testing.assert_allclose(y, np.where(mask, x / 0.75, 0), rtol=1e-6)
    assert 0.2 < 1 - mask.mean() < 0.3
    # A fresh session with the same seed draws the same masks in the same order; another seed does not.
    model = to_onnx(op_graph("Dropout", [x], {"p": 0.25, "seed": 5})).SerializeToString()
    fresh = CpuCompute(threads=1)
    exe = fresh.compile(model)
    again, _ = fresh.run(exe, feeds_of([x]))
    np.testing.assert_array_equal(y, again)
    second, _ = fresh.run(exe, feeds_of([x]))
    assert not np.array_equal(y, second)  # the next step draws a new mask
    other, _ = run_graph(op_graph("Dropout", [x], {"p": 0.25, "seed": 6}), feeds_of([x]))
    assert not np.array_equal(y, other)
    weights = rng.standard_normal(x.shape).astype(np.float32)
    forward = op_graph("Dropout", [x], {"p": 0.25, "seed": 5}, [weights, None])
    _, grad = run_graph(grad_graph(forward, ["a0"]), feeds_of([x]))
    np.testing.assert_allclose(grad, np.where(mask, weights / 0.75, 0), rtol=1e-6)
    (identity,) = run_graph(op_graph("Dropout", [x], {"p": 0.25, "training": False}), feeds_of([x]))
    np.testing.assert_array_equal(identity, x)


def conv2d(x, w, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), group=1):
    """Direct NCHW convolution (cross-correlation) in numpy, the independent reference."""
    x = np.pad(x, ((0, 0), (0, 0), pads[:2], pads[2:]))
    n, _, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    oh = (h - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    ow = (wd - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    out = np.zeros((n, oc, oh, ow), dtype=np.result_type(x, w))
    per_group = oc // group
    for o in range(oc):
        g = o // per_group
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dilation[0], i * dilation[0] + (oh - 1) * stride[0] + 1, stride[0])
                cols = slice(j * dilation[1], j * dilation[1] + (ow - 1) * stride[1] + 1, stride[1])
                patch = x[:, g * cg : (g + 1) * cg, rows, cols]
                out[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
    return out


@pytest.mark.parametrize(
    "attrs,pads",
    [
        ({}, (0, 0, 0, 0)),
        ({"stride": 2, "pad_mode": "pad", "pad": 1}, (1, 1, 1, 1)),
        ({"pad_mode": "same", "stride": 2}, (0, 1, 0, 1)),
        ({"dilation": 2, "pad_mode": "pad", "pad": (1, 0, 0, 1)}, (1, 0, 0, 1)),
        ({"group": 2}, (0, 0, 0, 0)),
    ],
)
def test_conv2d_forward_and_gradients(attrs, pads):
    group = attrs.get("group", 1)
    x, w = rand(2, 4, 6, 5), rand(4, 4 // group, 3, 2)
    stride, dilation = attrs.get("stride", 1), attrs.get("dilation", 1)
    fn = lambda x, w: conv2d(x, w, (stride,) * 2, pads, (dilation,) * 2, group)  # noqa: E731
    check_forward("Conv2D", [x, w], attrs, fn, rtol=1e-4, atol=1e-4)
    check_grad("Conv2D", [x, w], attrs, fn, dtype=np.float32, rtol=1e-3, atol=1e-3)  # no float64 Conv in ORT


def conv2d_transpose(dy, w, x_shape, stride, pads, dilation, group):
    """Conv2D's adjoint in x: each dy element spreads its kernel window back onto the padded x, then the pads go."""
    top, bottom, left, right = pads
    n, c, h, wd = x_shape
    padded = np.zeros((n, c, h + top + bottom, wd + left + right), dtype=np.result_type(dy, w))
    oc, cg, kh, kw = w.shape
    oh, ow = dy.shape[2:]
    per_group = oc // group
    for o in range(oc):
        g = o // per_group
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dilation[0], i * dilation[0] + (oh - 1) * stride[0] + 1, stride[0])
                cols = slice(j * dilation[1], j * dilation[1] + (ow - 1) * stride[1] + 1, stride[1])
                padded[:, g * cg : (g + 1) * cg, rows, cols] += np.einsum("nhw,c->nchw", dy[:, o], w[o, :, i, j])
    return padded[:, :, top : top + h, left : left + wd]


@pytest.mark.parametrize(
    "attrs,pads,x_shape",
    [
        ({"stride": 2, "pad_mode": "same"}, (0, 1, 0, 1), (2, 4, 6, 5)),
        ({"stride": 2, "pad_mode": "pad", "pad": (1, 0, 2, 1), "dilation": 2}, (1, 0, 2, 1), (2, 4, 7, 6)),
        ({"group": 2, "stride": 3}, (0, 0, 0, 0), (2, 4, 8, 7)),
    ],
)
def test_conv2d_backprop_input_forward_and_gradients(attrs, pads, x_shape):
    """Conv2DBackpropInput (what nn.Conv2dTranspose runs) against Conv2D's adjoint, and its own gradients with
    respect to dy and the weight (Conv2D and Conv2DBackpropFilter)."""
    group = attrs.get("group", 1)
    stride, dilation = (attrs.get("stride", 1),) * 2, (attrs.get("dilation", 1),) * 2
    w = rand(4, 4 // group, 3, 2)
    dy = rand(*conv2d(np.zeros(x_shape), w, stride, pads, dilation, group).shape)
    attrs = {**attrs, "input_shape": x_shape}
    fn = lambda dy, w: conv2d_transpose(dy, w, x_shape, stride, pads, dilation, group)  # noqa: E731
    check_forward("Conv2DBackpropInput", [dy, w], attrs, fn, rtol=1e-4, atol=1e-4)
    check_grad("Conv2DBackpropInput", [dy, w], attrs, fn, dtype=np.float32, rtol=1e-3, atol=1e-3)


def pool(x, k, s, pads, reduce, include_pad=False):
    fill = -np.inf if reduce is np.max else 0.0
    padded = np.pad(x, ((0, 0), (0, 0), pads[:2], pads[2:]), constant_values=fill)
    ones = np.pad(np.ones(x.shape[2:]), (pads[:2], pads[2:]))
    oh = (padded.shape[2] - k[0]) // s[0] + 1
    ow = (padded.shape[3] - k[1]) // s[1] + 1
    out = np.zeros((*x.shape[:2], oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = padded[:, :, i * s[0] : i * s[0] + k[0], j * s[1] : j * s[1] + k[1]]
            if reduce is np.max:
                out[:, :, i, j] = window.max((2, 3))
            else:
                count = (
                    k[0] * k[1] if include_pad else ones[i * s[0] : i * s[0] + k[0], j * s[1] : j * s[1] + k[1]].sum()
                )
                out[:, :, i, j] = window.sum((2, 3)) / count
    return out.astype(x.dtype)


@pytest.mark.parametrize(
    "attrs,pads",
    [
        ({"kernel_size": 2, "strides": 2}, (0, 0, 0, 0)),
        ({"kernel_size": 3, "strides": 1, "pad_mode": "same"}, (1, 1, 1, 1)),
        ({"kernel_size": (3, 2), "strides": (2, 1), "pad_mode": "pad", "pad": (1, 1, 0, 1)}, (1, 1, 0, 1)),
    ],
)
def test_pools(attrs, pads):
    x = rng.permutation(2 * 3 * 5 * 4).reshape(2, 3, 5, 4).astype(np.float32) / 10  # distinct: no max ties
    k = attrs["kernel_size"] if isinstance(attrs["kernel_size"], tuple) else (attrs["kernel_size"],) * 2
    s = attrs["strides"] if isinstance(attrs["strides"], tuple) else (attrs["strides"],) * 2
    max_ref = lambda x: pool(x, k, s, pads, np.max)  # noqa: E731
    avg_ref = lambda x: pool(x, k, s, pads, np.mean)  # noqa: E731
    check_forward("MaxPool", [x], attrs, max_ref)
    check_grad("MaxPool", [x], attrs, max_ref, rtol=1e-6, atol=1e-7)
    (_, argmax) = check_forward("MaxPoolWithArgmax", [x], attrs, max_ref)
    assert argmax.dtype == np.int64 and argmax.max() < 5 * 4
    check_forward("AvgPool", [x], attrs, avg_ref, rtol=1e-5)
    check_grad("AvgPool", [x], attrs, avg_ref, dtype=np.float32, rtol=1e-3, atol=1e-4)
    include = lambda x: pool(x, k, s, pads, np.mean, include_pad=True)  # noqa: E731
    check_forward("AvgPool", [x], {**attrs, "count_include_pad": True}, include, rtol=1e-5)
    check_grad("AvgPool", [x], {**attrs, "count_include_pad": True}, include, dtype=np.float32, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 2, 2)])
def test_bias_add_along_channels(shape):
    x, bias = rand(*shape), rand(shape[1])
    fn = lambda x, b: x + b.reshape((1, -1) + (1,) * (x.ndim - 2))  # noqa: E731
    check_forward("BiasAdd", [x, bias], {}, fn)
    check_grad("BiasAdd", [x, bias], {}, fn)


def test_a_training_dropout_whose_mask_nobody_reads_still_drops():
    # ONNX Runtime's EliminateDropout would remove it as if it ran for inference; the CPU plugin disables that rule.
    def f(x):
        return apply_all("Dropout", x, p=0.5, seed=3)[0]

    graph = trace(f, TensorSpec((4096,))).graph
    model = to_onnx(graph)
    assert [len(n.output) for n in model.graph.node if n.op_type == "Dropout"] == [1]  # the mask is not allocated
    (y,) = run_graph(graph, {"x": np.ones(4096, np.float32)})
    assert set(np.unique(y).tolist()) == {0.0, 2.0}


def test_float16_statistics_over_more_elements_than_float16_counts():
    # a float16 count beyond 65504 is inf: ReduceMean's gradient was 0 and BatchNorm's running variance NaN
    rng = np.random.default_rng(4)
    x = rng.standard_normal((70000,)).astype(np.float16)
    g = grad_graph(op_graph("ReduceMean", [x], {"axis": None}, [np.ones((), np.float16)]), ["a0"])
    _, dx = run_graph(g, feeds_of([x]))
    np.testing.assert_allclose(dx.astype(np.float64), 1 / 70000, rtol=5e-3)  # float16 near its subnormals
    x = rng.standard_normal((2, 2, 200, 200)).astype(np.float16)  # 80,000 values per channel
    ins = [x, np.ones(2, np.float16), np.zeros(2, np.float16), np.zeros(2, np.float16), np.ones(2, np.float16)]
    got = run_graph(op_graph("BatchNorm", ins, {"is_training": True}), feeds_of(ins))
    want = batch_norm_train(*[a.astype(np.float64) for a in ins])
    np.testing.assert_allclose(got[2].astype(np.float64), want[2], rtol=1e-3)  # the running variance
