"""Neural-network ops: activations, Softmax / LogSoftmax, Dropout and the softmax cross-entropy losses."""

from __future__ import annotations

import math

from tessel.compiler.builder import apply as op
from tessel.compiler.dtypes import DType
from tessel.compiler.ir import TensorType
from tessel.compiler.ops.common import ZERO_GRAD, lower_as, per_element_cost, require, require_float
from tessel.compiler.registry import register
from tessel.compiler.shapes import format_shape, normalize_axis
from tessel.compiler.sharding import along_axis, einsum, pointwise


def _infer_float(types, attrs):
    require_float(types[0])
    return (types[0],)


def _activation(name: str, lower, grad, flops: int, attrs: dict | None = None, doc: str = "") -> None:
    register(
        name,
        infer=_infer_float,
        sharding=pointwise,
        lower=lower,
        grad=grad,
        cost=per_element_cost(flops),
        attrs=attrs or {},
        num_inputs=1,
        doc=doc or f"{name}(x), element-wise.",
    )


# ReLU's gradient multiplies by the mask rather than selecting: ONNX Runtime's Where is ~8x slower than Greater,
# Cast and Mul together (measured on a 256 x 512 float32 gradient: 491 against 59 us on one core), a tenth of a
# batch-256 MLP step. The two differ only where the incoming gradient is not finite and the unit is off (NaN
# instead of 0), where training has already diverged.
_activation("ReLU", lower_as("Relu"), lambda c: (c.g * op("Cast", c.out > 0.0, dtype=c.out.dtype),), 1)
_activation("Sigmoid", lower_as("Sigmoid"), lambda c: (c.g * c.out * (1.0 - c.out),), 4)
_activation("Tanh", lower_as("Tanh"), lambda c: (c.g * (1.0 - c.out * c.out),), 4)
_activation(
    "Softplus",
    lower_as("Softplus"),
    lambda c: (c.g * op("Sigmoid", c.x),),
    4,
    doc="Softplus(x) = log(1 + exp(x)), element-wise (MindSpore ops.Softplus).",
)


def _leaky_relu_grad(c):
    below = op("Select", c.x < 0.0, c.g * c.attrs["alpha"], c.g * c.attrs["zero_slope"])
    return (op("Select", c.x > 0.0, c.g, below),)


_activation(
    "LeakyReLU",
    lambda ctx, node, i, o: ctx.add("LeakyRelu", i, o, alpha=float(node.attrs["alpha"])),
    _leaky_relu_grad,
    1,
    {"alpha": 0.2, "zero_slope": 0.2},
    doc="LeakyReLU(x, alpha, zero_slope): x, alpha * x below 0; its slope at exactly 0 is zero_slope (MindSpore's "
    "ops.leaky_relu: (1 + alpha) / 2, the tie of its maximum; torch's: alpha).",
)

# GELU: "none" is exact, x * Phi(x); "tanh" is the tanh approximation (MindSpore's GeLU primitive).
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def _lower_gelu(ctx, node, inputs, outputs):
    (x,), dtype = inputs, node.inputs[0].dtype
    c = lambda v: ctx.const(v, dtype)  # noqa: E731
    if node.attrs["approximate"] == "tanh":
        cube = ctx.add1("Mul", [ctx.add1("Mul", [x, x]), x])
        inner = ctx.add1("Mul", [ctx.add1("Add", [x, ctx.add1("Mul", [cube, c(_GELU_C)])]), c(_SQRT_2_OVER_PI)])
        phi2 = ctx.add1("Add", [ctx.add1("Tanh", [inner]), c(1.0)])
    else:
        phi2 = ctx.add1("Add", [ctx.add1("Erf", [ctx.add1("Mul", [x, c(1.0 / math.sqrt(2.0))])]), c(1.0)])
    ctx.add("Mul", [ctx.add1("Mul", [x, phi2]), c(0.5)], outputs)


