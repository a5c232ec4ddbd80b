"""Building graphs: `GraphBuilder` records nodes; `SymbolicTensor` is the tensor user code and gradient rules see.

`apply(op, *inputs, **attrs)` is the one entry point that emits a node: it turns Python scalars and numpy arrays
into constants (scalars are weak: `x * 2.0` stays in x's dtype), runs the op's shape inference, records the user's
file:line, and returns SymbolicTensors. Tracing, autodiff and the optimizers all build graphs through it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tessel.compiler import registry
from tessel.compiler.dtypes import DType, as_dtype, promote, scalar_dtype
from tessel.compiler.errors import DataDependentError, ShapeInferenceError, TraceError
from tessel.compiler.ir import Attrs, ConstArray, Graph, Node, Recompute, TensorType, Value, new_value


class GraphBuilder:
    """Collects inputs and nodes; `build(outputs)` returns the immutable Graph (dead nodes pruned).

    `recompute` (a `Recompute` or None) is stamped on every node emitted while it is set: the tracer sets it inside
    a recomputed cell, the parallel pass while it writes a recomputed node's rank-local ops."""

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.recompute: Recompute | None = None
        self._constants: dict[tuple, Value] = {}
        # Computes a value recorded so far, for Python code that reads it while it is traced (a PYNATIVE_MODE
        # gradient function runs its Python at every call, as MindSpore's does); None where nothing can (a graph).
        self.reader: Callable[[Value], np.ndarray] | None = None

    @classmethod
    def extend(cls, graph: Graph) -> GraphBuilder:
        """A builder that starts from an existing graph's inputs and nodes (autodiff, train steps)."""
        builder = cls(graph.name)
        builder.inputs = list(graph.inputs)
        builder.nodes = list(graph.nodes)
        return builder

    def add_input(self, name: str, shape: Sequence[Any], dtype: DType | str) -> SymbolicTensor:
        if any(v.name == name for v in self.inputs):
            raise TraceError(f"graph {self.name!r} already has an input named {name!r}; input names must be unique")
        value = new_value(shape, dtype, name)
        self.inputs.append(value)
        return SymbolicTensor(self, value)

    def emit(self, op: str, inputs: Sequence[Value], attrs: dict[str, Any] | Attrs | None = None) -> tuple[Value, ...]:
        """Append one node of `op` and return its outputs; inference errors name the op, inputs and location."""
        opdef = registry.get(op)
        where = user_location()
        try:
            frozen = attrs if isinstance(attrs, Attrs) else opdef.bind(attrs or {})
            opdef.check_arity(len(inputs))
            types = opdef.infer(tuple(v.type for v in inputs), frozen)
        except ShapeInferenceError as err:
            shown = ", ".join(repr(v.type) for v in inputs)
            at = f" at {where}" if where else ""
            raise ShapeInferenceError(f"{op}({shown}){at}: {err}") from None
        outputs = tuple(Value(t) for t in types)
        recompute = self.recompute if inputs else None  # a constant costs nothing to keep
        self.nodes.append(Node(op, tuple(inputs), frozen, outputs, where, recompute))
        return outputs

    def constant(self, value: Any, dtype: DType | None = None) -> Value:
        """A constant tensor; equal constants are emitted once."""
        frozen = ConstArray.of(value, dtype)
        key = (frozen.dtype, frozen.shape, frozen.data)
        if key not in self._constants:
            (self._constants[key],) = self.emit("Constant", (), {"value": frozen})
        return self._constants[key]

    def build(self, outputs: Sequence[Value], name: str | None = None) -> Graph:
        """The Graph computing `outputs`; nodes nothing needs are dropped unless they have side effects (Assign)."""
        needed = set(outputs)
        for node in self.nodes:
            if registry.get(node.op).side_effect:
                needed.update(node.outputs)
        kept = []
        for node in reversed(self.nodes):
            if any(o in needed for o in node.outputs):
                kept.append(node)
                needed.update(node.inputs)
        return Graph(tuple(self.inputs), tuple(reversed(kept)), tuple(outputs), name or self.name)

    def readout(self, value: Value) -> Graph:
        """The graph computing `value` from the nodes recorded so far, without their side effects: an Assign passes
        its value on, so that reading a value in Python writes no parameter (the traced graph does, once)."""
        needed, kept = {value}, []
        for node in reversed(self.nodes):
            if not any(o in needed for o in node.outputs):
                continue
            if registry.get(node.op).side_effect:
                node = Node("Depend", node.inputs[1:], registry.get("Depend").bind({}), node.outputs, node.source)
            kept.append(node)
            needed.update(node.inputs)
        inputs = tuple(v for v in self.inputs if v in needed)
        return Graph(inputs, tuple(reversed(kept)), (value,), f"{self.name}/read")


