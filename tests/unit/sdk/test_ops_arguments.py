"""MindSpore arguments of ops functions and primitives that tessel accepts: each one works as MindSpore documents
(checked against numpy in float64) or is refused with a clear error; none is silently ignored."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from sdk_testkit import np_conv2d, softmax

import tessel as ms
from tessel import nn, ops
from tessel.core.errors import ConfigurationError, NotSupportedYetError


def t(array) -> ms.Tensor:
    return ms.Tensor(np.asarray(array))


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


class Traced(nn.Cell):
    """`fn` inside construct, so that GRAPH_MODE traces it into a compiled graph."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, x):
        return self.fn(x)


# --- ops.div(rounding_mode) ---------------------------------------------------------------------------------------


def test_div_rounds_towards_zero_with_trunc():
    x, y = rand(3, 4) * 10, rand(3, 4) + 0.1
    np.testing.assert_allclose(ops.div(t(x), t(y), rounding_mode="trunc").asnumpy(), np.trunc(x / y))
    np.testing.assert_allclose(ops.div(t(x), t(y), rounding_mode="floor").asnumpy(), np.floor(x / y))
    np.testing.assert_allclose(ops.div(t(x), t(y)).asnumpy(), x / y)
    ints = ops.div(t(np.array([-7, 7, -6], np.int32)), 2, rounding_mode="trunc")
    assert ints.dtype == ms.int32 and ints.asnumpy().tolist() == [-3, 3, -3]
    big = np.array([2**40 + 1, -(2**40) - 1], np.int64)  # exact: integers do not pass through float32
    got = ops.div(t(big), t(np.array([3, 3], np.int64)), rounding_mode="trunc")
    assert got.dtype == ms.int64 and got.asnumpy().tolist() == [(2**40 + 1) // 3, -((2**40 + 1) // 3)]


def test_div_trunc_in_a_traced_graph():
    x = rand(2, 5) * 10
    out = Traced(lambda v: ops.div(v, 3.0, rounding_mode="trunc"))(t(x.astype(np.float32)))
    np.testing.assert_allclose(out.asnumpy(), np.trunc(x.astype(np.float32) / np.float32(3.0)))


@pytest.mark.parametrize("mode", ["ceil", "TRUNC", ""])
def test_div_refuses_a_rounding_mode_mindspore_lacks(mode):
    with pytest.raises(ConfigurationError, match=r"ops.div: rounding_mode must be None, 'floor' or 'trunc'"):
        ops.div(t(rand(2)), 2.0, rounding_mode=mode)


# --- ops.flatten(order) / Tensor.flatten(order) -------------------------------------------------------------------


def test_flatten_order_f_is_mindspores_column_major_flatten():
    x = rand(2, 3, 4)
    # MindSpore reverses the dims, then merges start_dim..end_dim of the reversed tensor.
    np.testing.assert_array_equal(ops.flatten(t(x), "F").asnumpy(), np.transpose(x).reshape(4, 6))
    np.testing.assert_array_equal(ops.flatten(t(x), order="F", start_dim=0).asnumpy(), x.flatten(order="F"))
    np.testing.assert_array_equal(
        ops.flatten(t(x), "F", start_dim=0, end_dim=1).asnumpy(), np.transpose(x).reshape(12, 2)
    )
    np.testing.assert_array_equal(t(x).flatten(order="F").asnumpy(), x.flatten(order="F"))
    np.testing.assert_array_equal(t(x).flatten().asnumpy(), x.flatten())
    np.testing.assert_array_equal(ops.flatten(t(x)).asnumpy(), x.reshape(2, 12))
    assert ops.flatten(t(np.float64(3.0)), "F").shape == (1,)


def test_flatten_order_f_in_a_traced_graph():
    x = rand(2, 3, 4).astype(np.float32)
    out = Traced(lambda v: ops.flatten(v, order="F", start_dim=0))(t(x))
    np.testing.assert_array_equal(out.asnumpy(), x.flatten(order="F"))
    out = Traced(lambda v: v.flatten(order="F", start_dim=1))(t(x))
    np.testing.assert_array_equal(out.asnumpy(), np.transpose(x).reshape(4, 6))


@pytest.mark.parametrize("order", ["A", "c", "K"])
def test_flatten_refuses_an_order_mindspore_lacks(order):
    with pytest.raises(ConfigurationError, match=r"ops.flatten: order must be 'C' \(row-major\) or 'F'"):
        ops.flatten(t(rand(2, 3)), order)
    with pytest.raises(ConfigurationError, match="order must be 'C'"):
        t(rand(2, 3)).flatten(order=order)


# --- ops.avg_pool2d / ops.max_pool2d ------------------------------------------------------------------------------


def np_pool(x, kernel, stride, pads, reduce, fill=0.0, include_pad=True):
    """Windows of NCHW x padded with (top, bottom, left, right), reduced by `reduce`."""
    top, bottom, left, right = pads
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=fill)
    real = np.pad(np.ones_like(x), ((0, 0), (0, 0), (top, bottom), (left, right)))
    view = np.lib.stride_tricks.sliding_window_view
    windows = view(padded, kernel, axis=(2, 3))[:, :, :: stride[0], :: stride[1]]
    if include_pad or reduce is np.max:
        return reduce(windows, axis=(-2, -1))
    counts = view(real, kernel, axis=(2, 3))[:, :, :: stride[0], :: stride[1]].sum(axis=(-2, -1))
    return windows.sum(axis=(-2, -1)) / counts


