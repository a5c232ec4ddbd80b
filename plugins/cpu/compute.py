"""ONNX Runtime's CPU execution provider as a ComputePlugin.

Measured facts this follows (DESIGN §4): one process-wide thread pool (per-session pools made a 3-session step
3.4x slower on 2 cores), one cached session per model, IOBinding onto numpy buffers so outputs land where the
next consumer reads them, and feeds of exactly the model's dtypes (ONNX Runtime never converts).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError, ExecutionError, MissingRuntimeError, NotSupportedYetError
from tessel.core.plugin import ComputePlugin, Executable

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def _ort():
    try:
        import onnxruntime
    except ImportError as err:
        raise MissingRuntimeError(
            "the CPU plugin needs ONNX Runtime; install it with `pip install 'tessel[cpu]'`"
        ) from err
    return onnxruntime


# ONNX Runtime rewrites that change what a model computes: EliminateDropout drops every Dropout whose mask output
# nobody reads, as if it ran for inference, also when its training_mode input is true (measured on 1.32: a training
# forward pass without dropout, and a recomputed Dropout whose original then differs from its copy).
_DISABLED_OPTIMIZERS = ["EliminateDropout"]
_EXECUTION_ORDER_KEY = b"tessel.execution_order"


def _wants_priority_order(onnx_bytes: bytes) -> bool:
    """The model asks to run in the order its nodes are written (tessel's `lower_onnx.EXECUTION_ORDER` metadata,
    set on models with recomputed copies). ONNX Runtime's default order, depth-first from the outputs, leaves each
    block's parameter-gradient branch to the end of the backward pass, holding its inputs until then (measured on
    MindSpore's recompute sample: 113 MiB peak instead of 64)."""
    if _EXECUTION_ORDER_KEY not in onnx_bytes:  # a quick look before parsing
        return False
    import onnx

    props = onnx.ModelProto.FromString(onnx_bytes).metadata_props
    return any(p.key == _EXECUTION_ORDER_KEY.decode() and p.value == "priority" for p in props)


_ENV_ALLOCATORS = "session.use_env_allocators"  # the session option that puts a session on the shared arena


def _on_shared_arena(session: Any) -> bool:
    """Whether the session allocates from the process's shared arena (session_options set the entry)."""
    try:
        return session.get_session_options().get_session_config_entry(_ENV_ALLOCATORS) == "1"
    except RuntimeError:  # ONNX Runtime raises for an entry never set
        return False


def session_options(onnx_bytes: bytes) -> tuple[Any, list[str]]:
    """(SessionOptions, disabled optimizers) of the session CpuCompute makes for this model: the global thread pool,
    every graph optimization but the ones in `_DISABLED_OPTIMIZERS`, and the order the model asks for."""
    ort = _ort()
    options = ort.SessionOptions()
    options.use_per_session_threads = False
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if _wants_priority_order(onnx_bytes):
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if _largest_port_bytes(onnx_bytes) >= LARGE_TENSOR_BYTES:
        # A session's own arena keeps the peak of its intermediates for good, and its memory pattern a second
        # block as large (measured: an Adam update of 2 x 64 MiB weights retained 545 MiB after two runs). Taken
        # from the system instead, a large intermediate is mapped anew every run, one page fault per 4 KiB page
        # (measured here: 2.6 us a fault, 10.6 ms for 16 MiB; a 2048-wide layer's weight-gradient segment ran
        # 41.0 ms against 30.1 ms). Models of large tensors share the process's one arena (see _shared_arena):
        # what they hold at once, reused run after run, and released when the daemon's last job ends.
        options.add_session_config_entry(_ENV_ALLOCATORS, "1")
        options.enable_mem_pattern = False
    return options, list(_DISABLED_OPTIMIZERS)


# The process-wide pool: ONNX Runtime allows it to be created once, before the first session.
_pool_lock = threading.Lock()
_pool_threads: int | None = None


def _global_pool(threads: int) -> int:
    """Create the global thread pool with `threads` intra-op threads (first call wins), and the shared arena;
    return the pool's size."""
    global _pool_threads
    with _pool_lock:
        if _pool_threads is None:
            _ort().set_global_thread_pool_sizes(threads, 1)
            _shared_arena()
            _pool_threads = threads
        return _pool_threads


