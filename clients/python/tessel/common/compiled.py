"""Compiled SDK functions: traced once per input signature, compiled into a daemon segment, run with one Execute.

A signature is the (shape, dtype) of every tensor argument plus the Python values of the others. The batch dim
is symbolic ("N") for every argument whose dim 0 equals the first argument's, so one graph serves every batch
size; a function that needs static shapes (slicing the batch, splitting it) is retraced with exact shapes, once.

Results come back to the client, except those a function marks as device results (gradients): these stay in the
daemon's store as handle Tensors under fixed names, which the next call overwrites (a still-referenced handle is
first copied aside on the daemon, see Engine.execute).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessel.common import parameter as P
from tessel.common import partition
from tessel.common.engine import engine, program
from tessel.common.support import log_once
from tessel.common.tensor import Tensor
from tessel.common.tracing import SdkTrace
from tessel.compiler import Graph, Node, Value, expand_gradients, registry
from tessel.compiler.ir import Attrs
from tessel.compiler.tracer import OutputTree, flatten
from tessel.core.errors import ConfigurationError, NotSupportedYetError

BATCH = "N"


# --- graph helpers ----------------------------------------------------------------------------------------------


def name_outputs(graph: Graph, names: Sequence[str]) -> Graph:
    """`graph` whose outputs are named `names` (each through an Identity, which ONNX Runtime removes)."""
    nodes, outputs = list(graph.nodes), []
    for value, name in zip(graph.outputs, names):
        named = Value(value.type, name)
        nodes.append(Node("Identity", (value,), Attrs({}), (named,)))
        outputs.append(named)
    return Graph(graph.inputs, tuple(nodes), tuple(outputs), graph.name)


def rename_inputs(graph: Graph, mapping: dict[str, str]) -> Graph:
    """`graph` with inputs renamed by `mapping` (state names are store names, so they must not collide)."""
    new = {v: Value(v.type, mapping[v.name], v.layout) for v in graph.inputs if v.name in mapping}
    sub = lambda v: new.get(v, v)  # noqa: E731
    nodes = tuple(dataclasses.replace(n, inputs=tuple(map(sub, n.inputs))) for n in graph.nodes)
    return Graph(tuple(map(sub, graph.inputs)), nodes, tuple(map(sub, graph.outputs)), graph.name)


def assigned_inputs(graph: Graph) -> list[str]:
    """Names of the inputs the graph writes (Assign), i.e. its state."""
    written = (registry.written(node) for node in graph.nodes)
    return list(dict.fromkeys(v.name for v in written if v is not None))


# --- signatures -------------------------------------------------------------------------------------------------


def is_tensor(x: Any) -> bool:
    """A data leaf of a call, fed by value. A Parameter passed as an argument is not: the graph reads (and may
    assign) the Parameter itself, as MindSpore's jit does with parameters among the top graph's inputs."""
    return isinstance(x, (Tensor, np.ndarray)) and not isinstance(x, P.Parameter)


def host_array(x: Any) -> np.ndarray:
    return x.asnumpy() if isinstance(x, Tensor) else np.ascontiguousarray(x)


@dataclass
class Call:
    """One call's arguments, flattened: leaves, how to re-nest them, and an input name per leaf."""

    leaves: list[Any]
    tree: OutputTree
    names: list[str]
    resident: list[bool]  # the leaf is a handle in the daemon's store: the graph reads it there, by its name

    @staticmethod
    def of(args: tuple, kwargs: dict, arg_names: Sequence[str], engine_id: int = 0) -> Call:
        leaves, tree = flatten((tuple(args), dict(sorted(kwargs.items()))))
        names = []
        for i, arg in enumerate(args):
            names += _leaf_names(arg_names[i] if i < len(arg_names) else f"arg{i}", arg)
        for key in sorted(kwargs):
            names += _leaf_names(key, kwargs[key])
        resident = [False] * len(leaves)
        for i, leaf in enumerate(leaves):
            ref = leaf._ref if isinstance(leaf, Tensor) else None
            if ref is not None and ref.engine.id == engine_id and ref.name not in names:
                names[i], resident[i] = ref.name, True
        return Call(leaves, tree, names, resident)

    def specs(self, symbolic: bool) -> list[tuple | None]:
        """(shape, dtype) per tensor leaf (batch dims symbolic when asked), None for Python values."""
        shapes = [tuple(leaf.shape) if is_tensor(leaf) else None for leaf in self.leaves]
        batch = next((s[0] for s in shapes if s), None) if symbolic else None
        out = []
        for leaf, shape in zip(self.leaves, shapes):
            if shape is None:
                out.append(None)
                continue
            if batch is not None and shape and shape[0] == batch:
                shape = (BATCH, *shape[1:])
            out.append((shape, str(getattr(leaf.dtype, "value", leaf.dtype))))
        return out

    def key(self, symbolic: bool) -> tuple:
        parts = []
        for leaf, spec, name, resident in zip(self.leaves, self.specs(symbolic), self.names, self.resident):
            if spec is None:  # a Python value: 1, 1.0 and True trace differently though they compare equal
                parts.append(("value", type(leaf).__name__, _hashable(leaf)))
            else:
                parts.append((*spec, name) if resident else spec)
        return (symbolic, tuple(parts))

    def batch_size(self) -> int | None:
        return next((leaf.shape[0] for leaf in self.leaves if is_tensor(leaf) and leaf.shape), None)