def test_avg_pool2d_has_mindspores_signature_and_defaults():
    params = inspect.signature(ops.avg_pool2d).parameters
    positional = [(n, p.default) for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == [
        ("input_x", inspect.Parameter.empty),
        ("kernel_size", 1),
        ("stride", 1),
        ("padding", 0),
        ("ceil_mode", False),
        ("count_include_pad", True),
        ("divisor_override", 0),
    ]
    params = inspect.signature(ops.max_pool2d).parameters
    positional = [(n, p.default) for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == [
        ("x", inspect.Parameter.empty),
        ("kernel_size", inspect.Parameter.empty),
        ("stride", None),
        ("padding", 0),
        ("dilation", 1),
        ("return_indices", False),
        ("ceil_mode", False),
    ]


def test_avg_pool2d_follows_mindspores_arguments():
    x = rand(2, 3, 6, 5).astype(np.float32)  # ONNX Runtime's AveragePool is float32 only; the reference float64

    def close(got, want):
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6)

    # stride defaults to 1 (MindSpore), not to kernel_size
    close(ops.avg_pool2d(t(x), 2), np_pool(x.astype(np.float64), (2, 2), (1, 1), (0,) * 4, np.mean))
    close(ops.avg_pool2d(t(x), (3, 2), (2, 1)), np_pool(x.astype(np.float64), (3, 2), (2, 1), (0,) * 4, np.mean))
    pads = (1, 0, 0, 1)  # (top, bottom, left, right)
    for include in (True, False):
        want = np_pool(x.astype(np.float64), (2, 2), (2, 2), pads, np.mean, include_pad=include)
        close(ops.avg_pool2d(t(x), 2, 2, pads, False, include), want)
    want = np_pool(x.astype(np.float64), (3, 3), (1, 1), (1,) * 4, np.mean, include_pad=False)
    close(ops.avg_pool2d(t(x), 3, 1, 1, count_include_pad=False, divisor_override=None), want)


def test_avg_pool2d_refuses_what_it_lacks():
    x = t(rand(1, 1, 4, 4))
    with pytest.raises(NotSupportedYetError, match=r"not supported yet: ops.avg_pool2d\(ceil_mode=True\)"):
        ops.avg_pool2d(x, 2, 2, 0, True)
    with pytest.raises(NotSupportedYetError, match=r"ops.avg_pool2d\(divisor_override=3\)"):
        ops.avg_pool2d(x, 2, 2, divisor_override=3)
    with pytest.raises(ConfigurationError, match=r"ops.avg_pool2d: padding must be an int >= 0 or \(top, bottom"):
        ops.avg_pool2d(x, 2, 2, (1, 1))


def test_max_pool2d_follows_mindspores_arguments():
    x = rand(2, 3, 6, 5)
    np.testing.assert_allclose(ops.max_pool2d(t(x), 2).asnumpy(), np_pool(x, (2, 2), (2, 2), (0,) * 4, np.max))
    got = ops.max_pool2d(t(x), 3, 2, (1, 0)).asnumpy()  # padding (pad_h, pad_w)
    np.testing.assert_allclose(got, np_pool(x, (3, 3), (2, 2), (1, 1, 0, 0), np.max, fill=-np.inf))
    got = ops.max_pool2d(t(x), 2, 1, 1, 1, False, False).asnumpy()
    np.testing.assert_allclose(got, np_pool(x, (2, 2), (1, 1), (1,) * 4, np.max, fill=-np.inf))


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"dilation": 2}, r"ops.max_pool2d\(dilation=2\)"),
        ({"return_indices": True}, r"ops.max_pool2d\(return_indices=True\)"),
        ({"ceil_mode": True}, r"ops.max_pool2d\(ceil_mode=True\)"),
    ],
)
def test_max_pool2d_refuses_what_it_lacks(options, what):
    with pytest.raises(NotSupportedYetError, match=f"not supported yet: {what}"):
        ops.max_pool2d(t(rand(1, 1, 4, 4)), 2, **options)


