"""Matrix products, reductions, shape and indexing ops, creation ops: forward vs numpy, gradients vs differences."""

from __future__ import annotations

import numpy as np
import pytest
from compiler_testkit import check_forward, check_grad, run_graph
from hypothesis import given, settings
from hypothesis import strategies as st

from tessel.compiler.builder import apply
from tessel.compiler.lower_onnx import to_onnx
from tessel.compiler.tracer import Trace

rng = np.random.default_rng(3)


def rand(*shape):
    return np.asarray(rng.standard_normal(shape), dtype=np.float32)


def t(x, flag):
    return np.swapaxes(x, -1, -2) if flag else x


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_transposes(ta, tb):
    a, b = rand(*((4, 3) if ta else (3, 4))), rand(*((5, 4) if tb else (4, 5)))
    fn = lambda a, b: t(a, ta) @ t(b, tb)  # noqa: E731
    attrs = {"transpose_a": ta, "transpose_b": tb}
    check_forward("MatMul", [a, b], attrs, fn, rtol=1e-5)
    check_grad("MatMul", [a, b], attrs, fn)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_batch_matmul_broadcasts_batch_dims(ta, tb):
    a = rand(2, 1, *((4, 3) if ta else (3, 4)))
    b = rand(3, *((5, 4) if tb else (4, 5)))
    fn = lambda a, b: t(a, ta) @ t(b, tb)  # noqa: E731
    attrs = {"transpose_a": ta, "transpose_b": tb}
    check_forward("BatchMatMul", [a, b], attrs, fn, rtol=1e-5, atol=1e-5)
    check_grad("BatchMatMul", [a, b], attrs, fn)


REDUCE = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max, "ReduceMin": np.min}


@pytest.mark.parametrize("op", sorted(REDUCE))
@settings(max_examples=5, deadline=None, database=None)
@given(axis=st.sampled_from([None, 0, 1, -1, (0, 2), (0, 1, 2)]), keep=st.booleans())
def test_reductions(op, axis, keep):
    x = rand(2, 3, 4)
    fn = lambda x: REDUCE[op](x, axis=axis, keepdims=keep)  # noqa: E731
    check_forward(op, [x], {"axis": axis, "keep_dims": keep}, fn, rtol=1e-5)
    check_grad(op, [x], {"axis": axis, "keep_dims": keep}, fn)


@pytest.mark.parametrize(
    "shape,axis,runs",
    [
        (("N", 256), 0, [(48, 256), (5, 256)]),  # a bias gradient over a symbolic batch
        (("N", 3, 64), 0, [(7, 3, 64)]),  # the kept dims flattened to one
        ((4, "T", 128), (0, 1), [(4, 9, 128), (4, 1, 128)]),  # several leading dims, one symbolic
        ((64, 8, 32), 0, [(64, 8, 32)]),  # static, just large enough
    ],
)
@pytest.mark.parametrize("keep", [False, True])
def test_a_float32_sum_over_leading_dims_runs_as_a_product_with_ones_and_equals_the_sum(shape, axis, runs, keep):
    with Trace("rows") as t:
        graph, _ = t.build(apply("ReduceSum", t.input("a0", shape), axis=axis, keep_dims=keep))
    ops = [n.op_type for n in to_onnx(graph).graph.node]
    assert "MatMul" in ops and "ReduceSum" not in ops
    for run in runs:
        x = rand(*run)
        (got,) = run_graph(graph, {"a0": x})
        want = np.sum(x.astype(np.float64), axis=axis, keepdims=keep)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,axis", [((3, 4), 0), (("N", 64), 0), ((8, 256), 0), (("N", 256), 1), ((2, 256), -1)])
def test_small_or_inner_sums_stay_reduce_sum(shape, axis):
    with Trace("rows") as t:
        graph, _ = t.build(apply("ReduceSum", t.input("a0", shape), axis=axis))
    assert "ReduceSum" in [n.op_type for n in to_onnx(graph).graph.node]


def test_reduce_max_shares_the_gradient_between_ties():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]], np.float32)
    check_grad("ReduceMax", [x], {"axis": 1}, lambda x: x.max(1), rtol=1e-6)  # finite differences split ties too


def test_argmax_and_argmin():
    x = rand(3, 5)
    (got,) = check_forward("Argmax", [x], {"axis": 1}, lambda x: x.argmax(1).astype(np.int32))
    assert got.dtype == np.int32
    check_forward("Argmin", [x], {"axis": 0, "keep_dims": True}, lambda x: x.argmin(0)[None].astype(np.int32))


@pytest.mark.parametrize(
    "op,attrs,fn,shape",
    [
        ("Reshape", {"shape": (3, -1)}, lambda x: x.reshape(3, -1), (2, 3, 2)),
        ("Flatten", {}, lambda x: x.reshape(2, -1), (2, 3, 2)),
        ("Transpose", {"perm": (2, 0, 1)}, lambda x: x.transpose(2, 0, 1), (2, 3, 4)),
        ("ExpandDims", {"axis": 1}, lambda x: x[:, None], (2, 3)),
        ("ExpandDims", {"axis": -1}, lambda x: x[..., None], (2, 3)),
        ("Squeeze", {}, np.squeeze, (2, 1, 3, 1)),
        ("Squeeze", {"axis": 1}, lambda x: x.squeeze(1), (2, 1, 3, 1)),
        ("BroadcastTo", {"shape": (4, 2, 3)}, lambda x: np.broadcast_to(x, (4, 2, 3)), (2, 1)),
        ("BroadcastTo", {"shape": (2, -1)}, lambda x: np.broadcast_to(x, (2, 3)), (3,)),
        ("Identity", {}, lambda x: x, (2, 2)),
    ],
)
def test_layout_ops(op, attrs, fn, shape):
    x = rand(*shape)
    check_forward(op, [x], attrs, fn)
    check_grad(op, [x], attrs, fn)


