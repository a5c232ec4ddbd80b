"""Tracing SDK code: a compiler `Trace` plus the Parameters it reads and the inputs fed at each run.

Inside `with SdkTrace(...)`, SDK Tensors are backed by SymbolicTensors; every op goes through `apply_op`,
which records it in the trace (tracing) or runs it at once on the daemon's compute (eager, PYNATIVE_MODE).
Each Parameter read while tracing becomes one graph input named by its store key.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from tessel.common.dtype import default_dtype_of
from tessel.compiler import Graph, SymbolicTensor, Trace, TraceError, apply_all
from tessel.compiler.ir import Recompute
from tessel.compiler.tracer import OutputTree, flatten

_local = threading.local()


def compute_dtype() -> Any:
    """The float dtype parameters are computed in inside a cell set with `to_float` (None elsewhere)."""
    stack = getattr(_local, "float_dtypes", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def compute_in(dtype: Any) -> Iterator[None]:
    """Inside `with compute_in(dtype)`, float parameters enter ops cast to `dtype` (Cell.to_float)."""
    stack = _local.__dict__.setdefault("float_dtypes", [])
    stack.append(dtype)
    try:
        yield
    finally:
        stack.pop()


def current() -> SdkTrace | None:
    """The innermost SDK trace on this thread, or None when running eagerly."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