def _shared_arena() -> None:
    """Register the process's one CPU arena, which the sessions of large models allocate from (session_options):
    it grows by what is asked (no doubling) and keeps freed blocks for the next run instead of unmapping them, so
    it holds what the runs of such models need at once, not the sum over sessions. It cannot merge blocks, so a
    run at input shapes not run before first gives the free blocks back (Binding.run, CpuCompute.run)."""
    ort = _ort()
    memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(memory, ort.OrtArenaCfg({"arena_extend_strategy": 1, "max_mem": 0}))


_shrink: tuple[Any, Any] | None = None  # the session and run options _release_shared_arena runs


def _release_shared_arena() -> None:
    """Give the shared arena's free blocks back to the system: ONNX Runtime shrinks an arena at the end of a run
    that asks for it, so a one-element run of a model on that arena asks."""
    global _shrink
    import onnx
    from onnx import helper

    ort = _ort()
    with _pool_lock:
        if _shrink is None:
            port = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1]) for n in ("x", "y")]
            graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "release", port[:1], port[1:])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
            options, _ = session_options(b"")
            options.add_session_config_entry(_ENV_ALLOCATORS, "1")
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            shrink = ort.RunOptions()
            shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
            _shrink = (session, shrink)
        session, shrink = _shrink
    session.run(None, {"x": np.zeros(1, np.float32)}, shrink)


LARGE_TENSOR_BYTES = 8 << 20  # models with an input or output this large allocate from the shared arena
MMAP_THRESHOLD_BYTES = 4 << 20  # host allocations from this size on are mapped from the system, and unmapped


def _large_allocations_from_the_system() -> None:
    """Fix glibc's mmap threshold (it otherwise rises to 32 MiB after the first large free), so that every buffer
    of 4 MiB or more (a gradient block, a gathered weight, a step's temporaries) goes back to the system when freed,
    and keep the heaps few.
    Measured: with the moving threshold, a daemon training 128 MiB of weights with optimizer parallel kept ~100 MiB
    more per step for three steps in freed heap memory it could not return."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, MMAP_THRESHOLD_BYTES)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 2 * MMAP_THRESHOLD_BYTES)  # M_TRIM_THRESHOLD: return freed heap tops beyond this
        # M_ARENA_MAX: gRPC's threads would each keep a heap of freed request buffers (measured: 192 MiB put in
        # 16 MiB tensors left ~230 MiB resident beyond the tensors; with one arena and a trim, ~70 MiB).
        libc.mallopt(-8, 1)
    except (OSError, AttributeError):
        pass  # not glibc


def _largest_port_bytes(onnx_bytes: bytes) -> int:
    """The bytes of the model's largest input or output of static shape (0 when none is static)."""
    import onnx

    sizes = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.FLOAT16: 2}
    try:
        graph = onnx.load_from_string(onnx_bytes).graph
    except Exception:  # not a model: ONNX Runtime's own error says so
        return 0
    largest = 0
    for value in (*graph.input, *graph.output):
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim]
        if dims and all(dims):
            largest = max(largest, int(np.prod(dims)) * sizes.get(tensor.elem_type, 4))
    return largest


@dataclass(frozen=True)
class Port:
    """One model input or output: name, numpy dtype and shape (str entries are symbolic dims)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]


class CpuExecutable(Executable):
    """An ONNX Runtime session plus the model's input/output signature."""

    def __init__(self, session: Any, key: str):
        self.session, self.key = session, key
        self.inputs = tuple(Port(i.name, np.dtype(_ORT_TYPES[i.type]), tuple(i.shape)) for i in session.get_inputs())
        self.outputs = tuple(Port(o.name, np.dtype(_ORT_TYPES[o.type]), tuple(o.shape)) for o in session.get_outputs())
        self.input_names = tuple(p.name for p in self.inputs)
        self.output_names = tuple(p.name for p in self.outputs)
        self._ports = {p.name: p for p in self.inputs}
        self.metadata = dict(session.get_modelmeta().custom_metadata_map)  # e.g. "tessel.inplace"
        self.shared_arena = _on_shared_arena(session)  # a model of large tensors: session_options decided
        self.run_shapes: set[tuple] = set()  # the input shapes CpuCompute.run has run it with

    def check_feed(self, name: str, array: np.ndarray) -> None:
        """Raise a clear error unless `array` matches input `name` exactly (dtype, rank, static dims)."""
        port = self._ports.get(name)
        if port is None:
            raise ConfigurationError(f"the model has no input {name!r}; its inputs are {list(self.input_names)}")
        if array.dtype != port.dtype:
            raise ConfigurationError(
                f"input {name!r} must be {port.dtype}, got {array.dtype}; convert it with .astype(np.{port.dtype})"
            )
        ok = array.ndim == len(port.shape) and all(
            not isinstance(d, int) or d == a for d, a in zip(port.shape, array.shape)
        )
        if not ok:
            raise ConfigurationError(f"input {name!r} must have shape {port.shape}, got {array.shape}")


