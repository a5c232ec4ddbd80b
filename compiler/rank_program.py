"""Lowering a graph to a rank program: ONNX segments split at collectives, plus the typed instructions that run
them on a daemon (RunSegment, CollectiveOp, WaitOp, FreeOp).

    program = lower_rank_program(train_graph, state=[s.name for s in train.state], world_size=4)
    print(program.dump())                      # segments, collectives, waits, in run order
    installed = daemon.install(program, session_id, initial=params)   # tessel.communication.daemon_handle
    losses = installed.run(feed={"x": x, "y": y}).fetched[program.outputs[0]]

Names in the daemon's store: graph inputs keep their names, graph outputs are named like `to_onnx` names them
("out<i>" or the Value's name), and tensors passed between steps are "<graph>@<hash>/v<k>" (freed at the end
of the program). A collective whose result is not needed by the very next step starts asynchronously and is
waited for just before its first reader; so is one issued while another on the same group is in flight (a
communicator runs its asynchronous calls in order on one thread). Groups: the world is "" (the daemon's world
group); any other tuple of ranks is "g_<r0>_<r1>..." and listed in `RankProgram.groups` for creation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tessel.compiler import registry
from tessel.compiler.ir import Graph, Node, Value
from tessel.compiler.lower_onnx import model_bytes, output_names
from tessel.compiler.ops.collective import group_ranks
from tessel.compiler.rank_plan import Step, is_write, plan_steps
from tessel.compiler.rank_rewrite import (
    alias_effects,
    expand_collectives,
    fold_value_free,
    op_rewrites,
    read_through_identities,
)
from tessel.compiler.row_parts import merge_row_parts
from tessel.compiler.train_step import micro_batch_ends
from tessel.core.errors import ConfigurationError
from tessel.v1 import collective_pb2, daemon_pb2

_REWRITE_ROUNDS = 4


def group_name(ranks: tuple[int, ...], world_size: int | None) -> str:
    """The daemon group name of `ranks`: "" for the whole world in order, else "g_<r0>_<r1>..."."""
    if world_size is not None and ranks == tuple(range(world_size)):
        return ""
    return "g_" + "_".join(map(str, ranks))


@dataclass(frozen=True, eq=False)
class RankSegment:
    """One ONNX segment: its graph, the serialized model, the state it writes in place and the outputs it keeps."""

    name: str
    graph: Graph
    onnx: bytes
    state: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class RankProgram:
    """What one rank runs: compiled segments, the instruction list, the groups to create first, and which store
    names are data (fed each step), state (kept between steps, updated in place) and outputs."""

    name: str
    segments: Mapping[str, RankSegment]
    program: daemon_pb2.Program
    groups: Mapping[str, tuple[int, ...]]
    data_inputs: tuple[str, ...]
    state_inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    segment_phases: Mapping[str, int] = field(default_factory=dict)  # a pipeline stage's: segment -> its phase

    def collective_counts(self) -> Counter:
        """How many collectives of each kind one run issues, e.g. Counter({'ALL_REDUCE': 2})."""
        return Counter(
            collective_pb2.CollectiveKind.Name(i.collective.kind)
            for i in self.program.instructions
            if i.WhichOneof("op") == "collective"
        )

    def dump(self) -> str:
        """The instruction list, one line each (segments show their inputs and outputs)."""
        lines = [f"rank program {self.name} (groups {dict(self.groups)})"]
        for index, ins in enumerate(self.program.instructions):
            lines.append(f"  {index:3d} {_describe(ins, self.segments)}")
        return "\n".join(lines)


def lower_rank_program(
    graph: Graph,
    *,
    state: Collection[str] = (),
    donate: Collection[str] = (),
    world_size: int | None = None,
    spmd: bool = False,
    phases: Mapping[Value, int] | None = None,
    one_host: bool = False,
) -> RankProgram:
    """Lower `graph` (which may hold collectives) to a RankProgram.

    `state`: inputs kept on the daemon between runs (parameters, optimizer slots); every input an `Assign`
    writes is state too. `donate`: data inputs the program may free after the run (batches a NextBatch stores
    again each run). `world_size`: lets the world's group run as the daemon's world group (""). `spmd`: every
    rank runs a copy of this graph (a parallel plan's rank graph, data parallelism), so independent collectives
    may start in the order their inputs can exist rather than the graph's (see rank_schedule). `phases` (a
    node's phase, keyed by its first output): the graph's order is the run order already (a pipeline stage's
    schedule), kept as it is, with a new segment wherever the phase changes; each temporary is then freed right
    after its last reader, so that a stage holds only what its micro-batches in flight need. `one_host`: every rank
    of the world shares this host, so collectives are quick (registry.RewriteContext): there the copies of a batch
    split into parts run as one (compiler/row_parts.py).
    """
    unknown = sorted(set(state) - {v.name for v in graph.inputs})
    if unknown:
        raise ConfigurationError(
            f"state {unknown} are not inputs of graph {graph.name!r}; its inputs: {[v.name for v in graph.inputs]}"
        )
    prepared = alias_effects(expand_collectives(graph))
    if phases is None:  # a pipeline's order is its schedule: no product of several micro-batches is stacked
        # Folded first: the rewrites read which collectives a value waits for, and a node that reads only shapes
        # (autodiff's seed of ones shaped like the summed loss) would make every gradient wait for every copy's.
        # GradAccumulation's micro-batches run apart, so that one micro-batch's activations are held at a time.
        apart = bool(micro_batch_ends(prepared))
        context = registry.RewriteContext(one_host=one_host, spmd=spmd, micro_batches_apart=apart)
        prepared = fold_value_free(prepared)
        for _ in range(_REWRITE_ROUNDS):  # each rewrite's result may open the way for the other's
            rewritten = op_rewrites(merge_row_parts(prepared, context), context)
            if rewritten is prepared:
                break
            prepared = rewritten
    prepared = read_through_identities(prepared)  # no segment copies out a tensor the store already holds
    steps = plan_steps(prepared, spmd, phases)
    names = _StoreNames(prepared)
    written = {n.inputs[0].name for s in steps for n in s.nodes if is_write(n)}
    _check_outputs(prepared, written)
    state_names = tuple(v.name for v in graph.inputs if v.name in {*state, *written})
    segments: dict[str, RankSegment] = {}
    segment_phases: dict[str, int] = {}
    readers = _readers(steps, prepared)
    for index, step in enumerate(steps):
        if step.collective is None:
            segment = _segment(steps, index, f"{names.prefix}/s{index}", prepared, names, readers)
            segments[segment.name] = segment
            if step.phase is not None:
                segment_phases[segment.name] = step.phase
    instructions, groups = _instructions(steps, segments, names, readers, world_size)
    kept = set(prepared.outputs) | set(prepared.inputs)
    temporary = sorted(n for v, n in names.assigned.items() if v not in kept) + sorted(set(donate))
    if phases is not None:
        instructions = _free_after_last_use(instructions, segments, temporary)
    elif temporary:
        instructions.append(daemon_pb2.Instruction(free=daemon_pb2.FreeOp(names=temporary)))
    return RankProgram(
        name=names.prefix,
        segments=segments,
        program=daemon_pb2.Program(instructions=instructions),
        groups=groups,
        data_inputs=tuple(v.name for v in graph.inputs if v.name not in state_names),
        state_inputs=state_names,
        outputs=tuple(names(v) for v in prepared.outputs),
        segment_phases=segment_phases,
    )


class _StoreNames:
    """Store names: graph inputs by name, graph outputs as to_onnx names them, others "<prefix>/v<k>"."""

    def __init__(self, graph: Graph):
        self.prefix = f"{graph.name}@{graph.hash[:8]}"
        self.assigned: dict[Value, str] = {}
        self._fixed: dict[Value, str] = {v: v.name for v in graph.inputs}
        for value, name in zip(graph.outputs, output_names(graph)):
            self._fixed.setdefault(value, name)

    def __call__(self, value: Value) -> str:
        if value in self._fixed:
            return self._fixed[value]
        if value not in self.assigned:
            self.assigned[value] = f"{self.prefix}/v{len(self.assigned)}"
        return self.assigned[value]


def _check_outputs(graph: Graph, written: set[str]) -> None:
    for value in graph.outputs:
        if value.name in written and value in graph.inputs:
            raise ConfigurationError(
                f"graph {graph.name!r} returns parameter {value.name!r} and also assigns it, so the returned value "
                "would be the new one after the run; return a copy (ops.Identity) computed before the write"
            )


def _readers(steps: list[Step], graph: Graph) -> dict[Value, list[int]]:
    """For each value, the indices of the steps reading it; graph outputs are read at len(steps)."""
    readers: dict[Value, list[int]] = {}
    for index, step in enumerate(steps):
        for value in step.reads():
            readers.setdefault(value, []).append(index)
    for value in graph.outputs:
        readers.setdefault(value, []).append(len(steps))
    return readers


def _segment(steps: list[Step], index: int, name: str, graph: Graph, names: _StoreNames, readers) -> RankSegment:
    """The ONNX segment of `steps[index]`: inputs are what it reads from elsewhere, outputs what later steps read
    (except constants that the later readers compute themselves: plan_steps copies them into each)."""
    step = steps[index]
    produced = {o for n in step.nodes for o in n.outputs}
    local: dict[Value, Value] = {}
    inputs: list[Value] = []
    for value in (v for n in step.nodes for v in n.inputs):
        if value not in produced and value not in local:
            local[value] = value if value in graph.inputs else Value(value.type, names(value))
            inputs.append(local[value])
    nodes, exported = [], []
    for node in step.nodes:
        for out in node.outputs:
            later = any(i > index and (i == len(steps) or node not in steps[i].nodes) for i in readers.get(out, ()))
            local[out] = Value(out.type, names(out)) if later else out
            exported += [local[out]] if later else []
        renamed = (tuple(local[v] for v in node.inputs), tuple(local[o] for o in node.outputs))
        nodes.append(replace(node, inputs=renamed[0], outputs=renamed[1]))
    inputs += _symbol_sources(nodes, inputs, graph)
    segment_graph = Graph(tuple(inputs), tuple(nodes), tuple(exported), name.replace("/", "_"))
    state = tuple(n.inputs[0].name for n in step.nodes if is_write(n))
    return RankSegment(name, segment_graph, model_bytes(segment_graph), state, tuple(v.name for v in exported))


def _symbol_sources(nodes: Sequence[Node], inputs: Sequence[Value], graph: Graph) -> list[Value]:
    """Graph inputs to add so that every symbolic dim the segment computes with can be read at run time."""
    have = {d for v in inputs for d in v.shape if isinstance(d, str)}
    extra = []
    for symbol in sorted({d for n in nodes for v in n.outputs for d in v.shape if isinstance(d, str)} - have):
        source = next((v for v in graph.inputs if symbol in v.shape), None)
        if source is not None and source not in inputs and source not in extra:
            extra.append(source)
    return extra


def _instructions(steps, segments, names, readers, world_size):
    instructions: list[daemon_pb2.Instruction] = []
    groups: dict[str, tuple[int, ...]] = {}
    pending: dict[str, tuple[str, list[Value]]] = {}  # handle -> (group, outputs)
    segment_names = iter(segments)
    for index, step in enumerate(steps):
        reads = step.reads()
        for handle, (_, outputs) in list(pending.items()):
            if reads.intersection(outputs):
                instructions.append(daemon_pb2.Instruction(wait=daemon_pb2.WaitOp(handle=handle)))
                del pending[handle]
        if step.collective is None:
            segment = segments[next(segment_names)]
            run = daemon_pb2.RunSegment(segment=segment.name, outputs=segment.outputs)
            instructions.append(daemon_pb2.Instruction(run_segment=run))
            continue
        node, spec = step.collective, registry.get(step.collective.op).collective
        ranks = group_ranks(node.attrs)
        group = group_name(ranks, world_size)
        if group:
            groups[group] = ranks
        outputs = [] if spec.alias else list(node.outputs)
        first_read = min((i for o in outputs for i in readers.get(o, ()) if i > index), default=len(steps))
        handle = ""
        if first_read > index + 1 or any(g == group for g, _ in pending.values()):
            handle = f"{names.prefix}/h{index}"
            pending[handle] = (group, outputs)
        op = daemon_pb2.CollectiveOp(
            kind=spec.kind,
            group=group,
            inputs=[names(v) for v in node.inputs] if spec.wire_inputs else [],
            outputs=[names(v) for v in outputs],
            handle=handle,
            **spec.fields(node),
        )
        instructions.append(daemon_pb2.Instruction(collective=op))
    for handle in pending:
        instructions.append(daemon_pb2.Instruction(wait=daemon_pb2.WaitOp(handle=handle)))
    return instructions, dict(sorted(groups.items()))


def _free_after_last_use(instructions: list, segments: Mapping[str, RankSegment], temporary: list[str]) -> list:
    """`instructions` with each temporary freed right after the last instruction that reads it (an asynchronous
    collective reads its inputs when it starts: the communicator keeps the array it was given)."""
    last: dict[str, int] = {}
    for index, ins in enumerate(instructions):
        which = ins.WhichOneof("op")
        if which == "run_segment":
            reads = [v.name for v in segments[ins.run_segment.segment].graph.inputs]
        elif which == "collective":
            reads = list(ins.collective.inputs)
        else:
            continue
        last.update((name, index) for name in reads)
    frees: dict[int, list[str]] = {}
    for name in temporary:
        frees.setdefault(last.get(name, len(instructions) - 1), []).append(name)
    out = []
    for index, ins in enumerate(instructions):
        out.append(ins)
        if index in frees:
            out.append(daemon_pb2.Instruction(free=daemon_pb2.FreeOp(names=sorted(frees[index]))))
    return out


def _describe(ins: daemon_pb2.Instruction, segments: Mapping[str, RankSegment]) -> str:
    which = ins.WhichOneof("op")
    op = getattr(ins, which)
    if which == "run_segment":
        segment = segments[op.segment]
        ins_names = ", ".join(v.name for v in segment.graph.inputs)
        writes = f" writes {list(segment.state)}" if segment.state else ""
        return f"run {op.segment} ({len(segment.graph.nodes)} nodes) ({ins_names}) -> {list(op.outputs)}{writes}"
    if which == "collective":
        kind = collective_pb2.CollectiveKind.Name(op.kind)
        start = f" start {op.handle}" if op.handle else ""
        return f"{kind} group={op.group or 'world'!r} {list(op.inputs)} -> {list(op.outputs)}{start}"
    if which == "wait":
        return f"wait {op.handle}"
    if which == "free":
        return f"free {len(op.names)} tensors"
    return f"{which} {op}"