class SdkTrace:
    """A trace in progress: the graph builder, Parameters read (in order) and run-time inputs (learning rates)."""

    def __init__(self, name: str):
        self.trace = Trace(name)
        self.builder = self.trace.builder
        self.params: dict[int, tuple[Any, SymbolicTensor]] = {}
        # ops.assign in the trace: the value each Parameter was last given, what later reads of it see
        self.assigned: dict[int, SymbolicTensor] = {}
        # Dropout cell -> its calls so far in this graph (call_seed), outside and inside gradient functions' forwards
        self._seed_calls: dict[int, int] = {}
        self._gradient_seed_calls: dict[int, int] = {}
        self._in_gradient = False
        self._assigned_plain: set[int] = set()  # parameters assigned outside any gradient function's forward
        self._assign_index: dict[int, int] = {}  # parameter -> the builder index of its Assign node
        self.differentiated = False  # what is traced here is differentiated (a gradient function, a train step)
        self.feeders: dict[str, Callable[[], np.ndarray]] = {}
        self.after_run: list[Callable[[], None]] = []
        # A bool scalar while an update may not apply (TrainOneStepWithLossScaleCell after an overflow): the
        # optimizer's assigns keep the old values where it is false.
        self.update_gate: SymbolicTensor | None = None
        self.cells: dict[int, Any] = {}  # cells traced through: their train/eval modes select compiled entries
        # For the parallel pass (tessel.parallel): the Primitive whose call created a node, and the nodes created
        # inside a cell set with set_data_parallel(), both keyed by the node's first output (graph rewrites that
        # rename inputs or add nodes keep output Values, not Node objects).
        self.primitive_of: dict[Any, Any] = {}
        self.data_parallel: set[Any] = set()
        self.cell_stack: list[Any] = []
        # For pipeline parallel (tessel.parallel.pipeline): the physical stage of the innermost cell with a
        # pipeline_stage, the micro-batch PipelineCell is running and that cell, per node's first output.
        self.pipeline_tags: dict[Any, tuple[int | None, int | None, Any]] = {}
        self.micro: int | None = None
        self.cell_paths: dict[int, str] = {}
        # ops.Print inside the trace: each call's items (text, or the index of a printed tensor in print_values);
        # the values become extra outputs of the compiled graph, printed after each run (see compiled.Entry).
        self.prints: list[PrintCall] = []
        self.print_values: list[SymbolicTensor] = []

    def __enter__(self) -> SdkTrace:
        _route_print()
        self.trace.__enter__()
        if not hasattr(_local, "stack"):
            _local.stack = []
        _local.stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.stack.pop()
        self.trace.__exit__(*exc)

    def param(self, parameter) -> SymbolicTensor:
        """The graph input carrying `parameter` (added on first use)."""
        found = self.params.get(id(parameter))
        if found is None:
            sym = self.trace.input(parameter.key, parameter.shape, parameter.dtype)
            found = self.params[id(parameter)] = (parameter, sym)
        return found[1]

    def assign(self, parameter, value: Any) -> Any:
        """ops.assign(parameter, value) in code order, as MindSpore's side-effect ordering: later reads of the
        parameter in this graph see `value`, and where the graph assigns it twice the last write is the one kept
        (the earlier Assign becomes a plain use of its value)."""
        from tessel.compiler import registry
        from tessel.compiler.ir import Node

        if self._in_gradient and id(parameter) in self._assigned_plain:
            # the gradient's forward repeats a plain forward whose state writes (BatchNorm's moving statistics)
            # this graph made already: one update per step, as MindSpore's TrainOneStepCell gives
            return value
        previous = self.assigned.get(id(parameter))
        if previous is not None:
            nodes = self.builder.nodes
            at = self._assign_index.get(id(parameter), -1)
            candidates = [at] if 0 <= at < len(nodes) and nodes[at].outputs[0] is previous.value else range(len(nodes))
            for i in candidates:
                node = nodes[i]
                if node.op == "Assign" and node.outputs[0] is previous.value:
                    depend = registry.get("Depend").bind({})
                    nodes[i] = Node("Depend", node.inputs[1:], depend, node.outputs, node.source, node.recompute)
                    break
        self._assign_index[id(parameter)] = len(self.builder.nodes)
        out = apply_op("Assign", self.param(parameter), value)
        self.assigned[id(parameter)] = out._sym
        if not self._in_gradient:
            self._assigned_plain.add(id(parameter))
        return out

    @contextlib.contextmanager
    def gradient_forward(self) -> Iterator[None]:
        """A gradient function's forward pass is traced inside: see `assign`; and it draws the masks a forward
        traced before it in this graph drew (call_seed counts again from 0), so that the loss and the gradient
        of loss = network(x); grads = grad(network)(x) see the same Dropout masks."""
        was, differentiated = self._in_gradient, self.differentiated
        self._in_gradient, self.differentiated = True, True
        try:
            yield
        finally:
            self._in_gradient, self.differentiated = was, differentiated

    def call_seed(self, owner: Any, seed: int) -> int:
        """The seed of `owner`'s n-th call in this graph: its own for the first, then one derived from (seed, n),
        so that a Dropout cell called twice (two micro-batches, two copies) draws two masks, as it does eagerly.
        Calls inside gradient functions' forwards are counted apart: the gradient of loss = network(x);
        grads = grad(network)(x) sees the loss's masks, and two gradient calls draw two masks."""
        calls = self._gradient_seed_calls if self._in_gradient else self._seed_calls
        n = calls.get(id(owner), 0)
        calls[id(owner)] = n + 1
        return seed if n == 0 else int(np.random.default_rng((seed, n)).integers(1, 2**31 - 1))

    def note_cell(self, cell: Any) -> None:
        self.cells.setdefault(id(cell), cell)

    @contextlib.contextmanager
    def in_cell(self, cell: Any) -> Iterator[None]:
        """Ops traced inside `with trace.in_cell(cell)` belong to `cell` (Cell.set_data_parallel, Cell.recompute)."""
        self.note_cell(cell)
        self.cell_stack.append(cell)
        self.sync_recompute()
        try:
            yield
        finally:
            self.cell_stack.pop()
            self.sync_recompute()

    def call_cell(self, cell: Any, construct: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`construct(*args, **kwargs)` traced inside `cell`; a recomputed cell's output ops are then kept for the
        backward pass instead of recomputed (MindSpore's rule: the outputs of a recomputed cell are not)."""
        with self.in_cell(cell):
            first = len(self.builder.nodes)
            out = construct(*args, **kwargs)
        if cell.__dict__.get("_output_no_recompute"):
            self._keep_outputs(out, first)
        return out

    def sync_recompute(self) -> None:
        """Point the builder at the recompute mark of what is traced now (see `recompute_mark`)."""
        self.builder.recompute = self.recompute_mark()

    def recompute_mark(self) -> Recompute | None:
        """How ops traced now are recomputed: as the primitive applying them says (Primitive.recompute), else as the
        innermost cell configured by Cell.recompute says; their collectives too unless mp_comm_recompute=False."""
        cell_mode, comm = None, True
        for cell in reversed(self.cell_stack):
            mode = cell.__dict__.get("_recompute_mode")
            if mode is not None:
                cell_mode, comm = mode, cell.__dict__.get("_recompute_comm", True)
                break
        stack = _primitive_stack()
        primitive = stack[-1][0] if stack else None
        attrs = getattr(primitive, "attrs", {})
        mode = attrs.get("recompute", cell_mode)
        comm = attrs.get("recompute_comm_op", comm)
        if not mode:
            return None
        return Recompute.WITH_COMM if comm else Recompute.WITHOUT_COMM

    def _keep_outputs(self, out: Any, first: int) -> None:
        """Unmark the nodes (made since index `first`) that produce the tensors `out` holds, unless the primitive
        that made one asked for recomputation itself."""
        from tessel.common.tensor import Tensor

        leaves, _ = flatten(out)
        produced = {leaf._sym.value for leaf in leaves if isinstance(leaf, Tensor) and leaf._sym is not None}
        nodes = self.builder.nodes
        for index in range(first, len(nodes)):
            node = nodes[index]
            if node.recompute is None or not any(o in produced for o in node.outputs):
                continue
            made = self.primitive_of.get(node.outputs[0])
            if made is None or getattr(made.primitive, "attrs", {}).get("recompute") is not True:
                nodes[index] = dataclasses.replace(node, recompute=None)

    def record(self, op: str, outputs: tuple[SymbolicTensor, ...]) -> None:
        """Note which Primitive call and which data-parallel cell created the node of `outputs`."""
        if not outputs:
            return
        key = outputs[0].value
        stack = _primitive_stack()
        if stack:
            primitive, call = stack[-1]
            self.primitive_of[key] = PrimitiveCall(primitive, call, op)
        if any(getattr(cell, "_shard", None) == "data_parallel" for cell in self.cell_stack):
            self.data_parallel.add(key)
        staged = next((c for c in reversed(self.cell_stack) if getattr(c, "_pipeline_stage", -1) >= 0), None)
        if staged is not None or self.micro is not None:
            cell = staged if staged is not None else (self.cell_stack[-1] if self.cell_stack else None)
            self.pipeline_tags[key] = (None if staged is None else staged._pipeline_stage, self.micro, cell)

    @contextlib.contextmanager
    def micro_batch(self, index: int) -> Iterator[None]:
        """Ops traced inside belong to micro-batch `index` (PipelineCell)."""
        before, self.micro = self.micro, index
        try:
            yield
        finally:
            self.micro = before

    def modes(self) -> tuple:
        """(cell, its graph modes) of every cell traced through: what the graph depends on besides inputs (train or
        eval, float dtype, recompute configuration; see Cell.graph_modes)."""
        return tuple((c, c.graph_modes()) for c in self.cells.values())

    def parameters(self) -> list:
        return [p for p, _ in self.params.values()]

    def input(self, name: str, shape: tuple, dtype: Any) -> SymbolicTensor:
        return self.trace.input(name, shape, dtype)

    def run_input(self, name: str, shape: tuple, dtype: Any, feeder: Callable[[], np.ndarray]) -> SymbolicTensor:
        """An input whose value `feeder()` computes at every run (a learning rate for this step)."""
        if name in self.feeders:
            return next(SymbolicTensor(self.builder, v) for v in self.builder.inputs if v.name == name)
        self.feeders[name] = feeder
        return self.trace.input(name, shape, dtype)

    def to_symbolic(self, x: Any) -> Any:
        """An op argument as the compiler takes it: SymbolicTensor, Python scalar or numpy constant."""
        from tessel.common.parameter import Parameter
        from tessel.common.tensor import Tensor

        if isinstance(x, Parameter):
            current_value = self.assigned.get(id(x))
            if current_value is None:
                current_value = self.param(x)
            dtype = compute_dtype()
            if dtype is not None and x.dtype.is_float and x.dtype != dtype:
                return apply_all("Cast", current_value, dtype=dtype)[0]
            return current_value
        if isinstance(x, Tensor):
            if x._sym is not None:
                if x._sym.builder is not self.builder:
                    raise TraceError(
                        "a tensor traced in another function was used here; pass it in as an argument instead"
                    )
                return x._sym
            constant = x.asnumpy()
            dtype = compute_dtype()  # Cell.to_float casts a cell's Tensors too (MindSpore: its Tensor inputs)
            if dtype is not None and constant.dtype.kind == "f" and constant.dtype != dtype.numpy:
                constant = constant.astype(dtype.numpy)
            return constant
        if isinstance(x, (list, tuple)):
            if any(isinstance(i, Tensor) for i in x):
                raise TraceError("a list of tensors cannot be one op input; stack or concat them first")
            return np.asarray(x, dtype=default_dtype_of(x))
        return x

    def print_call(self, args: tuple, python: bool = False) -> None:
        """Record ops.Print(*args), or with `python` a print() call: strings and numbers as text, Tensors and
        Parameters as the values they hold when the graph runs, printed after each run."""
        from tessel.common.tensor import Tensor

        items: list[tuple[str, Any]] = []
        for arg in args:
            if _runs_in_graph(arg):
                items.append(("tensor", len(self.print_values)))
                self.print_values.append(self.to_symbolic(arg))
            else:
                items.append(("text", Tensor.__repr__(arg) if isinstance(arg, Tensor) else str(arg)))
        self.prints.append(PrintCall(items, python))

    def build(self, outputs: Any, with_prints: bool = False) -> tuple[Graph, OutputTree]:
        """The graph of `outputs` (nested tuples/lists/dicts of Tensors or numbers) and their nesting; with
        `with_prints`, the values ops.Print printed follow as extra graph outputs (not in the tree)."""
        leaves, tree = flatten(outputs)
        if with_prints:
            leaves = [*leaves, *(_tensor_of(v) for v in self.print_values)]
        values = []
        for leaf in leaves:
            sym = self.to_symbolic(leaf)
            if isinstance(sym, SymbolicTensor):
                values.append(sym.value)
            elif isinstance(sym, (bool, int, float, np.ndarray, np.generic)):
                values.append(self.builder.constant(sym))
            else:
                raise TraceError(f"a traced function returned {type(leaf).__name__}; return tensors or numbers")
        return self.builder.build(values), tree


class PrintCall(NamedTuple):
    """One print of a traced graph: its items, ("text", str) or ("tensor", index into print_values), and whether
    Python's print() made it (MindSpore's graph mode runs it as ops.Print)."""

    items: list[tuple[str, Any]]
    python: bool


def _runs_in_graph(arg: Any) -> bool:
    """A traced Tensor or a Parameter: its value is the graph's, known when it runs."""
    from tessel.common.parameter import Parameter
    from tessel.common.tensor import Tensor

    return isinstance(arg, Parameter) or (isinstance(arg, Tensor) and arg._sym is not None)


_builtin_print = builtins.print


def _print(*args: Any, sep: str | None = " ", end: str | None = "\n", file: Any = None, flush: bool = False) -> None:
    """builtins.print once a graph was traced: inside a graph-mode trace a print() of traced tensors runs as
    ops.Print does, at every run of the graph with the values it computes, as MindSpore's graph mode runs it; a
    trace that computes values when read (a PYNATIVE gradient function's) and every other print are Python's."""
    trace = current()
    if trace is not None:
        _refuse_batch_dims(args)
        to_stdout = file is None or file is sys.stdout
        if to_stdout and trace.builder.reader is None and any(map(_runs_in_graph, args)):
            trace.print_call(args, python=True)
            return
    _builtin_print(*args, sep=sep, end=end, file=file, flush=flush)


def _refuse_batch_dims(value: Any) -> None:
    """A printed shape with the symbolic batch dim of a graph traced for any batch size raises as comparing it
    does, so that the graph is traced again with the call's sizes and the real shape prints."""
    from tessel.common.tensor import SymbolicDim

    if isinstance(value, SymbolicDim):
        value._unknown()
    if isinstance(value, (tuple, list)):
        for item in value:
            _refuse_batch_dims(item)


def _route_print() -> None:
    if builtins.print is _builtin_print:
        builtins.print = _print


def _tensor_of(symbolic: SymbolicTensor) -> Any:
    from tessel.common.tensor import Tensor

    return Tensor._wrap_symbolic(symbolic)


class PrimitiveCall(NamedTuple):
    """One node's creator: the Primitive, which call of a primitive it was (a counter per thread) and the op."""

    primitive: Any
    call: int
    op: str


def _primitive_stack() -> list:
    return _local.__dict__.setdefault("primitives", [])


@contextlib.contextmanager
def created_by(primitive: Any) -> Iterator[None]:
    """Ops applied inside `with created_by(primitive)` were created by calling `primitive` (its shard() strategy
    applies to them). Only the outermost primitive counts: one that calls others owns what they create."""
    stack = _primitive_stack()
    if stack:
        stack.append(stack[-1])
    else:
        _local.calls = getattr(_local, "calls", 0) + 1
        stack.append((primitive, _local.calls))
    trace = current()
    if trace is not None:
        trace.sync_recompute()
    try:
        yield
    finally:
        stack.pop()
        if trace is not None:
            trace.sync_recompute()


def apply_op(op: str, *inputs: Any, **attrs: Any) -> Any:
    """Apply registered op `op`: recorded when tracing, run now otherwise. Returns a Tensor or a tuple of them."""
    from tessel.common.tensor import Tensor

    trace = current()
    if trace is not None:
        attrs = {key: _plain_dims(value) for key, value in attrs.items()}
        outs = apply_all(op, *(trace.to_symbolic(x) for x in inputs), **attrs)
        trace.record(op, outs)
        wrapped = tuple(Tensor._wrap_symbolic(o) for o in outs)
    else:
        from tessel.common.engine import engine

        arrays = [_host(x) for x in inputs]
        result = engine().eager.run(op, *arrays, **attrs)
        wrapped = tuple(Tensor._wrap(np.asarray(r)) for r in (result if isinstance(result, tuple) else (result,)))
    return wrapped[0] if len(wrapped) == 1 else wrapped


def _plain_dims(value: Any) -> Any:
    """An op attribute with the user-facing symbolic dims of Tensor.shape (which refuse comparisons in user code)
    back as the compiler's plain symbols, which compare unequal to any number."""
    if isinstance(value, str) and type(value) is not str:
        return str(value)
    if isinstance(value, tuple):
        return tuple(_plain_dims(v) for v in value)
    if isinstance(value, list):
        return [_plain_dims(v) for v in value]
    return value


def _host(x: Any) -> Any:
    from tessel.common.tensor import Tensor

    if isinstance(x, Tensor):
        array = x.asnumpy()
        dtype = compute_dtype()  # inside Cell.to_float: its Parameters and Tensors computed in that dtype
        return array.astype(dtype.numpy) if dtype is not None and array.dtype.kind == "f" else array
    if isinstance(x, np.generic):
        return np.asarray(x)
    if isinstance(x, (list, tuple)):
        return np.asarray(x, dtype=default_dtype_of(x))
    return x
