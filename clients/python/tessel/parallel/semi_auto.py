"""From a user's network (Primitive.shard(), Cell.set_data_parallel(), the auto-parallel context) to one rank's
forward graph: the SDK side of SEMI_AUTO_PARALLEL, on top of the compiler's parallel pass
(tessel.compiler.parallel).

The engine's Model.train calls, on every rank,

    part = partition_for_rank(graph, sdk_trace, param_names, full_values, rank, device_num)
    part.graph                 # this rank's forward graph: loss first, collectives inserted, Mirror on replicas
    part.params                # {name: this rank's slice of the parameter's full initial value}
    part.slice_feeds(batch)    # the dataset's batch for this rank -> this rank's feeds

`graph` is the forward graph as traced by the SDK with the *global* (whole-world) batch; `sdk_trace` the SdkTrace
that traced it (it knows which Primitive created each node and which cells are set_data_parallel). Every rank
computes the same plan independently (it is deterministic), and caches it per graph.

Data import (the seed's "full import" / "data parallel import" / "model parallel import"):
- full_batch=True (dataset_strategy="full_batch"): every rank's dataset yields the whole global batch; each rank
  keeps what its layout needs (the slicing happens here, on the host: an input the plan only reads in slices is
  sent to the daemon as this rank's slice, with `slice_whole_inputs`);
- full_batch=False (dataset_strategy="data_parallel"): each rank's dataset yields its own slice of the batch
  (dim 0 cut device_num ways); it is checked and passed through;
- dataset_strategy=((a, b), (c,), ...): one strategy per data input, in graph input order; as the seed says, the
  dataset's tensors must match it (each rank reads its slice): a feed of the local shape passes through, a feed
  of the global shape is sliced.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessel import context
from tessel.compiler.ir import Graph, Node
from tessel.compiler.parallel import DATA_PARALLEL, ParallelPlan, Strategy, parallelize, save_graphs
from tessel.compiler.shapes import format_shape
from tessel.core.errors import ConfigurationError
from tessel.parallel.layout import TensorLayout, as_compiler_strategy

_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> {(strategies, world, dataset): plan}


@dataclass(frozen=True, eq=False)
class RankPartition:
    """One rank's share of a network: its forward graph, its parameter slices and how to cut its feeds."""

    graph: Graph
    params: dict[str, np.ndarray]
    slice_feeds: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    plan: ParallelPlan
    rank: int


def strategies_of(graph: Graph, sdk_trace: Any) -> dict[Node, Any]:
    """Each node's strategy as the user set it: the shard() of the Primitive that created it (applied to the
    nodes of that primitive's own op, or the first node it emitted), else DATA_PARALLEL inside a cell set with
    set_data_parallel(); nodes without either are left to the pass (data parallel by default)."""
    primitive_of = getattr(sdk_trace, "primitive_of", {})
    marked = getattr(sdk_trace, "data_parallel", set())
    calls: dict[int, list[tuple[Node, Any]]] = {}
    strategies: dict[Node, Any] = {}
    for node in graph.nodes:
        if not node.outputs:
            continue
        key = node.outputs[0]
        if key in marked:
            strategies[node] = DATA_PARALLEL
        made = primitive_of.get(key)
        if made is not None and getattr(made.primitive, "in_strategy", None) is not None:
            calls.setdefault(made.call, []).append((node, made))
    for nodes in calls.values():
        primitive = nodes[0][1].primitive
        own = [node for node, made in nodes if made.op == primitive.main_op] or [nodes[0][0]]
        strategy = primitive  # the compiler reads its in_strategy/out_strategy; Layouts are converted first
        if any(isinstance(s, TensorLayout) for s in (*primitive.in_strategy, *(primitive.out_strategy or ()))):
            inputs, outputs = (as_compiler_strategy(s) for s in (primitive.in_strategy, primitive.out_strategy))
            strategy = Strategy.of_parts(inputs, outputs)
        for node in own:
            strategies[node] = strategy
    return strategies


def dataset_setting() -> str | tuple:
    """The data import the auto-parallel context asks for: "full_batch", "data_parallel" or a tuple of strategies."""
    return context.get_auto_parallel_context("dataset_strategy")


def plan_for(
    graph: Graph,
    sdk_trace: Any,
    param_names: Collection[str],
    device_num: int,
    dataset: str | tuple | None = None,
    fixed: Mapping[str, Any] | None = None,
    slice_whole_inputs: bool = False,
) -> ParallelPlan:
    """The parallel plan of `graph` (cached per graph, strategies, world size, data import and the layouts of
    parameters an earlier plan sliced, `fixed`). `slice_whole_inputs`: a full_batch input that the plan only reads
    in slices arrives sliced (compiler.parallel.parallelize; the feeds are cut on the host, `slice_feeds`)."""
    from tessel.parallel import planning

    dataset = dataset_setting() if dataset is None else dataset
    inputs = {v.name for v in graph.inputs}
    parameters = tuple(name for name in param_names if name in inputs)
    strategies = planning.strategies(graph, sdk_trace, list(parameters), device_num, dataset)
    fixed = {name: layout for name, layout in (fixed or {}).items() if name in inputs}
    index = {node: k for k, node in enumerate(graph.nodes)}
    shown = tuple(sorted((index[n], _strategy_key(s)) for n, s in strategies.items()))
    from tessel.common.partition import redistribution_steps

    repeated_mean = bool(context.get_auto_parallel_context("loss_repeated_mean"))
    steps = redistribution_steps()
    fixed_key = tuple(sorted(fixed.items(), key=lambda kv: kv[0]))
    key = (shown, device_num, dataset, parameters, fixed_key, repeated_mean, steps, slice_whole_inputs)
    cache = _PLANS.setdefault(graph, {})
    if key not in cache:
        dataset_arg = _dataset_arg(dataset)
        cache[key] = parallelize(
            graph,
            strategies,
            device_num,
            parameters,
            dataset_arg,
            steps=steps,
            fixed=fixed,
            loss_repeated_mean=repeated_mean,
            slice_whole_inputs=slice_whole_inputs,
        )
    return cache[key]


