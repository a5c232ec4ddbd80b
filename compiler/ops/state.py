"""Ops about order and state: Assign (write a parameter), Depend (order without data), After (order that the
runtime must keep) and GradientOf (gradients, differentiated once the graph is final).

`Assign(param, value)` returns `value` and marks it as the parameter's new value; lowering turns it into the model
output `<param>/new`, which executors bind onto the parameter's buffer (see lower_onnx.assign_output_name).
"""

from __future__ import annotations

from tessel.compiler.dtypes import DType
from tessel.compiler.errors import GradientError
from tessel.compiler.ir import Node
from tessel.compiler.ops.common import ZERO_GRAD, free, moves_data, require
from tessel.compiler.registry import REQUIRED, register
from tessel.compiler.shapes import format_shape
from tessel.compiler.sharding import ShardingSpec, depend, pointwise


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


# After(x, token): x, but only once `token` has been computed. Depend lowers to an Identity, which ONNX Runtime
# schedules wherever it likes; recomputation needs its copies to run late (after the backward pass reached them),
# so After makes the order a data edge: Reshape(x, Shape(x) + n), where n = [token[0] > token[0]] summed, is 0 for
# any token value (a NaN too), costs one element read, and no graph optimizer can prove it constant. ONNX
# Runtime's Reshape aliases its input, so x is not copied.
def _lower_after(ctx, node, inputs, outputs):
    x, token = inputs
    flat = ctx.add1("Reshape", [token, ctx.ints([-1])])
    first = ctx.cast(ctx.add1("Slice", [flat, ctx.ints([0]), ctx.ints([1])]), node.inputs[1].dtype, DType.float32)
    never = ctx.add1("Cast", [ctx.add1("Greater", [first, first])], to=DType.int64.onnx)
    zero = ctx.add1("ReduceSum", [never], keepdims=0)  # a scalar 0, also for a token with no elements
    shape = ctx.add1("Add", [ctx.add1("Shape", [x]), zero])
    ctx.add("Reshape", [x, shape], outputs)


register(
    "After",
    infer=lambda types, attrs: (types[0],),
    sharding=depend,
    lower=_lower_after,
    grad=lambda c: (c.g, None),
    cost=free,
    num_inputs=2,
    orders=True,
    doc="After(x, token): x, computed no earlier than token; unlike Depend the order survives ONNX lowering "
    "(recomputation places its copies with it).",
)


def _infer_gradient_of(types, attrs):
    loss, *wrt = types
    if attrs["seeded"]:
        require(wrt, "GradientOf(loss, *wrt, seed) needs the seed as its last input")
        seed = wrt.pop()
        require(seed == loss, f"the seed {seed!r} must have the loss's shape and dtype {loss!r}")
    require(loss.dtype.is_float, f"the loss {loss!r} must be a float tensor to differentiate")
    for w in wrt:
        require(w.dtype.is_float, f"cannot differentiate with respect to {w!r}: only float tensors have gradients")
    return tuple(wrt)


def _gradient_of_sharding(node: Node) -> ShardingSpec:
    """Each gradient has the labels of the input it is the gradient of; the parallel pass keeps their layouts."""
    inputs = tuple(tuple(f"i{k}.{d}" for d in range(v.ndim)) for k, v in enumerate(node.inputs))
    fixed = frozenset(label for labels in inputs for label in labels)
    return ShardingSpec(inputs, inputs[1 : 1 + len(node.outputs)], fixed, "a gradient", None)


def _lower_gradient_of(ctx, node, inputs, outputs):
    raise GradientError(
        "GradientOf reached ONNX lowering unexpanded; expand it first (tessel.compiler.expand_gradients, or the "
        "parallel pass, which differentiates each rank's graph)"
    )


def _gradient_of_grad(c):
    raise GradientError("a gradient of a gradient (higher-order differentiation) is not supported yet")


register(
    "GradientOf",
    infer=_infer_gradient_of,
    sharding=_gradient_of_sharding,
    lower=_lower_gradient_of,
    grad=_gradient_of_grad,
    cost=free,
    attrs={"seeded": False},
    differentiates=True,
    doc="GradientOf(loss, *wrt, [seed], seeded=False): d(loss)/d(wrt) for each wrt (seeded by `seed`, default 1). "
    "Autodiff expands it once the graph is final (expand_gradients), after the parallel pass under SEMI_AUTO.",
)


def _infer_micro_batch_end(types, attrs):
    (x,) = types
    count, index = attrs["count"], attrs["index"]
    require(
        isinstance(count, int) and isinstance(index, int) and 0 <= index < count,
        f"MicroBatchEnd index={index!r}, count={count!r}: index must lie in 0..count-1",
    )
    require(x.dtype.is_float, f"MicroBatchEnd marks a micro-batch's loss, a float tensor; got {x!r}")
    return (x,)


register(
    "MicroBatchEnd",
    infer=_infer_micro_batch_end,
    sharding=pointwise,
    lower=lambda ctx, node, inputs, outputs: ctx.add("Identity", inputs, outputs),
    grad=lambda c: (c.g,),
    cost=free,
    attrs={"index": REQUIRED, "count": REQUIRED},
    num_inputs=1,
    doc="MicroBatchEnd(loss, index, count): the identity, marking micro-batch `index` of `count`'s loss "
    "(GradAccumulation; MindSpore's `forward_end` attribute). A train step differentiates each marked loss on its "
    "own and accumulates the gradients before one reduction and one update.",
)
