"""Which strategy every op of a traced graph runs with, and the strategy file that records it.

- SEMI_AUTO_PARALLEL: the user's own (`shard()`, `Cell.set_data_parallel()`); every other op the parallel pass's
  default (data parallel on the data side, following its inputs on the weight side).
- AUTO_PARALLEL: the search mode of `set_auto_parallel_context(search_mode=...)` (MindSpore's default,
  "recursive_programming"; "sharding_propagation"; "dynamic_programming") plans every op the user did not
  configure (`tessel.compiler.parallel.search`), keeping the user's strategies, within the memory budget
  `tessel.runtime.set_memory(max_size=...)` gives. In a job with a coordinator the coordinator plans (one plan for
  every rank, priced with the daemons' measurements, cached across jobs); a world of 1 or a simulated rank plans
  in this process with the same library. The weight side (an optimizer's update) still follows the parameters'
  layouts.
- `strategy_ckpt_config={"save_file": "s.json"}` (or the older `strategy_ckpt_save_file`) writes, on rank 0, every
  parameter's layout and every planned graph's op strategies as JSON; `load_file` reads them back: parameters keep
  those layouts and a graph found in the file (same net, by hash) runs its saved strategies, no search.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from tessel import context
from tessel.compiler import registry
from tessel.compiler.ir import Graph, Node
from tessel.core.errors import ConfigurationError

_AUTO = context.ParallelMode.AUTO_PARALLEL


def strategies(graph: Graph, sdk_trace: Any, parameters: list[str], device_num: int, dataset: Any, weights=()):
    """{node: strategy} for the parallel pass (see the module docstring)."""
    from tessel.parallel.semi_auto import _dataset_arg, strategies_of

    user = strategies_of(graph, sdk_trace)
    saved = _saved_graph(graph)
    if saved is not None:
        return saved
    if context.get_auto_parallel_context("parallel_mode") != _AUTO:
        return user
    taken = set(parameters) | set(weights) | set(getattr(sdk_trace, "feeders", ()))
    if not any(v.ndim > 0 and v.name not in taken for v in graph.inputs):
        return user  # no data: an optimizer's update, which follows the parameters' layouts
    from tessel.compiler.parallel.partition import weight_side
    from tessel.coordinator.plan_client import plan_remotely_or_locally

    client, job_id = _coordinator(device_num)
    budget = _memory_budget()
    if budget is None and client is None:
        # planned here, priced with a generic CPU model: its memory size (8 GiB) describes no real device, so
        # without ms.runtime.set_memory(max_size=...) the budget is this host's memory
        budget = _host_memory()
    plan = plan_remotely_or_locally(
        forward_part(graph),
        mode=context.get_auto_parallel_context("search_mode"),
        device_num=device_num,
        fixed=user,
        parameters=parameters,
        dataset=_dataset_arg(dataset),
        memory_budget=budget,
        client=client,
        job_id=job_id,
        alltoall=context.get_auto_parallel_context("enable_alltoall"),
    )
    global last_cost_model
    last_cost_model = plan.cost_model
    logging.getLogger("tessel").debug(
        "planned graph %r on %d devices %s in %.3f s%s: predicted step %.3f ms",
        graph.name,
        device_num,
        "by the coordinator" if plan.where == "coordinator" else "in this process",
        plan.seconds,
        " (cached)" if plan.cached else "",
        plan.step_time * 1e3,
    )
    planned = plan.strategies
    side = weight_side(graph, set(parameters), set(weights))
    kept = {}
    for node, strategy in planned.items():
        own = registry.get(node.op)
        weight_only = own.differentiates or own.writes is not None or all(v in side for v in node.inputs)
        if node in user or not weight_only:
            kept[node] = strategy
    return kept


# The cost model the last AUTO_PARALLEL plan was priced with (the job's measured one when a coordinator planned it):
# what save_graphs' cost breakdown uses. None until a plan was searched.
last_cost_model: Any = None


def reported_cost_model(device_num: int) -> Any:
    """The model save_graphs' cost breakdown prices a plan with: the last plan's (CostModel.default_cpu before any),
    with or without AlltoAll as the plan was made (enable_alltoall)."""
    import dataclasses

    from tessel.compiler.parallel.search import CostModel

    model = last_cost_model or CostModel.default_cpu(device_num)
    return dataclasses.replace(model, alltoall=bool(context.get_auto_parallel_context("enable_alltoall")))


def _coordinator(device_num: int) -> tuple[Any, str]:
    """(coordinator client, job id) when this rank's job has a coordinator that can plan a world of `device_num`
    (the job's own size); else (None, ""): a world of 1 in this process, or a simulated rank, plans here."""
    from tessel.communication import runtime

    current = runtime._runtime
    if current is None or current.coordinator is None or current.world_size != device_num:
        return None, ""
    return current.coordinator, current.job_id


def forward_part(graph: Graph) -> Graph:
    """The graph up to its gradients: what a search plans (the backward follows the forward's layouts, and what
    uses the gradients, an update, follows the parameters'). Nodes are the graph's own, so plans map back."""
    after = {o for n in graph.nodes if registry.get(n.op).differentiates for o in n.outputs}
    if not after:
        return graph
    kept, losses = [], []
    for node in graph.nodes:
        if registry.get(node.op).differentiates:
            losses.append(node.inputs[0])
        elif any(v in after for v in node.inputs):
            after.update(node.outputs)
        else:
            kept.append(node)
    produced = {o for n in kept for o in n.outputs} | set(graph.inputs)
    outputs = [v for v in (*losses, *graph.outputs) if v in produced and v not in after]
    return Graph(graph.inputs, tuple(kept), tuple(dict.fromkeys(outputs)), graph.name)


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _memory_budget() -> int | None:
    from tessel.runtime import memory_settings

    settings = memory_settings()
    return settings.max_size if settings.configured else None


# --- strategy files -----------------------------------------------------------------------------------------------

FORMAT = "tessel-strategy-checkpoint-1"


def _files() -> tuple[str, str]:
    config = context.get_auto_parallel_context("strategy_ckpt_config") or {}
    save = config.get("save_file") or context.get_auto_parallel_context("strategy_ckpt_save_file")
    load = config.get("load_file") or context.get_auto_parallel_context("strategy_ckpt_load_file")
    return save or "", load or ""


def _document(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as source:
            document = json.load(source)
    except FileNotFoundError:
        raise ConfigurationError(f"strategy_ckpt load_file {path!r} does not exist") from None
    except ValueError:
        raise ConfigurationError(f"strategy_ckpt load_file {path!r} is not JSON") from None
    if document.get("format") != FORMAT:
        raise ConfigurationError(
            f"strategy_ckpt load_file {path!r} was not written by tessel's strategy_ckpt_config save_file"
        )
    return document


def _saved_graph(graph: Graph) -> dict[Node, Any] | None:
    """The strategies the load_file saved for this graph (None: no file, or not this graph)."""
    from tessel.compiler.parallel.search.strategy_file import strategies_of_document

    _, load = _files()
    if not load:
        return None
    graphs = _document(load)["graphs"]
    saved = graphs.get(_graph_key(graph))
    if saved is None:  # files of earlier versions: one entry per graph name
        saved = graphs.get(graph.name)
    return None if saved is None else strategies_of_document(saved, graph, load)


def _graph_key(graph: Graph) -> str:
    """A graph's entry in a strategy file: its name and portable hash, so the same net compiled for two input
    shapes keeps two entries (one name would keep the last only)."""
    from tessel.compiler.parallel.search.strategy_file import portable_hash

    return f"{graph.name}@{portable_hash(graph)[:16]}"


def loaded_layouts() -> dict[str, Any]:
    """name -> Layout of the parameters the load_file lists."""
    from tessel.parallel.checkpoint import layout_of

    _, load = _files()
    if not load:
        return {}
    return {name: layout_of(record) for name, record in _document(load)["parameters"].items()}


def record(plan: Any, params: list[Any], rank: int) -> None:
    """Add this plan's op strategies and the parameters' layouts to the save_file (rank 0 writes)."""
    from tessel.communication.simulation import settings as simulation
    from tessel.compiler.parallel.search.strategy_file import strategy_document
    from tessel.parallel.checkpoint import layout_record
    from tessel.train.serialization import atomic_write

    report = os.environ.get("TESSEL_PARAMETER_REPORT")
    if report:  # how this rank holds every parameter, rewritten after each plan
        from tessel.common.parameter import report_layouts

        os.makedirs(report, exist_ok=True)
        report_layouts(os.path.join(report, f"rank_{rank}.json"))
    save, _ = _files()
    if not save or (rank != 0 and simulation() is None):  # a simulated world has only the rank it plans
        return
    try:
        with open(save, encoding="utf-8") as source:
            document = json.load(source)
    except (FileNotFoundError, ValueError):
        document = {}
    if document.get("format") != FORMAT:
        document = {"format": FORMAT, "parameters": {}, "graphs": {}}
    config = context.get_auto_parallel_context("strategy_ckpt_config") or {}
    trainable_only = config.get("only_trainable_params", True)
    for p in params:
        if p.layout is not None and (p.requires_grad or not trainable_only):
            document["parameters"][p.name] = layout_record(p.layout, p.shape)
    document["graphs"][_graph_key(plan.graph)] = strategy_document(plan)
    folder = os.path.dirname(os.path.abspath(save))
    os.makedirs(folder, exist_ok=True)
    atomic_write(save, json.dumps(document, indent=1).encode())
