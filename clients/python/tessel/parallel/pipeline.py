"""Pipeline parallel in the SDK: MindSpore's `pipeline_stages`, `Cell.pipeline_stage` and `PipelineCell`, on the
compiler's pipeline pass (tessel.compiler.pipeline).

    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", pipeline_stages=2,
                                 pipeline_config={"pipeline_scheduler": "1f1b"})
    net.layer1.pipeline_stage = 0
    net.layer2.pipeline_stage = 1
    loss_net = nn.PipelineCell(nn.WithLossCell(net, loss_fn), micro_size=4)   # returns the sum of the 4 losses

The world of N ranks is `pipeline_stages` S stages of R = N / S ranks: stage s holds ranks s*R .. s*R+R-1, and
the ranks of one stage plan the network among themselves as SEMI_AUTO/AUTO_PARALLEL does (shard() strategies,
data parallel by default): stages x data-parallel x model-parallel = world. Every rank traces the whole network
at the global shapes of its stage's R devices and the parallel pass partitions it for its place among them; the
pipeline pass then keeps this rank's stage, in the order of the schedule (`Schedule.rank_ops`), with transfers to
the ranks of the same place in the other stages. The whole schedule, every stage's, is generated and run dry in
the rank simulator (`tessel.compiler.pipeline.check`) before this rank compiles anything.

A rank holds only its stage's parameters and optimizer state: the others are never put on its daemon (and,
created under `no_init_parameters`, never drawn); reading one of them there is an error naming the stages that
hold it. Every rank returns the step's loss (the last stage sends it to the others).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from tessel import context
from tessel.compiler import registry
from tessel.compiler.ir import Graph, Node, Value
from tessel.compiler.pipeline import PipelinedGraph, Schedule, Tag, check, generate, pipeline_rank_graph
from tessel.core.errors import ConfigurationError

_MODES = (context.ParallelMode.SEMI_AUTO_PARALLEL, context.ParallelMode.AUTO_PARALLEL)
_checked: dict[tuple, Any] = {}  # (schedule, transfers) -> checked


@dataclass(frozen=True)
class Mesh:
    """Where this rank sits: `stages` pipeline stages of `devices` ranks each; this rank is `index` of `stage`."""

    stages: int
    devices: int
    stage: int
    index: int

    @property
    def pipelined(self) -> bool:
        return self.stages > 1


def stages() -> int:
    return context.get_auto_parallel_context("pipeline_stages")


def mesh(world: int, rank: int) -> Mesh:
    """This rank's place for the current context (a world of one stage unless pipeline_stages > 1)."""
    count = stages()
    if count == 1:
        return Mesh(1, world, 0, rank)
    mode = context.get_auto_parallel_context("parallel_mode")
    if mode not in _MODES:
        raise ConfigurationError(
            f"pipeline_stages={count} with parallel_mode={mode!r}: pipeline parallel plans the stages' networks "
            "as SEMI_AUTO_PARALLEL does. Fix: set_auto_parallel_context(parallel_mode=ParallelMode."
            "SEMI_AUTO_PARALLEL, pipeline_stages=...) (or AUTO_PARALLEL)"
        )
    if world % count:
        divisor = max(d for d in range(1, count) if world % d == 0)
        raise ConfigurationError(
            f"pipeline_stages={count} does not divide the {world} ranks of the job; the rule: every stage runs on "
            f"the same number of ranks (world = stages x ranks per stage). Fix: pipeline_stages a divisor of {world} "
            f"(e.g. {divisor}), or run {count * -(-world // count)} ranks"
        )
    devices = world // count
    return Mesh(count, devices, rank // devices, rank % devices)


def current_mesh() -> Mesh:
    from tessel.common.engine import engine

    eng = engine()
    return mesh(eng.world_size, eng.runtime.rank)


def scheduler() -> tuple[str, bool]:
    """(pipeline_scheduler, pipeline_interleave) from pipeline_config."""
    config = context.get_auto_parallel_context("pipeline_config") or {}
    return config.get("pipeline_scheduler", "1f1b"), bool(config.get("pipeline_interleave", False))


# --- what the trace says about stages and micro-batches --------------------------------------------------------------


def cell_name(trace: Any, cell: Any) -> str:
    if cell is None:
        return ""
    path = trace.cell_paths.get(id(cell))
    return f"{path} ({cell.cls_name})" if path else cell.cls_name


def logical_tags(graph: Graph, trace: Any, count: int, interleave: bool) -> tuple[dict[Node, Tag], int, int]:
    """Each traced node's Tag (virtual stage, micro-batch, cell), the chunks per stage and the micro-batches.

    Chunks: with pipeline_interleave, a stage number lower than the one before it in a micro-batch's order of
    execution starts the next chunk (MindSpore's interleaved stage_config: 0, 1, 0, 1 is chunk 0 on stages 0 and
    1, then chunk 1); virtual stage = chunk * stages + stage."""
    raw = {n: trace.pipeline_tags.get(n.outputs[0]) for n in graph.nodes if n.outputs}
    _check_stage_numbers(trace, raw, count)
    in_micro = any(found is not None and found[1] is not None for found in raw.values())
    chunk: dict[int, int] = {}
    last: dict[int, int] = {}
    tags: dict[Node, Tag] = {}
    micros = 0
    for node, found in raw.items():
        if found is None:
            continue
        stage, micro, cell = found
        if micro is not None:
            micros = max(micros, micro + 1)
        order = micro if in_micro else 0  # without PipelineCell (inference) the whole batch is micro-batch 0
        virtual = None
        if stage is not None and order is not None:
            if stage < last.get(order, 0) and interleave:
                chunk[order] = chunk.get(order, 0) + 1
            last[order] = stage
            virtual = chunk.get(order, 0) * count + stage
        tags[node] = Tag(virtual, micro, cell_name(trace, cell))
    chunks = {c for c in chunk.values()} | {0}
    if len({chunk.get(m, 0) for m in range(micros)}) > 1:
        raise ConfigurationError("the micro-batches of PipelineCell run different stage sequences; they must be alike")
    return tags, max(chunks) + 1, max(micros, 1)


def _check_stage_numbers(trace: Any, raw: Mapping, count: int) -> None:
    """Stage numbers lie in 0 .. stages-1 and every stage has a cell."""
    cells: dict[int, set[str]] = {}
    for found in raw.values():
        if found is not None and found[0] is not None:
            cells.setdefault(found[0], set()).add(cell_name(trace, found[2]))
    for stage, names in sorted(cells.items()):
        if stage >= count:
            raise ConfigurationError(
                f"cell {sorted(names)[0]} has pipeline_stage={stage}, but pipeline_stages={count}; the rule: stages "
                f"are numbered 0 .. {count - 1}. Fix: pipeline_stage < {count}, or pipeline_stages > {stage}"
            )
    missing = sorted(set(range(count)) - set(cells))
    if missing:
        shown = {s: sorted(n)[:3] for s, n in sorted(cells.items())}
        raise ConfigurationError(
            f"pipeline_stages={count} but no cell is on stage(s) {missing} (cells by stage: {shown}); the rule: "
            f"every stage 0 .. {count - 1} runs some cells, numbered without gaps. Fix: set pipeline_stage "
            f"{missing[0]} on a cell with parameters, or pipeline_stages={count - len(missing)}"
        )


def schedule_for(count: int, chunks: int, micros: int, tagged_micro: bool, forward_only: bool = False) -> Schedule:
    """The schedule the context asks for; a step without gradients (inference) runs GPipe's forwards, with any
    number of micro-batches."""
    name, interleave = scheduler()
    if forward_only:
        return generate("gpipe", count, micros, chunks, forward_only=True)
    if micros < count:
        fix = (
            f"PipelineCell(net, micro_size={count}) or more"
            if tagged_micro
            else "wrap the loss network in nn.PipelineCell(net_with_loss, micro_size), micro_size >= stages"
        )
        raise ConfigurationError(
            f"pipeline_stages={count} with {micros} micro-batch(es): the rule: micro_size >= pipeline_stages (a "
            f"stage needs a micro-batch to work on while the pipeline fills). Fix: {fix}"
        )
    if chunks > 1 and not interleave:  # pragma: no cover - chunks are only counted with interleave
        raise ConfigurationError("internal: chunks without pipeline_interleave")
    return generate(name, count, micros, chunks)


# --- the stage's graph ----------------------------------------------------------------------------------------------


def stage_graph(
    plan: Any,
    graph: Graph,
    trace: Any,
    where: Mesh,
    data: Collection[str],
    parameters: Collection[str],
    expand_gradients: bool = False,
    local_outputs: Collection[int] = (),
) -> PipelinedGraph:
    """This rank's graph: the rank graph of `plan` (over one stage's devices) cut to its stage (see the module
    docstring); the schedule, every stage's, is checked first."""
    _, interleave = scheduler()
    tags, chunks, micros = logical_tags(graph, trace, where.stages, interleave)
    tagged_micro = any(t.micro is not None for t in tags.values())
    forward_only = not any(registry.get(n.op).differentiates for n in graph.nodes)
    schedule = schedule_for(where.stages, chunks, micros, tagged_micro, forward_only)
    rank_graph = plan.rank_graph(where.index, expand_gradients=expand_gradients)
    origins = plan.rank_origins(where.index, expand_gradients=expand_gradients)
    return cut(rank_graph, origins, tags, data, parameters, schedule, where, local_outputs)


def cut(
    rank_graph: Graph,
    origins: Mapping[Node, Node],
    tags: Mapping[Node, Tag],
    data: Collection[str],
    parameters: Collection[str],
    schedule: Schedule,
    where: Mesh,
    local_outputs: Collection[int] = (),
) -> PipelinedGraph:
    """The pipeline pass on a rank graph whose nodes map (`origins`) to traced nodes (`tags`)."""
    by_value: dict[Value, Tag] = {}
    for node in rank_graph.nodes:
        origin = origins.get(node, node)
        tag = tags.get(origin)
        if tag is not None and node.outputs:
            by_value[node.outputs[0]] = tag
    piped = pipeline_rank_graph(
        rank_graph, by_value, data, schedule, where.stage, where.devices, where.index, parameters, local_outputs
    )
    key = (schedule, piped.transfers)
    if key not in _checked:
        _checked[key] = check(schedule, piped.transfers)
    return piped


def train_stage(train: Graph, forward: Graph, part: Any, trace: Any, keys: Collection[str], where: Mesh):
    """Model.train's step on this rank's stage: `train` is the fused step built on the rank's forward graph of
    `part` (a RankPartition over one stage's devices) with its gradients deferred; `forward` the traced graph."""
    from tessel.common.engine import engine

    _, interleave = scheduler()
    tags, chunks, micros = logical_tags(forward, trace, where.stages, interleave)
    schedule = schedule_for(where.stages, chunks, micros, any(t.micro is not None for t in tags.values()))
    params = set(keys)
    data = [v.name for v in forward.inputs if v.name not in params and v.name not in trace.feeders]
    piped = cut(train, part.plan.rank_origins(where.index), tags, data, list(keys), schedule, where)
    mark_parameters({p.key: p for p in trace.parameters()}, piped, engine().id)
    return piped


def mark_parameters(params: Mapping[str, Any], piped: PipelinedGraph, engine_id: int) -> None:
    """Record, on each Parameter, whether this rank holds it (some graph of the job kept it on this stage)."""
    held = set(piped.parameters)
    for key, p in params.items():
        before = p._pipeline[1] if p._pipeline is not None and p._pipeline[0] == engine_id else False
        p._pipeline = (engine_id, before or key in held)