def _gelu_grad(c):
    x = c.x
    if c.attrs["approximate"] == "tanh":
        t = op("Tanh", _SQRT_2_OVER_PI * (x + _GELU_C * x * x * x))
        slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * x * x)
    else:
        cdf = 0.5 * (1.0 + op("Erf", x * (1.0 / math.sqrt(2.0))))
        slope = cdf + x * op("Exp", -0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return (c.g * slope,)


_activation("GELU", _lower_gelu, _gelu_grad, 8, {"approximate": "tanh"}, "GELU(x, approximate='tanh'|'none').")


def _axis(node) -> int:
    return normalize_axis(node.attrs["axis"], node.inputs[0].ndim)


def _softmax_grad(c):
    return (c.out * (c.g - op("ReduceSum", c.g * c.out, axis=c.attrs["axis"], keep_dims=True)),)


def _log_softmax_grad(c):
    return (c.g - op("Exp", c.out) * op("ReduceSum", c.g, axis=c.attrs["axis"], keep_dims=True),)


for _name, _onnx, _grad, _why in (
    ("Softmax", "Softmax", _softmax_grad, "the softmax axis"),
    ("LogSoftmax", "LogSoftmax", _log_softmax_grad, "the log-softmax axis"),
):
    register(
        _name,
        infer=_infer_float,
        sharding=along_axis(_why),
        lower=lambda ctx, node, i, o, _onnx=_onnx: ctx.add(_onnx, i, o, axis=_axis(node)),
        grad=_grad,
        cost=per_element_cost(5),
        attrs={"axis": -1},
        num_inputs=1,
        doc=f"{_name}(x, axis=-1).",
    )


# Dropout: in training, output 1 is the keep mask (bool) that the gradient reuses; ONNX Runtime draws it from a
# generator seeded by `seed`, so a given seed gives the same masks step after step in every process (and a copy of
# the node that recomputation makes draws the masks of the original: each node has its generator). ONNX Runtime's
# EliminateDropout removes a Dropout whose mask nobody reads as if it ran for inference, training or not: the CPU
# plugin disables that rewrite.
def _dropout_active(attrs) -> bool:
    return attrs["training"] and attrs["p"] > 0.0


def _infer_dropout(types, attrs):
    (x,) = types
    require_float(x)
    require(0.0 <= attrs["p"] < 1.0, f"drop probability p={attrs['p']} must be in [0, 1)")
    return (x, TensorType(x.shape, DType.bool_)) if _dropout_active(attrs) else (x,)


def _lower_dropout(ctx, node, inputs, outputs):
    if not _dropout_active(node.attrs):
        ctx.add("Identity", inputs, outputs)
        return
    ratio = ctx.const(node.attrs["p"], node.inputs[0].dtype)
    training = ctx.const(True, DType.bool_)
    keep = outputs if ctx.is_read(node.outputs[1]) else outputs[:1]  # an unread mask is never allocated
    ctx.add("Dropout", [inputs[0], ratio, training], keep, seed=int(node.attrs["seed"]))


def _dropout_grad(c):
    if not _dropout_active(c.attrs):
        return (c.g,)
    keep = op("Cast", c.outputs[1], dtype=c.x.dtype)
    return (c.g * keep * (1.0 / (1.0 - c.attrs["p"])),)


register(
    "Dropout",
    infer=_infer_dropout,
    sharding=pointwise,
    lower=_lower_dropout,
    grad=_dropout_grad,
    attrs={"p": 0.5, "seed": 0, "training": True},
    num_inputs=1,
    random=True,
    doc="Dropout(x, p=0.5, seed=0, training=True) -> (y, keep_mask) in training, (y,) otherwise.",
)


# RandomUniformLike(x): float32 numbers uniform in [0, 1), shaped like x (mint.rand and the random functions built
# on it). As Dropout's masks, ONNX Runtime draws them from a generator seeded by `seed` that goes on from run to run.
register(
    "RandomUniformLike",
    infer=lambda types, attrs: (TensorType(types[0].shape, DType.float32),),
    sharding=pointwise,
    lower=lambda ctx, node, inputs, outputs: ctx.add(
        "RandomUniformLike", inputs, outputs, dtype=1, low=0.0, high=1.0, seed=float(node.attrs["seed"])
    ),
    grad=ZERO_GRAD,
    attrs={"seed": 0},
    num_inputs=1,
    random=True,
    doc="RandomUniformLike(x, seed=0): float32 uniform numbers in [0, 1) shaped like x, new at every run.",
)


# Softmax cross-entropy per sample over the last axis. Dense labels are probabilities; sparse labels are indices.
def _infer_cross_entropy(sparse: bool):
    def infer(types, attrs):
        logits, labels = types
        require_float(logits, "logits")
        require(logits.ndim >= 1, "logits need a class dim")
        if sparse:
            require(labels.dtype.is_int, f"sparse labels must be int32/int64, got {labels.dtype.value}")
            expected = logits.shape[:-1]
        else:
            expected = logits.shape
        require(
            labels.shape == expected,
            f"labels {format_shape(labels.shape)} must have shape {format_shape(expected)} for logits "
            f"{format_shape(logits.shape)}",
        )
        return (TensorType(logits.shape[:-1], logits.dtype),)

    return infer


def _lower_cross_entropy(ctx, node, inputs, outputs):
    logits, labels = node.inputs
    log_p = ctx.add1("LogSoftmax", [inputs[0]], axis=-1)
    if labels.dtype.is_int:
        index = ctx.add1("Unsqueeze", [ctx.cast(inputs[1], labels.dtype, DType.int64), ctx.ints([-1])])
        picked = ctx.add1("GatherElements", [log_p, index], axis=logits.ndim - 1)
        ctx.add("Neg", [ctx.add1("Squeeze", [picked, ctx.ints([-1])])], outputs)
    else:
        summed = ctx.add1("ReduceSum", [ctx.add1("Mul", [inputs[1], log_p]), ctx.ints([-1])], keepdims=0)
        ctx.add("Neg", [summed], outputs)


def _cross_entropy_grad(c):
    logits, labels = c.inputs
    g = op("ExpandDims", c.g, axis=-1)
    p = op("Softmax", logits, axis=-1)
    if labels.dtype.is_int:
        # the forward's GatherElements, transposed: 1 at each label's class (any rank of labels, a symbolic class
        # count, and a negative label counted from the end as the forward counts it)
        index = op("ExpandDims", op("Cast", labels, dtype=DType.int64), axis=-1)
        ones = op("OnesLike", op("Cast", index, dtype=logits.dtype))
        target = op("ScatterAdd", op("ZerosLike", logits), index, ones, axis=logits.ndim - 1)
        return (p - target) * g, None
    return (p - labels) * g, -op("LogSoftmax", logits, axis=-1) * g


for _name, _sparse in (("SoftmaxCrossEntropy", False), ("SparseSoftmaxCrossEntropy", True)):
    register(
        _name,
        infer=_infer_cross_entropy(_sparse),
        sharding=einsum("...c,...->..." if _sparse else "...c,...c->...", fixed="c", why="the class axis", reduce=None),
        lower=_lower_cross_entropy,
        grad=_cross_entropy_grad,
        cost=per_element_cost(6),
        num_inputs=2,
        doc=f"{_name}(logits, labels) -> per-sample loss, softmax over the last axis "
        + ("(labels are class indices)." if _sparse else "(labels are probabilities)."),
    )


def _infer_bias_add(types, attrs):
    x, bias = types
    require(x.ndim >= 2, f"x {format_shape(x.shape)} needs a channel dim 1")
    require(
        bias.shape == (x.shape[1],),
        f"bias {format_shape(bias.shape)} must have x's channel count ({x.shape[1]},); the rule: bias adds along dim 1",
    )
    require(bias.dtype == x.dtype, f"bias dtype {bias.dtype.value} differs from x's {x.dtype.value}")
    return (x,)


def _lower_bias_add(ctx, node, inputs, outputs):
    x = node.inputs[0]
    shaped = ctx.add1("Reshape", [inputs[1], ctx.ints((1, -1) + (1,) * (x.ndim - 2))])
    ctx.add("Add", [inputs[0], shaped], outputs)


register(
    "BiasAdd",
    infer=_infer_bias_add,
    sharding=einsum("nc...,c->nc..."),
    lower=_lower_bias_add,
    grad=lambda c: (c.g, op("ReduceSum", c.g, axis=(0, *range(2, c.x.ndim)))),
    num_inputs=2,
    doc="BiasAdd(x, bias): adds bias along channel dim 1 (MindSpore BiasAdd, NCHW / NC).",
)