class SymbolicTensor:
    """A tensor whose value is known only when the graph runs. Supports Python operators and a few methods."""

    __slots__ = ("builder", "value")
    __array_ufunc__ = None  # `ndarray * tensor` defers to our reflected operators instead of converting us

    def __init__(self, builder: GraphBuilder, value: Value):
        self.builder, self.value = builder, value

    shape = property(lambda self: self.value.shape)
    dtype = property(lambda self: self.value.dtype)
    ndim = property(lambda self: self.value.ndim)

    def __repr__(self) -> str:
        return f"SymbolicTensor({self.value.type!r})"

    __hash__ = object.__hash__

    # Arithmetic and comparison operators emit ops; comparisons return bool tensors (MindSpore semantics).
    def __add__(self, o):
        return apply("Add", self, o)

    def __radd__(self, o):
        return apply("Add", o, self)

    def __sub__(self, o):
        return apply("Sub", self, o)

    def __rsub__(self, o):
        return apply("Sub", o, self)

    def __mul__(self, o):
        return apply("Mul", self, o)

    def __rmul__(self, o):
        return apply("Mul", o, self)

    def __truediv__(self, o):
        return apply("Div", self, o)

    def __rtruediv__(self, o):
        return apply("Div", o, self)

    def __pow__(self, o):
        return apply("Pow", self, o)

    def __rpow__(self, o):
        return apply("Pow", o, self)

    def __matmul__(self, o):
        return apply("MatMul" if self.ndim == 2 and _ndim(o) == 2 else "BatchMatMul", self, o)

    def __rmatmul__(self, o):
        return apply("MatMul" if self.ndim == 2 and _ndim(o) == 2 else "BatchMatMul", o, self)

    def __neg__(self):
        return apply("Neg", self)

    def __abs__(self):
        return apply("Abs", self)

    def __lt__(self, o):
        return apply("Less", self, o)

    def __le__(self, o):
        return apply("LessEqual", self, o)

    def __gt__(self, o):
        return apply("Greater", self, o)

    def __ge__(self, o):
        return apply("GreaterEqual", self, o)

    def __eq__(self, o):  # type: ignore[override]
        return apply("Equal", self, o)

    def __ne__(self, o):  # type: ignore[override]
        return apply("NotEqual", self, o)

    def __and__(self, o):
        return apply("LogicalAnd", self, o)

    def __or__(self, o):
        return apply("LogicalOr", self, o)

    def __invert__(self):
        return apply("LogicalNot", self)

    def __getitem__(self, key):
        from tessel.compiler.indexing import getitem

        return getitem(self, key)

    def reshape(self, *shape):
        return apply("Reshape", self, shape=_varargs(shape))

    def transpose(self, *perm):
        return apply("Transpose", self, perm=_varargs(perm) or tuple(reversed(range(self.ndim))))

    def sum(self, axis=None, keepdims: bool = False):
        return apply("ReduceSum", self, axis=axis, keep_dims=keepdims)

    def mean(self, axis=None, keepdims: bool = False):
        return apply("ReduceMean", self, axis=axis, keep_dims=keepdims)

    def max(self, axis=None, keepdims: bool = False):
        return apply("ReduceMax", self, axis=axis, keep_dims=keepdims)

    def astype(self, dtype):
        dtype = as_dtype(dtype)
        return self if dtype == self.dtype else apply("Cast", self, dtype=dtype)

    # A graph cannot branch on or read a value it has not computed yet; a trace with a reader computes it now.
    def read(self, what: str) -> np.ndarray:
        """The value, for Python code that reads it: `what` says how, for the error where it cannot be read."""
        if self.builder.reader is None:
            raise _data_dependent(self, what)
        return self.builder.reader(self.value)

    def __bool__(self):
        return bool(self.read(AS_BOOL))

    def __int__(self):
        return int(self.read("converted with int()").item())

    def __float__(self):
        return float(self.read("converted with float()").item())

    def __index__(self):
        return int(self.read("used as a Python index").item())

    def __array__(self, dtype=None, copy=None):
        array = self.read("converted to a numpy array")
        return array if dtype is None else array.astype(dtype)

    def item(self):
        return self.read("read with .item()").item()

    def asnumpy(self):
        return self.read("read with .asnumpy()")

    def __len__(self) -> int:
        if not self.shape or not isinstance(self.shape[0], int):
            raise _data_dependent(self, "asked for len() of a scalar or symbolic dim")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _varargs(args: tuple) -> tuple:
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def _ndim(x: Any) -> int:
    return x.ndim if isinstance(x, SymbolicTensor) else np.ndim(x)