def test_max_pool2d_refuses_a_padding_mindspore_lacks():
    with pytest.raises(ConfigurationError, match=r"ops.max_pool2d: padding must be an int >= 0 or \(pad_h, pad_w\)"):
        ops.max_pool2d(t(rand(1, 1, 4, 4)), 2, 2, (1, 1, 1, 1))


def test_pooling_cells_still_pass_their_pad_mode():
    x = rand(1, 2, 5, 5).astype(np.float32)
    got = nn.AvgPool2d(2, 2, pad_mode="pad", padding=1, count_include_pad=False)(t(x)).asnumpy()
    want = np_pool(x.astype(np.float64), (2, 2), (2, 2), (1,) * 4, np.mean, include_pad=False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    got = nn.MaxPool2d(3, 2, pad_mode="same")(t(x)).asnumpy()
    np.testing.assert_allclose(got, np_pool(x, (3, 3), (2, 2), (1,) * 4, np.max, fill=-np.inf))


# --- ops.dropout(seed) / ops.Dropout(Seed0, Seed1) ----------------------------------------------------------------


@pytest.fixture
def fresh_dropout_streams(monkeypatch):
    from tessel.common import seed

    monkeypatch.setattr(seed, "_op_streams", {})


def dropped(x, p, rng):
    return x * (rng.random(x.shape) >= p) / (1.0 - p)


def test_eager_dropout_draws_from_its_seed(fresh_dropout_streams):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, p = rand(8, 16) + 3.0, 0.3
    first = ops.dropout(t(x), p, seed=5).asnumpy()
    ops.dropout(t(x), p)  # an unseeded draw in between changes nothing
    second = ops.dropout(t(x), p, seed=5).asnumpy()
    rng = np.random.default_rng((0, 5))  # the global seed (set_seed(0)) and the op seed
    np.testing.assert_allclose(first, dropped(x, p, rng))
    np.testing.assert_allclose(second, dropped(x, p, rng))
    assert not np.array_equal(first, second)  # a seeded op draws a new mask each call
    other = ops.dropout(t(x), p, seed=6).asnumpy()
    assert not np.array_equal(first != 0, other != 0)


def test_eager_dropout_repeats_under_the_same_seeds(fresh_dropout_streams, monkeypatch):
    x = rand(8, 16) + 3.0
    ms.set_seed(3)
    first = [ops.dropout(t(x), 0.5, seed=9).asnumpy() for _ in range(2)]
    ms.set_seed(3)  # setting the seed again replays the seeded ops' masks, as a new process would
    ops.dropout(t(x), 0.5)  # unseeded draws do not move a seeded op's masks
    again = [ops.dropout(t(x), 0.5, seed=9).asnumpy() for _ in range(2)]
    np.testing.assert_array_equal(first, again)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_dropout_refuses_a_bad_seed(seed):
    with pytest.raises(ConfigurationError, match=r"ops.dropout: seed must be None or an int >= 0"):
        ops.dropout(t(rand(3)), 0.5, seed=seed)


def test_dropout_primitive_seeds_its_own_stream():
    x = rand(8, 16) + 3.0
    runs = []
    for _ in range(2):
        drop = ops.Dropout(keep_prob=0.6, Seed0=1, Seed1=2)
        runs.append([drop(t(x))[0].asnumpy() for _ in range(2)])
    np.testing.assert_array_equal(runs[0], runs[1])  # each instance: the same masks
    rng = np.random.default_rng((0, drop.seed))
    np.testing.assert_allclose(runs[0][0], dropped(x, 0.4, rng))
    np.testing.assert_allclose(runs[0][1], dropped(x, 0.4, rng))
    out, mask = ops.Dropout(keep_prob=0.6, Seed0=0, Seed1=3)(t(x))
    assert not np.array_equal(out.asnumpy(), runs[0][0])
    np.testing.assert_array_equal(mask.asnumpy(), out.asnumpy() != 0)
    with pytest.raises(ConfigurationError, match="Dropout: Seed1 must be an int >= 0"):
        ops.Dropout(0.5, 0, -2)


# --- ops.MaxPool / ops.AvgPool / ops.Conv2D -----------------------------------------------------------------------


@pytest.mark.parametrize("prim", [ops.MaxPool, ops.AvgPool, ops.Conv2D])
def test_primitives_refuse_a_data_format_other_than_nchw(prim):
    args = (2, 3) if prim is ops.Conv2D else ()
    with pytest.raises(NotSupportedYetError, match=f"ops.{prim.__name__}\\(data_format='NHWC'\\).*'NCHW' runs"):
        prim(*args, data_format="NHWC")
    with pytest.raises(ConfigurationError, match=f"ops.{prim.__name__}: data_format must be 'NCHW' or 'NHWC'"):
        prim(*args, data_format="nchw")
    prim(*args, data_format="NCHW")


def test_conv2d_checks_out_channel_and_kernel_size_against_the_weight():
    x, w = rand(1, 3, 6, 6).astype(np.float32), rand(4, 3, 3, 2).astype(np.float32)  # ONNX Runtime's Conv: float32
    got = ops.Conv2D(4, (3, 2))(t(x), t(w)).asnumpy()
    np.testing.assert_allclose(got, np_conv2d(x.astype(np.float64), w.astype(np.float64)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigurationError, match=r"Conv2D: the weight's shape \(4, 3, 3, 2\) must be \(out_channel=5"):
        ops.Conv2D(5, (3, 2))(t(x), t(w))
    with pytest.raises(ConfigurationError, match=r"kernel_size=\(3, 3\)\).*kernel_size=\(3, 2\)"):
        ops.Conv2D(4, 3)(t(x), t(w))


# --- ops.Softmax(axis=tuple) --------------------------------------------------------------------------------------


def joint_softmax(z, axes):
    e = np.exp(z - z.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


def test_softmax_over_several_axes_is_the_joint_softmax():
    z = rand(2, 3, 4, 5) * 3
    for axes in [(1, 2), (0, -1), (-3, -2, -1)]:
        np.testing.assert_allclose(ops.Softmax(axes)(t(z)).asnumpy(), joint_softmax(z, axes), rtol=1e-12)
        np.testing.assert_allclose(ops.softmax(t(z), axes).asnumpy(), joint_softmax(z, axes), rtol=1e-12)
    np.testing.assert_allclose(ops.Softmax((2,))(t(z)).asnumpy(), softmax(z, 2), rtol=1e-12)
    np.testing.assert_allclose(ops.Softmax(-1)(t(z)).asnumpy(), softmax(z, -1), rtol=1e-12)


def test_softmax_over_several_axes_traced_with_its_gradient():
    z = (rand(2, 3, 4) * 3).astype(np.float32)
    weights = rand(2, 3, 4).astype(np.float32)
    out = Traced(ops.Softmax((0, 2)))(t(z))
    np.testing.assert_allclose(out.asnumpy(), joint_softmax(z.astype(np.float64), (0, 2)), rtol=1e-5)

    def loss(v):
        return ops.sum(ops.Softmax((0, 2))(v) * t(weights))

    grad = ms.grad(loss)(t(z)).asnumpy()
    s = joint_softmax(z.astype(np.float64), (0, 2))
    want = s * (weights - (s * weights).sum(axis=(0, 2), keepdims=True))  # d/dz of sum(softmax(z) * w)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)


def test_softmax_refuses_a_bad_axis():
    with pytest.raises(ConfigurationError, match="Softmax: axis must be an int or a non-empty tuple of ints"):
        ops.Softmax(())
    with pytest.raises(ConfigurationError, match=r"axis \(1, -2\) must name distinct dims"):
        ops.Softmax((1, -2))(t(rand(2, 3, 4)))
    with pytest.raises(ConfigurationError, match="LogSoftmax: axis must be an int"):
        ops.LogSoftmax((0, 1))


def test_dropout_primitive_mask_marks_the_kept_elements_even_where_x_is_zero():
    x = np.tile(np.array([0.0, 1.0, 0.0, -2.0], np.float32), (8, 4))
    for seeds in ((0, 0), (3, 4)):
        ms.set_seed(1)
        out, mask = ops.Dropout(0.5, *seeds)(ms.Tensor(x))
        assert mask.dtype == ms.float32  # MindSpore's CPU/GPU mask has x's dtype
        kept = mask.asnumpy().astype(bool)
        assert 0.2 < kept.mean() < 0.8
        assert (kept & (x == 0)).any()  # a kept zero is in the mask (out != 0 would drop it)
        np.testing.assert_allclose(out.asnumpy(), np.where(kept, x / 0.5, 0.0), rtol=1e-6)


def test_flatten_refuses_dims_out_of_order_or_range():
    x = ms.Tensor(np.ones((2, 3, 4), np.float32))
    assert ops.flatten(x, start_dim=1, end_dim=1).shape == (2, 3, 4)
    with pytest.raises(ConfigurationError, match="start_dim 2 comes after end_dim 1"):
        ops.flatten(x, start_dim=2, end_dim=1)
    for options in ({"start_dim": 3}, {"end_dim": -4}, {"start_dim": 1.0}):
        with pytest.raises(ConfigurationError, match=r"must be an int in \[-3, 3\)"):
            ops.flatten(x, **options)


def test_partly_honoured_arguments_of_the_second_audit():
    from tessel import mint

    assert ops.Squeeze(0)(ms.Tensor(np.ones((1, 3, 1), np.float32))).shape == (3, 1)  # axis 0 is not "every dim"
    assert ops.Squeeze()(ms.Tensor(np.ones((1, 3, 1), np.float32))).shape == (3,)
    rng = np.random.default_rng(4)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 4), (5, 4), (5,)))
    for data in (x, x[0, 0]):  # MindSpore's dense takes (*, in_channels)
        got = ops.dense(ms.Tensor(data), ms.Tensor(w), ms.Tensor(b)).asnumpy()
        np.testing.assert_allclose(got, data.astype(np.float64) @ w.T + b, rtol=1e-5, atol=1e-5)
    big = ms.Tensor(np.full(4, 2**30, np.int32))
    assert int(ops.sum(big, dtype=ms.int64).asnumpy()) == 2**32 == int(big.sum(dtype=ms.int64).asnumpy())
    assert int(ops.sum(ms.Tensor(np.ones(4, np.int8)), dtype=ms.int32).asnumpy()) == 4
    image, kernel = ms.Tensor(np.ones((1, 2, 6, 6), np.float32)), ms.Tensor(np.ones((3, 2, 3, 3), np.float32))
    assert ops.conv2d(image, kernel, pad_mode="pad", padding=1).shape == (1, 3, 6, 6)
    # MindSpore 2.7.0's ops.conv2d: an int or (top/bottom, left/right); four is its ValueError
    assert ops.conv2d(image, kernel, pad_mode="pad", padding=(1, 2)).shape == (1, 3, 6, 8)
    with pytest.raises(ValueError, match=r"ops.conv2d: padding must be an int >= 0 or \(pad_h, pad_w\)"):
        ops.conv2d(image, kernel, pad_mode="pad", padding=(1, 0, 2, 0))
    for mode in ("same", "valid"):
        with pytest.raises(ConfigurationError, match="padding=1 needs pad_mode='pad'"):
            ops.conv2d(image, kernel, pad_mode=mode, padding=1)
    with pytest.raises(ConfigurationError, match=r"Tensor\(input_data, shape=...\)"):
        ms.Tensor([1, 2, 3, 4], shape=(2, 2))
    with pytest.raises(ConfigurationError, match=r"Tensor\(input_data, init=...\)"):
        ms.Tensor([1.0], shape=None, init="zeros")
    exact = mint.div(
        ms.Tensor(np.array([2**25 + 1, -7], np.int64)), ms.Tensor(np.array([1, 2], np.int64)), rounding_mode="trunc"
    )
    np.testing.assert_array_equal(exact.asnumpy(), [2**25 + 1, -3])  # through float32 it was 2**25