def _quick_signature(args: tuple) -> tuple | None:
    """(shape, dtype) of each argument when all are plain arrays or host Tensors (the per-step case), else None."""
    parts = []
    for a in args:
        array = a if type(a) is np.ndarray else a._array if type(a) is Tensor else None
        if array is None:
            return None
        parts.append((array.shape, array.dtype))
    return tuple(parts)


def _leaf_names(base: str, value: Any) -> list[str]:
    leaves, _ = flatten(value)
    return [base] if len(leaves) == 1 else [f"{base}.{j}" for j in range(len(leaves))]


def _hashable(value: Any) -> Any:
    if isinstance(value, P.Parameter):  # the graph is bound to this Parameter (MindSpore keys on its id too)
        return ("parameter", id(value), tuple(value.shape), str(value.dtype))
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def arg_names_of(fn: Callable) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def trace_call(
    fn: Callable,
    call: Call,
    name: str,
    symbolic: bool,
    params_first=(),
    specs: Sequence | None = None,
    reads: PythonReads | None = None,
) -> tuple[Graph, OutputTree, SdkTrace]:
    """Trace fn on symbolic tensors shaped like `call`'s tensor leaves (or like `specs`, (shape, dtype) per leaf);
    Python values pass through. With `reads`, Python code can read the traced tensors' values (see PythonReads)."""
    specs = call.specs(symbolic) if specs is None else specs
    with SdkTrace(name) as tr:
        if reads is not None:
            tr.builder.reader = lambda value: reads(tr, value)
        for p in params_first:
            tr.param(p)
        leaves = [
            leaf if spec is None else Tensor._wrap_symbolic(tr.input(input_name, spec[0], spec[1]))
            for leaf, spec, input_name in zip(call.leaves, specs, call.names)
        ]
        args, kwargs = call.tree.unflatten(leaves)
        graph, out_tree = tr.build(fn(*args, **kwargs), with_prints=True)
    return graph, out_tree, tr


class PythonReads:
    """The values a PYNATIVE_MODE gradient function's Python reads from its traced tensors (`if loss > 0:`,
    `print(loss)`, `loss.item()`), computed when read: the graph traced so far runs up to the value, on this call's
    inputs and without its parameter writes, which the whole graph makes once when it runs."""

    def __init__(self, call: Call, name: str):
        self.call, self.name = call, name
        self.known: dict[Value, np.ndarray] = {}  # a value read twice in one trace is computed once

    def __call__(self, tr: SdkTrace, value: Value) -> np.ndarray:
        found = self.known.get(value)
        if found is None:
            found = self.known[value] = self._compute(tr, value)
        return found

    def _compute(self, tr: SdkTrace, value: Value) -> np.ndarray:
        if value in tr.builder.inputs:  # an argument, a Parameter or a fed input: its value is here already
            if value.name in self.call.names:
                return host_array(self.call.leaves[self.call.names.index(value.name)])
            params = {p.key: p for p in tr.parameters()}
            if value.name in params:
                return params[value.name].asnumpy()
            return np.asarray(tr.feeders[value.name]())
        graph = tr.builder.readout(value)
        random = sorted({n.op for n in graph.nodes if registry.get(n.op).random})
        if random:
            raise NotSupportedYetError(
                f"reading in Python a value computed from a random op ({', '.join(random)}) inside a PYNATIVE_MODE "
                "gradient function is not supported yet: computing it ahead of the graph would draw other random "
                "numbers than the graph does. Fix: return the value as an extra output (value_and_grad(..., "
                "has_aux=True)) and read it after the call."
            )
        entry = make_entry(graph, OutputTree("leaf"), tr, self.call, f"{self.name}/read", False, readout=True)
        return entry.run(self.call).asnumpy()


