"""Lowering a Graph to an ONNX model (opset 18), generic over the op registry.

Each node's `OpDef.lower(ctx, node, inputs, outputs)` appends ONNX nodes through the `LoweringContext`, which
hands out fresh names, deduplicated constant initializers, casts, and runtime shape tensors for shapes that hold
symbolic dims (read from the graph input that carries the symbol, so one model serves every batch size).

State writes: every `Assign(param, value)` node becomes an extra model output named `<param>/new`
(`assign_output_name`), which executors bind onto the parameter's buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tessel.compiler import registry
from tessel.compiler.dtypes import DType
from tessel.compiler.ir import Graph, Node, Value
from tessel.compiler.shapes import Dim

OPSET = 18
# ONNX Runtime 1.17+ reads IR version 8 models at opset 18; newer onnx packages would stamp a version it rejects.
IR_VERSION = 8
ASSIGN_SUFFIX = "/new"
# Model metadata asking the runtime to run nodes in the order they are written wherever the data allows (ONNX
# Runtime's priority-based order, Kahn's algorithm by node index) rather than its default depth-first order from
# the outputs: set on models holding ops that order the graph (After), so that recomputed copies run where the
# backward needs them and parameter-gradient branches do not wait until the end of the backward pass.
EXECUTION_ORDER = "tessel.execution_order"
PRIORITY_ORDER = "priority"


def assign_output_name(param_name: str) -> str:
    """The ONNX output carrying the new value of parameter `param_name` (from an Assign node)."""
    return param_name + ASSIGN_SUFFIX


class LoweringContext:
    """What an op's `lower` function uses to emit ONNX. All names are strings in the ONNX graph."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._constants: dict[tuple, str] = {}
        self._counter = 0
        self._symbol_dims: dict[str, str] = {}
        # Each symbolic dim is read at run time from the first graph input that has it.
        self._symbol_sources: dict[str, tuple[str, int]] = {}
        for v in graph.inputs:
            for axis, d in enumerate(v.shape):
                if isinstance(d, str):
                    self._symbol_sources.setdefault(d, (v.name, axis))

    @cached_property
    def _read(self) -> set[Value]:
        return {v for n in self.graph.nodes for v in n.inputs} | set(_output_values(self.graph))

    def is_read(self, value: Value) -> bool:
        """Whether some node or model output reads `value`: an op may leave an optional output nobody reads out
        of its ONNX node, and ONNX Runtime then never allocates it (it keeps unread outputs until the run ends)."""
        return value in self._read

    def fresh(self, hint: str = "t") -> str:
        self._counter += 1
        return f"_{hint}{self._counter}"

    def add(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | int = 1, **attrs: Any) -> list[str]:
        """Append one ONNX node; `outputs` is a list of names or a count of fresh names. Returns output names."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)] if isinstance(outputs, int) else list(outputs)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names

    def add1(self, op_type: str, inputs: Sequence[str], output: str | None = None, **attrs: Any) -> str:
        """Like add, for a node with one output."""
        return self.add(op_type, inputs, [output] if output else 1, **attrs)[0]

    def const(self, value: Any, dtype: DType | None = None) -> str:
        """A constant initializer (deduplicated)."""
        arr = np.asarray(value, dtype=None if dtype is None else dtype.numpy)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._constants:
            name = self.fresh("const")
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._constants[key] = name
        return self._constants[key]

    def ints(self, values: Sequence[int]) -> str:
        """A 1-D int64 constant (axes, pads, static shapes)."""
        return self.const(np.asarray(list(values), dtype=np.int64).reshape(-1))

    def cast(self, name: str, src: DType, dst: DType) -> str:
        return name if src == dst else self.add1("Cast", [name], to=dst.onnx)

    def dim(self, d: Dim) -> str:
        """A 1-element int64 tensor holding dim `d` (read from a graph input's shape when symbolic)."""
        if isinstance(d, int):
            return self.ints([d])
        if d not in self._symbol_dims:
            if d not in self._symbol_sources:
                raise ValueError(f"symbolic dim {d!r} does not appear in any input of graph {self.graph.name!r}")
            source, axis = self._symbol_sources[d]
            self._symbol_dims[d] = self.add1("Shape", [source], start=axis, end=axis + 1)
        return self._symbol_dims[d]

    def shape(self, dims: Sequence[Dim]) -> str:
        """A 1-D int64 tensor of `dims`; static runs become one constant, symbols are read at run time."""
        if all(isinstance(d, int) for d in dims):
            return self.ints(dims)
        parts, run = [], []
        for d in dims:
            if isinstance(d, int):
                run.append(d)
                continue
            if run:
                parts.append(self.ints(run))
                run = []
            parts.append(self.dim(d))
        if run:
            parts.append(self.ints(run))
        return parts[0] if len(parts) == 1 else self.add1("Concat", parts, axis=0)

    def full(self, dims: Sequence[Dim], value: Any, dtype: DType) -> str:
        """A tensor of shape `dims` filled with `value` (symbolic dims read at run time)."""
        if all(isinstance(d, int) for d in dims) and np.prod(dims) <= 16:
            return self.const(np.full(tuple(dims), value, dtype=dtype.numpy))
        fill = numpy_helper.from_array(np.full((1,), value, dtype=dtype.numpy))
        return self.add1("ConstantOfShape", [self.shape(dims)], value=fill)

    def count(self, dims: Sequence[Dim], dtype: DType) -> str:
        """A scalar of `dtype` holding the product of `dims` (symbols read at run time)."""
        static = int(np.prod([d for d in dims if isinstance(d, int)], dtype=np.int64))
        symbols = [d for d in dims if isinstance(d, str)]
        if not symbols:
            return self.const(np.asarray(static, dtype=dtype.numpy))
        total = self.add1("ReduceProd", [self.shape(symbols)], keepdims=0)
        total = self.cast(total, DType.int64, dtype)
        return self.add1("Mul", [total, self.const(np.asarray(static, dtype=dtype.numpy))]) if static != 1 else total


def _value_info(name: str, value: Value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, value.dtype.onnx, list(value.shape))


def to_onnx(graph: Graph, opset: int = OPSET) -> onnx.ModelProto:
    """Lower `graph` to an ONNX model. Inputs keep their names; outputs are named by `output_names(graph)`."""
    ctx = LoweringContext(graph)
    names: dict[Value, str] = {v: v.name for v in graph.inputs}
    wanted = list(zip(output_names(graph), _output_values(graph)))
    # A node output that is a model output takes the output's name directly (no Identity needed).
    direct = {}
    for name, value in wanted:
        direct.setdefault(value, name)
    # So does a value written to a parameter ("<param>/new"): its other readers then read the new value where it is
    # written, instead of ONNX Runtime keeping it in a temporary and copying it out with an Identity (measured: two
    # temporaries of every moment of an Adam update, and a copy each).
    written = _directly_written(graph, direct)
    new_names = {node.inputs[1]: name for node, name in written.items()}
    for i, node in enumerate(graph.nodes):
        if node in written:
            names[node.outputs[0]] = names[node.inputs[1]]
            continue
        for j, out in enumerate(node.outputs):
            default = f"{node.op.lower()}_{i}" + (f"_{j}" if len(node.outputs) > 1 else "")
            names[out] = direct.get(out) or new_names.get(out) or default
        _lower_node(ctx, node, names)

    outputs = []
    for name, value in wanted:
        if names[value] != name:  # a graph input returned as is, or one value returned twice
            ctx.add("Identity", [names[value]], [name])
        outputs.append(_value_info(name, value))
    inputs = [_value_info(v.name, v) for v in graph.inputs]
    onnx_graph = helper.make_graph(ctx.nodes, graph.name, inputs, outputs, ctx.initializers)
    model = helper.make_model(
        onnx_graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tessel", ir_version=IR_VERSION
    )
    if any(registry.get(node.op).orders for node in graph.nodes):
        helper.set_model_props(model, {EXECUTION_ORDER: PRIORITY_ORDER})
    return model


def _directly_written(graph: Graph, direct: dict[Value, str]) -> dict[Node, str]:
    """Assign nodes whose value can carry the output name "<param>/new" itself: computed by a node of this graph,
    written once, and no model output of its own."""
    produced = {out for node in graph.nodes if not registry.get(node.op).side_effect for out in node.outputs}
    uses: dict[Value, int] = {}
    for node in _assign_nodes(graph):
        uses[node.inputs[1]] = uses.get(node.inputs[1], 0) + 1
    return {
        node: assign_output_name(node.inputs[0].name)
        for node in _assign_nodes(graph)
        if node.inputs[1] in produced and node.inputs[1] not in direct and uses[node.inputs[1]] == 1
    }


def output_names(graph: Graph) -> list[str]:
    """ONNX output names: `out<i>` (or the Value's name) for graph outputs, then `<param>/new` per Assign."""
    names = [v.name or f"out{i}" for i, v in enumerate(graph.outputs)]
    names += [assign_output_name(node.inputs[0].name) for node in _assign_nodes(graph)]
    if len(set(names)) != len(names):
        raise ValueError(f"graph {graph.name!r} has duplicate output names {names} (a parameter assigned twice?)")
    return names


def _assign_nodes(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if registry.get(n.op).side_effect]


def _output_values(graph: Graph) -> list[Value]:
    return list(graph.outputs) + [n.outputs[0] for n in _assign_nodes(graph)]


def _lower_node(ctx: LoweringContext, node: Node, names: dict[Value, str]) -> None:
    opdef = registry.get(node.op)
    before = len(ctx.nodes)
    opdef.lower(ctx, node, [names[v] for v in node.inputs], [names[v] for v in node.outputs])
    for index, proto in enumerate(ctx.nodes[before:], before):
        # runtime errors quote the node's name: it says which tessel op, made where, the failing node belongs to
        proto.name = f"{node.op}#{index}" + (f"@{node.source}" if node.source else "")
        if node.source:
            proto.doc_string = node.source


def model_bytes(graph: Graph) -> bytes:
    """Serialized ONNX model of `graph`, cached by graph hash (lowering is deterministic)."""
    key = graph.hash
    cached = _BYTES_CACHE.get(key)
    if cached is None:
        cached = to_onnx(graph).SerializeToString()
        if len(_BYTES_CACHE) >= 256:
            _BYTES_CACHE.pop(next(iter(_BYTES_CACHE)))
        _BYTES_CACHE[key] = cached
    return cached


_BYTES_CACHE: dict[str, bytes] = {}
