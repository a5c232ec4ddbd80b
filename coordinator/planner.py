"""Strategy assignment (DESIGN, Coordinator): ranks send the traced forward graph, the coordinator plans a strategy
for every node with the job's measured cost model and returns one plan to every rank.

    reply = planner.plan(PlanRequest(job_id="train1", graph=graph_to_json(graph), world_size=8,
                                     mode="dynamic_programming", parameters=["w1", "w2"]), wait_s=60)
    strategies = strategies_from_json(graph, reply.strategies)

- Cached across jobs: by (graph hash, world size, mode, fixed strategies, parameters, dataset, memory budget, cost
  model), LRU, CACHE_ENTRIES plans; a second job with the same net on the same daemons gets its plan in
  milliseconds. Requests with the very same bytes share one search while it runs, and a job keeps the first plan
  it was given for a request (even when a refresh of the measurements changed the cost model meanwhile), so every
  rank of a job gets the identical plan.
- Bounded: graphs above MAX_GRAPH_BYTES / MAX_GRAPH_NODES are refused with the limit and the fix; at most
  MAX_PENDING distinct searches wait or run; each caller waits at most its deadline (PlanningTimeoutError; the
  search goes on and its plan is cached, so asking again gets it).
- Off the state lock: searches run in the planner's own thread pool and read the registry through the state's
  public snapshots (job_info, cluster_status), so heartbeats and rendezvous never wait for a search.

The compiler (planner library, IR decoding) is imported on first use: a coordinator that never plans starts fast.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from tessel.coordinator.cluster_model import ClusterMeasurements, job_cost_model, job_daemons
from tessel.core import errors
from tessel.v1 import coordinator_pb2

log = logging.getLogger("tessel.coordinator")

MAX_GRAPH_BYTES = 32 << 20
MAX_GRAPH_NODES = 50_000
CACHE_ENTRIES = 64
KEEP_JOB_PLANS = 1024  # (job, request) -> the plan its first rank got, so that all its ranks get that one
MAX_PENDING = 8
WORKERS = 2
DEFAULT_PLAN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class _Planned:
    strategies: bytes
    seconds: float
    step_time: float
    memory_bytes: float


class StrategyPlanner:
    """The coordinator's planner: `plan(request, wait_s)` and `cost_model(job_id)`; `close()` stops its threads."""

    def __init__(self, state, token: str | None = None, workers: int = WORKERS, cache_entries: int = CACHE_ENTRIES):
        self.state = state
        self.cluster = ClusterMeasurements(token) if token else None
        self.cache_entries = cache_entries
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="tessel-planner")
        self._lock = threading.Lock()
        self._plans: OrderedDict[tuple, _Planned] = OrderedDict()  # plan key (graph hash ...) -> plan
        self._aliases: OrderedDict[tuple, tuple] = OrderedDict()  # request key (graph bytes' digest ...) -> plan key
        self._pending: dict[tuple, Future] = {}
        self._job_plans: OrderedDict[tuple, tuple[_Planned, Any]] = OrderedDict()  # (job, request) -> its plan
        self._closed = False

    # --- RPCs -------------------------------------------------------------------------------------------------------

    def cost_model(self, job_id: str, refresh: bool = False) -> coordinator_pb2.ClusterModel:
        """The job's ClusterModel (GetCostModel); `refresh`: its daemons measure again first."""
        return job_cost_model(self.state, job_id, self.cluster, refresh)[1]

    def plan(self, request: coordinator_pb2.PlanRequest, wait_s: float) -> coordinator_pb2.PlanReply:
        """A strategy for every node (PlanStrategies); waits at most `wait_s` for a search."""
        from tessel.compiler.parallel.search import SEARCH_MODES

        if request.mode not in SEARCH_MODES:
            valid = ", ".join(repr(m) for m in SEARCH_MODES)
            raise errors.ConfigurationError(
                f"PlanStrategies: search_mode {request.mode!r} is not a strategy search mode; the valid ones are "
                f"{valid} (set_auto_parallel_context(search_mode=...))"
            )
        if len(request.graph) > MAX_GRAPH_BYTES:
            raise errors.ConfigurationError(
                f"PlanStrategies: the graph is {len(request.graph)} bytes, over this coordinator's limit of "
                f"{MAX_GRAPH_BYTES} bytes ({MAX_GRAPH_NODES} nodes); shard() the large parts yourself and plan a "
                "smaller graph, or plan in-process (tessel.coordinator.plan_client.plan_locally)"
            )
        world, _ = job_daemons(self.state, request.job_id)
        if request.world_size != world:
            raise errors.ConfigurationError(
                f"PlanStrategies: job '{request.job_id}' has {world} ranks, but the plan was asked for world_size "
                f"{request.world_size}; plan for the job's world size (device_num must equal get_group_size(), "
                f"{world})"
            )
        job_key = (request.job_id, *_request_key(request, None)[:-1])
        with self._lock:
            pinned = self._job_plans.get(job_key)
        if pinned is not None:  # this job was given a plan for this request already: every rank gets that one
            return _reply(*pinned, cached=True)
        model, message = job_cost_model(self.state, request.job_id, self.cluster)
        if request.without_alltoall:
            model = dataclasses.replace(model, alltoall=False)
        key = _request_key(request, model)
        future, ran = self._lookup_or_submit(key, request, model)
        try:
            planned = future.result(timeout=max(wait_s, 0.0))
        except FutureTimeout:
            raise errors.PlanningTimeoutError(
                f"PlanStrategies: the {request.mode} search for job '{request.job_id}' took longer than {wait_s:.1f} "
                "s; it goes on and its plan is cached: ask again (a longer timeout_s), or pick the faster "
                "search_mode 'sharding_propagation' or 'recursive_programming'"
            ) from None
        with self._lock:
            # The first plan a job gets is its plan: a refresh of the measurements between two ranks' requests (a
            # new cost model, a new search) must not give its ranks two plans.
            planned, message = self._job_plans.setdefault(job_key, (planned, message))
            _trim(self._job_plans, KEEP_JOB_PLANS)
        return _reply(planned, message, cached=not ran)

    # --- the cache and the pool ---------------------------------------------------------------------------------------

    def _lookup_or_submit(self, key: tuple, request, model) -> tuple[Future, bool]:
        """(the future of the plan, whether this request started the search)."""
        with self._lock:
            if self._closed:
                raise errors.TesselError("PlanStrategies: the coordinator is stopping")
            plan_key = self._aliases.get(key)
            if plan_key is not None and plan_key in self._plans:
                self._aliases.move_to_end(key)
                self._plans.move_to_end(plan_key)
                done: Future = Future()
                done.set_result(self._plans[plan_key])
                return done, False
            if key in self._pending:
                return self._pending[key], False
            if len(self._pending) >= MAX_PENDING:
                raise errors.TesselError(
                    f"PlanStrategies: {len(self._pending)} searches are already waiting or running on this "
                    f"coordinator (at most {MAX_PENDING}); ask again in a moment"
                )
            future = self._pool.submit(self._search, key, request, model)
            self._pending[key] = future
            return future, True

    def _search(self, key: tuple, request, model) -> _Planned:
        try:
            plan_key, planned = self._run(request, model)
            with self._lock:
                self._plans[plan_key] = planned
                self._plans.move_to_end(plan_key)
                self._aliases[key] = plan_key
                _trim(self._plans, self.cache_entries)
                _trim(self._aliases, 4 * self.cache_entries)
            return planned
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def _run(self, request, model) -> tuple[tuple, _Planned]:
        from tessel.compiler.ir_json import GraphDecodeError, graph_from_json
        from tessel.compiler.parallel.search import search
        from tessel.compiler.parallel.strategy_json import strategies_from_json, strategies_to_json, value_from_json

        try:
            graph = graph_from_json(request.graph, max_nodes=MAX_GRAPH_NODES)
            fixed = strategies_from_json(graph, request.fixed) if request.fixed else {}
            dataset = value_from_json(_json(request.dataset), "dataset") if request.dataset else "data_parallel"
        except GraphDecodeError as exc:
            raise GraphDecodeError(
                f"PlanStrategies: the coordinator cannot decode the request: {exc}. Fix: send the graph as "
                "tessel.compiler.ir_json.graph_to_json(graph) and the strategies as strategy_json.strategies_to_json "
                "(the client's and the coordinator's tessel versions must agree)"
            ) from None
        plan_key = (graph.hash, *_request_key(request, model)[1:])
        with self._lock:
            known = self._plans.get(plan_key)
        if known is not None:  # the same net sent with other source locations (another script path)
            return plan_key, known
        started = time.perf_counter()
        result = search(
            graph,
            mode=request.mode,
            device_num=request.world_size,
            fixed=fixed,
            parameters=list(request.parameters),
            dataset=dataset,
            cost_model=model,
            memory_budget=request.memory_budget or None,
        )
        seconds = time.perf_counter() - started
        log.info(
            "planned graph %s (%d nodes) for job '%s' on %d devices with %s in %.3f s",
            graph.hash[:12],
            len(graph.nodes),
            request.job_id,
            request.world_size,
            request.mode,
            seconds,
        )
        planned = _Planned(strategies_to_json(graph, result.strategies), seconds, result.step_time, result.memory_bytes)
        return plan_key, planned

    def close(self) -> None:
        """Stop taking plans; searches not started are cancelled, a running one finishes in the background."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)


def _reply(planned: _Planned, message, cached: bool) -> coordinator_pb2.PlanReply:
    return coordinator_pb2.PlanReply(
        strategies=planned.strategies,
        seconds=planned.seconds,
        cached=cached,
        step_time_s=planned.step_time,
        memory_bytes=planned.memory_bytes,
        cost_model=message,
    )


def _request_key(request: coordinator_pb2.PlanRequest, model: Any) -> tuple:
    return (
        hashlib.sha256(request.graph).hexdigest(),
        request.world_size,
        request.mode,
        bytes(request.fixed),
        tuple(request.parameters),
        bytes(request.dataset),
        request.memory_budget,
        request.without_alltoall,
        model,
    )


def _json(data: bytes) -> Any:
    import json

    from tessel.compiler.ir_json import GraphDecodeError

    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GraphDecodeError(f"the dataset is not JSON: {exc}") from None


def _trim(entries: OrderedDict, limit: int) -> None:
    while len(entries) > limit:
        entries.popitem(last=False)
