"""Semi-automatic parallelism for SDK networks: `explain(net, *inputs)` and, for the engine, `semi_auto`
(`partition_for_rank`: a traced network -> one rank's graph, parameter slices and feeds).

    >>> ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, device_num=8)
    >>> text = tessel.parallel.explain(net, ms.Tensor(np.zeros((32, 128), np.float32)))
    parallel plan of graph 'SemiAutoParallelNet' on 8 devices
    ...
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessel.common.compiled import arg_names_of
from tessel.common.tracing import SdkTrace
from tessel.compiler.ir import Graph
from tessel.compiler.parallel import ParallelPlan, collective_counts
from tessel.compiler.parallel import explain as explain_plan
from tessel.core.errors import ConfigurationError
from tessel.parallel import function, nn
from tessel.parallel.algo_parameters import get_algo_parameters, reset_algo_parameters, set_algo_parameters
from tessel.parallel.checkpoint import (
    convert_checkpoints,
    load_distributed_checkpoint,
    rank_list_for_transform,
    transform_checkpoint_by_rank,
    transform_checkpoints,
)
from tessel.parallel.checkpoint_tools import (
    build_searched_strategy,
    convert_checkpoint_by_rank,
    load_segmented_checkpoints,
    merge_sliced_parameter,
    parameter_broadcast,
    rank_list_for_convert,
    restore_group_info_list,
    set_op_strategy_config,
    unified_safetensors,
)
from tessel.parallel.layout import Layout
from tessel.parallel.pipeline_tools import merge_pipeline_strategys, sync_pipeline_shared_parameters
from tessel.parallel.semi_auto import RankPartition, global_shape, partition_for_rank, plan_for, strategies_of
from tessel.parallel.shard import shard

__all__ = [
    "Layout",
    "RankPartition",
    "build_searched_strategy",
    "collective_counts",
    "convert_checkpoint_by_rank",
    "convert_checkpoints",
    "explain",
    "function",
    "get_algo_parameters",
    "global_shape",
    "load_distributed_checkpoint",
    "load_segmented_checkpoints",
    "merge_pipeline_strategys",
    "merge_sliced_parameter",
    "nn",
    "parameter_broadcast",
    "partition_for_rank",
    "plan",
    "plan_for",
    "rank_list_for_convert",
    "rank_list_for_transform",
    "reset_algo_parameters",
    "restore_group_info_list",
    "set_algo_parameters",
    "set_op_strategy_config",
    "shard",
    "strategies_of",
    "sync_pipeline_shared_parameters",
    "trace_network",
    "transform_checkpoint_by_rank",
    "transform_checkpoints",
    "unified_safetensors",
]


def trace_network(net: Any, *inputs: Any) -> tuple[Graph, SdkTrace]:
    """The forward graph of `net` (a Cell or function) on inputs shaped like `inputs` (Tensors, numpy arrays or
    (shape, dtype) pairs; the global batch), and the SdkTrace that recorded it. Inputs are named after the
    arguments of `construct`; parameters by their store keys."""
    from tessel.common.dtype import to_dtype
    from tessel.common.tensor import Tensor

    function = getattr(net, "construct", net)
    names = arg_names_of(function)
    names = (names + [f"input{i}" for i in range(len(names), len(inputs))])[: len(inputs)]
    with SdkTrace(getattr(net, "cls_name", getattr(net, "__name__", "network"))) as trace:
        args = []
        for name, x in zip(names, inputs):
            if isinstance(x, tuple) and len(x) == 2 and not isinstance(x[0], (int, np.integer)):
                shape, dtype = x
            else:
                array = x.asnumpy() if isinstance(x, Tensor) else np.asarray(x)
                shape, dtype = array.shape, array.dtype
            args.append(Tensor._wrap_symbolic(trace.input(name, tuple(shape), to_dtype(dtype))))
        graph, _ = trace.build(net(*args))
    return graph, trace


def plan(net: Any, *inputs: Any, device_num: int | None = None) -> ParallelPlan:
    """The parallel plan of `net` on `inputs` (global shapes) with the shard() strategies of its primitives, the
    context's data import and device_num (or the one given)."""
    from tessel import context

    graph, trace = trace_network(net, *inputs)
    world = device_num or context.get_auto_parallel_context("device_num")
    if world < 1:
        raise ConfigurationError(f"explain: device_num must be >= 1, got {world}")
    return plan_for(graph, trace, [p.key for p in trace.parameters()], world)


def explain(net: Any, *inputs: Any, device_num: int | None = None, show: bool = True) -> str:
    """Print (and return) each op's strategy, tensor layouts, inserted collectives and bytes moved per rank when
    `net` runs on `inputs` (global shapes) over device_num devices (the context's, unless given).

        >>> tessel.parallel.explain(net, x, device_num=4)
    """
    text = explain_plan(plan(net, *inputs, device_num=device_num))
    if show:
        print(text)
    return text
