"""Which part of a pipelined step each node of a rank's graph is: the first half of the pipeline pass.

The SDK tags the nodes it traced (by their first output Value): the virtual stage of the cell that created them
(`Cell.pipeline_stage`, chunks counted by the SDK) and the micro-batch `PipelineCell` was splitting. From the tags
and the graph's data flow every node of a graph holding at most one GradientOf gets its part:

- prologue: forward nodes that depend on no micro-batch (parameters read through a Mirror or a Cast, a learning
  rate times the loss seed): run once, at the start, on every stage that reads them;
- piece (v, m): forward nodes of micro-batch m on virtual stage v; an untagged node runs on the latest stage of
  its inputs (or, reading none, on the earliest stage of its readers);
- epilogue: forward nodes that combine several micro-batches (the sum of their losses), on the stage of their
  latest input;
- the GradientOf node, and post: the nodes that read its gradients (a gradient reducer, the optimizer's update),
  each on the stages of the parameters it touches.

A node whose tag says stage t but that reads what a later stage computes is an error naming both cells: stages
follow the network's order of execution.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from tessel.compiler import registry
from tessel.compiler.ir import Graph, Node, Value
from tessel.core.errors import ConfigurationError, NotSupportedYetError


@dataclass(frozen=True)
class Tag:
    """What the SDK knew when it traced a node: the virtual stage of its cell (None: follow the graph), the
    micro-batch it belongs to (None: not inside PipelineCell) and the cell's path (for errors)."""

    stage: int | None = None
    micro: int | None = None
    cell: str = ""


@dataclass
class Parts:
    """The parts of a graph's nodes (see the module docstring). `stage` and `micro` hold the virtual stage and
    micro-batch of every piece and epilogue node; `uses` the virtual stages that read each prologue value and
    graph input (directly or through other prologue nodes)."""

    graph: Graph
    gradient: Node | None
    prologue: list[Node] = field(default_factory=list)
    pieces: dict[tuple[int, int], list[Node]] = field(default_factory=dict)
    epilogue: list[Node] = field(default_factory=list)
    post: list[Node] = field(default_factory=list)
    stage: dict[Node, int] = field(default_factory=dict)
    micro: dict[Node, int] = field(default_factory=dict)
    uses: dict[Value, set[int]] = field(default_factory=dict)
    cells: dict[Node, str] = field(default_factory=dict)

    def where(self, node: Node) -> str:
        """The node, its cell and the user's line, for messages."""
        cell = self.cells.get(node)
        at = f" at {node.source}" if node.source else ""
        return f"{node.op}" + (f" in cell '{cell}'" if cell else "") + at


def split_parts(graph: Graph, tags: Mapping[Value, Tag], data: Collection[str], virtual_stages: int) -> Parts:
    """The parts of `graph`'s nodes; `data` names the inputs that are dataset columns (when no node carries a
    micro-batch, the whole step is micro-batch 0)."""
    gradients = [n for n in graph.nodes if registry.get(n.op).differentiates]
    if len(gradients) > 1:
        raise NotSupportedYetError(
            "not supported yet: two gradient computations (value_and_grad / GradOperation) in one pipelined step, "
            "pipeline parallel differentiates the step's loss once; compute both losses in one network"
        )
    parts = Parts(graph, gradients[0] if gradients else None)
    _tag_lookup = {n: tags.get(n.outputs[0]) if n.outputs else None for n in graph.nodes}
    parts.cells = {n: t.cell for n, t in _tag_lookup.items() if t is not None and t.cell}
    forward = _separate_post(parts)
    micros = _micro_sets(parts, forward, _tag_lookup, data)
    data_side = [n for n in forward if micros[n]]
    parts.prologue = [n for n in forward if not micros[n]]
    for node in data_side:
        if len(micros[node]) == 1:
            (parts.micro[node],) = micros[node]
    _assign_stages(parts, data_side, _tag_lookup, virtual_stages)
    for node in data_side:
        if node in parts.micro:
            parts.pieces.setdefault((parts.stage[node], parts.micro[node]), []).append(node)
        else:
            parts.epilogue.append(node)
    _uses(parts)
    return parts


