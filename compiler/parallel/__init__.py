"""Semi-automatic parallelism: layouts, sharding rules, redistribution and the parallel pass.

    >>> from tessel.compiler.parallel import parallelize
    >>> plan = parallelize(graph, {matmul: ((1, 1), (1, 2))}, device_num=8, parameters=["w"])
    >>> print(explain(plan))                 # each op's strategy, layouts, collectives and bytes moved
    >>> plan.rank_graph(0).dump()            # rank 0's program, collectives inserted, parameters sliced

Modules: mesh (device matrices), layout (Layout, Shard/Replicate/Partial), rules + op_rules (the sharding rule of
every op), strategy (shard() strategies -> placements), redistribution (cost table, planner, cache), partition
(the pass), virtual_ops (VirtualDiv), explain (explain / save_graphs / collective_counts), cost (candidate
strategies and their cost, for AUTO_PARALLEL later). tessel.compiler.rank_simulator runs the rank graphs of a plan.
"""

from tessel.compiler.parallel import virtual_ops  # noqa: F401 - registers VirtualDiv
from tessel.compiler.parallel.explain import collective_counts, explain, save_graphs
from tessel.compiler.parallel.layout import Layout, Partial, Replicate, Shard, assemble, piece, scatter
from tessel.compiler.parallel.mesh import DeviceMesh
from tessel.compiler.parallel.op_rules import RULES, rule_for
from tessel.compiler.parallel.partition import LocalOp, ParallelPlan, parallelize
from tessel.compiler.parallel.redistribution import TABLE, Redistribution, redistribution_cost
from tessel.compiler.parallel.redistribution import plan as plan_redistribution
from tessel.compiler.parallel.rules import ShardingSpec
from tessel.compiler.parallel.strategy import DATA_PARALLEL, Placement, Strategy, StrategyError

__all__ = [
    "DATA_PARALLEL",
    "RULES",
    "TABLE",
    "DeviceMesh",
    "Layout",
    "LocalOp",
    "ParallelPlan",
    "Partial",
    "Placement",
    "Redistribution",
    "Replicate",
    "Shard",
    "ShardingSpec",
    "Strategy",
    "StrategyError",
    "assemble",
    "collective_counts",
    "explain",
    "parallelize",
    "piece",
    "plan_redistribution",
    "redistribution_cost",
    "rule_for",
    "save_graphs",
    "scatter",
]
