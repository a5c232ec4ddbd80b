"""AUTO_PARALLEL's strategy planner: a strategy for every node, found by one of MindSpore's three search modes over
an α–β cost model of the cluster, keeping the user's own strategies.

    >>> strategies = plan_strategies(graph, mode="sharding_propagation", device_num=4,
    ...                              fixed={matmul: ((1, 1), (1, 4))}, parameters=["w", "b"],
    ...                              cost_model=CostModel.default_cpu(4))
    >>> plan = parallelize(graph, strategies, 4, parameters=["w", "b"])
    >>> predict_step_time(plan, CostModel.default_cpu(4))

(a complete example: planner.py's docstring). MindSpore's `set_auto_parallel_context(search_mode=...)` maps onto
`mode`; `shard()` and `Cell.set_data_parallel()` onto `fixed`; `dataset_strategy` / `full_batch` onto `dataset`.

Modules, one concept each: cost_model (CostModel, links, collective and redistribution prices), objective (the
terms of a step's time and memory; predict_step_time), problem (variables, options, edges: what every mode
searches), propagation (sharding_propagation), recursive (recursive_programming), elimination
(dynamic_programming), planner (plan_strategies / search: modes, memory budget, errors), strategy_file (JSON).
"""

from tessel.compiler.parallel.search.cost_model import CostModel, DeviceMeasurement, Link
from tessel.compiler.parallel.search.objective import StepTime, predict_step_time
from tessel.compiler.parallel.search.planner import (
    SEARCH_MODES,
    MemoryBudgetError,
    SearchResult,
    plan_strategies,
    search,
)
from tessel.compiler.parallel.search.strategy_file import load_strategy_file, save_strategy_file

__all__ = [
    "SEARCH_MODES",
    "CostModel",
    "DeviceMeasurement",
    "Link",
    "MemoryBudgetError",
    "SearchResult",
    "StepTime",
    "load_strategy_file",
    "plan_strategies",
    "predict_step_time",
    "save_strategy_file",
    "search",
]