# --- MindSpore signatures and conventions found in a review ---------------------------------------------------------


def test_ops_follow_mindspores_signatures_and_outputs():
    x = rand(2, 3, 4).astype(np.float32)
    index = ops.argmin(t(x), axis=1, keepdims=True)  # MindSpore: axis/keepdims and P.Argmin's int32
    assert index.dtype == ms.int32 and np.array_equal(index.asnumpy(), x.argmin(1)[:, None])
    assert ms.mint.argmin(t(x), 1).dtype == ms.int64  # torch's form keeps int64
    np.testing.assert_array_equal(ops.transpose(t(x), (0, -1, 1)).asnumpy(), x.transpose(0, 2, 1))  # negative perm
    assert ops.unsqueeze(t(x), dim=0).shape == (1, 2, 3, 4) and ops.permute(t(x), axis=(2, 0, 1)).shape == (4, 2, 3)
    assert [p.shape for p in ops.split(t(x), np.int64(2), 2)] == [(2, 3, 2), (2, 3, 2)]
    gamma, beta = np.ones((3, 4), np.float32), np.zeros((3, 4), np.float32)
    _, mean, rstd = ops.LayerNorm(1, 1)(t(x), t(gamma), t(beta))  # MindSpore 2.3+: rstd, not the variance
    flat = x.reshape(2, -1).astype(np.float64)
    np.testing.assert_allclose(rstd.asnumpy().reshape(-1), 1 / np.sqrt(flat.var(1) + 1e-7), rtol=1e-5)
    np.testing.assert_allclose(mean.asnumpy().reshape(-1), flat.mean(1), rtol=1e-5)
    _, mask = ops.Dropout(0.5)(t(x))
    assert mask.dtype == ms.float32  # CPU/GPU: the mask has x's dtype


