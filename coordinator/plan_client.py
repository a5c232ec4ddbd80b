"""What a rank calls to get its strategies: from the coordinator when the job has one (one plan for every rank,
priced with the daemons' measurements, cached across jobs), else in-process with the same planner library (a plain
`python` world of 1, `tessel.parallel.explain`).

    >>> plan = plan_remotely_or_locally(graph, mode="sharding_propagation", device_num=get_group_size(),
    ...                                 fixed={matmul: ((1, 1), (1, 2))}, parameters=["w1", "w2"],
    ...                                 client=coordinator_client, job_id=job_id)
    >>> parallelize(graph, plan.strategies, plan.device_num, parameters=["w1", "w2"])
    >>> plan.where, plan.cached, plan.cost_model        # "coordinator", True, CostModel(...)

`cluster_cost_model(client, job_id)` is the job's measured CostModel (what `predict_step_time` takes).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tessel.compiler.ir import Graph, Node
from tessel.compiler.ir_json import dumps, graph_to_json
from tessel.compiler.parallel.search import CostModel, search
from tessel.compiler.parallel.strategy_json import strategies_from_json, strategies_to_json, value_to_json
from tessel.coordinator.cluster_model import cost_model_from_proto
from tessel.core.coordinator_client import CoordinatorClient


@dataclass(frozen=True)
class Plan:
    """A strategy for every node of `graph` (keyed by its nodes, as `parallelize` takes them), the model it was
    priced with, its predicted step time (s) and memory per device (bytes), and where and how it was made."""

    graph: Graph
    device_num: int
    strategies: dict[Node, Any]
    cost_model: CostModel
    step_time: float
    memory_bytes: float
    seconds: float  # how long the search took (when it ran)
    cached: bool  # True: this call did not run the search
    where: str  # "coordinator" or "in-process"

    def by_index(self) -> dict[int, Any]:
        """The strategies keyed by node index (graph.nodes order)."""
        index = {node: k for k, node in enumerate(self.graph.nodes)}
        return {index[node]: strategy for node, strategy in self.strategies.items()}


def plan_remotely(
    client: CoordinatorClient,
    job_id: str,
    graph: Graph,
    *,
    mode: str,
    device_num: int,
    fixed: Mapping[Node | int, Any] | None = None,
    parameters: Collection[str] = (),
    dataset: Any = "data_parallel",
    memory_budget: float | None = None,
    timeout_s: float = 120.0,
    alltoall: bool = True,
) -> Plan:
    """The coordinator's plan for `graph` in job `job_id` (device_num must be the job's world size); `alltoall`:
    whether redistributions may use AlltoAll (set_auto_parallel_context(enable_alltoall))."""
    reply = client.plan_strategies(
        job_id,
        graph_to_json(graph),
        device_num,
        mode,
        fixed=strategies_to_json(graph, fixed) if fixed else b"",
        parameters=list(parameters),
        dataset=dumps(value_to_json(dataset)),
        memory_budget=memory_budget or 0.0,
        timeout_s=timeout_s,
        alltoall=alltoall,
    )
    return Plan(
        graph,
        device_num,
        strategies_from_json(graph, reply.strategies),
        replace(cost_model_from_proto(reply.cost_model), alltoall=alltoall),
        reply.step_time_s,
        reply.memory_bytes,
        reply.seconds,
        reply.cached,
        "coordinator",
    )


def plan_locally(
    graph: Graph,
    *,
    mode: str,
    device_num: int,
    fixed: Mapping[Node | int, Any] | None = None,
    parameters: Collection[str] = (),
    dataset: Any = "data_parallel",
    memory_budget: float | None = None,
    cost_model: CostModel | None = None,
    alltoall: bool = True,
) -> Plan:
    """The same search in this process (default model: CostModel.default_cpu(device_num))."""
    model = replace(cost_model or CostModel.default_cpu(device_num), alltoall=alltoall)
    started = time.perf_counter()
    result = search(
        graph,
        mode=mode,
        device_num=device_num,
        fixed=fixed,
        parameters=parameters,
        dataset=dataset,
        cost_model=model,
        memory_budget=memory_budget,
    )
    seconds = time.perf_counter() - started
    return Plan(
        graph, device_num, result.strategies, model, result.step_time, result.memory_bytes, seconds, False, "in-process"
    )


def plan_remotely_or_locally(
    graph: Graph,
    *,
    mode: str,
    device_num: int,
    fixed: Mapping[Node | int, Any] | None = None,
    parameters: Collection[str] = (),
    dataset: Any = "data_parallel",
    memory_budget: float | None = None,
    client: CoordinatorClient | None = None,
    job_id: str = "",
    cost_model: CostModel | None = None,
    timeout_s: float = 120.0,
    alltoall: bool = True,
) -> Plan:
    """With a coordinator (`client` and the job's `job_id`): its plan, the same on every rank. Without (a world of
    1 in a plain `python` process): the same planner in-process, priced with `cost_model` (default_cpu if None)."""
    if client is not None and job_id:
        return plan_remotely(
            client,
            job_id,
            graph,
            mode=mode,
            device_num=device_num,
            fixed=fixed,
            parameters=parameters,
            dataset=dataset,
            memory_budget=memory_budget,
            timeout_s=timeout_s,
            alltoall=alltoall,
        )
    return plan_locally(
        graph,
        mode=mode,
        device_num=device_num,
        fixed=fixed,
        parameters=parameters,
        dataset=dataset,
        memory_budget=memory_budget,
        cost_model=cost_model,
        alltoall=alltoall,
    )


def cluster_cost_model(client: CoordinatorClient, job_id: str, refresh: bool = False) -> CostModel:
    """The measured cost model of the job's daemons (GetCostModel), for `predict_step_time`; `refresh`: the daemons
    measure again first (their figures from registration may be stale: other load, other tenants)."""
    return cost_model_from_proto(client.cost_model(job_id, refresh))
