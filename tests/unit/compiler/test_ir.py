"""The IR: frozen attributes, readable dumps, stable hashes, the layout slot, and the registry's contract."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

from tessel.compiler import registry
from tessel.compiler.builder import apply
from tessel.compiler.dtypes import DType
from tessel.compiler.errors import ShapeInferenceError
from tessel.compiler.ir import Attrs, ConstArray, Graph, TensorType, Value
from tessel.compiler.tracer import TensorSpec, trace


def mlp(x, w, b):
    return apply("ReLU", apply("MatMul", x, w, transpose_b=True) + b).sum(axis=1)


def traced(out_dim=4):
    return trace(mlp, TensorSpec(("N", 3)), TensorSpec((out_dim, 3)), TensorSpec((out_dim,))).graph


def test_dump_is_one_line_per_node_with_types_attrs_and_source():
    graph = traced()
    lines = graph.dump().splitlines()
    assert lines[0] == "graph mlp(%x: f32[N,3], %w: f32[4,3], %b: f32[4]) {"
    assert lines[1].startswith("  %0: f32[N,4] = MatMul(%x, %w) {transpose_a=False, transpose_b=True}   # ")
    assert lines[1].endswith(f"test_ir.py:{inspect.getsourcelines(mlp)[1] + 1}")
    assert "%2: f32[N,4] = ReLU(%1)" in lines[3]
    assert lines[-2] == "  return (%3)" and lines[-1] == "}"
    assert len(lines) == len(graph.nodes) + 3


def test_hash_is_stable_and_sensitive_to_what_matters():
    a, b = traced(), traced()
    assert a.hash == b.hash and a.dump(sources=False) == b.dump(sources=False)
    assert traced(out_dim=5).hash != a.hash  # shapes count
    other = trace(
        lambda x, w, b: apply("ReLU", apply("MatMul", x, w, transpose_b=False) + b).sum(axis=1),
        TensorSpec(("N", 3)),
        TensorSpec((3, 4)),
        TensorSpec((4,)),
    ).graph
    assert other.hash != a.hash  # attributes count


def test_constants_are_hashed_by_content():
    g1 = trace(lambda x: x * np.arange(6, dtype=np.float32), TensorSpec((6,))).graph
    g2 = trace(lambda x: x * np.arange(6, dtype=np.float32), TensorSpec((6,))).graph
    g3 = trace(lambda x: x * (np.arange(6, dtype=np.float32) + 1), TensorSpec((6,))).graph
    assert g1.hash == g2.hash != g3.hash
    assert "<f32[6] sha:" in g1.dump()


def test_attrs_are_frozen_hashable_and_sorted():
    attrs = Attrs({"shape": [2, [3, 4]], "value": np.float32(1.5), "table": np.eye(2)})
    assert attrs["shape"] == (2, (3, 4)) and isinstance(attrs["value"], float)
    assert isinstance(attrs["table"], ConstArray) and np.array_equal(attrs["table"].numpy(), np.eye(2))
    assert hash(attrs) == hash(Attrs({"table": np.eye(2), "value": 1.5, "shape": (2, (3, 4))}))
    assert list(attrs) == ["shape", "table", "value"]
    with pytest.raises(TypeError, match="cannot be frozen"):
        Attrs({"fn": print})


def test_values_carry_a_layout_slot_that_dumps_and_hashes_show():
    value = Value(TensorType((2, 3), DType.float32), "x")
    assert value.layout is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.layout = 1  # type: ignore[misc]
    sharded = dataclasses.replace(value, layout=("dp", None))
    plain, laid_out = Graph((value,), (), (value,)), Graph((sharded,), (), (sharded,))
    assert "%x: f32[2,3] @('dp', None)" in laid_out.dump()
    assert plain.hash != laid_out.hash


def test_hash_is_the_same_in_another_process():
    code = (
        "from tessel.compiler import apply, trace, TensorSpec\n"
        "def mlp(x, w, b):\n"
        "    return apply('ReLU', apply('MatMul', x, w, transpose_b=True) + b).sum(axis=1)\n"
        "print(trace(mlp, TensorSpec(('N', 3)), TensorSpec((4, 3)), TensorSpec((4,))).graph.hash)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == traced().hash


def test_every_op_defines_each_part_in_one_place():
    for name in registry.names():
        op = registry.get(name)
        assert callable(op.infer) and callable(op.lower) and callable(op.cost), name
        assert op.grad is None or op.grad is registry.ZERO_GRAD or callable(op.grad), name
        assert op.sharding is not None or op.collective is not None, f"{name} has no sharding rule"
        assert op.doc, f"{name} has no doc"
    with pytest.raises(ValueError, match="already registered"):
        registry.register("Add", infer=None, lower=None, grad=None)


def test_unknown_op_and_attribute_errors_are_clear():
    with pytest.raises(ShapeInferenceError, match=r"unknown op 'Matmul'.*MatMul"):
        trace(lambda x: apply("Matmul", x, x), TensorSpec((2, 2)))
    with pytest.raises(ShapeInferenceError, match=r"unknown attribute\(s\) \['transpose'\]; MatMul takes"):
        trace(lambda x: apply("MatMul", x, x, transpose=True), TensorSpec((2, 2)))
    with pytest.raises(ShapeInferenceError, match=r"missing required attribute\(s\) \['perm'\]"):
        trace(lambda x: apply("Transpose", x), TensorSpec((2, 2)))


def test_cost_model_counts_matmul_flops_with_symbolic_batch():
    graph = traced()
    matmul = graph.nodes[0]
    cost = registry.get("MatMul").cost(matmul, {"N": 8})
    assert cost.flops == 2 * 8 * 4 * 3
    assert cost.bytes == 4 * (8 * 3 + 4 * 3 + 8 * 4)
    with pytest.raises(ShapeInferenceError, match="symbolic dim 'N' needs a value"):
        registry.get("MatMul").cost(matmul, {})
