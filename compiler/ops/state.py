"""Ops about order and state: Assign (write a parameter) and Depend (order without data).

`Assign(param, value)` returns `value` and marks it as the parameter's new value; lowering turns it into the model
output `<param>/new`, which executors bind onto the parameter's buffer (see lower_onnx.assign_output_name).
"""

from __future__ import annotations

from tessel.compiler.ops.common import ZERO_GRAD, free, moves_data, require
from tessel.compiler.registry import register
from tessel.compiler.shapes import format_shape
from tessel.compiler.sharding import depend, pointwise


def _infer_assign(types, attrs):
    var, value = types
    require(
        var == value,
        f"value {value!r} must have the parameter's shape and dtype {var!r}; "
        f"Cast or Reshape the value to {format_shape(var.shape)}",
    )
    return (value,)


def _lower_assign(ctx, node, inputs, outputs):
    require(node.inputs[0].name is not None, "Assign writes a parameter: its first input must be a graph input")
    ctx.add("Identity", [inputs[1]], outputs)


register(
    "Assign",
    infer=_infer_assign,
    sharding=pointwise,
    lower=_lower_assign,
    grad=ZERO_GRAD,
    cost=moves_data,
    num_inputs=2,
    writes=0,
    doc="Assign(param, value): the parameter's new value after this step; returns value.",
)
register(
    "Depend",
    infer=lambda types, attrs: (types[0],),
    sharding=depend,
    lower=lambda ctx, node, inputs, outputs: ctx.add("Identity", inputs[:1], outputs),
    grad=lambda c: (c.g,) + (None,) * (len(c.inputs) - 1),
    cost=free,
    doc="Depend(x, *deps): x, computed after deps (MindSpore ops.Depend).",
)
