"""The coordinator's strategy assignment without processes or gRPC: the job's cost model from its daemons'
measurements, one plan per (graph, world, mode, ..., cluster) cached across jobs, shared by concurrent ranks,
bounded (size, pending searches, deadline), off the state lock, and clear errors."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from test_coordinator_state import Call, daemon_info, start_job

from tessel.compiler.builder import apply
from tessel.compiler.ir_json import GraphDecodeError, graph_to_json
from tessel.compiler.parallel.search import CostModel, Link, search
from tessel.compiler.parallel.strategy_json import strategies_from_json, strategies_to_json
from tessel.compiler.tracer import TensorSpec, trace
from tessel.coordinator import planner as planner_module
from tessel.coordinator.cluster_model import cost_model_from_proto, job_cost_model
from tessel.coordinator.planner import StrategyPlanner
from tessel.coordinator.state import CoordinatorState
from tessel.core import errors
from tessel.v1 import coordinator_pb2

GFLOPS = 1e9


def measured(port: int, host: str = "h0", flops: float = 50 * GFLOPS, latency: float = 30e-6):
    info = daemon_info(port, hostname=host)
    info.memory_bytes = 16 << 30
    m = info.measurement
    m.matmul_flops, m.memory_bandwidth, m.shm_latency_s, m.shm_bandwidth = flops, 20e9, latency, 10e9
    m.op_overhead_s, m.launch_overhead_s = 1e-6, 4e-6 * port
    m.op_factors.update({"Conv2D": 2.0 * port, "MatMul": 1.0})
    return info


def mlp(hidden: int = 16):
    def net(x, w1, b1, w2):
        return apply("MatMul", apply("ReLU", apply("BiasAdd", apply("MatMul", x, w1), b1)), w2).mean()

    specs = [TensorSpec((32, 16), name="x"), TensorSpec((16, hidden), name="w1"), TensorSpec((hidden,), name="b1")]
    return trace(net, *specs, TensorSpec((hidden, 8), name="w2")).graph


def request(graph, job="j", world=2, mode="dynamic_programming", **fields):
    return coordinator_pb2.PlanRequest(
        job_id=job, graph=graph_to_json(graph), world_size=world, mode=mode, parameters=["w1", "b1", "w2"], **fields
    )


@pytest.fixture
def state():
    state = CoordinatorState(heartbeat_timeout_s=30.0)
    state.register_daemon(measured(1, flops=80 * GFLOPS, latency=20e-6))
    state.register_daemon(measured(2, flops=50 * GFLOPS, latency=35e-6))
    return state


@pytest.fixture
def planner(state):
    planner = StrategyPlanner(state)
    yield planner
    planner.close()


def test_the_cost_model_is_what_the_job_s_daemons_measured(state):
    start_job(state, "j", 2)
    model, message = job_cost_model(state, "j", None)
    assert model.flops_per_second == 50 * GFLOPS  # the slowest rank paces every step
    assert model.shared_memory == Link(35e-6, 10e9) and message.shared_memory.measured
    assert model.tcp == CostModel.default_cpu().tcp and not message.tcp.measured  # one host: nothing to probe
    assert model.hosts == () and [d.matmul_flops for d in message.devices] == [80 * GFLOPS, 50 * GFLOPS]
    assert model.launch_overhead == 8e-6 and model.op_factors == (("Conv2D", 4.0), ("MatMul", 1.0))  # the slowest
    assert cost_model_from_proto(message) == model


def test_a_refresh_without_a_token_to_call_daemons_is_a_clear_error(state):
    start_job(state, "j", 2)
    with pytest.raises(errors.ConfigurationError, match="cannot call daemons to refresh them"):
        job_cost_model(state, "j", None, refresh=True)


def test_ranks_on_two_hosts_and_unmeasured_daemons_keep_defaults():
    state = CoordinatorState(heartbeat_timeout_s=30.0)
    state.register_daemon(measured(1, host="a"))
    state.register_daemon(daemon_info(2, hostname="b"))  # measured nothing (TESSEL_MEASURE=0, another plugin)
    start_job(state, "j", 2)
    model, message = job_cost_model(state, "j", None)
    assert model.hosts == (0, 1)
    assert model.flops_per_second == CostModel.default_cpu().flops_per_second
    assert [d.measured for d in message.devices] == [True, False]


def test_a_plan_is_the_library_s_plan_and_the_second_job_gets_it_from_the_cache(state, planner):
    start_job(state, "j", 2)
    graph = mlp()
    first = planner.plan(request(graph), 30)
    model, _ = job_cost_model(state, "j", None)
    want = search(graph, mode="dynamic_programming", device_num=2, parameters=["w1", "b1", "w2"], cost_model=model)
    assert strategies_from_json(graph, first.strategies) == want.strategies
    assert not first.cached and first.step_time_s == pytest.approx(want.step_time)
    state.finish_rank("j", 0)
    state.finish_rank("j", 1)
    start_job(state, "k", 2)  # another job on the same daemons, the same net traced again
    began = time.perf_counter()
    second = planner.plan(request(mlp(), job="k"), 30)
    assert second.cached and second.strategies == first.strategies and second.seconds == first.seconds
    assert time.perf_counter() - began < 0.25  # no search: a digest and a dictionary lookup


def test_ranks_asking_at_once_share_one_search_and_get_the_same_bytes(state, planner, monkeypatch):
    start_job(state, "j", 2)
    runs = []
    real = planner_module.StrategyPlanner._run

    def counted(self, *args):
        runs.append(1)
        time.sleep(0.2)  # long enough for the other rank to arrive while it runs
        return real(self, *args)

    monkeypatch.setattr(planner_module.StrategyPlanner, "_run", counted)
    calls = [Call(planner.plan, request(mlp()), 30) for _ in range(2)]
    replies = [c.result(30) for c in calls]
    assert len(runs) == 1 and replies[0].strategies == replies[1].strategies
    assert sorted(r.cached for r in replies) == [False, True]


def test_the_cache_is_keyed_by_what_changes_the_plan_and_bounded(state):
    start_job(state, "j", 2)
    planner = StrategyPlanner(state, cache_entries=2)
    try:
        fixed = strategies_to_json(mlp(), {0: ((1, 1), (1, 2))})
        for r in (request(mlp()), request(mlp(), fixed=fixed), request(mlp(), mode="sharding_propagation")):
            assert not planner.plan(r, 30).cached
        assert planner.plan(request(mlp(), mode="sharding_propagation"), 30).cached
        state.finish_rank("j", 0)
        state.finish_rank("j", 1)
        start_job(state, "k", 2)  # (job j keeps the plans it was given; another job asks the cache)
        assert planner.plan(request(mlp(), job="k", mode="sharding_propagation"), 30).cached
        assert not planner.plan(request(mlp(), job="k"), 30).cached  # the oldest of three went: two entries kept
    finally:
        planner.close()


def test_a_plan_without_alltoall_is_searched_and_priced_apart(state, planner):
    # set_auto_parallel_context(enable_alltoall=False) reaches the search through the request, within one job too
    start_job(state, "j", 2)
    graph = mlp()
    with_alltoall = planner.plan(request(graph), 30)
    without = planner.plan(request(mlp(), without_alltoall=True), 30)
    assert not with_alltoall.cached and not without.cached
    model, _ = job_cost_model(state, "j", None)
    want = search(
        graph,
        mode="dynamic_programming",
        device_num=2,
        parameters=["w1", "b1", "w2"],
        cost_model=dataclasses.replace(model, alltoall=False),
    )
    assert strategies_from_json(graph, without.strategies) == want.strategies
    assert without.step_time_s == pytest.approx(want.step_time)
    assert planner.plan(request(mlp(), without_alltoall=True), 30).cached


def test_planning_runs_off_the_state_lock(state, planner, monkeypatch):
    start_job(state, "j", 2)
    release = threading.Event()
    real = planner_module.StrategyPlanner._run
    monkeypatch.setattr(planner_module.StrategyPlanner, "_run", lambda self, *a: (release.wait(10), real(self, *a))[1])
    call = Call(planner.plan, request(mlp()), 30)
    time.sleep(0.1)
    began = time.perf_counter()
    state.register_daemon(measured(3))  # registry, heartbeats and rendezvous take the lock meanwhile
    state.cluster_status()
    assert time.perf_counter() - began < 0.5
    release.set()
    assert not call.result(30).cached


def test_a_slow_search_times_out_clearly_and_its_plan_is_cached_for_the_next_ask(state, planner, monkeypatch):
    start_job(state, "j", 2)
    real = planner_module.StrategyPlanner._run
    monkeypatch.setattr(planner_module.StrategyPlanner, "_run", lambda self, *a: (time.sleep(0.5), real(self, *a))[1])
    with pytest.raises(errors.PlanningTimeoutError, match=r"longer than 0\.1 s; it goes on and its plan is cached"):
        planner.plan(request(mlp()), 0.1)
    time.sleep(1.0)
    assert planner.plan(request(mlp()), 5).cached


def test_too_many_pending_searches_are_refused(state, planner, monkeypatch):
    start_job(state, "j", 2)
    release = threading.Event()
    monkeypatch.setattr(planner_module, "MAX_PENDING", 1)
    real = planner_module.StrategyPlanner._run
    monkeypatch.setattr(planner_module.StrategyPlanner, "_run", lambda self, *a: (release.wait(10), real(self, *a))[1])
    call = Call(planner.plan, request(mlp()), 30)
    time.sleep(0.1)
    with pytest.raises(errors.TesselError, match="1 searches are already waiting or running"):
        planner.plan(request(mlp(hidden=32)), 1)
    release.set()
    call.result(30)
    assert not planner.plan(request(mlp(hidden=32)), 30).cached  # room again


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (dict(mode="auto"), errors.ConfigurationError, "search_mode 'auto' is not a strategy search mode"),
        (dict(world=4), errors.ConfigurationError, "job 'j' has 2 ranks, but the plan was asked for world_size 4"),
        (dict(job="nope"), KeyError, "no job 'nope' at this coordinator"),
    ],
)
def test_bad_requests_name_the_thing_and_the_fix(state, planner, change, error, message):
    start_job(state, "j", 2)
    with pytest.raises(error, match=message):
        planner.plan(request(mlp(), **change), 30)


def test_graphs_the_coordinator_cannot_decode_or_accept_are_clear_errors(state, planner, monkeypatch):
    start_job(state, "j", 2)
    bad = request(mlp())
    bad.graph = b"\x80\x04\x95pickle"
    with pytest.raises(GraphDecodeError, match=r"cannot decode the request: the graph is not JSON.*graph_to_json"):
        planner.plan(bad, 30)
    monkeypatch.setattr(planner_module, "MAX_GRAPH_BYTES", 100)
    with pytest.raises(errors.ConfigurationError, match=r"over this coordinator's limit of 100 bytes"):
        planner.plan(request(mlp()), 30)


def test_a_job_still_forming_has_no_cost_model_yet(state, planner):
    Call(state.join, coordinator_pb2.JoinJobRequest(job_id="j", world_size=2, rank=0, hostname="h0", pid=1), 0.5)
    time.sleep(0.1)
    with pytest.raises(errors.ConfigurationError, match="waiting with 0 of its 2 ranks placed on daemons"):
        planner.cost_model("j")


def test_a_job_keeps_its_first_plan_when_the_cost_model_changes_meanwhile(state, planner):
    class Refreshed:  # what ClusterMeasurements gives after a refresh: the daemons measured again, slower
        slower = False

        def latest(self, daemon):
            found = coordinator_pb2.DaemonInfo()
            found.measurement.CopyFrom(daemon.measurement)
            found.measurement.matmul_flops /= 10 if self.slower else 1
            return found.measurement

        def tcp_link(self, daemons):
            return None

        def collective_latency(self, daemons, refresh=False):
            return None

    planner.cluster = Refreshed()
    start_job(state, "j", 2)
    first = planner.plan(request(mlp()), 30)
    planner.cluster.slower = True
    assert job_cost_model(state, "j", planner.cluster)[1] != first.cost_model  # a new model for new requests ...
    second = planner.plan(request(mlp()), 30)  # ... but this job's next rank gets the plan its first rank got
    assert second.cached and second.strategies == first.strategies and second.cost_model == first.cost_model