def count_leaves(tree: OutputTree) -> int:
    return 1 if tree.kind == "leaf" else sum(count_leaves(c) for c in tree.children)


# --- compiled functions -----------------------------------------------------------------------------------------


@dataclass
class Entry:
    """One compiled signature: its daemon segment and how to feed, run and unpack it."""

    segment: tuple[str, Graph, list[str]]  # (segment name, graph with named outputs, state names)
    data: list[tuple[str, int]]  # (input name, leaf index)
    params: list[P.Parameter]
    assigned: list[P.Parameter]
    feeders: dict[str, Callable[[], np.ndarray]]
    after_run: list[Callable[[], None]]
    host_names: list[str]
    device_names: list[str]
    device_types: list[tuple[tuple, Any]]
    out_tree: OutputTree
    device_layouts: list = field(default_factory=list)  # SEMI_AUTO/AUTO: the layout of each device output
    batch_outputs: bool = False  # some output's shape follows the batch size
    modes: tuple = ()  # (cell, Cell.graph_modes()) at trace time; the entry serves calls in the same modes
    print_names: list[str] = field(default_factory=list)  # outputs holding the tensors ops.Print printed
    prints: list = field(default_factory=list)  # each Print call (tracing.PrintCall)
    absent_prints: set[int] = field(default_factory=set)  # printed tensors this rank does not compute (pipeline)
    input_slices: dict[str, Callable[[np.ndarray], np.ndarray]] = field(default_factory=dict)  # full_batch: cut here
    programs: dict = field(default_factory=dict)
    engine_id: int = 0
    staged_at: int = -1

    def program(self, eng, batch: int | None):
        """The program to run; outputs shaped by the batch get one daemon segment per batch size, because a
        daemon segment reuses its output buffers from run to run."""
        if self.engine_id != eng.id:
            self.programs, self.engine_id, self.staged_at = {}, eng.id, -1
        key = batch if self.batch_outputs else None
        prog = self.programs.get(key)
        if prog is None:
            seg, graph, state = self.segment
            name = seg if key is None else f"{seg}@{batch}"
            eng.compile(name, graph, state)
            prog = self.programs[key] = program(name, graph_out_names(graph))
        return prog

    def run(self, call: Call) -> Any:
        eng = engine()
        batch = call.batch_size()
        prog = self.program(eng, batch)
        feed = {name: host_array(call.leaves[i]) for name, i in self.data}
        for name, cut in self.input_slices.items():  # a whole (full_batch) input the rank reads a slice of
            feed[name] = cut(feed[name])
        if self.staged_at != P.host_writes():
            P.stage(eng, self.params, feed)
            self.staged_at = P.host_writes()
        for name, feeder in self.feeders.items():
            feed[name] = feeder()
        fetched = eng.execute(prog, feed, [*self.host_names, *self.print_names], self.device_names)
        P.updated_on_device(self.assigned)
        for hook in self.after_run:
            hook()
        self.print_fetched(fetched)
        values = [Tensor._wrap(fetched[n]) for n in self.host_names]
        layouts = self.device_layouts or [None] * len(self.device_names)
        for name, (shape, dtype), layout in zip(self.device_names, self.device_types, layouts):
            values.append(eng.handle(name, tuple(batch if d == BATCH else d for d in shape), dtype, layout))
        return self.out_tree.unflatten(values)

    def print_fetched(self, fetched: dict) -> None:
        """What the run's ops.Print calls printed (after the run, in call order)."""
        for call in self.prints:
            if any(kind == "tensor" and ref in self.absent_prints for kind, ref in call.items):
                continue  # another pipeline stage computes it
            for kind, ref in call.items:
                print(Tensor.__repr__(Tensor._wrap(fetched[self.print_names[ref]])) if kind == "tensor" else ref)


def graph_out_names(graph: Graph) -> list[str]:
    return [v.name for v in graph.outputs]