CACHED_SESSIONS = 256  # compiled models a CpuCompute keeps for later calls (and jobs)
CACHED_MODEL_BYTES = 2 << 30  # and at most this many bytes of them (their weights' constants included)


class CpuCompute(ComputePlugin):
    """Compiles ONNX models into cached ONNX Runtime sessions sharing one process-wide thread pool.

    >>> compute = CpuCompute(threads=2)
    >>> exe = compute.compile(model_bytes)
    >>> (y,) = compute.run(exe, {"x": np.ones((4, 784), np.float32)})
    """

    def __init__(self, threads: int = 1):
        if threads < 1:
            raise ConfigurationError(f"threads must be >= 1, got {threads}")
        _large_allocations_from_the_system()
        self.threads = _global_pool(threads)  # an earlier CpuCompute in this process may have fixed the size
        self._sessions: OrderedDict[str, tuple[CpuExecutable, int]] = OrderedDict()  # least recently used first
        self._cached_bytes = 0
        self._lock = threading.Lock()

    def compile(self, onnx_bytes: bytes) -> CpuExecutable:
        """A session for the model, cached by the model's content hash: a daemon keeps its models warm from job to
        job, the least recently used going once the cache holds CACHED_SESSIONS of them or CACHED_MODEL_BYTES of
        models (a long-running daemon serves many jobs; a session in use lives on with its users)."""
        key = hashlib.sha256(onnx_bytes).hexdigest()
        with self._lock:
            cached = self._sessions.get(key)
            if cached is not None:
                self._sessions.move_to_end(key)
                return cached[0]
            exe = CpuExecutable(self._session(onnx_bytes), key)
            self._sessions[key] = (exe, len(onnx_bytes))
            self._cached_bytes += len(onnx_bytes)
            while len(self._sessions) > 1 and (
                len(self._sessions) > CACHED_SESSIONS or self._cached_bytes > CACHED_MODEL_BYTES
            ):
                _, (_, size) = self._sessions.popitem(last=False)
                self._cached_bytes -= size
        return exe

    def _session(self, onnx_bytes: bytes) -> Any:
        options, disabled = session_options(onnx_bytes)
        try:
            return _ort().InferenceSession(
                onnx_bytes, options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled
            )
        except Exception as err:  # ONNX Runtime raises its own exception types
            missing = re.search(r"NOT_IMPLEMENTED : Could not find an implementation for (\w+)", str(err))
            if missing:  # a kernel ONNX Runtime's CPU provider lacks (float64 Conv or Erf): name it, with the fix
                raise NotSupportedYetError(
                    f"not supported yet: {missing.group(1)} for these input dtypes on the CPU plugin (ONNX Runtime "
                    f"has no CPU kernel for it); compute it in float32 (x.astype(ms.float32)). ({err})"
                ) from err
            raise ConfigurationError(f"ONNX Runtime rejected the model: {err}") from err

    def run(self, executable: Executable, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run with numpy feeds (exact dtypes, every input given); returns outputs in model order."""
        exe = _cpu(executable)
        missing = [n for n in exe.input_names if n not in inputs]
        if missing:
            raise ConfigurationError(f"missing model input(s) {missing}; the model takes {list(exe.input_names)}")
        feeds = {name: np.asarray(array) for name, array in inputs.items()}  # numpy scalars -> 0-d arrays
        for name, array in feeds.items():
            exe.check_feed(name, array)
        shapes = tuple(array.shape for array in feeds.values())
        if exe.shared_arena and shapes not in exe.run_shapes:
            _release_shared_arena()  # shapes not run before, as Binding.run: blocks sized for other shapes go back
            exe.run_shapes.add(shapes)
        try:
            return exe.session.run(None, feeds, _quiet_run())
        except Exception as err:
            raise runtime_failure(err) from err

    def bind(self, executable: Executable) -> Binding:
        """An IOBinding for repeated runs onto fixed numpy buffers (see Binding)."""
        return Binding(_cpu(executable))

    def release_memory(self) -> None:
        """Give the shared arena's free blocks back to the system."""
        _release_shared_arena()


class Binding:
    """Inputs and outputs bound once to numpy buffers; `run()` then only executes.

    Bound arrays must stay alive and unmoved while bound (the session reads and writes their memory).
    Outputs not bound to a buffer come back from `run()` as new arrays: where the model fixes the output's shape
    (a loss), a fresh numpy array is bound before each run; otherwise ONNX Runtime allocates it, which costs a
    `get_outputs` and binding every output afresh after the run (~0.1 ms for a train step's outputs).
    """

    def __init__(self, exe: CpuExecutable):
        self.exe = exe
        self._binding = exe.session.io_binding()
        self._bind_input, self._bind_output = _raw_binders(self._binding)
        self._checked: set[tuple[str, np.dtype, tuple[int, ...]]] = set()
        self._outputs: dict[str, np.ndarray | None] = {}  # binding order; None = allocated by the runtime
        self._fresh: dict[str, tuple[tuple[int, ...], np.dtype]] = {}  # static-shape outputs: a new array per run
        self._kept: dict[str, np.ndarray] = {}
        self._new_shapes = False  # an input was bound with a shape this binding had not run with

    def input(self, name: str, array: np.ndarray) -> None:
        if self._kept.get(name) is array:
            return  # already bound to this very buffer (a parameter, a learning rate fed again)
        signature = (name, array.dtype, array.shape)
        if signature not in self._checked:
            self.exe.check_feed(name, array)
            self._checked.add(signature)
            self._new_shapes = True
        array = _contiguous(name, array)
        self._kept[name] = array
        self._bind_input(name, array.dtype, list(array.shape), array.ctypes.data)

    def forget(self, name: str) -> None:
        """Stop keeping input `name`'s buffer alive; the next run must bind it again (input() does)."""
        self._kept.pop(name, None)

    def output(self, name: str, array: np.ndarray | None = None) -> None:
        """Bind output `name` onto `array` (exact dtype and shape), or let the runtime allocate it when None."""
        port = next((p for p in self.exe.outputs if p.name == name), None)
        if port is None:
            raise ConfigurationError(f"the model has no output {name!r}; its outputs are {list(self.exe.output_names)}")
        if name in self._outputs:
            raise ConfigurationError(f"output {name!r} is already bound")
        if array is None and all(isinstance(d, int) for d in port.shape):
            self._fresh[name] = (tuple(port.shape), port.dtype)
            self._bind_fresh(name)  # now, so that the binding order stays the order of output() calls
        elif array is None:
            self._binding.bind_output(name, "cpu")
        elif array.dtype != port.dtype:
            raise ConfigurationError(f"output buffer {name!r} must be {port.dtype}, got {array.dtype}")
        else:
            _contiguous(name, array)
            self._bind_output(name, array.dtype, list(array.shape), array.ctypes.data)
        self._outputs[name] = array

    def _bind_fresh(self, name: str) -> np.ndarray:
        shape, dtype = self._fresh[name]
        array = self._kept[name] = np.empty(shape, dtype)  # rebinding a bound name keeps its place in the order
        self._bind_output(name, dtype, list(shape), array.ctypes.data)
        return array

    def run(self) -> list[np.ndarray]:
        """Execute; returns the outputs that were not bound to buffers, in binding order."""
        fresh = {name: self._kept[name] for name in self._fresh}  # the caller keeps these; the next run gets new ones
        if self._new_shapes and self.exe.shared_arena:
            # The shared arena grows by what a run asks and cannot merge its blocks: runs at ever new shapes (a
            # batch that grows, the last short batch) would each add theirs (+281 MiB for a batch growing from
            # 128 to 2048 rows by 128 on a 2048-wide layer). A run at shapes not seen before starts from a
            # released arena instead.
            _release_shared_arena()
        self._new_shapes = False
        try:
            self.exe.session.run_with_iobinding(self._binding, _quiet_run())
        except Exception as err:
            raise runtime_failure(err) from err
        if not any(a is None and name not in fresh for name, a in self._outputs.items()):
            for name in fresh:
                self._bind_fresh(name)
            return [fresh[name] for name, a in self._outputs.items() if a is None]
        values = self._binding.get_outputs()
        result = [
            fresh[name] if name in fresh else v.numpy()
            for (name, a), v in zip(self._outputs.items(), values)
            if a is None
        ]
        # Runtime-allocated outputs stay bound to this run's shapes; bind every output afresh, in order, so that the
        # next run may have another batch size.
        self._binding.clear_binding_outputs()
        for name, array in self._outputs.items():
            if name in fresh:
                self._bind_fresh(name)
            elif array is None:
                self._binding.bind_output(name, "cpu")
            else:
                self._bind_output(name, array.dtype, list(array.shape), array.ctypes.data)
        return result


def _raw_binders(binding: Any) -> tuple[Callable, Callable]:
    """bind_input / bind_output(name, dtype, shape, pointer) onto CPU memory. The public IOBinding methods build
    an OrtDevice on every call (~10 us, a tenth of a small train step's overhead); where this onnxruntime exposes
    the binding it wraps, its methods are called with one cached device instead."""
    raw = getattr(binding, "_iobinding", None)
    try:
        device = _ort().OrtDevice.make("cpu", 0)._get_c_device()
    except AttributeError:
        raw = None
    if raw is None:
        return (
            lambda name, dtype, shape, ptr: binding.bind_input(name, "cpu", 0, dtype, shape, ptr),
            lambda name, dtype, shape, ptr: binding.bind_output(name, "cpu", 0, dtype, shape, ptr),
        )
    return (
        lambda name, dtype, shape, ptr: raw.bind_input(name, device, dtype, shape, ptr),
        lambda name, dtype, shape, ptr: raw.bind_output(name, device, dtype, shape, ptr),
    )


def _contiguous(name: str, array: np.ndarray) -> np.ndarray:
    if not array.flags.c_contiguous:
        raise ConfigurationError(f"buffer {name!r} must be C-contiguous to bind; pass np.ascontiguousarray(...)")
    return array


# ONNX Runtime's text for a node that failed while running: "... running <OnnxOp> node. Name:'<name>' Status
# Message: <where in its sources> <what>"; lower_onnx names each node "<tessel op>#<index>@<user file:line>".
_FAILED_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)' Status Message: (.*)", re.S)
_HINTS = {
    "out of range": "an index is outside its axis: a loss's labels must be class indices in [0, classes), and "
    "Gather / Embedding indices must be smaller than the axis they index",
    "out of data bounds": "an index is outside its axis: a loss's labels must be class indices in [0, classes), "
    "and Gather / Embedding indices must be smaller than the axis they index",
}


