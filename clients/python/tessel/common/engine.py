"""The SDK's handle on this process's daemon: compiled segments, one Execute per call, eager ops.

All compiled execution goes through `runtime.daemon` (embedded in-process for a world of 1, gRPC under
`tessel run`), so the same code runs distributed. Results the client does not need right away (gradients) stay
in the daemon's store as handle Tensors; a handle whose store name is about to be overwritten while the Tensor
is still alive is first copied aside in the daemon's store, in the same Execute (`Engine.execute(writes=...)`),
so a Tensor never changes value under its user.

A graph holding collectives (ops.AllReduce in a construct, data parallelism's bucketed gradient reduction) cannot
be one ONNX segment: `Engine.compile` lowers it to a rank program (segments split at the collectives, see
`tessel.compiler.lower_rank_program`), installs its groups and segments, and from then on a `RunSegment` of its
name in any program this engine executes stands for the rank program's instructions.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import sys
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tessel import profiler
from tessel.common.tensor import DeviceRef
from tessel.communication import runtime
from tessel.compiler import EagerExecutor, Graph, lower_rank_program, model_bytes, registry
from tessel.compiler.buckets import communicate_in_fp32, reduces_float16
from tessel.compiler.memory import free_early, mark_inplace, mark_program_inplace
from tessel.compiler.rank_rewrite import op_rewrites
from tessel.core.errors import ConfigurationError
from tessel.v1 import daemon_pb2

_ids = itertools.count(1)
_engine: Engine | None = None


def engine() -> Engine:
    """The engine of the current runtime (starting a world of 1 in this process when nothing was launched)."""
    global _engine
    current = runtime._runtime
    if _engine is not None and current is _engine.runtime:
        return _engine
    _engine = Engine(runtime.init())
    return _engine


def program(segment: str, outputs: Sequence[str] = (), copies: Sequence[tuple[str, str]] = ()) -> daemon_pb2.Program:
    """A program running one segment (after optional store copies source → target)."""
    instructions = [daemon_pb2.Instruction(copy=daemon_pb2.CopyOp(source=s, target=t)) for s, t in copies]
    run = daemon_pb2.RunSegment(segment=segment, outputs=list(outputs))
    instructions.append(daemon_pb2.Instruction(run_segment=run))
    return daemon_pb2.Program(instructions=instructions)


class Engine:
    """Compiles segments once, runs programs, fetches and tracks handle Tensors on one daemon session."""

    def __init__(self, rt: runtime.Runtime):
        self.runtime = rt
        self.daemon, self.session = rt.daemon, rt.session_id
        self.id = next(_ids)
        self._segments: set[str] = set()
        self._live: dict[str, weakref.ref] = {}
        self._backups = itertools.count()
        self._unused: list[str] = []  # store names of collected handles, freed by the next Execute
        self._rank_programs: dict[str, daemon_pb2.Program] = {}  # segment name -> its rank program's instructions
        self._expanded: dict[int, tuple[daemon_pb2.Program, daemon_pb2.Program]] = {}
        core = getattr(self.daemon, "core", None)
        # Embedded daemon: eager ops run on its compute plugin directly; remote: as one-node segments.
        self.eager = EagerExecutor(core.plugin.compute if core is not None else _DaemonCompute(self))

    @property
    def world_size(self) -> int:
        return self.runtime.world_size

    def compile(self, name: str, graph: Graph, state: Iterable[str] = ()) -> None:
        """Compile `graph` as segment `name` (once); `state` inputs are updated in place by "<name>/new" outputs."""
        if name in self._segments:
            return
        collective = has_collectives(graph)
        pipeline = sys.modules.get("tessel.compiler.pipeline")  # loaded by the pipeline pass, if one ran here
        phases = pipeline.phases_of(graph) if pipeline and collective else None  # a stage's graph: its schedule's order
        if collective and reduces_float16(graph):
            widened = _fp32_communication()
            _compiled_with_fp32_communication.setdefault(widened, name)
            if widened:
                graph = _reduced_in_fp32(graph, phases)
        _save_graph(name, graph, self.runtime.rank)
        if collective:
            # The program prefix comes from the graph's name: per-batch-size copies of one graph must not share it.
            named = Graph(graph.inputs, graph.nodes, graph.outputs, name)
            lowered = lower_rank_program(
                named,
                state=list(state),
                world_size=self.world_size,
                spmd=_spmd() and phases is None,
                phases=phases,
                one_host=self.runtime.local_size >= self.world_size,
            )
            if phases is not None:  # its lowering frees temporaries after their last reader already
                pipeline.check_lowered(lowered, graph, self.world_size)
            else:
                lowered = free_early(mark_program_inplace(lowered))  # tensors die with their last use (compiler.memory)
            self.daemon.install(lowered, self.session)
            self._rank_programs[name] = lowered.program
            actions = pipeline.actions_of(graph) if phases is not None else {}
            for segment in lowered.segments.values():
                action = actions.get(lowered.segment_phases.get(segment.name, -1))
                profiler.name_segment(segment.name, segment.graph, action)
        else:
            onnx = mark_inplace(model_bytes(op_rewrites(graph)), list(state))
            self.daemon.compile_segment(self.session, name, onnx, list(state))
            profiler.name_segment(name, graph)
        self._segments.add(name)

    def expand(self, prog: daemon_pb2.Program) -> daemon_pb2.Program:
        """`prog` with every RunSegment of a rank-lowered graph replaced by that rank program's instructions."""
        if not self._rank_programs:
            return prog
        known = self._expanded.get(id(prog))
        if known is not None and known[0] is prog:
            return known[1]
        out, changed = [], False
        for ins in prog.instructions:
            lowered = self._rank_programs.get(ins.run_segment.segment) if ins.HasField("run_segment") else None
            if lowered is None:
                out.append(ins)
            else:
                out.extend(lowered.instructions)
                changed = True
        expanded = daemon_pb2.Program(instructions=out) if changed else prog
        if len(self._expanded) > 256:  # one-off programs: keep the cache small
            self._expanded.clear()
        self._expanded[id(prog)] = (prog, expanded)  # programs of compiled entries are reused every step
        return expanded

    def execute(
        self,
        prog: daemon_pb2.Program,
        feed: dict[str, np.ndarray] | None = None,
        fetch: Sequence[str] = (),
        writes: Iterable[str] = (),
    ) -> dict[str, np.ndarray]:
        """One Execute: store `feed`, run `prog`, return `fetch`; live handles named in `writes` are copied aside."""
        self.runtime.check()
        before = self._preserve(writes)
        if self._unused:
            frees, self._unused = self._unused, []
            before.append(daemon_pb2.Instruction(free=daemon_pb2.FreeOp(names=frees)))
        prog = self.expand(prog)
        if before:
            prog = daemon_pb2.Program(instructions=[*before, *prog.instructions])
        return profiler.execute(self.daemon, self.session, prog, fetch=fetch, feed=feed).fetched

    def get(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        return self.daemon.get(self.session, list(names)) if names else {}

    def handle(self, name: str, shape: tuple[int, ...], dtype: Any, layout: Any = None):
        """A Tensor naming store entry `name` (fetched on first use); `layout` when the store holds a piece."""
        from tessel.common.tensor import Tensor

        tensor = Tensor._wrap_ref(DeviceRef(self, name, shape, dtype, layout))
        self._live[name] = weakref.ref(tensor)
        return tensor

    def _preserve(self, names: Iterable[str]) -> list[daemon_pb2.Instruction]:
        """Copy instructions moving still-referenced handles out of the way of a run that overwrites them."""
        copies = []
        for name in names:
            ref = self._live.pop(name, None)
            tensor = ref() if ref is not None else None
            if tensor is not None and tensor._ref is not None and tensor._ref.name == name:
                aside = f"{name}@{next(self._backups)}"
                copies.append(daemon_pb2.Instruction(copy=daemon_pb2.CopyOp(source=name, target=aside)))
                tensor._ref = DeviceRef(self, aside, tensor._ref.shape, tensor._ref.dtype, tensor._ref.layout)
                weakref.finalize(tensor, self._unused.append, aside)
        return copies


def _fp32_communication() -> bool:
    from tessel import context

    return bool(context.get_auto_parallel_context("force_fp32_communication"))


# force_fp32_communication -> the first segment this process compiled with that value that reduces float16 values
_compiled_with_fp32_communication: dict[bool, str] = {}


def check_fp32_communication_change(value: bool) -> None:
    """set_auto_parallel_context(force_fp32_communication=value) once segments that reduce float16 values compiled
    with the other value: they are reused as they are, so the change could not reach them."""
    compiled = _compiled_with_fp32_communication.get(not value)
    if compiled is not None:
        raise ConfigurationError(
            f"force_fp32_communication={value}: {compiled} reduces float16 values and was compiled with "
            f"force_fp32_communication={not value}; set it (or AutoParallel.enable_fp32_communication()) before the "
            "network first runs"
        )


def _reduced_in_fp32(graph: Graph, phases: Any) -> Graph:
    """force_fp32_communication: `graph`'s reductions of float16 values run in float32."""
    if phases is not None:
        from tessel.common.support import not_supported_yet

        raise not_supported_yet(
            "force_fp32_communication with a float16 network under pipeline parallel",
            "a pipeline stage's schedule is fixed before the casts around its reductions could be placed; run the "
            "network in float32 or drop force_fp32_communication",
        )
    return communicate_in_fp32(graph)


def _spmd() -> bool:
    """Whether every rank compiles a copy of the same graph: the parallel modes where tessel generates the ranks'
    graphs (data parallelism, a parallel plan), not manual parallelism, whose graphs may differ by rank."""
    from tessel import context

    modes = (
        context.ParallelMode.DATA_PARALLEL,
        context.ParallelMode.SEMI_AUTO_PARALLEL,
        context.ParallelMode.AUTO_PARALLEL,
    )
    if context.get_auto_parallel_context("batch_split") != "even":
        # uneven shares: a graph traced with a rank's own batch size (not a symbolic one) has other static shapes
        # on other ranks, and the schedule's cost estimates (which start collectives in an SPMD block in the order
        # their inputs exist) could then order the collectives differently on different ranks
        return False
    return context.get_auto_parallel_context("parallel_mode") in modes


def has_collectives(graph: Graph) -> bool:
    """True when `graph` communicates (holds a collective), so it runs as a rank program."""
    return any(registry.get(node.op).collective is not None for node in graph.nodes)


class _DaemonCompute:
    """The ComputePlugin face EagerExecutor needs, running each op as a one-node segment on a remote daemon."""

    def __init__(self, owner: Engine):
        self.owner = owner

    def compile(self, onnx_bytes: bytes) -> tuple[daemon_pb2.Program, list[str]]:
        import onnx

        name = "eager/" + hashlib.sha256(onnx_bytes).hexdigest()[:16]
        outputs = [o.name for o in onnx.load_from_string(onnx_bytes).graph.output]
        if name not in self.owner._segments:
            self.owner.daemon.compile_segment(self.owner.session, name, onnx_bytes, [])
            self.owner._segments.add(name)
        return program(name, outputs), outputs

    def run(self, executable, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        prog, outputs = executable
        fetched = self.owner.execute(prog, feed=dict(inputs), fetch=outputs)
        return [fetched[n] for n in outputs]


def _save_graph(name: str, graph: Graph, rank: int) -> None:
    """With set_context(save_graphs=...) write the graph's text dump, one file per compiled segment, into
    save_graphs_path/rank_<rank>/ as MindSpore does (ranks on one host would overwrite each other's files)."""
    from tessel import context

    if not context.get_context("save_graphs"):
        return
    folder = os.path.join(context.get_context("save_graphs_path") or ".", f"rank_{rank}")
    os.makedirs(folder, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    with open(os.path.join(folder, f"{safe}.ir"), "w", encoding="utf-8") as out:
        out.write(graph.dump() + "\n")