def _strategy_key(strategy: Any) -> Any:
    return strategy if strategy == DATA_PARALLEL else repr(strategy)


def _dataset_arg(dataset: str | tuple) -> Any:
    if isinstance(dataset, str):
        return dataset
    return [s.compiler_layout() if isinstance(s, TensorLayout) else tuple(s) for s in dataset]


def global_shape(shape: tuple, column: int, device_num: int, dataset: str | tuple | None = None) -> tuple:
    """The global (traced) shape of dataset column `column` whose batches each rank's dataset yields at `shape`:
    data_parallel multiplies dim 0 by device_num, full_batch keeps it, a dataset_strategy multiplies each dim by
    its cut. The engine traces the network at these shapes before calling partition_for_rank."""
    dataset = dataset_setting() if dataset is None else dataset
    shape = tuple(shape)
    if dataset == "full_batch" or not shape:
        return shape
    if dataset == "data_parallel":
        return (shape[0] * device_num, *shape[1:])
    entry = dataset[column] if column < len(dataset) else None
    cuts = entry.compiler_layout().splits if isinstance(entry, TensorLayout) else entry
    if cuts is None or len(cuts) != len(shape):
        raise ConfigurationError(
            f"dataset_strategy {dataset} has no {len(shape)}-dim entry for dataset column {column} of shape "
            f"{format_shape(shape)}; the rule: one tuple of cuts per column, one cut per dim. Fix: add or correct it"
        )
    return tuple(size * cut for size, cut in zip(shape, cuts))


def partition_for_rank(
    graph: Graph,
    sdk_trace: Any,
    param_names: Collection[str],
    full_values: Mapping[str, np.ndarray] | None,
    rank: int,
    device_num: int,
    fixed: Mapping[str, Any] | None = None,
    slice_whole_inputs: bool = False,
) -> RankPartition:
    """Rank `rank`'s forward graph, parameter slices (of `full_values`, when given) and feed slicer (see the
    module docstring); `fixed` holds the layouts of parameters an earlier plan sliced. Invalid strategies fail
    here, before any step runs, with a StrategyError naming the op, input, dim and a fix. With
    set_context(save_graphs=True) the graph before and after the pass is written to
    <save_graphs_path>/rank_<rank>/step_parallel_{begin,end}_*.ir. `slice_whole_inputs`: see plan_for."""
    dataset = dataset_setting()
    plan = plan_for(graph, sdk_trace, param_names, device_num, dataset, fixed, slice_whole_inputs)
    rank_graph = plan.rank_graph(rank)
    params = {}
    for name in param_names if full_values is not None else ():
        if name not in full_values:
            raise ConfigurationError(f"partition_for_rank: no full value given for parameter {name!r}")
        held = name in plan.parameters
        params[name] = plan.local_value(name, full_values[name], rank) if held else np.asarray(full_values[name])
    if context.get_context("save_graphs"):
        directory = os.path.join(context.get_context("save_graphs_path"), f"rank_{rank}")
        from tessel.parallel import planning

        save_graphs(plan, directory, ranks=(rank,), cost_model=planning.reported_cost_model(plan.device_num))
    return RankPartition(rank_graph, params, _feed_slicer(plan, rank, dataset), plan, rank)


def _feed_slicer(plan: ParallelPlan, rank: int, dataset: str | tuple) -> Callable:
    data = {v.name: v for v in plan.graph.inputs if v.name not in plan.parameters}

    def slice_feeds(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for name, value in feeds.items():
            value = np.asarray(value)
            if name not in data:  # not a dataset column of this graph (a learning rate, say): as it is
                out[name] = value
                continue
            full = tuple(data[name].shape)
            local = plan.input_layout(name).local_shape(full)
            if value.shape == local and (dataset != "full_batch" or local == full):
                out[name] = value
            elif value.shape == full and dataset != "data_parallel":
                out[name] = plan.local_value(name, value, rank)
            else:
                raise ConfigurationError(_feed_error(name, value.shape, full, local, dataset, plan.device_num))
        return out

    return slice_feeds


def _feed_error(name: str, got: tuple, full: tuple, local: tuple, dataset: Any, device_num: int) -> str:
    if dataset == "full_batch":
        rule = f"full_batch=True: every rank's dataset yields the whole global batch {format_shape(full)}"
        fix = "batch the dataset with the global batch size on every rank, or set full_batch=False"
    elif dataset == "data_parallel":
        rule = (
            f"full_batch=False: each of the {device_num} ranks reads its own slice of the global batch "
            f"{format_shape(full)}, i.e. {format_shape(local)}"
        )
        fix = f"batch each rank's dataset with {local[0] if local else 1} rows, or set full_batch=True"
        if got == full:
            fix += (
                f" (if the network was traced at the per-rank shape {format_shape(got)}, trace it at the global "
                "shape: tessel.parallel.semi_auto.global_shape)"
            )
    else:
        rule = f"dataset_strategy {dataset}: each rank reads its slice {format_shape(local)} of {format_shape(full)}"
        fix = "shard the dataset to match dataset_strategy, or feed the global batch"
    return f"input {name!r}: the dataset gave shape {format_shape(got)}; the rule: {rule}. Fix: {fix}"