AS_BOOL = "used as a Python bool (if/while/and/or/not)"


def _data_dependent(tensor: SymbolicTensor, what: str) -> DataDependentError:
    where = user_location(with_code=True) or "an unknown location"
    return DataDependentError(
        f"a traced tensor {tensor.value.type!r} was {what} at {where}. In graph mode a tensor's value is known "
        "only when the graph runs, so Python control flow cannot depend on it. Fix: choose element-wise with "
        "ops.Select (where), make the condition depend on shapes or Python values, or run in PYNATIVE_MODE, where "
        "gradient functions (value_and_grad, grad, GradOperation) and TrainOneStepCell / Model.train steps in feed "
        "mode run their Python at every call (ms.jit compiles once in both modes)."
    )


# --- applying ops -------------------------------------------------------------------------------------------------

_state = threading.local()


def current_builder() -> GraphBuilder | None:
    """The builder of the innermost active trace on this thread (see tracer.trace), or None."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


def push_builder(builder: GraphBuilder) -> None:
    if not hasattr(_state, "stack"):
        _state.stack = []
    _state.stack.append(builder)


def pop_builder(builder: GraphBuilder) -> None:
    assert _state.stack and _state.stack[-1] is builder, "trace builders popped out of order"
    _state.stack.pop()


def apply_all(op: str, *inputs: Any, **attrs: Any) -> tuple[SymbolicTensor, ...]:
    """Emit `op` on the inputs' graph and return every output (see module docstring for scalar handling)."""
    symbolic = [x for x in inputs if isinstance(x, SymbolicTensor)]
    builder = symbolic[0].builder if symbolic else current_builder()
    if builder is None:
        raise TraceError(f"{op} was applied outside a trace and without a symbolic input; call it inside trace()")
    if any(x.builder is not builder for x in symbolic):
        raise TraceError(
            f"{op} mixes tensors of two different traces (a tensor captured from an outer trace?); "
            "pass it in as an argument instead"
        )
    partner = None
    for x in symbolic:
        partner = x.dtype if partner is None else promote(partner, x.dtype)
    values = [_as_value(builder, x, partner) for x in inputs]
    return tuple(SymbolicTensor(builder, v) for v in builder.emit(op, values, attrs))


def apply(op: str, *inputs: Any, **attrs: Any) -> Any:
    """Like apply_all, but a single-output op returns its one SymbolicTensor."""
    outs = apply_all(op, *inputs, **attrs)
    return outs[0] if len(outs) == 1 else outs


def _as_value(builder: GraphBuilder, x: Any, partner: DType | None) -> Value:
    if isinstance(x, SymbolicTensor):
        return x.value
    if isinstance(x, (bool, int, float)):
        return builder.constant(x, scalar_dtype(x, partner))
    if isinstance(x, (np.ndarray, np.generic)):
        return builder.constant(x)
    if isinstance(x, (list, tuple)):
        return builder.constant(np.asarray(x))
    raise TraceError(f"cannot use {type(x).__name__} {x!r} as a tensor in a traced graph")


def constant_like(x: SymbolicTensor, value: Any, dtype: DType | None = None) -> SymbolicTensor:
    """A constant on x's graph (dtype defaults to x's dtype)."""
    return SymbolicTensor(x.builder, x.builder.constant(value, dtype or x.dtype))


def tensor_type(x: SymbolicTensor) -> TensorType:
    return x.value.type


# --- where the user's code is --------------------------------------------------------------------------------------


def _inside_tessel(frame) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module == "tessel" or module.startswith("tessel.")


def user_location(with_code: bool = False) -> str | None:
    """`file:line` of the innermost frame outside tessel (optionally with the source line), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _inside_tessel(frame) and not filename.startswith("<frozen"):
            where = f"{filename}:{frame.f_lineno}"
            if with_code:
                import linecache

                code = linecache.getline(filename, frame.f_lineno).strip()
                where += f" (`{code}`)" if code else ""
            return where
        frame = frame.f_back
    return None