def make_entry(
    graph: Graph,
    out_tree: OutputTree,
    tr: SdkTrace,
    call: Call,
    name: str,
    device_result: bool,
    extra_params: Sequence[P.Parameter] = (),
    readout: bool = False,
) -> Entry:
    """Compile-ready entry: outputs named per segment; with device_result the result is (host part, device part).
    A `readout` (PythonReads) has no ops.Print outputs and no after-run hooks."""
    graph = _gather_stored_blocks(_expanded(graph), (*tr.parameters(), *extra_params))
    seg = f"{name}:{graph.hash[:12]}"
    n_prints = 0 if readout else len(tr.print_values)
    n_host = count_leaves(out_tree.children[0]) if device_result else len(graph.outputs) - n_prints
    host_names = [f"{seg}/out{i}" for i in range(n_host)]
    device_names = [f"{seg}/dev{i}" for i in range(len(graph.outputs) - n_host - n_prints)]
    print_names = [f"{seg}/print{i}" for i in range(n_prints)]
    state = assigned_inputs(graph)
    by_key = {p.key: p for p in (*tr.parameters(), *extra_params)}
    input_names = {v.name for v in graph.inputs}
    return Entry(
        segment=(seg, name_outputs(graph, host_names + device_names + print_names), state),
        data=[(n, i) for i, n in enumerate(call.names) if n in input_names and not call.resident[i]],
        params=[p for key, p in by_key.items() if key in input_names],
        assigned=[by_key[s] for s in state if s in by_key],
        feeders={k: f for k, f in tr.feeders.items() if k in input_names},
        after_run=[] if readout else list(tr.after_run),
        host_names=host_names,
        device_names=device_names,
        device_types=[(v.shape, v.dtype) for v in graph.outputs[n_host : len(graph.outputs) - n_prints]],
        out_tree=out_tree,
        batch_outputs=any(BATCH in v.shape for v in graph.outputs),
        modes=tr.modes(),
        print_names=print_names,
        prints=[] if readout else list(tr.prints),
    )


# Traced graph hash -> the graph with its gradients expanded: a PYNATIVE gradient function traces again at every
# call (CompiledFunction.python_each_call) and differentiates only a graph it has not seen.
_EXPANDED: OrderedDict[str, Graph] = OrderedDict()
_EXPANDED_KEPT = 64


def _expanded(graph: Graph) -> Graph:
    found = _EXPANDED.get(graph.hash)
    if found is None:
        found = _EXPANDED[graph.hash] = expand_gradients(graph)
        if len(_EXPANDED) > _EXPANDED_KEPT:
            _EXPANDED.popitem(last=False)
    else:
        _EXPANDED.move_to_end(graph.hash)
    return found


def _gather_stored_blocks(graph: Graph, params: Sequence[P.Parameter]) -> Graph:
    """Under DATA_PARALLEL optimizer parallel level3 the daemons store only a block of some parameters: a graph
    that reads one whole (an eval or predict network) all-gathers it first (compiler.optimizer_parallel)."""
    eng_id = engine().id
    blocks = {p.key: p._zero_shard for p in params if getattr(p, "_zero_shard", None) and p._layout_engine == eng_id}
    if not blocks:
        return graph
    from tessel.compiler.optimizer_parallel import gather_blocks

    return gather_blocks(graph, blocks)


# Bumped when something a traced graph captured changes: a Cell's forward hook added or removed (hooks run while a
# graph is traced; MindSpore's _update_hook_version), an optimizer hyper-parameter compiled into its update set anew.
# Graphs traced before the change are not reused after it.
_captured_version = [0]


def captured_changed() -> None:
    _captured_version[0] += 1