def test_concat_and_split_are_adjoint():
    a, b, c = rand(2, 1), rand(2, 3), rand(2, 2)
    cat = lambda *xs: np.concatenate(xs, axis=1)  # noqa: E731
    check_forward("Concat", [a, b, c], {"axis": 1}, cat)
    check_grad("Concat", [a, b, c], {"axis": 1}, cat)
    x = rand(6, 2)
    equal = lambda x: tuple(np.split(x, 3))  # noqa: E731
    check_forward("Split", [x], {"output_num": 3}, equal)
    check_grad("Split", [x], {"output_num": 3}, equal)
    sizes = lambda x: tuple(np.split(x, [1, 4]))  # noqa: E731
    check_forward("Split", [x], {"sizes": (1, 3, 2)}, sizes)
    check_grad("Split", [x], {"sizes": (1, 3, 2)}, sizes)


@settings(max_examples=25, deadline=None, database=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([None, -5, -2, 0, 1, 3, 6]),
            st.sampled_from([None, -6, -1, 0, 2, 4, 7]),
            st.sampled_from([1, 2, 3, -1, -2]),
        ),
        min_size=2,
        max_size=2,
    )
)
def test_strided_slice_matches_python_slicing(spec):
    x = rand(5, 6)
    key = tuple(slice(*s) for s in spec)
    attrs = {"begin": tuple(s[0] for s in spec), "end": tuple(s[1] for s in spec), "strides": tuple(s[2] for s in spec)}
    fn = lambda x: x[key]  # noqa: E731
    if 0 in fn(x).shape:
        check_forward("StridedSlice", [x], attrs, fn)
        return
    check_forward("StridedSlice", [x], attrs, fn)
    check_grad("StridedSlice", [x], attrs, fn)


def test_pad():
    x = rand(2, 3)
    attrs = {"paddings": ((1, 0), (2, 3)), "value": 0.0}
    fn = lambda x: np.pad(x, ((1, 0), (2, 3)))  # noqa: E731
    check_forward("Pad", [x], attrs, fn)
    check_grad("Pad", [x], attrs, fn)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_with_repeated_indices(axis):
    x = rand(4, 3, 5)
    idx = np.array([[0, 2], [2, 1]], np.int32)  # index 2 twice: its gradient must add up
    fn = lambda x, i: np.take(x, i, axis=axis)  # noqa: E731
    check_forward("Gather", [x, idx], {"axis": axis}, fn)
    check_grad("Gather", [x, idx], {"axis": axis}, fn)


def test_unsorted_segment_sum_gather_elements_scatter_add():
    data, ids = rand(5, 2), np.array([0, 2, 0, 1, 2], np.int64)

    def segment_sum(d, i):
        out = np.zeros((3, 2), d.dtype)
        np.add.at(out, i, d)
        return out

    check_forward("UnsortedSegmentSum", [data, ids], {"num_segments": 3}, segment_sum)
    check_grad("UnsortedSegmentSum", [data, ids], {"num_segments": 3}, segment_sum)
    x, idx = rand(3, 4), np.array([[0, 1, 1, 3], [2, 2, 0, 0], [3, 1, 2, 0]], np.int64)
    take = lambda x, i: np.take_along_axis(x, i, axis=1)  # noqa: E731
    check_forward("GatherElements", [x, idx], {"axis": 1}, take)
    check_grad("GatherElements", [x, idx], {"axis": 1}, take)

    def scatter_add(d, i, u):
        out = d.copy()
        rows = np.arange(d.shape[0])[:, None].repeat(i.shape[1], 1)
        np.add.at(out, (rows, i), u)
        return out

    updates = rand(3, 4)
    check_forward("ScatterAdd", [x, idx, updates], {"axis": 1}, scatter_add)
    check_grad("ScatterAdd", [x, idx, updates], {"axis": 1}, scatter_add, wrt=[0, 2])


def test_one_hot():
    idx = np.array([[0, 3], [2, 1]], np.int32)
    check_forward("OneHot", [idx], {"depth": 4}, lambda i: np.eye(4, dtype=np.float32)[i])
    fn = lambda i: np.moveaxis(np.where(np.eye(4, dtype=bool)[i], 5.0, -1.0), -1, 0)  # noqa: E731
    check_forward("OneHot", [idx], {"depth": 4, "on_value": 5.0, "off_value": -1.0, "axis": 0, "dtype": "float64"}, fn)
    # a negative index (or one >= depth) is all off_value, as MindSpore's kernel (ONNX counts -1 from the end)
    masked = np.array([-1, 2, 4], np.int32)
    want = np.array([[0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], np.float32)
    check_forward("OneHot", [masked], {"depth": 4}, lambda i: want)


def test_creation_ops():
    check_forward("Zeros", [], {"shape": (2, 3)}, lambda: np.zeros((2, 3), np.float32))
    check_forward("Ones", [], {"shape": (20,), "dtype": "int32"}, lambda: np.ones(20, np.int32))
    check_forward("Fill", [], {"shape": (3, 7), "value": 2.5}, lambda: np.full((3, 7), 2.5, np.float32))
    x = rand(2, 3)
    check_forward("ZerosLike", [x], {}, np.zeros_like)
    check_forward("OnesLike", [x], {}, np.ones_like)
    check_forward("DimSize", [x], {"axes": (0, 1), "dtype": "float32"}, lambda x: np.float32(x.size))


def test_depend_returns_its_first_input_and_routes_gradient_there():
    x, y = rand(3), rand(2)
    check_forward("Depend", [x, y], {}, lambda x, y: x)
    check_grad("Depend", [x, y], {}, lambda x, y: x, wrt=[0])
