"""Compiled functions under SEMI_AUTO_PARALLEL / AUTO_PARALLEL: every graph goes through the parallel pass.

A cell called in GRAPH_MODE, a `value_and_grad` function, an `@ms.jit` step, `optimizer(grads)`: each is traced
at the *global* shapes and partitioned for this rank (`tessel.compiler.parallel.parallelize`), so a functional
training loop partitions exactly as `Model.train` does:

- parameters are sliced: the first plan that uses one decides its layout (`Parameter.place`), later plans keep it
  (a consumer that wants another layout gets a redistribution); the daemon holds this rank's slice;
- data inputs are this rank's share of the global batch, as the dataset gives it (`dataset_strategy`): traced at
  the global shape, fed as they come; under full_batch an input the plan reads only in slices is cut on the host
  and only this rank's slice is sent;
- gradients (GradientOf) are differentiated on the rank's graph, reduced over the parameter's replicas; handles
  returned on the daemon (gradients) keep their layout, so `optimizer(grads)` updates the slices where they are;
- values returned to the host are this rank's share in the dataset's convention (dim 0 split under
  "data_parallel", whole under "full_batch"); a scalar loss is whole on every rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tessel import context
from tessel.core.errors import ConfigurationError

_MODES = (context.ParallelMode.SEMI_AUTO_PARALLEL, context.ParallelMode.AUTO_PARALLEL)


def active() -> bool:
    """Compiled graphs are partitioned: SEMI_AUTO/AUTO_PARALLEL over more than one rank."""
    if context.get_auto_parallel_context("parallel_mode") not in _MODES:
        return False
    from tessel.common.engine import engine

    return engine().world_size > 1


def redistribution_steps() -> frozenset[str]:
    """The redistribution steps the context's enable_alltoall allows (redistribution.allowed_steps)."""
    from tessel.compiler.parallel.redistribution import allowed_steps

    return allowed_steps(bool(context.get_auto_parallel_context("enable_alltoall")))


def plan_settings() -> tuple:
    """What a partitioned graph depends on besides its strategies and inputs: a change replans it."""
    ctx = context.get_auto_parallel_context
    return ctx("enable_alltoall"), ctx("loss_repeated_mean")


def global_specs(call: Any) -> list[tuple | None]:
    """(shape, dtype) per leaf of `call` at the global shape: data tensors as the dataset convention makes them
    (this rank's share times the world), handles held on the daemon at their own (global) shape."""
    from tessel.parallel import pipeline
    from tessel.parallel.semi_auto import dataset_setting, global_shape

    world, dataset = pipeline.current_mesh().devices, dataset_setting()
    specs, column = [], 0
    for spec, resident in zip(call.specs(False), call.resident):
        if spec is None or resident:
            specs.append(spec)
            continue
        specs.append((global_shape(spec[0], column, world, dataset), spec[1]))
        column += 1
    return specs


