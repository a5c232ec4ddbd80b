"""Tracing: Python control flow unrolls, data-dependent control flow is a clear error at the user's line,
shape errors name the op, both shapes and the rule, and indexing lowers to slices."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from compiler_testkit import run_graph

from tessel.compiler.builder import apply
from tessel.compiler.errors import ShapeInferenceError, TraceError
from tessel.compiler.tracer import TensorSpec, Trace, trace

rng = np.random.default_rng(11)


def test_python_loops_unroll_and_outputs_keep_their_nesting():
    def net(x, ws):
        for w in ws:  # a Python list of tensors: unrolled
            x = apply("Tanh", x @ w)
        return {"out": x, "stats": (x.sum(), x.mean())}

    ws = [rng.standard_normal((3, 3)).astype(np.float32) for _ in range(3)]
    traced = trace(lambda x: net(x, ws), TensorSpec(("N", 3)))
    assert [n.op for n in traced.graph.nodes].count("MatMul") == 3
    x = rng.standard_normal((5, 3)).astype(np.float32)
    out = traced.outputs.unflatten(run_graph(traced.graph, {"x": x}))
    ref = x
    for w in ws:
        ref = np.tanh(ref @ w)
    np.testing.assert_allclose(out["out"], ref, rtol=1e-5)
    np.testing.assert_allclose(out["stats"][0], ref.sum(), rtol=1e-5)
    assert isinstance(out["stats"], tuple)


def test_one_graph_serves_every_batch_size():
    traced = trace(lambda x: (x.reshape("N", -1) * 2.0).mean(axis=0), TensorSpec(("N", 2, 3)))
    for batch in (1, 7):
        x = rng.standard_normal((batch, 2, 3)).astype(np.float32)
        (got,) = run_graph(traced.graph, {"x": x})
        np.testing.assert_allclose(got, (x.reshape(batch, -1) * 2).mean(0), rtol=1e-6)


def test_branching_on_a_tensor_value_names_the_users_line():
    def net(x):
        if x.sum() > 0:
            return x
        return -x

    line = inspect.getsourcelines(net)[1] + 1
    with pytest.raises(TraceError) as err:
        trace(net, TensorSpec((3,)))
    message = str(err.value)
    assert f"test_tracer.py:{line}" in message
    assert "(`if x.sum() > 0:`)" in message
    assert "Select" in message and "PYNATIVE_MODE" in message


@pytest.mark.parametrize("convert", [float, int, np.asarray, lambda t: t.item()])
def test_reading_a_traced_value_is_an_error(convert):
    with pytest.raises(TraceError, match="known only when the graph runs"):
        trace(lambda x: convert(x), TensorSpec(()))


def test_python_branches_on_static_shapes_are_fine():
    def net(x):
        return x * 2.0 if x.shape[-1] > 2 else x

    assert [n.op for n in trace(net, TensorSpec((2, 3))).graph.nodes] == ["Constant", "Mul"]
    assert [n.op for n in trace(net, TensorSpec((2, 2))).graph.nodes] == []


def test_shape_errors_name_the_op_both_shapes_the_rule_and_the_line():
    def net(x, y):
        return x + y

    with pytest.raises(ShapeInferenceError) as err:
        trace(net, TensorSpec((2, 3)), TensorSpec((4,)))
    message = str(err.value)
    assert message.startswith("Add(f32[2,3], f32[4]) at ")
    assert f"test_tracer.py:{inspect.getsourcelines(net)[1] + 1}" in message
    assert "(2, 3) and (4,) do not broadcast: dim -1 is 3 vs 4" in message and "equal or one of them 1" in message


def test_matmul_shape_error_explains_the_contraction():
    with pytest.raises(
        ShapeInferenceError,
        match=r"MatMul\(f32\[2,3\], f32\[4,5\]\).*x \(2, 3\) \(transpose_a=False\) "
        r"gives k=3, y \(4, 5\) \(transpose_b=False\) gives k=4",
    ):
        trace(lambda x, y: apply("MatMul", x, y), TensorSpec((2, 3)), TensorSpec((4, 5)))


def test_other_shape_errors():
    with pytest.raises(ShapeInferenceError, match=r"cannot reshape \(2, 3\) into \(4, -1\)"):
        trace(lambda x: x.reshape(4, -1), TensorSpec((2, 3)))
    with pytest.raises(ShapeInferenceError, match="differ outside axis 0"):
        trace(lambda x, y: apply("Concat", x, y, axis=0), TensorSpec((2, 3)), TensorSpec((2, 4)))
    with pytest.raises(ShapeInferenceError, match=r"axis 2 is out of range for a tensor of rank 2"):
        trace(lambda x: x.sum(axis=2), TensorSpec((2, 3)))
    with pytest.raises(ShapeInferenceError, match="must be a float tensor, got int32"):
        trace(lambda x: apply("Exp", x), TensorSpec((2,), "int32"))
    with pytest.raises(ShapeInferenceError, match="x has 3 channels but weight"):
        trace(lambda x, w: apply("Conv2D", x, w), TensorSpec((1, 3, 5, 5)), TensorSpec((2, 4, 3, 3)))


@pytest.mark.parametrize(
    "key",
    [
        (1,),
        (-1,),
        (slice(1, None),),
        (slice(None, None, -2), 0),
        (Ellipsis, 1),
        (None, slice(0, 2), None, -2),
        (slice(None), None, slice(None, None, 2)),
    ],
)
def test_getitem_matches_numpy(key):
    traced = trace(lambda x: x[key], TensorSpec((4, 5)))
    x = rng.standard_normal((4, 5)).astype(np.float32)
    (got,) = run_graph(traced.graph, {"x": x})
    np.testing.assert_array_equal(got, x[key])


def test_getitem_with_an_index_tensor_gathers():
    traced = trace(lambda x, i: x[:, i], TensorSpec((3, 5)), TensorSpec((2,), "int64"))
    x, i = rng.standard_normal((3, 5)).astype(np.float32), np.array([4, 0])
    (got,) = run_graph(traced.graph, {"x": x, "i": i})
    np.testing.assert_array_equal(got, x[:, i])
    with pytest.raises(TraceError, match="boolean masks"):
        trace(lambda x: x[x > 0], TensorSpec((3,)))
    with pytest.raises(TraceError, match="out of bounds"):
        trace(lambda x: x[3], TensorSpec((3,)))


def test_trace_context_for_the_sdk_and_its_errors():
    with Trace("cell") as t:
        x = t.input("x", ("N", 2))
        w = t.input("weight", (2, 2))
        zeros = apply("Zeros", shape=(2,))  # no tensor input: lands in the active trace
        graph, tree = t.build((x @ w) + zeros)
    assert [v.name for v in graph.inputs] == ["x", "weight"] and tree.kind == "leaf"
    with pytest.raises(TraceError, match="already has an input named 'x'"), Trace() as t2:
        t2.input("x", (1,))
        t2.input("x", (1,))
    with pytest.raises(TraceError, match="outside a trace"):
        apply("Zeros", shape=(2,))
    with Trace() as outer:
        captured = outer.input("a", (2,))
        with pytest.raises(TraceError, match="mixes tensors of two different traces"), Trace() as inner:
            captured + inner.input("b", (2,))