class CompiledFunction:
    """`fn` compiled per input signature and run on the daemon (GRAPH_MODE cells, value_and_grad, jit).

    With `device_result=True`, fn returns (host part, device part) and the device part stays on the daemon.
    """

    def __init__(
        self,
        fn: Callable,
        name: str,
        *,
        params_first: Callable[[], Sequence] = tuple,
        device_result: bool = False,
        key_extra: Callable[[], Any] = lambda: None,
        arg_names: Sequence[str] | None = None,
        symbolic_batch: bool = True,
        transform: Callable | None = None,
        partition: bool = True,
        python_each_call: Callable[[], bool] = lambda: False,
    ):
        self.fn, self.name = fn, name
        # When python_each_call() is true, fn's Python runs at every call, reading traced values where it asks
        # (PythonReads), and the graph it traced runs: MindSpore's PYNATIVE_MODE gradient functions. Not under the
        # parallel pass, which plans one graph for every step.
        self.python_each_call = python_each_call
        self._graphs_traced: set[str] = set()  # python_each_call: the distinct graphs seen, up to _MANY_GRAPHS
        # Under SEMI_AUTO/AUTO over several ranks the traced graph goes through the parallel pass (off for a
        # transform that partitions by itself: the fused train step).
        self.partition = partition
        self.params_first, self.device_result, self.key_extra = params_first, device_result, key_extra
        self.arg_names = list(arg_names) if arg_names is not None else arg_names_of(fn)
        # transform(graph, trace) -> (graph, extra Parameters): rewrites the traced graph before it is compiled.
        self.transform = transform
        # Static shapes when asked, or once a symbolic-batch trace failed and an exact-shape one worked.
        self.static = not symbolic_batch
        self.entries: dict[tuple, list[Entry]] = {}
        self._quick: dict[tuple, tuple] = {}  # (shape, dtype) per plain array argument -> (key, tree, names)

    def __deepcopy__(self, memo: dict) -> CompiledFunction:
        # Compiled entries name the original's parameters: a copied cell compiles afresh.
        import copy

        fn, params_first, transform = (copy.deepcopy(f, memo) for f in (self.fn, self.params_first, self.transform))
        made = CompiledFunction(
            fn,
            self.name,
            params_first=params_first,
            device_result=self.device_result,
            key_extra=self.key_extra,
            arg_names=self.arg_names,
            transform=transform,
            partition=self.partition,
            python_each_call=self.python_each_call,
        )
        made.static = self.static
        return made

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.python_each_call() and not (self.partition and partition.active()):
            return self._run_python(args, kwargs)
        entry, call = self.entry(args, kwargs)
        return entry.run(call)

    def _run_python(self, args: tuple, kwargs: dict) -> Any:
        """Trace fn on this call's exact shapes with its values readable, then run the graph (compiled once per
        graph: the daemon keeps a segment by its graph's hash)."""
        call = Call.of(args, kwargs, self.arg_names, engine().id)
        reads = PythonReads(call, self.name)
        params = tuple(self.params_first())
        graph, out_tree, tr = trace_call(self.fn, call, self.name, symbolic=False, params_first=params, reads=reads)
        extra = ()
        if self.transform is not None:
            graph, extra = self.transform(graph, tr)
        entry = make_entry(graph, out_tree, tr, call, self.name, self.device_result, extra)
        self._count_graph(entry.segment[0])
        from tessel.common.rank_step import broadcast_parameters

        broadcast_parameters(entry.params)
        return entry.run(call)

    def _count_graph(self, segment: str) -> None:
        """Warn once when the calls trace many different graphs: each new one is compiled (and kept) anew, which a
        Python number computed afresh at every call (a mixup weight, a float schedule) causes."""
        if len(self._graphs_traced) > _MANY_GRAPHS or segment in self._graphs_traced:
            return
        self._graphs_traced.add(segment)
        if len(self._graphs_traced) > _MANY_GRAPHS:
            log_once(
                f"many_graphs.{self.name}",
                f"{self.name}: its calls traced {_MANY_GRAPHS + 1} different graphs, each compiled anew; a Python "
                "number that changes from call to call is a constant of the graph. Pass it as a Tensor argument "
                "(ms.Tensor(value)) so that one graph serves every call.",
            )

    def entry(self, args: tuple, kwargs: dict) -> tuple[Entry, Call]:
        """The compiled entry for this call's signature and cell modes (traced and compiled on first use)."""
        sharded = self.partition and partition.active()
        static = self.static or sharded  # the parallel pass cuts static shapes
        quick = _quick_signature(args) if not kwargs else None
        known = self._quick.get((quick, static)) if quick is not None else None
        if known is not None:
            signature, tree, names = known
            call = Call(list(args), tree, names, [False] * len(args))
        else:
            call = Call.of(args, kwargs, self.arg_names, engine().id)
            signature = call.key(not static)
        # Settings the graph depends on are read at every call (cheap): a change builds another entry.
        settings = (self.key_extra(), partition.plan_settings() if sharded else None, _captured_version[0])
        for entry in self.entries.get((signature, settings, sharded), ()):
            if all(c.graph_modes() == modes for c, modes in entry.modes):
                break
        else:
            entry = self._build(call, sharded)
            static = self.static or sharded
            signature = call.key(not static)
            self.entries.setdefault((signature, settings, sharded), []).append(entry)
        if quick is not None and known is None:
            self._quick[(quick, static)] = (signature, call.tree, call.names)
        return entry, call

    def _build(self, call: Call, sharded: bool) -> Entry:
        from tessel.common.rank_step import broadcast_parameters

        entry = self._build_entry(call, sharded)
        broadcast_parameters(entry.params)  # parameter_broadcast=True: rank 0's values, before the first run
        return entry

    def _build_entry(self, call: Call, sharded: bool) -> Entry:
        if sharded:
            return self._trace(call, symbolic=False, sharded=True)
        if not self.static:
            try:
                return self._trace(call, symbolic=True)
            except Exception:
                pass
        entry = self._trace(call, symbolic=False)
        self.static = True
        return entry

    def _trace(self, call: Call, symbolic: bool, sharded: bool = False) -> Entry:
        specs = partition.global_specs(call) if sharded else None
        graph, out_tree, tr = trace_call(self.fn, call, self.name, symbolic, tuple(self.params_first()), specs)
        extra = ()
        if self.transform is not None:
            graph, extra = self.transform(graph, tr)
        if sharded:
            return partition.make_entry(graph, out_tree, tr, call, self.name, self.device_result, extra)
        return make_entry(graph, out_tree, tr, call, self.name, self.device_result, extra)


