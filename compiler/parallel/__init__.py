"""Semi-automatic parallelism: layouts, sharding rules, redistribution and the parallel pass.

    >>> from tessel.compiler.parallel import parallelize
    >>> plan = parallelize(graph, {matmul: ((1, 1), (1, 2))}, device_num=8, parameters=["w"])
    >>> print(explain(plan))                 # each op's strategy, layouts, collectives and bytes moved
    >>> plan.rank_graph(0).dump()            # rank 0's program, collectives inserted, parameters sliced

Modules: mesh (device matrices), layout (Layout, Shard/Replicate/Partial), strategy (shard() strategies ->
placements), redistribution (cost table, planner, cache), partition (the pass), explain (explain / save_graphs /
collective_counts), cost (candidate strategies and their cost). Each op's sharding rule is part of its definition
(`registry.get(op).sharding`, generators in compiler/sharding.py); tessel.compiler.rank_simulator runs the rank
graphs of a plan.
"""

from tessel.compiler.parallel.explain import collective_counts, explain, save_graphs
from tessel.compiler.parallel.layout import Layout, Partial, Replicate, Shard, assemble, piece, scatter
from tessel.compiler.parallel.mesh import DeviceMesh
from tessel.compiler.parallel.partition import LocalOp, ParallelPlan, parallelize
from tessel.compiler.parallel.redistribution import TABLE, Redistribution, redistribution_cost
from tessel.compiler.parallel.redistribution import plan as plan_redistribution
from tessel.compiler.parallel.strategy import DATA_PARALLEL, Placement, Strategy, StrategyError
from tessel.compiler.sharding import ShardingSpec

__all__ = [
    "DATA_PARALLEL",
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
    "save_graphs",
    "scatter",
]