def _separate_post(parts: Parts) -> list[Node]:
    """The forward nodes; the nodes reading the gradients (and what they compute) go to parts.post."""
    after: set[Value] = set(parts.gradient.outputs) if parts.gradient is not None else set()
    forward = []
    for node in parts.graph.nodes:
        if node is parts.gradient:
            continue
        if any(v in after for v in node.inputs):
            parts.post.append(node)
            after.update(node.outputs)
        else:
            forward.append(node)
    return forward


def _micro_sets(parts: Parts, forward: list[Node], tags, data: Collection[str]) -> dict[Node, frozenset[int]]:
    """The micro-batches each forward node depends on: its tag's, for a node that reads the data (what reads only
    parameters is shared by the micro-batches, as a Mirror a micro-batch's op first asked for), else its inputs'."""
    tagged = any(t is not None and t.micro is not None for t in tags.values())
    sets: dict[Value, frozenset[int]] = {}
    data_side: set[Value] = {v for v in parts.graph.inputs if v.name in data}
    if not tagged:  # no PipelineCell: the whole step is one micro-batch
        sets.update((v, frozenset({0})) for v in data_side)
    out: dict[Node, frozenset[int]] = {}
    for node in forward:
        mine = frozenset().union(*(sets.get(v, frozenset()) for v in node.inputs))
        tag = tags.get(node)
        reads_data = any(v in data_side for v in node.inputs)
        if reads_data:
            data_side.update(node.outputs)
        if tag is not None and tag.micro is not None and reads_data:
            if mine - {tag.micro}:
                raise ConfigurationError(
                    f"{parts.where(node)} computes micro-batch {tag.micro} but reads micro-batches "
                    f"{sorted(mine - {tag.micro})}; the rule: PipelineCell's micro-batches run independently. Fix: "
                    "do not pass tensors from one micro-batch's call to another"
                )
            mine = frozenset({tag.micro})
        out[node] = mine
        sets.update((o, mine) for o in node.outputs)
    return out


def _assign_stages(parts: Parts, nodes: list[Node], tags, virtual_stages: int) -> None:
    """Each data-side node's virtual stage: its tag's, else its latest input's, else its earliest reader's."""
    producer = {o: n for n in nodes for o in n.outputs}
    stage = parts.stage
    for node in nodes:
        tag = tags.get(node)
        inputs = [producer[v] for v in node.inputs if v in producer and producer[v] in stage]
        latest = max(inputs, key=lambda n: stage[n], default=None)
        if tag is not None and tag.stage is not None:
            if latest is not None and stage[latest] > tag.stage:
                raise ConfigurationError(
                    f"{parts.where(node)} is on pipeline stage {tag.stage} but reads what {parts.where(latest)} "
                    f"computes on the later stage {stage[latest]}; the rule: pipeline_stage never decreases along "
                    "the network's order of execution. Fix: give the reading cell a stage >= "
                    f"{stage[latest]}, or the earlier cell a smaller one"
                )
            stage[node] = tag.stage
        elif latest is not None:
            stage[node] = stage[latest]
    readers: dict[Node, list[Node]] = {n: [] for n in nodes}
    for node in nodes:
        for v in node.inputs:
            if v in producer:
                readers[producer[v]].append(node)
    for node in reversed(nodes):
        if node not in stage:
            known = [stage[r] for r in readers[node] if r in stage]
            stage[node] = min(known) if known else 0
    for node in nodes:
        if not 0 <= stage[node] < virtual_stages:
            raise ConfigurationError(
                f"{parts.where(node)} is on pipeline stage {stage[node]}, outside 0..{virtual_stages - 1}"
            )


def _uses(parts: Parts) -> None:
    """The virtual stages reading each prologue value and graph input, directly or through prologue nodes; the
    loss and seed of the gradient count as read where the loss is computed."""
    uses = parts.uses
    for node, stage in parts.stage.items():
        for v in node.inputs:
            uses.setdefault(v, set()).add(stage)
    if parts.gradient is not None:
        loss_stage = _stage_of_value(parts, parts.gradient.inputs[0])
        if loss_stage is not None:
            for v in (parts.gradient.inputs[0], parts.gradient.inputs[-1]):
                uses.setdefault(v, set()).add(loss_stage)
    for node in reversed(parts.prologue):
        mine = set().union(*(uses.get(o, set()) for o in node.outputs))
        for v in node.inputs:
            uses.setdefault(v, set()).update(mine)


def _stage_of_value(parts: Parts, value: Value) -> int | None:
    producer = parts.graph.producers.get(value)
    return parts.stage.get(producer) if producer is not None else None