def make_entry(graph, out_tree, trace, call, name: str, device_result: bool, extra_params: Sequence = ()):
    """The compiled entry of this rank's share of `graph` (see the module docstring)."""
    from tessel.common.compiled import count_leaves
    from tessel.common.compiled import make_entry as make_local_entry
    from tessel.common.engine import engine
    from tessel.compiler.parallel import Layout, parallelize, save_graphs
    from tessel.parallel import pipeline, planning
    from tessel.parallel.semi_auto import _dataset_arg, dataset_setting

    eng = engine()
    # Under pipeline parallel the plan is for the ranks of one stage, and this rank's place among them.
    where = pipeline.mesh(eng.world_size, eng.runtime.rank)
    world, rank, dataset = where.devices, where.index, dataset_setting()
    inputs = {v.name for v in graph.inputs}
    params = {p.key: p for p in (*trace.parameters(), *extra_params) if p.key in inputs}
    fixed = parameter_layouts(params.values(), world, eng.id, lambda p: p.layout)
    handles = {n: leaf._ref for leaf, n, resident in zip(call.leaves, call.names, call.resident) if resident}
    for n, ref in handles.items():
        fixed[n] = ref.layout if ref.layout is not None else Layout.replicated(len(ref.shape), world)
    for value in graph.inputs:  # values fed at every run (a learning rate) are no dataset column: whole everywhere
        if value.name in trace.feeders:
            fixed[value.name] = Layout.replicated(value.ndim, world)
    n_prints = len(trace.print_values)  # ops.Print's tensors: the last outputs, each rank printing its own share
    n_host = count_leaves(out_tree.children[0]) if device_result else len(graph.outputs) - n_prints
    returned = [_returned_layout(v.shape, world, dataset) for v in graph.outputs[:n_host]]

    def plan_with(fixed_layouts: dict):
        return parallelize(
            graph,
            planning.strategies(graph, trace, list(params), world, dataset, weights=list(handles)),
            world,
            parameters=list(params),
            dataset=_dataset_arg(dataset),
            fixed=fixed_layouts,
            weights=list(handles),
            output_layouts=returned + [None] * (len(graph.outputs) - n_host),
            steps=redistribution_steps(),
            loss_repeated_mean=bool(context.get_auto_parallel_context("loss_repeated_mean")),
            slice_whole_inputs=dataset == "full_batch" and not where.pipelined,
        )

    fused = sorted(p.name for p in params.values() if p.comm_fusion != 1)
    if fused and any(node.op == "GradientOf" for node in graph.nodes):
        from tessel.common.support import log_once

        log_once(
            "comm-fusion-functional",
            f"comm_fusion of {fused[:3]}{'...' if len(fused) > 3 else ''}: gradients taken in a compiled function "
            "under SEMI_AUTO/AUTO_PARALLEL (value_and_grad, GradOperation) are each reduced by a collective of "
            "their own, so fusion indices group nothing there; Model.train / TrainOneStepCell's step buckets "
            "gradients by fusion index",
        )
    if (
        where.pipelined
        and context.optimizer_shard_config() is not None
        and any(n.op == "GradientOf" for n in graph.nodes)
    ):
        from tessel.common.support import not_supported_yet

        raise not_supported_yet(
            f"enable_parallel_optimizer=True with pipeline_stages={where.stages}",
            "pipeline stages do not shard their optimizer state yet (each rank holds only its stage's parameters "
            "and state already). Fix: set_auto_parallel_context(enable_parallel_optimizer=False) under pipeline "
            "parallel",
        )
    plan = plan_with(fixed)
    blocks = _state_blocks(plan, params, fixed, rank)
    if blocks:  # optimizer parallel: the optimizer's state takes its blocks, and the plan follows
        plan = plan_with({**fixed, **blocks})
        level = context.optimizer_shard_config()[0]
        if level != "level1":
            from tessel.common.support import log_once

            log_once(
                "optimizer-level-functional",
                f"optimizer_level={level}: an optimizer called on gradients in a compiled function (value_and_grad "
                "+ optimizer(grads)) shards its state (level1) but keeps gradients and weights whole; Model.train "
                f"and TrainOneStepCell run {level}",
            )
    for key, p in params.items():
        p.place(plan.input_layout(key), eng.id)
    if where.pipelined:
        data = [n for n, resident in zip(call.names, call.resident) if n in inputs and not resident]
        data = [n for n in data if n not in params and n not in trace.feeders]
        prints = range(len(graph.outputs) - n_prints, len(graph.outputs))
        piped = pipeline.stage_graph(plan, graph, trace, where, data, list(params), local_outputs=prints)
        pipeline.mark_parameters(params, piped, eng.id)
        local = piped.graph
    else:
        local = plan.rank_graph(rank)
    planning.record(plan, list(params.values()), eng.runtime.rank)
    if context.get_context("save_graphs"):
        directory = os.path.join(context.get_context("save_graphs_path"), f"rank_{eng.runtime.rank}")
        save_graphs(plan, directory, ranks=(rank,), cost_model=planning.reported_cost_model(plan.device_num))
    sliced = _check_data(plan, call, graph, dataset)
    entry = make_local_entry(local, out_tree, trace, call, name, device_result, extra_params)
    entry.input_slices = {n: _slicer(plan, n, rank) for n in sliced}
    end = len(graph.outputs) - n_prints
    entry.device_types = [(v.shape, v.dtype) for v in graph.outputs[n_host:end]]
    entry.device_layouts = list(plan.output_layouts[n_host:end])
    if where.pipelined:
        entry.absent_prints = {i - end for i in piped.absent_outputs if i >= end}
    return entry


