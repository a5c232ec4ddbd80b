"""Tensors made from nothing or from another's shape: Constant, Fill, Zeros, Ones, ZerosLike, OnesLike."""

from __future__ import annotations

from onnx import numpy_helper

from tessel.compiler.dtypes import DType, as_dtype
from tessel.compiler.ir import TensorType
from tessel.compiler.ops.common import ZERO_GRAD, free
from tessel.compiler.registry import REQUIRED, register
from tessel.compiler.shapes import as_shape
from tessel.compiler.sharding import pointwise, replicated


def _infer_constant(types, attrs):
    value = attrs["value"]
    return (TensorType(value.shape, value.dtype),)


register(
    "Constant",
    infer=_infer_constant,
    sharding=replicated,
    lower=lambda ctx, node, i, o: ctx.add(
        "Constant", [], o, value=numpy_helper.from_array(node.attrs["value"].numpy())
    ),
    grad=ZERO_GRAD,
    cost=free,
    attrs={"value": REQUIRED},
    num_inputs=0,
    doc="Constant(value=array).",
)


def _register_fill(name: str, value: float | None) -> None:
    attrs = {"shape": REQUIRED, "dtype": DType.float32}
    if value is None:
        attrs["value"] = REQUIRED

    def infer(types, attrs):
        return (TensorType(as_shape(attrs["shape"]), as_dtype(attrs["dtype"])),)

    def lower(ctx, node, inputs, outputs):
        out = node.outputs[0]
        fill = value if value is not None else node.attrs["value"]
        ctx.add("Identity", [ctx.full(out.shape, fill, out.dtype)], outputs)

    register(
        name,
        infer=infer,
        sharding=replicated,
        lower=lower,
        grad=ZERO_GRAD,
        cost=free,
        attrs=attrs,
        num_inputs=0,
        doc=f"{name}(shape, dtype=float32" + (", value" if value is None else "") + ").",
    )


def _register_like(name: str, value: float) -> None:
    def lower(ctx, node, inputs, outputs):
        x = node.inputs[0]
        ctx.add("Identity", [ctx.full(x.shape, value, x.dtype)], outputs)

    register(
        name,
        infer=lambda types, attrs: (types[0],),
        sharding=pointwise,
        lower=lower,
        grad=ZERO_GRAD,
        cost=free,
        num_inputs=1,
        doc=f"{name}(x): a tensor of x's shape and dtype filled with {value}.",
    )


_register_fill("Fill", None)
_register_fill("Zeros", 0)
_register_fill("Ones", 1)
_register_like("ZerosLike", 0)
_register_like("OnesLike", 1)