_MANY_GRAPHS = 16  # distinct graphs of one python_each_call function before it warns


def _check_choice(call: str, name: str, value: Any, choices: tuple) -> None:
    if isinstance(value, bool) is not isinstance(choices[0], bool) or value not in choices:
        raise ConfigurationError(f"{call}: {name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def jit_class(cls: type) -> type:
    """Mark a user-defined class as usable inside compiled functions (MindSpore's jit_class). tessel traces the
    Python that runs, so any class's attributes and methods work there already; the checks are MindSpore's.

    >>> @ms.jit_class
    ... class Scale:
    ...     def __init__(self):
    ...         self.value = 10
    """
    from tessel.nn.cell import Cell

    if not inspect.isclass(cls):
        raise TypeError(f"Decorator jit_class can only be used for class type, but got {cls}.")
    if issubclass(cls, Cell):
        raise TypeError(f"Decorator jit_class is used for user-defined classes and cannot be used for nn.Cell: {cls}.")
    cls.__ms_class__ = True
    return cls


def jit(
    function: Callable | None = None,
    *,
    capture_mode: str = "ast",
    jit_level: str = "O0",
    dynamic: int = 0,
    fullgraph: bool = False,
    backend: str = "",
    **options: Any,
) -> Callable:
    """Compile a function of Tensors once per input signature (MindSpore `jit`); inside a trace it is inlined.

    >>> @ms.jit
    ... def step(x, y):
    ...     return ops.matmul(x, y).sum()

    tessel builds the graph by tracing the function's execution whatever `capture_mode` says, and compiles it with
    ONNX Runtime: MindSpore's capture modes, optimization levels (`jit_level`), dynamic-shape compilation (tessel
    compiles again for a new input signature), `fullgraph` and its backends give the same results and are checked,
    then logged once as having no effect here; so are the backend's `options`.
    """
    choices = {  # each option's values, MindSpore's default first
        "capture_mode": (capture_mode, ("ast", "bytecode", "trace")),
        "jit_level": (jit_level, ("O0", "O1")),
        "dynamic": (dynamic, (0, 1)),
        "fullgraph": (fullgraph, (False, True)),
        "backend": (backend, ("", "ms_backend", "GE")),
    }
    given = {}
    for name, (value, allowed) in choices.items():
        _check_choice("jit", name, value, allowed)
        if value != allowed[0]:
            given[name] = value
    for name, value in {**given, **options}.items():
        log_once(
            f"jit.{name}",
            f"jit: {name}={value!r} has no effect in tessel, which traces the function and compiles it with ONNX "
            "Runtime (same results)",
            logging.INFO,
        )
    import functools

    from tessel.common.tracing import current

    def wrap(fn: Callable) -> Callable:
        def traced(*args: Any, **kwargs: Any) -> Any:
            if args and hasattr(args[0], "graph_modes"):  # a jit construct: the cell's own train/eval mode counts
                current().note_cell(args[0])
            return fn(*args, **kwargs)

        compiled = CompiledFunction(traced, getattr(fn, "__name__", "jit"), arg_names=arg_names_of(fn))

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs) if current() is not None else compiled(*args, **kwargs)

        return run

    return wrap if function is None else wrap(function)