# inspect.signature of mindspore.ops.<name> in MindSpore 2.7.0: (parameter, kind) in order, kind "*" for
# keyword-only; the names tessel had differently before (logsumexp took axis/keep_dims, isclose x1/x2, ...)
MINDSPORE_SIGNATURES = {
    "binary_cross_entropy_with_logits": "input target weight pos_weight reduction",
    "div": "input other *rounding_mode",
    "floor_div": "x y",
    "gelu": "input approximate",
    "hardsigmoid": "input",
    "hardswish": "input",
    "isclose": "input other rtol atol equal_nan",
    "logsumexp": "input dim keepdim",
    "mean": "x axis keep_dims",
    "mish": "x",
    "ones": "shape dtype",
    "ones_like": "input *dtype",
    "select": "condition input other",
    "sqrt": "x",
    "stop_gradient": "value",
    "true_divide": "dividend divisor",
    "zeros_like": "input *dtype",
}


@pytest.mark.parametrize("name", sorted(MINDSPORE_SIGNATURES))
def test_ops_parameters_have_mindspores_names_and_order(name):
    parameters = inspect.signature(getattr(ops, name)).parameters.values()
    found = " ".join(("*" if p.kind == p.KEYWORD_ONLY else "") + p.name for p in parameters)
    assert found == MINDSPORE_SIGNATURES[name]


