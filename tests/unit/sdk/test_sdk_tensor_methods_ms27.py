"""Tensor methods in MindSpore 2.7's argument forms, both the new (dim=, keepdim=) and the old (axis=, keepdims=).

Expected values are MindSpore 2.7.0's (CPU, PYNATIVE) printed outputs on the same inputs, except where a comment
says numpy float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import mint

SIGNS = np.array([1, -1, 1, -1], np.float32)


def a_tensor() -> ms.Tensor:
    """[[0, -1, 2, -3], [4, -5, 6, -7], [8, -9, 10, -11]]."""
    return ms.Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) * SIGNS)


def check(got, dtype, values) -> None:
    assert got.dtype == dtype
    np.testing.assert_allclose(got.asnumpy(), np.array(values), rtol=1e-6)


def test_transpose_with_two_ints_swaps_those_dims_at_any_rank():
    """MindSpore 2.7.0: (2, 3, 4).transpose(1, 2) and .transpose(-2, -1) are (2, 4, 3); dim0=0, dim1=2 gives
    (4, 3, 2); a 2-D x.transpose(0, 1) is its transpose; three ints or a tuple stay a full permutation."""
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = ms.Tensor(data)
    for got in (x.transpose(1, 2), x.transpose(-2, -1), x.transpose(0, 2, 1), x.transpose((0, 2, 1))):
        np.testing.assert_array_equal(got.asnumpy(), data.transpose(0, 2, 1))
    np.testing.assert_array_equal(x.transpose(dim0=0, dim1=2).asnumpy(), data.swapaxes(0, 2))
    np.testing.assert_array_equal(x.transpose().asnumpy(), data.transpose())
    a = a_tensor()
    assert a.transpose(0, 1).shape == a.transpose(1, 0).shape == (4, 3)
    np.testing.assert_array_equal(a.transpose(0, 1).asnumpy(), a.asnumpy().T)
    assert ms.jit(lambda t: t.transpose(-2, -1))(x).shape == (2, 4, 3)
    with pytest.raises(TypeError):
        x.transpose(dim0=1)


def test_sum_mean_take_dim_keepdim_dtype_and_the_old_forms():
    a = a_tensor()
    for got in (a.sum(dim=1, keepdim=True), a.sum(1, True), a.sum(axis=1, keepdims=True)):
        check(got, ms.float32, [[-2.0], [-2.0], [-2.0]])
    check(a.sum(1, ms.float16), ms.float16, [-2.0, -2.0, -2.0])
    check(ms.Tensor(np.array([[100, 100, 3]], np.int32)).sum(dim=1, dtype=ms.int8), ms.int8, [-53])
    check(a.mean(dim=0, keepdim=True), ms.float32, [[4.0, -5.0, 6.0, -7.0]])
    check(a.mean(dtype=ms.float16), ms.float16, -0.5)
    for got in (a.mean(1, True), a.mean(axis=1, keep_dims=True)):
        check(got, ms.float32, [[-0.5], [-0.5], [-0.5]])


def test_sum_into_a_narrow_int_dtype_wraps_as_mindspore():
    """MindSpore 2.7.0: int32 [100, 100, 3].sum(dtype=ms.int8) is int8 -53 (203 wrapped)."""
    x = ms.Tensor(np.array([100, 100, 3], np.int32))
    check(x.sum(dtype=ms.int8), ms.int8, -53)
    check(x.sum(axis=0, dtype=ms.int8), ms.int8, -53)
    check(ms.Tensor(np.array([[100, 100, 3]], np.int32)).sum(1, ms.int8), ms.int8, [-53])
    check(ms.Tensor(np.array([100, 100, 3], np.int8)).sum(dtype=ms.int32), ms.int32, 203)


def test_max_min_along_a_dim_keyword_give_values_and_int64_indices():
    a = a_tensor()
    for values, index in (a.max(dim=1), a.max(1)):
        check(values, ms.float32, [2.0, 6.0, 10.0])
        check(index, ms.int64, [2, 2, 2])
    values, index = a.max(dim=1, keepdim=True)
    check(values, ms.float32, [[2.0], [6.0], [10.0]])
    check(index, ms.int64, [[2], [2], [2]])
    values, index = a.min(dim=0, keepdim=True)
    check(values, ms.float32, [[0.0, -9.0, 2.0, -11.0]])
    check(index, ms.int64, [[0, 2, 0, 2]])
    check(a.max(axis=1), ms.float32, [2.0, 6.0, 10.0])


@pytest.mark.parametrize(
    ("name", "fn", "data"),
    [
        ("mint.max(x, dim=1)", lambda t: mint.max(t, dim=1)[0].sum(), [[1.0, 3.0, 3.0, 0.0]]),
        ("mint.min(x, 1, keepdim=True)", lambda t: mint.min(t, 1, keepdim=True)[0].sum(), [[1.0, 0.0, 0.0, 3.0]]),
        ("x.max(axis=1)", lambda t: t.max(axis=1).sum(), [[1.0, 3.0, 3.0, 0.0]]),
        ("x.max(axis=-1, keepdims=True)", lambda t: t.max(axis=-1, keepdims=True).sum(), [[1.0, 3.0, 3.0, 0.0]]),
        ("x.min(axis=1)", lambda t: t.min(axis=1).sum(), [[1.0, 0.0, 0.0, 3.0]]),
        ("x.max(dim=1)", lambda t: t.max(dim=1)[0].sum(), [[1.0, 3.0, 3.0, 0.0]]),
    ],
)
def test_max_min_along_a_dim_send_the_gradient_to_the_returned_index(name, fn, data):
    """MindSpore 2.7.0 (ArgMaxWithValue): the gradient goes to the first of equal extremes, [[0, 1, 0, 0]]."""
    got = ms.grad(fn)(ms.Tensor(np.array(data, np.float32))).asnumpy()
    np.testing.assert_array_equal(got, [[0.0, 1.0, 0.0, 0.0]], err_msg=name)


def test_full_max_shares_the_gradient_among_equal_maxima():
    """MindSpore 2.7.0: x.max() and mint.max(x) of [[1, 3, 3, 0]] give the gradient [[0, .5, .5, 0]]."""
    x = ms.Tensor(np.array([[1.0, 3.0, 3.0, 0.0]], np.float32))
    for fn in (lambda t: t.max(), lambda t: mint.max(t)):
        np.testing.assert_array_equal(ms.grad(fn)(x).asnumpy(), [[0.0, 0.5, 0.5, 0.0]])


def test_argmax_std_var_all_any_take_the_new_keywords():
    a = a_tensor()
    for got in (a.argmax(dim=1, keepdim=True), a.argmax(axis=1, keepdims=True), a.argmax(1, True)):
        check(got, ms.int64, [[2], [2], [2]])
    check(a.argmin(dim=1, keepdim=True), ms.int32, [[3], [3], [3]])
    check(a.std(dim=1, correction=1), ms.float32, [2.0816659927368164, 6.454972267150879, 11.030261039733887])
    check(a.std(dim=1), ms.float32, [1.8027756214141846, 5.590169906616211, 9.552486419677734])
    check(a.std(dim=1, correction=0, keepdim=True), ms.float32, [[1.8027756], [5.5901699], [9.5524864]])
    check(a.std(axis=1, ddof=1, keepdims=True), ms.float32, [[2.0816659], [6.4549723], [11.0302610]])
    check(a.var(1), ms.float32, [3.25, 31.25, 91.25])
    # MindSpore 2.7.0's CPU has no Var kernel for var(dim=...); numpy float64 var(ddof=1) (its default correction)
    want = (np.arange(12, dtype=np.float64).reshape(3, 4) * SIGNS).var(axis=1, ddof=1)
    check(a.var(dim=1), ms.float32, want)
    check(a.var(dim=1, correction=1), ms.float32, want)
    flags = ms.Tensor(np.array([[True, False], [True, True]]))
    check(flags.all(dim=1), ms.bool_, [False, True])
    check(flags.all(dim=1, keepdim=True), ms.bool_, [[False], [True]])
    check(flags.any(dim=0), ms.bool_, [True, True])


def test_cumsum_sort_argsort_take_dim():
    a = a_tensor()
    check(a.cumsum(dim=0), ms.float32, [[0, -1, 2, -3], [4, -6, 8, -10], [12, -15, 18, -21]])
    check(a.cumsum(dim=1, dtype=ms.float16), ms.float16, [[0, -1, 1, -2], [4, -1, 5, -2], [8, -1, 9, -2]])
    for values, index in (a.sort(dim=1, descending=True), a.sort(axis=1, descending=True)):
        check(values, ms.float32, [[2, 0, -1, -3], [6, 4, -5, -7], [10, 8, -9, -11]])
        check(index, ms.int32, [[2, 0, 1, 3]] * 3)
    check(a.sort(dim=1, stable=True)[1], ms.int32, [[3, 1, 0, 2]] * 3)
    check(a.argsort(dim=0), ms.int32, [[0, 2, 0, 2], [1, 1, 1, 1], [2, 0, 2, 0]])
    check(a.argsort(dim=1, descending=True), ms.int32, [[2, 0, 1, 3]] * 3)


@pytest.mark.parametrize(
    ("dtype", "want"),
    [
        (np.bool_, ms.int32),
        (np.int8, ms.int32),
        (np.uint8, ms.int32),
        (np.int16, ms.int32),
        (np.int32, ms.int32),
        (np.int64, ms.int64),
    ],
)
def test_cumsum_of_narrow_ints_and_bool_is_int32(dtype, want):
    """MindSpore 2.7.0: [1, 1, 0, 1].cumsum(0) of bool, int8, uint8, int16 and int32 is int32, of int64 int64."""
    x = ms.Tensor(np.array([1, 1, 0, 1], dtype))
    check(x.cumsum(0), want, [1, 2, 2, 3])
    check(x.cumsum(axis=0), want, [1, 2, 2, 3])


def test_index_select_tile_matmul_reshape_take_their_keywords():
    a = a_tensor()
    index = ms.Tensor(np.array([2, 0], np.int32))
    check(a.index_select(dim=0, index=index), ms.float32, [[8, -9, 10, -11], [0, -1, 2, -3]])
    check(a.index_select(axis=1, index=index), ms.float32, [[2, 0], [6, 4], [10, 8]])
    for got in (a.tile(dims=(1, 2)), a.tile(reps=(1, 2))):
        assert got.shape == (3, 8)
    check(a.matmul(tensor2=ms.Tensor(np.ones((4, 2), np.float32))), ms.float32, [[-2, -2]] * 3)
    assert a.reshape(shape=(12,)).shape == (12,)
    assert a.reshape(4, 3).shape == a.reshape((4, 3)).shape == (4, 3)
    assert a.reshape([2, 6]).shape == (2, 6)


def test_flatten_takes_start_and_end_dims_positionally_and_the_order_form():
    """MindSpore 2.7.0 on a (2, 3, 4, 5) tensor: flatten(1) is (2, 60), flatten(1, 2) (2, 12, 5), flatten(order='C')
    and flatten('C') (120,), flatten('C', start_dim=1) (2, 60); a 2x3 arange's flatten(order='F') is
    [0, 3, 1, 4, 2, 5]."""
    img = ms.Tensor(np.zeros((2, 3, 4, 5), np.float32))
    assert img.flatten(1).shape == (2, 60)
    assert img.flatten(1, 2).shape == img.flatten(start_dim=1, end_dim=2).shape == (2, 12, 5)
    assert img.flatten(order="C").shape == img.flatten("C").shape == img.flatten().shape == (120,)
    assert img.flatten("C", start_dim=1).shape == (2, 60)
    small = ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    check(small.flatten(order="F"), ms.float32, [0, 3, 1, 4, 2, 5])


def test_gather_takes_dim_index_and_input_indices_axis():
    a = a_tensor()
    index = ms.Tensor(np.array([[0, 0], [1, 0], [3, 2]], np.int64))
    for got in (a.gather(1, index), a.gather(dim=1, index=index)):
        check(got, ms.float32, [[0, 0], [-5, 4], [-11, 10]])
    rows = ms.Tensor(np.array([2, 0], np.int32))
    check(a.gather(rows, 0), ms.float32, [[8, -9, 10, -11], [0, -1, 2, -3]])
    check(a.gather(input_indices=rows, axis=1), ms.float32, [[2, 0], [6, 4], [10, 8]])
    check(a.gather(rows, 1, 0), ms.float32, [[2, 0], [6, 4], [10, 8]])


def test_double_and_fill():
    """MindSpore 2.7.0: double() is float64; fill(2.5) keeps the dtype, an int32 tensor holding 2."""
    a = a_tensor()
    check(a.double(), ms.float64, a.asnumpy())
    check(a.fill(2.5), ms.float32, np.full((3, 4), 2.5))
    check(a.fill(ms.Tensor(2.5)), ms.float32, np.full((3, 4), 2.5))
    check(ms.Tensor(np.array([1, 2], np.int32)).fill(2.5), ms.int32, [2, 2])


def test_int_and_bool_inputs_that_mindspore_promotes():
    """MindSpore 2.7.0: mint.sqrt / mint.reciprocal / Tensor.sqrt of int or bool are float32; mint.round of an int
    is the input; mint.nn.functional.relu keeps an int dtype and gives a bool input back."""
    ints = ms.Tensor(np.array([4, 2], np.int32))
    flags = ms.Tensor(np.array([True, False]))
    check(mint.sqrt(ints), ms.float32, [2.0, 1.4142135381698608])
    check(ints.sqrt(), ms.float32, [2.0, 1.4142135381698608])
    check(mint.sqrt(flags), ms.float32, [1.0, 0.0])
    check(mint.sqrt(ms.Tensor(np.array([4, 2], np.uint8))), ms.float32, [2.0, 1.4142135381698608])
    check(mint.reciprocal(ints), ms.float32, [0.25, 0.5])
    check(mint.reciprocal(flags), ms.float32, [1.0, np.inf])
    signed = ms.Tensor(np.array([4, -2], np.int32))
    check(mint.round(signed), ms.int32, [4, -2])
    check(mint.round(ms.Tensor(np.array([4, -2], np.int64))), ms.int64, [4, -2])
    check(mint.nn.functional.relu(signed), ms.int32, [4, 0])
    check(mint.nn.functional.relu(ms.Tensor(np.array([4, -2], np.int8))), ms.int8, [4, 0])
    check(mint.nn.functional.relu(flags), ms.bool_, [True, False])
    check(ms.jit(lambda t: mint.nn.functional.relu(t) + mint.round(t))(signed), ms.int32, [8, -2])


def test_gather_with_a_positional_dim_and_index_keyword_and_reshape_without_a_shape():
    x = ms.Tensor(np.array([[1.0, 2.0, 3.0], [4.0, 6.0, 8.0]], np.float32))
    picked = x.gather(1, index=ms.Tensor(np.array([[0, 2], [1, 0]], np.int64)))
    assert picked.asnumpy().tolist() == [[1.0, 3.0], [6.0, 4.0]]  # MindSpore 2.7.0's output
    assert ms.Tensor(np.array([5.0], np.float32)).reshape(()).shape == ()
    with pytest.raises(TypeError, match=r"Tensor.reshape\(\) missing its shape"):  # MindSpore: a TypeError too
        x.reshape()
