"""Element-wise ops: forward vs numpy and gradients vs float64 central differences, with broadcasting."""

from __future__ import annotations

import numpy as np
import pytest
from compiler_testkit import check_forward, check_grad, erf, feeds_of, op_graph, run_graph
from hypothesis import given, settings
from hypothesis import strategies as st

from tessel.compiler.autodiff import grad_graph

rng = np.random.default_rng(42)


def rand(*shape, low=-2.0, high=2.0):
    return np.asarray(rng.uniform(low, high, shape), dtype=np.float32)


BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Maximum": np.maximum,
    "Minimum": np.minimum,
}


@st.composite
def broadcast_pair(draw):
    """Two small shapes that broadcast: some dims set to 1 in one operand, maybe fewer leading dims."""
    rank = draw(st.integers(0, 3))
    dims = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    a = [d if draw(st.booleans()) else 1 for d in dims]
    b = [d if draw(st.booleans()) else 1 for d in dims]
    b = b[draw(st.integers(0, rank)) :]
    return tuple(a), tuple(b)


@pytest.mark.parametrize("op", sorted(BINARY))
@settings(max_examples=6, deadline=None, database=None)
@given(shapes=broadcast_pair())
def test_binary_broadcasting_forward_and_grad(op, shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1], low=0.5, high=2.0)  # b away from 0 for Div
    if op in ("Maximum", "Minimum"):
        b = b * np.where(rng.random(b.shape) < 0.5, -1, 1).astype(np.float32)  # ties have no derivative
    check_forward(op, [a, b], {}, BINARY[op])
    check_grad(op, [a, b], {}, BINARY[op])


def test_pow_gradient_for_base_and_exponent():
    x, y = rand(2, 3, low=0.5, high=2.0), rand(3, low=-1.5, high=1.5)
    check_forward("Pow", [x, y], {}, np.power)
    check_grad("Pow", [x, y], {}, np.power)
    # a negative base (integer exponent): its term of the exponent's gradient counts log 1 = 0 (MindSpore's bprop),
    # where log of a negative base was NaN and took the whole gradient with it
    base, power = np.array([-1.0, 2.0], np.float32), np.array(2.0, np.float32)
    g = grad_graph(op_graph("Pow", [base, power], {}, [np.ones(2, np.float32)]), ["a1"])
    (dpower,) = run_graph(g, feeds_of([base, power]))[1:]
    assert float(dpower) == pytest.approx(4 * np.log(2.0), rel=1e-6)


def test_mixed_dtypes_promote_like_mindspore():
    x, k = rand(2, 3), np.arange(3, dtype=np.int32)
    (got,) = check_forward("Mul", [x, k], {}, lambda a, b: a * b.astype(np.float32))
    assert got.dtype == np.float32
    check_grad("Mul", [x, k], {}, lambda a, b: a * b, wrt=[0])
    # uint8 ranks below every signed integer (it used to win and wrap: int32 1000 + uint8 200 gave uint8 176)
    big, small = np.array([1000, -5], np.int32), np.array([200, 100], np.uint8)
    (got,) = check_forward("Add", [big, small], {}, lambda a, b: a.astype(np.int64) + b)
    assert got.dtype == np.int32 and got.tolist() == [1200, 95]
    (got,) = check_forward("Add", [np.array([-100], np.int8), small[:1]], {}, lambda a, b: a.astype(np.int16) + b)
    assert got.dtype == np.int16 and got.tolist() == [100]  # int8 and uint8 meet in int16


@pytest.mark.parametrize(
    "op,fn,low,f64",
    [
        ("Neg", np.negative, -2, True),
        ("Abs", np.abs, -2, True),
        ("Sqrt", np.sqrt, 0.2, True),
        ("Rsqrt", lambda x: 1 / np.sqrt(x), 0.2, True),
        ("Square", np.square, -2, True),
        ("Reciprocal", np.reciprocal, 0.3, True),
        ("Exp", np.exp, -2, True),
        ("Log", np.log, 0.2, True),
        ("Sin", np.sin, -2, True),
        ("Cos", np.cos, -2, True),
        ("Erf", erf, -2, False),  # ONNX Runtime has no float64 Erf
    ],
)
def test_unary(op, fn, low, f64):
    x = rand(3, 4, low=low)
    if op == "Abs":
        x[np.abs(x) < 0.1] = 0.5  # |x| has no derivative at 0
    check_forward(op, [x], {}, fn, rtol=2e-5)
    if f64:
        check_grad(op, [x], {}, fn)
    else:
        check_grad(op, [x], {}, fn, dtype=np.float32, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("op,fn", [("Sign", np.sign), ("Floor", np.floor), ("Ceil", np.ceil), ("Round", np.round)])
def test_piecewise_constant_ops_have_zero_gradient(op, fn):
    x = rand(5) + 0.25
    check_forward(op, [x], {}, fn)
    check_grad(op, [x], {}, fn)


@pytest.mark.parametrize(
    "op,fn",
    [
        ("Equal", np.equal),
        ("NotEqual", np.not_equal),
        ("Less", np.less),
        ("LessEqual", np.less_equal),
        ("Greater", np.greater),
        ("GreaterEqual", np.greater_equal),
    ],
)
def test_comparisons_return_bool(op, fn):
    a = np.array([[1, 2, 3], [3, 2, 1]], np.float32)
    b = np.array([2, 2, 2], np.float32)
    (got,) = check_forward(op, [a, b], {}, fn)
    assert got.dtype == np.bool_


def test_logical_ops():
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    check_forward("LogicalAnd", [a, b], {}, np.logical_and)
    check_forward("LogicalOr", [a, b], {}, np.logical_or)
    check_forward("LogicalNot", [a], {}, np.logical_not)


def test_select_broadcasts_and_routes_gradient():
    cond = rng.random((2, 3)) < 0.5
    x, y = rand(2, 3), rand(3)
    check_forward("Select", [cond, x, y], {}, np.where)
    check_grad("Select", [cond, x, y], {}, np.where)


def test_cast_and_its_gradient():
    x = rand(4)
    check_forward("Cast", [x], {"dtype": "float64"}, lambda a: a.astype(np.float64))
    check_forward("Cast", [x * 3], {"dtype": "int32"}, lambda a: a.astype(np.int32))
    check_grad("Cast", [x], {"dtype": "float64"}, lambda a: a.astype(np.float64), dtype=np.float32, rtol=1e-4)


def test_stop_gradient_blocks_the_gradient():
    x = rand(3)
    check_forward("StopGradient", [x], {}, lambda a: a)
    check_grad("StopGradient", [x], {}, lambda a: np.zeros_like(a) + 0 * a)