def test_ops_take_mindspores_keywords():
    """MindSpore 2.7.0: logsumexp([[1, -2, 3]], dim=1, keepdim=True) is [[3.132845]]; zeros_like(x, dtype=int8) is
    Int8 zeros; isclose(input=, other=, rtol=0.1, atol=4.0, equal_nan=True) of [1, -2, 3] and [0.5, 4, -1] is
    [True, False, True]; mint.sqrt keeps mint's input."""
    x, y = t(np.array([[1.0, -2.0, 3.0]], np.float32)), t(np.array([[0.5, 4.0, -1.0]], np.float32))
    np.testing.assert_allclose(ops.logsumexp(x, dim=1, keepdim=True).asnumpy(), [[3.1328452]], rtol=1e-6)
    zeros = ops.zeros_like(x, dtype=ms.int8)
    assert zeros.dtype == ms.int8 and zeros.asnumpy().tolist() == [[0, 0, 0]]
    assert ops.ones_like(x, dtype=ms.float16).dtype == ms.float16
    close = ops.isclose(input=x, other=y, rtol=0.1, atol=4.0, equal_nan=True)
    assert close.asnumpy().tolist() == [[True, False, True]]
    chosen = ops.select(condition=t([True, False]), input=t([1.0, 2.0]), other=t([3.0, 4.0]))
    assert chosen.asnumpy().tolist() == [1.0, 4.0]
    assert ms.mint.sqrt(input=t(np.float32(4.0))).asnumpy() == 2.0
    with pytest.raises(TypeError):
        ops.div(x, y, "floor")  # rounding_mode is keyword-only, as MindSpore's


def test_conv2d_takes_mindspores_four_element_stride_and_dilation():
    x, w = rand(1, 2, 9, 9).astype(np.float32), rand(3, 2, 3, 3).astype(np.float32)
    four = ops.Conv2D(3, 3, stride=(1, 1, 2, 2), dilation=(1, 1, 2, 2))(t(x), t(w))
    two = ops.Conv2D(3, 3, stride=2, dilation=2)(t(x), t(w))
    np.testing.assert_allclose(four.asnumpy(), two.asnumpy())