def _state_blocks(plan, params: dict, fixed: dict, rank: int) -> dict:
    """Optimizer parallel: the block layout of each optimizer slot (store key "<parameter key>/<slot>") of a
    parameter the plan leaves replicated over some ranks, for slots no plan placed yet
    (compiler.optimizer_parallel.block_of)."""
    settings = context.optimizer_shard_config()
    if settings is None:
        return {}
    import numpy as np

    from tessel.compiler.optimizer_parallel import ShardConfig, block_of

    config, blocks = ShardConfig(*settings), {}
    for key, slot in params.items():
        base = key.rpartition("/")[0]
        if not base or base not in params or key in fixed:
            continue
        param = params[base]
        if not param.parallel_optimizer or tuple(slot.shape) != tuple(param.shape):
            continue
        found = block_of(plan.input_layout(base), param.shape, np.dtype(param.dtype.numpy).itemsize, config, rank)
        if found is not None:
            blocks[key] = found[1]
    return blocks


def parameter_layouts(params: Iterable[Any], world: int, engine_id: int, current: Callable[[Any], Any]) -> dict:
    """key -> the layout each parameter must keep in a plan: the one an earlier plan of this engine gave it
    (`current(p)`), else Cell.shard's parameter_plan, else strategy_ckpt_config's load_file."""
    from tessel.parallel import planning

    loaded = planning.loaded_layouts()
    fixed = {}
    for p in params:
        requested = getattr(p, "_requested", None)
        if p.layout is not None and p._layout_engine == engine_id:
            layout = current(p)
        elif requested is not None:
            layout = _requested_layout(requested, world)
        else:
            layout = loaded.get(p.name)
        if layout is not None:
            fixed[p.key] = layout
    return fixed


def _requested_layout(requested: Any, world: int):
    from tessel.compiler.parallel import Layout

    return (
        requested.compiler_layout() if hasattr(requested, "compiler_layout") else Layout.from_strategy(requested, world)
    )


def _returned_layout(shape: tuple, world: int, dataset: Any):
    """The share of an output a rank gets back: dim 0 split under "data_parallel" (when it divides), else whole."""
    from tessel.compiler.parallel import Layout

    if dataset == "data_parallel" and shape and shape[0] % world == 0:
        return Layout.from_strategy((world,) + (1,) * (len(shape) - 1), world)
    return Layout.replicated(len(shape), world)


def _slicer(plan, name: str, rank: int):
    return lambda full: plan.local_value(name, full, rank)


def _check_data(plan, call, graph, dataset) -> list[str]:
    """Each data tensor the call gives must be this rank's share of the traced global input; the names of those
    the call gives whole (full_batch) that the plan reads in slices: the host cuts them before they are sent."""
    from tessel.common.compiled import is_tensor
    from tessel.compiler.shapes import format_shape

    names = {v.name for v in graph.inputs}
    sliced = []
    for leaf, name, resident in zip(call.leaves, call.names, call.resident):
        if resident or not is_tensor(leaf) or name not in names:
            continue
        full = tuple(plan.graph.input(name).shape)
        local = plan.input_layout(name).local_shape(full)
        if dataset == "full_batch" and tuple(leaf.shape) == full != tuple(local):
            sliced.append(name)
        elif tuple(leaf.shape) != tuple(local):
            raise ConfigurationError(
                f"input {name!r}: this rank gave shape {format_shape(tuple(leaf.shape))}, but under "
                f"dataset_strategy {dataset!r} its share of the global {format_shape(full)} is {format_shape(local)}"
            )
    return sliced
