"""Element-wise math: arithmetic, comparisons, logic, unary functions, Select and Cast.

Gradient rules receive an autodiff.GradContext `c` (c.inputs, c.outputs, c.g = cotangent of output 0) and return
one cotangent per input in the *output's* shape; autodiff sums broadcast dims away and casts to the input dtype.
"""

from __future__ import annotations

import math

from tessel.compiler.builder import apply as op
from tessel.compiler.dtypes import DType, as_dtype
from tessel.compiler.ir import TensorType
from tessel.compiler.ops.common import (
    ZERO_GRAD,
    elementwise,
    infer_broadcast,
    infer_same,
    lower_as,
    operand_dtype,
    require,
    require_float,
)
from tessel.compiler.registry import REQUIRED, register
from tessel.compiler.shapes import broadcast_all
from tessel.compiler.sharding import pointwise


def _extremum_grad(x_wins: str):
    """Maximum/Minimum: the cotangent goes to the input that was taken, halved between the two on ties (MindSpore's
    MaximumGrad / MinimumGrad: max(x, y) at x == y gives each 0.5)."""

    def grad(c):
        x, y = c.inputs
        half = c.g * 0.5
        tie = op("Equal", x, y)
        take_x = op(x_wins, x, y)
        return (
            op("Select", take_x, c.g, op("Select", tie, half, 0.0)),
            op("Select", take_x, 0.0, op("Select", tie, half, c.g)),
        )

    return grad


def _pow_grad(c):
    x, y = c.inputs
    dx = c.g * y * x ** (y - 1.0)
    # d/dy x^y = x^y log x, defined for x > 0; only built when the exponent needs a gradient. A negative base
    # counts as 1 there (log 0), as MindSpore's bprop sets it: one negative base must not NaN a learnt exponent.
    dy = c.g * c.out * op("Log", op("Select", x < 0.0, 1.0, x)) if c.needs[1] else None
    return dx, dy


# Binary arithmetic (broadcasting, MindSpore promotion).
elementwise("Add", "Add", lambda c: (c.g, c.g), 2)
elementwise("Sub", "Sub", lambda c: (c.g, -c.g), 2)
elementwise("Mul", "Mul", lambda c: (c.g * c.inputs[1], c.g * c.inputs[0]), 2)
elementwise("Div", "Div", lambda c: (c.g / c.inputs[1], -c.g * c.out / c.inputs[1]), 2)
elementwise("Pow", "Pow", _pow_grad, 2, float_only=True, flops=4)
elementwise("Maximum", "Max", _extremum_grad("Greater"), 2)
elementwise("Minimum", "Min", _extremum_grad("Less"), 2)

# Comparisons and logic produce bool tensors; nothing flows back through them.
for _name, _onnx in [
    ("Equal", "Equal"),
    ("Less", "Less"),
    ("LessEqual", "LessOrEqual"),
    ("Greater", "Greater"),
    ("GreaterEqual", "GreaterOrEqual"),
]:
    elementwise(_name, _onnx, ZERO_GRAD, 2, result=DType.bool_)
elementwise("LogicalAnd", "And", ZERO_GRAD, 2, result=DType.bool_)
elementwise("LogicalOr", "Or", ZERO_GRAD, 2, result=DType.bool_)


def _lower_not_equal(ctx, node, inputs, outputs):
    dtype = operand_dtype(tuple(v.type for v in node.inputs))
    equal = ctx.add1("Equal", [ctx.cast(n, v.dtype, dtype) for n, v in zip(inputs, node.inputs)])
    ctx.add("Not", [equal], outputs)


register(
    "NotEqual",
    infer=infer_broadcast(result=DType.bool_),
    sharding=pointwise,
    lower=_lower_not_equal,
    grad=ZERO_GRAD,
    num_inputs=2,
    doc="Element-wise x != y (bool).",
)


def _infer_logical_not(types, attrs):
    require(types[0].dtype == DType.bool_, f"input must be bool, got {types[0].dtype.value}")
    return (types[0],)


register(
    "LogicalNot",
    infer=_infer_logical_not,
    sharding=pointwise,
    lower=lower_as("Not"),
    grad=ZERO_GRAD,
    num_inputs=1,
    doc="Element-wise not.",
)

