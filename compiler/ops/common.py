"""Generators shared by the op families, so that most ops are defined in one line (DTensor's pointwise style)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tessel.compiler.dtypes import DType, promote
from tessel.compiler.errors import ShapeInferenceError
from tessel.compiler.ir import Attrs, Node, TensorType
from tessel.compiler.registry import ZERO_GRAD, Cost, io_bytes, register
from tessel.compiler.shapes import broadcast_all, numel
from tessel.compiler.sharding import pointwise

__all__ = [
    "ZERO_GRAD",
    "Cost",
    "elementwise",
    "free",
    "infer_broadcast",
    "infer_same",
    "io_bytes",
    "lower_as",
    "moves_data",
    "operand_dtype",
    "per_element_cost",
    "require",
    "require_float",
]


def per_element_cost(flops: int) -> Callable:
    """`flops` per element of the larger of input 0 and output 0, plus every byte read and written."""

    def cost(node: Node, sizes) -> Cost:
        counted = node.inputs[:1] + node.outputs[:1]
        return Cost(flops * max(numel(v.shape, sizes) for v in counted), io_bytes(node, sizes))

    return cost


def moves_data(node: Node, sizes) -> Cost:
    """The cost of ops that only move or copy data: no flops, every byte read and written."""
    return Cost(0, io_bytes(node, sizes))


def free(node: Node, sizes) -> Cost:
    """The cost of ops that cost nothing at run time (constants, ordering)."""
    return Cost(0, 0)


def require(condition: bool, message: str) -> None:
    """Raise ShapeInferenceError(message) unless `condition` (the builder adds the op name and inputs)."""
    if not condition:
        raise ShapeInferenceError(message)


def require_float(t: TensorType, what: str = "input") -> None:
    require(t.dtype.is_float, f"{what} must be a float tensor, got {t.dtype.value}; Cast it to float32 first")


def operand_dtype(types: tuple[TensorType, ...]) -> DType:
    """The dtype the inputs are computed in (MindSpore implicit promotion)."""
    dtype = types[0].dtype
    for t in types[1:]:
        dtype = promote(dtype, t.dtype)
    return dtype


def infer_same(types: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    return (types[0],)


# ONNX ops without bool kernels whose bool meaning is numpy's: Add and Max are a logical or, Mul and Min an and
# (computed in uint8, then back to bool); Sub and Div of bools are refused, as numpy refuses them.
# ONNX has no bool kernel for these: bools go through uint8 (comparisons of bools, abs of a bool)
_BOOL_THROUGH_UINT8 = ("Add", "Mul", "Max", "Min", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Abs")
_NO_BOOL = ("Sub", "Div")


def infer_broadcast(result: DType | None = None, float_only: bool = False, onnx_op: str = "") -> Callable:
    """Inference for an element-wise op: broadcast shapes, promote dtypes (or return `result`, e.g. bool)."""

    def infer(types: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
        shape = broadcast_all([t.shape for t in types])
        dtype = operand_dtype(types)
        if float_only:
            require(dtype.is_float, f"inputs must be float tensors, got {dtype.value}; Cast to float32 first")
        require(
            not (dtype == DType.bool_ and onnx_op in _NO_BOOL),
            f"{onnx_op} of bool tensors is not defined; cast them to a number type first (x.astype(ms.int32))",
        )
        return (TensorType(shape, result or dtype),)

    return infer


def lower_as(onnx_op: str, promote_inputs: bool = True, **fixed: Any) -> Callable:
    """Lowering to one ONNX op of the same arity; inputs are cast to the promoted dtype when they differ."""

    def lower(ctx, node: Node, inputs: list[str], outputs: list[str]) -> None:
        dtype = operand_dtype(tuple(v.type for v in node.inputs)) if node.inputs else None
        if promote_inputs and len(node.inputs) > 1:
            inputs = [ctx.cast(name, v.dtype, dtype) for name, v in zip(inputs, node.inputs)]
        if dtype == DType.bool_ and onnx_op in _BOOL_THROUGH_UINT8:
            wide = [ctx.cast(name, DType.bool_, DType.uint8) for name in inputs]
            ctx.add("Cast", [ctx.add1(onnx_op, wide, **fixed)], outputs, to=DType.bool_.onnx)
            return
        ctx.add(onnx_op, inputs, outputs, **fixed)

    return lower


def elementwise(
    name: str,
    onnx_op: str,
    grad: Callable | None,
    arity: int,
    result: DType | None = None,
    float_only: bool = False,
    flops: int = 1,
    doc: str = "",
):
    """Register an element-wise op with broadcasting, promotion and a one-to-one ONNX lowering."""
    return register(
        name,
        infer=infer_broadcast(result, float_only, onnx_op),
        sharding=pointwise,
        lower=lower_as(onnx_op),
        grad=grad,
        cost=per_element_cost(flops),
        num_inputs=arity,
        doc=doc or f"Element-wise {name} (ONNX {onnx_op}), with broadcasting.",
    )
