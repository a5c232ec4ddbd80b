"""Matrix products: MatMul (2-D) and BatchMatMul (batched, batch dims broadcast), both with transpose_a/b.

Both share one contraction rule (`_contract`); their gradients are products of the same ops with flipped
transposes, so no explicit Transpose nodes appear in the backward graph (ONNX Runtime fuses the ones lowering adds).
"""

from __future__ import annotations

from tessel.compiler.builder import apply as op
from tessel.compiler.ir import Node, TensorType
from tessel.compiler.ops.common import Cost, io_bytes, operand_dtype, require
from tessel.compiler.registry import register
from tessel.compiler.shapes import broadcast, format_shape, numel
from tessel.compiler.sharding import Rule, ShardingSpec, einsum


def _contract(a: TensorType, b: TensorType, ta: bool, tb: bool) -> tuple:
    m, ka = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
    require(
        ka == kb,
        f"contraction dims differ: x {format_shape(a.shape)} (transpose_a={ta}) gives k={ka}, "
        f"y {format_shape(b.shape)} (transpose_b={tb}) gives k={kb}; the rule: x's columns must equal y's rows "
        "after the transposes. Fix: transpose an input or set transpose_a/transpose_b",
    )
    return m, n


def _infer_matmul(types, attrs):
    a, b = types
    require(a.ndim == 2 and b.ndim == 2, "MatMul takes two 2-D tensors; use BatchMatMul for batched inputs")
    m, n = _contract(a, b, attrs["transpose_a"], attrs["transpose_b"])
    return (TensorType((m, n), operand_dtype(types)),)


def _infer_batch_matmul(types, attrs):
    a, b = types
    require(a.ndim >= 2 and b.ndim >= 2, "BatchMatMul inputs need at least 2 dims")
    m, n = _contract(a, b, attrs["transpose_a"], attrs["transpose_b"])
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    return (TensorType((*batch, m, n), operand_dtype(types)),)


def _lower(ctx, node, inputs, outputs):
    dtype = node.outputs[0].dtype
    names = []
    for name, value, flag in zip(inputs, node.inputs, (node.attrs["transpose_a"], node.attrs["transpose_b"])):
        name = ctx.cast(name, value.dtype, dtype)
        if flag:
            perm = [*range(value.ndim - 2), value.ndim - 1, value.ndim - 2]
            name = ctx.add1("Transpose", [name], perm=perm)
        names.append(name)
    ctx.add("MatMul", names, outputs)


def _grad(c):
    """C = op(A) op(B): each case's dA, dB written as products with transposes (no explicit transposes)."""
    a, b = c.inputs
    g, ta, tb = c.g, c.attrs["transpose_a"], c.attrs["transpose_b"]
    name = c.node.op
    if not ta and not tb:
        return op(name, g, b, transpose_a=False, transpose_b=True), op(name, a, g, transpose_a=True, transpose_b=False)
    if not ta and tb:
        return op(name, g, b, transpose_a=False, transpose_b=False), op(name, g, a, transpose_a=True, transpose_b=False)
    if ta and not tb:
        return op(name, b, g, transpose_a=False, transpose_b=True), op(name, a, g, transpose_a=False, transpose_b=False)
    return op(name, b, g, transpose_a=True, transpose_b=True), op(name, g, a, transpose_a=True, transpose_b=True)


def _cost(node, sizes) -> Cost:
    a = node.inputs[0]
    k = a.shape[-2] if node.attrs["transpose_a"] else a.shape[-1]
    return Cost(2 * numel(node.outputs[0].shape, sizes) * numel((k,), sizes), io_bytes(node, sizes))


_EINSUM = {  # (transpose_a, transpose_b) -> equation; a split k gives partial sums
    (False, False): "mk,kn->mn",
    (False, True): "mk,nk->mn",
    (True, False): "km,kn->mn",
    (True, True): "km,nk->mn",
}


def _matmul_sharding(batched: bool) -> Rule:
    """MatMul and BatchMatMul (and so Dense): one einsum per transpose case, batch dims broadcast."""

    def rule(node: Node) -> ShardingSpec:
        equation = _EINSUM[(node.attrs["transpose_a"], node.attrs["transpose_b"])]
        if batched:
            lhs, out = equation.split("->")
            a, b = lhs.split(",")
            equation = f"...{a},...{b}->...{out}"
        return einsum(equation)(node)

    return rule


for _name, _infer, _batched in (("MatMul", _infer_matmul, False), ("BatchMatMul", _infer_batch_matmul, True)):
    register(
        _name,
        infer=_infer,
        sharding=_matmul_sharding(_batched),
        lower=_lower,
        grad=_grad,
        cost=_cost,
        attrs={"transpose_a": False, "transpose_b": False},
        num_inputs=2,
        doc=f"{_name}(x, y, transpose_a=False, transpose_b=False): matrix product of the last two dims.",
    )