_quiet: Any = None


def _quiet_run() -> Any:
    """RunOptions that keep ONNX Runtime from logging a failed node: runtime_failure raises it in tessel's terms."""
    global _quiet
    if _quiet is None:
        _quiet = _ort().RunOptions()
        _quiet.log_severity_level = 4
    return _quiet


def runtime_failure(err: BaseException) -> BaseException:
    """ONNX Runtime's exception for a failed run, told in tessel's terms: an ExecutionError naming the tessel op and
    the user's line that made the failing node (any other exception is returned as it is)."""
    text = str(err)
    found = _FAILED_NODE.search(text)
    # run() raises ONNX Runtime's own classes; run_with_iobinding a RuntimeError("Error in execution: ...")
    if not type(err).__module__.startswith("onnxruntime") and found is None:
        return err
    if found is None:
        return ExecutionError(f"ONNX Runtime failed running a compiled program: {text}")
    onnx_op, name, detail = found.groups()
    detail = detail.strip().rsplit("] ", 1)[-1] if "onnxruntime_src" in detail else detail.strip()
    op, _, source = name.partition("@")
    where = f"op {op.split('#')[0]}" + (f" (made at {source})" if source else "") if op else "a node"
    hint = next((h for key, h in _HINTS.items() if key in detail.lower()), None)
    return ExecutionError(
        f"the compiled program failed at {where}, in its ONNX {onnx_op}: {detail}" + (f"; {hint}" if hint else "")
    )


def _cpu(executable: Executable) -> CpuExecutable:
    if not isinstance(executable, CpuExecutable):
        raise ConfigurationError(f"{type(executable).__name__} was not compiled by CpuCompute")
    return executable
