"""Readable views of the parallel pass: `explain` (each op's strategy, layouts, inserted collectives and bytes
moved), `save_graphs` (the graph before and after the pass, like MindSpore's step_parallel_begin/end IR files)
and `collective_counts` (how many collectives of each kind a graph issues: "Megatron MLP = one AllReduce").

    >>> print(explain(graph, {matmul: ((1, 1), (1, 2))}, device_num=8, parameters=["w"]))
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

from tessel.compiler import registry
from tessel.compiler.ir import Graph, Value
from tessel.compiler.parallel.partition import ParallelPlan, parallelize
from tessel.compiler.parallel.redistribution import TABLE, Redistribution, Step


def collective_counts(graph: Graph) -> Counter:
    """How many nodes of each collective op `graph` holds, e.g. Counter({'AllReduce': 1})."""
    return Counter(node.op for node in graph.nodes if registry.get(node.op).collective is not None)


def explain(graph: Graph | ParallelPlan, strategies: Any = None, device_num: int | None = None, **options: Any) -> str:
    """The plan as text: inputs with their layouts and local shapes; per node its strategy (and where it came
    from), device matrix, the redistribution of each input (collectives, group sizes, bytes each rank sends) and
    its output layouts; totals per rank at the end."""
    plan = graph if isinstance(graph, ParallelPlan) else parallelize(graph, strategies, device_num or 1, **options)
    ids = _ids(plan.graph)
    lines = [f"parallel plan of graph {plan.graph.name!r} on {plan.device_num} devices", "inputs:"]
    for v in plan.graph.inputs:
        layout = plan.layouts[v]
        kind = "parameter" if v.name in plan.parameters else "data"
        local = layout.local_shape(v.shape)
        lines.append(f"  {v.name}: {v.type!r} {kind} {layout} {layout.describe()}, local {list(local)}")
    lines.append("nodes:")
    totals: Counter = Counter()
    sent = 0
    for node in plan.graph.nodes:
        placement = plan.placements[node]
        args = ", ".join(ids[v] for v in node.inputs)
        outs = ", ".join(ids[o] for o in node.outputs)
        lines.append(
            f"  {outs} = {node.op}({args})  {placement.origin} {placement.strategy}, "
            f"device matrix {placement.device_matrix}"
        )
        moves = [(f"in {i} {ids[v]}", plan.redistributions.get((node, i))) for i, v in enumerate(node.inputs)]
        moves += [(f"out {j}", plan.redistributions.get((node, "out", j))) for j in range(len(node.outputs))]
        for label, move in moves:
            if move is not None:
                lines.append(f"      {label}: {_move(move)}")
                totals.update(move.collectives)
                sent += move.sent_bytes
        shown = ", ".join(repr(layout) for layout in placement.outputs)
        lines.append(f"      out: {shown}")
    lines.append("outputs:")
    for k, (v, layout) in enumerate(zip(plan.graph.outputs, plan.output_layouts)):
        move = plan.redistributions.get(("output", k))
        if move is not None:
            totals.update(move.collectives)
            sent += move.sent_bytes
        lines.append(f"  {k}: {ids[v]} {layout}" + (f"  <- {_move(move)}" if move else ""))
    counted = ", ".join(f"{op} x{n}" for op, n in sorted(totals.items())) or "none"
    lines.append(f"forward collectives per rank: {counted}; bytes sent per rank: {sent}")
    return "\n".join(lines)


def _ids(graph: Graph) -> dict[Value, str]:
    """Value names as Graph.dump prints them (%name for inputs, %k for node outputs)."""
    ids = {v: f"%{v.name}" for v in graph.inputs}
    for node in graph.nodes:
        for out in node.outputs:
            ids[out] = f"%{len(ids) - len(graph.inputs)}"
    return ids


def _move(move: Redistribution) -> str:
    steps = ", ".join(
        _step(step, seg.device_matrix, sent) for seg in move.segments for step, sent in zip(seg.steps, seg.sent_bytes)
    )
    return f"{move.source} -> {move.target}: {steps} ({move.sent_bytes} bytes/rank)"


def _step(step: Step, matrix: tuple[int, ...], sent: int) -> str:
    ranks = 1
    for a in step.axes:
        ranks *= matrix[a]
    op = TABLE[step.kind].op
    if step.kind == "slice":
        return f"{op}(dim {step.dim} into {ranks})"
    if step.kind == "all_to_all":
        return f"{op}({ranks} ranks, split dim {step.to_dim}, concat dim {step.dim}, {sent} B)"
    where = "" if step.kind == "all_reduce" else f", dim {step.dim}"
    reduce = f"{step.op}, " if step.kind in ("all_reduce", "reduce_scatter") else ""
    return f"{op}({reduce}{ranks} ranks{where}, {sent} B)"


def begin_text(plan: ParallelPlan) -> str:
    """The graph before the pass, each node followed by its strategy (step_parallel_begin)."""
    lines = plan.graph.dump().splitlines()
    out = [lines[0]]
    for node, line in zip(plan.graph.nodes, lines[1:]):
        placement = plan.placements[node]
        out.append(line)
        out.append(
            f"      # strategy {placement.strategy} ({placement.origin}), device matrix {placement.device_matrix}"
        )
    out.extend(lines[1 + len(plan.graph.nodes) :])
    return "\n".join(out) + "\n"


def cost_text(plan: ParallelPlan, cost_model=None) -> str:
    """The cost model's prediction for the plan against plain data parallel (every op's batch dim cut, every
    parameter whole) on the same devices and data: the breakdown AUTO_PARALLEL's search weighs. A model without
    AlltoAll (`alltoall=False`) prices a plan made without it."""
    from tessel.compiler.parallel.partition import parallelize
    from tessel.compiler.parallel.redistribution import allowed_steps
    from tessel.compiler.parallel.search import CostModel, predict_step_time

    model = cost_model or CostModel.default_cpu(plan.device_num)
    data = {v.name: plan.layouts[v] for v in plan.graph.inputs if v.name not in plan.parameters}
    plain = parallelize(
        plan.graph, {}, plan.device_num, plan.parameters, dataset=data, steps=allowed_steps(model.alltoall)
    )
    lines = [f"predicted step of graph {plan.graph.name!r} on {plan.device_num} devices (cost model: {model!r})"]
    for what, each in (("this plan", plan), ("data parallel", plain)):
        t = predict_step_time(each, model)
        lines.append(
            f"  {what:13s} {t.total * 1e3:9.3f} ms = compute {t.compute * 1e3:.3f} + redistribution "
            f"{t.redistribution * 1e3:.3f} + gradients {t.gradients * 1e3:.3f} + update {t.update * 1e3:.3f} ms; "
            f"{t.memory_bytes / 2**20:.2f} MiB per device"
        )
    return "\n".join(lines) + "\n"


def save_graphs(
    plan: ParallelPlan, directory: str | os.PathLike, ranks: Iterable[int] = (0,), cost_model=None
) -> list[str]:
    """Write step_parallel_begin_<graph>.ir (before the pass, with strategies), step_parallel_end_<graph>_rank<r>.ir
    (each rank's graph after it, layouts and collectives shown) and parallel_plan_<graph>.txt (each op's
    strategy, the redistributions with their bytes, the predicted cost against data parallel, priced with
    `cost_model`, default CostModel.default_cpu) into `directory`; returns the paths."""
    os.makedirs(directory, exist_ok=True)
    name = plan.graph.name
    written = [os.path.join(directory, f"step_parallel_begin_{name}.ir")]
    _write(written[0], begin_text(plan))
    for rank in ranks:
        path = os.path.join(directory, f"step_parallel_end_{name}_rank{rank}.ir")
        _write(path, plan.rank_graph(rank).dump() + "\n")
        written.append(path)
    summary = os.path.join(directory, f"parallel_plan_{name}.txt")
    _write(summary, explain(plan) + "\n" + cost_text(plan, cost_model))
    written.append(summary)
    return written


def _write(path: str, text: str) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(temporary, path)
