"""ops composed from registered ops (tessel/ops/composed.py): float64 numpy references in PYNATIVE_MODE and in a
graph, gradients where they are smooth, and the errors."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import ops
from tessel.core.errors import ConfigurationError

RNG = np.random.default_rng(7)
A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((3, 4)).astype(np.float32)
MODES = pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])


def run(mode, fn, *arrays):
    """fn on Tensors of `arrays`: eagerly, or traced as one graph."""
    ms.set_context(mode=getattr(ms, mode))
    tensors = [ms.Tensor(a) for a in arrays]
    out = ms.jit(fn)(*tensors) if mode == "GRAPH_MODE" else fn(*tensors)
    return [o.asnumpy() for o in out] if isinstance(out, (tuple, list)) else out.asnumpy()


@MODES
def test_element_wise_ops_match_float64(mode):
    x = np.array([-30.0, -5.0, -1e-6, 0.0, 1e-7, 0.5, 3.0, 25.0], np.float32)
    x64 = x.astype(np.float64)
    softplus = np.where(x64 > 20, x64, np.log1p(np.exp(x64)))
    cases = {
        "log1p": (lambda t: ops.log1p(ops.abs(t)), np.log1p(np.abs(x64))),
        "expm1": (ops.expm1, np.expm1(x64)),
        "softplus": (ops.softplus, softplus),
        "elu": (lambda t: ops.elu(t, 0.7), np.where(x64 > 0, x64, 0.7 * np.expm1(x64))),
        "mish": (ops.mish, x64 * np.tanh(softplus)),
        "hardswish": (ops.hardswish, x64 * np.clip(x64 + 3, 0, 6) / 6),
        "hardsigmoid": (ops.hardsigmoid, np.clip(x64 + 3, 0, 6) / 6),
    }
    for name, (fn, want) in cases.items():
        got = run(mode, fn, x)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30, err_msg=name)  # small x exact: Kahan's forms
    got = run(mode, lambda a, b: ops.lerp(a, b, 0.25), A, B)
    np.testing.assert_allclose(got, A + 0.25 * (B - A), rtol=1e-6)
    got = run(mode, lambda a, b: ops.addcdiv(a, a, b + 4.0, value=0.5), A, B)
    np.testing.assert_allclose(got, A + 0.5 * A / (B + 4.0), rtol=1e-6)
    got = run(mode, lambda a, b: ops.addcmul(a, a, b, value=2), A, B)
    np.testing.assert_allclose(got, A + 2 * A * B, rtol=1e-6)
    near = np.array([1.0, np.inf, np.nan, 1.0, 2.0], np.float32)
    other = np.array([1.0 + 1e-6, np.inf, np.nan, 1.1, 2.0], np.float32)
    assert run(mode, ops.isclose, near, other).tolist() == [True, True, False, False, True]
    assert run(mode, lambda a, b: ops.isclose(a, b, equal_nan=True), near, other).tolist()[2] is True
    bools = run(mode, ops.logical_xor, np.array([1, 0, 2, 0], np.int32), np.array([1, 1, 0, 0], np.int32))
    assert bools.tolist() == [False, True, True, False]
    mask = A > 0
    np.testing.assert_array_equal(run(mode, lambda a, m: ops.masked_fill(a, m, -1.5), A, mask), np.where(mask, -1.5, A))


@MODES
def test_reductions_and_index_patterns_match_numpy(mode):
    big = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, 0.0, 1.0]], np.float32)
    want = np.log(np.exp(big.astype(np.float64) - big.max(1, keepdims=True)).sum(1)) + big.max(1)
    np.testing.assert_allclose(run(mode, lambda t: ops.logsumexp(t, 1), big), want, rtol=1e-6)
    assert run(mode, lambda t: ops.logsumexp(t, 0, keepdim=True), A).shape == (1, 4)
    # MindSpore 2.7.0 follows its formula log(sum(e^(x - max))) + max: nan where the maximum is infinite
    infinite = np.array([[-np.inf, -np.inf], [np.inf, np.inf], [np.inf, 1.0], [-np.inf, 1.0]], np.float32)
    np.testing.assert_array_equal(run(mode, lambda t: ops.logsumexp(t, 1), infinite), [np.nan, np.nan, np.nan, 1.0])
    np.testing.assert_allclose(
        run(mode, lambda t: ops.cumsum(t, 1), A), np.cumsum(A.astype(np.float64), 1), rtol=1e-5, atol=1e-6
    )
    ints = np.array([[2**40, 1, -3], [7, 8, 9]], np.int64)
    got = run(mode, lambda t: ops.cumsum(t, 0), ints)
    assert got.dtype == np.int64 and got.tolist() == np.cumsum(ints, 0).tolist()
    assert run(mode, lambda t: ops.cumsum(t, -1, dtype=ms.float32), ints).dtype == np.float32
    square = RNG.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(run(mode, ops.trace, square), np.trace(square), rtol=1e-6)
    cube = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    for diagonal in (-1, 0, 2):
        np.testing.assert_array_equal(run(mode, lambda t, d=diagonal: ops.tril(t, d), cube), np.tril(cube, diagonal))
        np.testing.assert_array_equal(run(mode, lambda t, d=diagonal: ops.triu(t, d), cube), np.triu(cube, diagonal))
    np.testing.assert_array_equal(run(mode, lambda t: ops.flip(t, (0, 2)), cube), np.flip(cube, (0, 2)))
    np.testing.assert_array_equal(
        run(mode, lambda t: ops.roll(t, (1, -2), (1, 2)), cube), np.roll(cube, (1, -2), (1, 2))
    )
    np.testing.assert_array_equal(run(mode, lambda t: ops.roll(t, 5), cube), np.roll(cube, 5))
    for reps in ((2, 1, 3), (2,), (2, 1, 1, 2)):
        np.testing.assert_array_equal(run(mode, lambda t, r=reps: ops.tile(t, r), cube), np.tile(cube, reps))
    parts = run(mode, lambda t: ops.unbind(t, 1), cube)
    assert len(parts) == 3 and all(np.array_equal(p, cube[:, i]) for i, p in enumerate(parts))
    np.testing.assert_array_equal(run(mode, lambda t: ops.narrow(t, 2, 1, 2), cube), cube[:, :, 1:3])
    picked = run(mode, lambda t, i: ops.index_select(t, 1, i), cube, np.array([2, 0], np.int32))
    np.testing.assert_array_equal(picked, cube[:, [2, 0]])
    v, w = A[0], B[1]
    np.testing.assert_allclose(run(mode, ops.outer, v, w), np.outer(v, w), rtol=1e-6)
    np.testing.assert_allclose(run(mode, ops.inner, A, B), np.inner(A, B), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run(mode, lambda a, b: ops.mm(a, ops.transpose(b, (1, 0))), A, B), A @ B.T, rtol=1e-5)


def test_creation_ops_give_mindspores_dtypes():
    assert ops.arange(5).dtype == ms.int64 and ops.arange(5).asnumpy().tolist() == [0, 1, 2, 3, 4]
    assert ops.arange(1, 2, 0.25).dtype == ms.float32 and ops.arange(1, 2, 0.25).asnumpy().tolist() == [
        1,
        1.25,
        1.5,
        1.75,
    ]
    assert ops.arange(0, 3, dtype=ms.float32).dtype == ms.float32
    assert ops.linspace(0, 1, 5).asnumpy().tolist() == [0, 0.25, 0.5, 0.75, 1]
    assert ops.eye(2, 3).asnumpy().tolist() == [[1, 0, 0], [0, 1, 0]] and ops.eye(2).dtype == ms.float32
    x, y = ops.meshgrid(ms.Tensor(np.arange(3)), ms.Tensor(np.arange(2)))
    nx, ny = np.meshgrid(np.arange(3), np.arange(2))
    assert x.asnumpy().tolist() == nx.tolist() and y.asnumpy().tolist() == ny.tolist()
    i, j = ops.meshgrid(ms.Tensor(np.arange(3)), ms.Tensor(np.arange(2)), indexing="ij")
    ni, nj = np.meshgrid(np.arange(3), np.arange(2), indexing="ij")
    assert i.asnumpy().tolist() == ni.tolist() and j.asnumpy().tolist() == nj.tolist()
    assert ops.numel(ms.Tensor(A)) == 12


@MODES
def test_gradients_flow_through_the_compositions(mode):
    ms.set_context(mode=getattr(ms, mode))
    x = ms.Tensor(A)

    def loss(t):
        return ops.sum(ops.logsumexp(t, 1)) + ops.sum(ops.cumsum(t, 0) * ops.flip(t, 1)) + ops.sum(ops.softplus(t))

    grad = ms.grad(loss)(x).asnumpy()
    a = A.astype(np.float64)
    soft = np.exp(a) / np.exp(a).sum(1, keepdims=True)
    rev = np.flip(a, 1)
    # d/da sum(cumsum(a,0) * flip(a,1)): cumsum's adjoint is a reverse cumsum; flip's is a flip
    from_cumsum = np.flip(np.cumsum(np.flip(rev, 0), 0), 0)
    from_flip = np.flip(np.cumsum(a, 0), 1)
    want = soft + from_cumsum + from_flip + 1 / (1 + np.exp(-a))
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)


def test_errors_name_the_rule():
    with pytest.raises(ConfigurationError, match="must be at least 2-D"):
        ops.tril(ms.Tensor(A[0]))
    with pytest.raises(ConfigurationError, match="dim 3 is out of range for a 2-D tensor"):
        ops.flip(ms.Tensor(A), 3)
    with pytest.raises(ConfigurationError, match="must lie within dim 1 of size 4"):
        ops.narrow(ms.Tensor(A), 1, 3, 2)
    with pytest.raises(ConfigurationError, match="step must not be 0"):
        ops.arange(0, 3, 0)
    with pytest.raises(ConfigurationError, match=r"shifts .* and dims .* must have the same length"):
        ops.roll(ms.Tensor(A), (1, 2), 0)
    with pytest.raises(ConfigurationError, match="indexing must be 'xy' or 'ij'"):
        ops.meshgrid(ms.Tensor(A[0]), indexing="yx")


def test_activation_cells_built_on_them():
    x = np.array([-2.0, 0.5, 30.0], np.float32)
    x64 = x.astype(np.float64)
    soft = np.where(x64 > 20, x64, np.log1p(np.exp(x64)))
    cases = [
        (ms.nn.ELU(alpha=0.5), np.where(x64 > 0, x64, 0.5 * np.expm1(x64))),
        (ms.nn.Softplus(beta=2, threshold=10), np.where(2 * x64 > 10, x64, np.log1p(np.exp(2 * x64)) / 2)),
        (ms.nn.Mish(), x64 * np.tanh(soft)),
        (ms.nn.HSwish(), x64 * np.clip(x64 + 3, 0, 6) / 6),
        (ms.nn.HSigmoid(), np.clip(x64 + 3, 0, 6) / 6),
        (ms.nn.get_activation("mish"), x64 * np.tanh(soft)),
    ]
    for cell, want in cases:
        np.testing.assert_allclose(cell(ms.Tensor(x)).asnumpy(), want, rtol=2e-6, err_msg=cell.cls_name)
    with pytest.raises(TypeError, match="ELU: alpha must be an int or a float"):
        ms.nn.ELU(alpha="1")


@MODES
def test_statistics_and_norms_match_numpy(mode):
    cube = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    c64 = cube.astype(np.float64)
    for axis, ddof, keep in [(None, 0, False), (1, 1, False), ((0, 2), True, True), (-1, 0, True)]:
        np_axis = tuple(axis) if isinstance(axis, tuple) else axis
        got = run(mode, lambda t, a=axis, d=ddof, k=keep: ops.std(t, a, d, k), cube)
        np.testing.assert_allclose(got, c64.std(np_axis, ddof=int(ddof), keepdims=keep), rtol=1e-5)
        v, m = run(mode, lambda t, a=axis, d=ddof, k=keep: ops.var_mean(t, a, d, k), cube)
        np.testing.assert_allclose(v, c64.var(np_axis, ddof=int(ddof), keepdims=keep), rtol=1e-5)
        np.testing.assert_allclose(m, c64.mean(np_axis, keepdims=keep), rtol=1e-5, atol=1e-7)
    for ord_, dim in [(None, None), (None, 1), (1, 2), (float("inf"), 0), (0, 1), (3, -1), (float("-inf"), 1)]:
        got = run(mode, lambda t, o=ord_, d=dim: ops.norm(t, o, d), cube)
        want = np.linalg.norm(c64.reshape(-1)) if dim is None else np.linalg.norm(c64, ord_, dim)
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"ord {ord_} dim {dim}")
    square = c64[0]
    for ord_ in ("fro", 1, -1, float("inf"), float("-inf")):
        got = run(mode, lambda t, o=ord_: ops.norm(t, o), cube[0])
        np.testing.assert_allclose(got, np.linalg.norm(square, ord_), rtol=1e-5, err_msg=f"matrix ord {ord_}")
    got = run(mode, lambda t, o=1: ops.norm(t, o, (1, 2), True), cube)
    np.testing.assert_allclose(got, np.linalg.norm(c64, 1, (1, 2), True), rtol=1e-5)
    a, b = A.astype(np.float64), B.astype(np.float64)
    want = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    np.testing.assert_allclose(run(mode, ops.cosine_similarity, A, B), want, rtol=1e-5)


def test_integer_trace_and_norm_have_mindspores_dtypes():
    """MindSpore 2.7.0: trace of arange(9) as int8/int32/uint8 is 12 of that dtype; norm of int32 [0, 1, 2, 3] is
    float32 3.7416575 (ord None or 2, int64 and int8 alike), of [[0, 1], [2, 3]] along dim 1 float32 [1, 3.6055512];
    the matrix inf norm stays int32 (5) and the 1 norm is int64 (4)."""
    square = np.arange(9).reshape(3, 3)
    for dtype, want in ((np.int8, ms.int8), (np.int32, ms.int32), (np.uint8, ms.uint8)):
        out = ops.trace(ms.Tensor(square.astype(dtype)))
        assert out.dtype == want and out.asnumpy() == 12
    vector, matrix = ms.Tensor(np.arange(4, dtype=np.int32)), ms.Tensor(np.arange(4, dtype=np.int32).reshape(2, 2))
    for out in (ops.norm(vector), ops.norm(vector, 2), ops.norm(ms.Tensor(np.arange(4, dtype=np.int64)))):
        assert out.dtype == ms.float32
        np.testing.assert_allclose(out.asnumpy(), np.sqrt(14.0), rtol=1e-6)
    by_row = ops.norm(matrix, dim=1)
    assert by_row.dtype == ms.float32
    np.testing.assert_allclose(by_row.asnumpy(), [1.0, np.sqrt(13.0)], rtol=1e-6)
    assert ops.norm(matrix, "fro").dtype == ms.float32
    infinity = ops.norm(matrix, float("inf"))
    assert infinity.dtype == ms.int32 and infinity.asnumpy() == 5
    one = ops.norm(matrix, 1)
    assert one.dtype == ms.int64 and one.asnumpy() == 4


def test_norm_errors_say_what_is_missing():
    from tessel.core.errors import NotSupportedYetError

    with pytest.raises(NotSupportedYetError, match="ord='nuc'"):
        ops.norm(ms.Tensor(A), "nuc")
    with pytest.raises(ConfigurationError, match="is a matrix norm; give dim two dims"):
        ops.norm(ms.Tensor(A), "fro", 1)
    with pytest.raises(ConfigurationError, match="ddof must be an int or a bool"):
        ops.std(ms.Tensor(A), ddof=0.5)


@MODES
def test_group_norm_matches_float64_and_trains_its_affine_parameters(mode):
    ms.set_context(mode=getattr(ms, mode))
    x = RNG.standard_normal((2, 6, 3, 2)).astype(np.float32)
    cell = ms.nn.GroupNorm(3, 6)
    cell.gamma.set_data(ms.Tensor(np.arange(1, 7, dtype=np.float32)))
    cell.beta.set_data(ms.Tensor(np.full(6, 0.5, np.float32)))
    g = x.astype(np.float64).reshape(2, 3, -1)
    normed = ((g - g.mean(2, keepdims=True)) / np.sqrt(g.var(2, keepdims=True) + 1e-5)).reshape(x.shape)
    want = normed * np.arange(1, 7).reshape(1, 6, 1, 1) + 0.5
    np.testing.assert_allclose(cell(ms.Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-6)
    grads = ms.grad(lambda t: ops.sum(cell(t)), None, cell.trainable_params())(ms.Tensor(x))
    np.testing.assert_allclose(grads[0].asnumpy(), normed.sum((0, 2, 3)), atol=1e-5)  # d/dgamma
    np.testing.assert_allclose(grads[1].asnumpy(), np.full(6, 12.0), rtol=1e-6)  # d/dbeta: N * H * W
    assert not ms.nn.GroupNorm(2, 4, affine=False).trainable_params()
    with pytest.raises(ConfigurationError, match="num_channels 6 must divide by num_groups 4"):
        ms.nn.GroupNorm(4, 6)
    with pytest.raises(ConfigurationError, match=r"expects input \(N, 6, \.\.\.\)"):
        cell(ms.Tensor(x[:, :4]))


@MODES
def test_activation_slopes_at_their_kinks_are_mindsporess(mode):
    """MindSpore 2.7.0's gradients at x = -3, 0, 3 (measured): LeakyReLU splits the tie of its maximum at 0,
    HSwish's middle piece holds at both ends, HSigmoid's at neither; mint.leaky_relu keeps torch's slope."""
    ms.set_context(mode=getattr(ms, mode))
    x = ms.Tensor(np.array([-3.0, 0.0, 3.0, 6.0], np.float32))
    slopes = {
        "leaky": (ms.nn.LeakyReLU(0.2), [0.2, 0.6, 1.0, 1.0]),
        "leaky1.5": (ms.nn.LeakyReLU(1.5), [1.5, 1.25, 1.0, 1.0]),
        "hswish": (ms.nn.HSwish(), [-0.5, 0.5, 1.5, 1.0]),
        "hsigmoid": (ms.nn.HSigmoid(), [0.0, 1 / 6, 0.0, 0.0]),
        "mint.leaky_relu": (lambda t: ms.mint.nn.functional.leaky_relu(t, 0.2), [0.2, 0.2, 1.0, 1.0]),
    }
    for name, (fn, want) in slopes.items():
        grad = ms.grad(lambda t, f=fn: ops.sum(f(t)))(x).asnumpy()
        np.testing.assert_allclose(grad, want, rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(ms.nn.HSwish()(x).asnumpy(), [0.0, 0.0, 3.0, 6.0])
    np.testing.assert_allclose(ms.nn.HSigmoid()(x).asnumpy(), [0.0, 0.5, 1.0, 1.0])