# Unary functions: (name, ONNX op, gradient rule, float-only).
_SQRT_PI = 2.0 / math.sqrt(math.pi)
_UNARY = [
    ("Neg", "Neg", lambda c: (-c.g,), False),
    ("Abs", "Abs", lambda c: (c.g * op("Sign", c.x),), False),
    ("Sign", "Sign", ZERO_GRAD, False),
    ("Floor", "Floor", ZERO_GRAD, True),
    ("Ceil", "Ceil", ZERO_GRAD, True),
    ("Round", "Round", ZERO_GRAD, True),
    ("Sqrt", "Sqrt", lambda c: (c.g / (2.0 * c.out),), True),
    ("Square", None, lambda c: (c.g * 2.0 * c.x,), False),
    ("Reciprocal", "Reciprocal", lambda c: (-c.g * c.out * c.out,), True),
    ("Exp", "Exp", lambda c: (c.g * c.out,), True),
    ("Log", "Log", lambda c: (c.g / c.x,), True),
    ("Erf", "Erf", lambda c: (c.g * _SQRT_PI * op("Exp", -c.x * c.x),), True),
    ("Sin", "Sin", lambda c: (c.g * op("Cos", c.x),), True),
    ("Cos", "Cos", lambda c: (-c.g * op("Sin", c.x),), True),
]


def _unary_infer(float_only: bool):
    def infer(types, attrs):
        if float_only:
            require_float(types[0])
        return (types[0],)

    return infer


def _lower_square(ctx, node, inputs, outputs):
    ctx.add("Mul", [inputs[0], inputs[0]], outputs)


for _name, _onnx, _grad, _float in _UNARY:
    register(
        _name,
        infer=_unary_infer(_float),
        sharding=pointwise,
        lower=lower_as(_onnx) if _onnx else _lower_square,
        grad=_grad,
        num_inputs=1,
        doc=f"Element-wise {_name}.",
    )
register(
    "Rsqrt",
    infer=_unary_infer(True),
    sharding=pointwise,
    lower=lambda ctx, node, i, o: ctx.add("Reciprocal", [ctx.add1("Sqrt", i)], o),
    grad=lambda c: (c.g * -0.5 * c.out * c.out * c.out,),
    num_inputs=1,
    doc="Element-wise 1 / sqrt(x).",
)


def _infer_select(types, attrs):
    cond, x, y = types
    require(cond.dtype == DType.bool_, f"condition must be bool, got {cond.dtype.value}")
    return (TensorType(broadcast_all([t.shape for t in types]), operand_dtype((x, y))),)


def _lower_select(ctx, node, inputs, outputs):
    dtype = node.outputs[0].dtype
    x, y = (ctx.cast(n, v.dtype, dtype) for n, v in zip(inputs[1:], node.inputs[1:]))
    ctx.add("Where", [inputs[0], x, y], outputs)


register(
    "Select",
    infer=_infer_select,
    sharding=pointwise,
    lower=_lower_select,
    grad=lambda c: (None, op("Select", c.x, c.g, 0.0), op("Select", c.x, 0.0, c.g)),
    num_inputs=3,
    doc="Select(cond, x, y): x where cond else y, broadcasting all three (MindSpore Select / where).",
)


def _infer_cast(types, attrs):
    return (TensorType(types[0].shape, as_dtype(attrs["dtype"])),)


register(
    "Cast",
    infer=_infer_cast,
    sharding=pointwise,
    attrs={"dtype": REQUIRED},
    lower=lambda ctx, node, i, o: ctx.add("Cast", i, o, to=node.outputs[0].dtype.onnx),
    grad=lambda c: (c.g,),  # autodiff casts the cotangent back to the input dtype
    num_inputs=1,
    doc="Cast(x, dtype=...).",
)
register(
    "StopGradient",
    infer=infer_same,
    sharding=pointwise,
    lower=lower_as("Identity"),
    identity=True,
    grad=ZERO_GRAD,
    num_inputs=1,
    doc="Identity forward; no gradient flows back.",
)
