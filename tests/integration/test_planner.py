"""Strategy assignment with real processes: daemons report what they measured at registration, the coordinator
prices plans with it and gives concurrent ranks one plan (cached across jobs), daemons probe links on the
coordinator's behalf (token-authenticated), and across two test-bed hosts the TCP link is probed, not assumed."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
from testbed_cluster import describe

from tessel.compiler.builder import apply
from tessel.compiler.tracer import TensorSpec, trace
from tessel.coordinator.cluster_model import cost_model_from_proto
from tessel.coordinator.plan_client import cluster_cost_model, plan_remotely, plan_remotely_or_locally
from tessel.core import errors, rpc
from tessel.v1 import daemon_pb2, daemon_pb2_grpc

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).with_name("scripts") / "cost_model.py")


def graph():
    def mlp(x, w1, w2):
        return apply("MatMul", apply("ReLU", apply("MatMul", x, w1)), w2).mean()

    specs = [TensorSpec((64, 32), name="x"), TensorSpec((32, 64), name="w1"), TensorSpec((64, 16), name="w2")]
    return trace(mlp, *specs).graph


def run_all(calls):
    results: list = [None] * len(calls)

    def run(i, fn):
        try:
            results[i] = fn()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def join(cluster, job: str):
    clients = [cluster.client() for _ in range(2)]
    run_all([lambda c=c, r=r: c.join_job(job, 2, r, timeout_s=30) for r, c in enumerate(clients)])
    return clients


@pytest.mark.timeout(240)
def test_daemons_report_measurements_and_concurrent_ranks_get_one_cached_plan(cluster):
    cluster.start_daemons(2, threads=1)
    daemons = cluster.client().cluster_status().daemons
    for d in daemons:
        m = d.measurement
        assert m.matmul_flops > 1e9 and m.memory_bandwidth > 1e8 and m.launch_overhead_s > 0, d
        assert m.shm_latency_s > 0 and m.shm_bandwidth > 1e8, d
        assert set(m.op_factors) == {"MatMul", "Conv2D", "ReLU"}, d
    clients = join(cluster, "plan-a")
    g = graph()
    ask = dict(mode="dynamic_programming", device_num=2, parameters=["w1", "w2"], fixed={0: ((1, 1), (1, 2))})
    first = run_all([lambda c=c: plan_remotely(c, "plan-a", g, **ask) for c in clients])
    assert first[0].strategies == first[1].strategies and first[0].where == "coordinator"
    assert sorted(p.cached for p in first) == [False, True]
    model = cluster_cost_model(clients[0], "plan-a")
    assert model == first[0].cost_model
    assert model.flops_per_second == min(d.measurement.matmul_flops for d in daemons)
    for c, r in zip(clients, range(2)):
        c.finish_rank("plan-a", r)

    again = join(cluster, "plan-b")  # a second job with the same net: the cache answers
    began = time.perf_counter()
    second = plan_remotely_or_locally(g, client=again[0], job_id="plan-b", **ask)
    assert second.cached and second.strategies == first[0].strategies
    assert time.perf_counter() - began < 1.0
    with pytest.raises(errors.ConfigurationError, match="job 'plan-b' has 2 ranks, but the plan was asked for"):
        plan_remotely(again[0], "plan-b", g, **{**ask, "device_num": 4})
    with pytest.raises(errors.ConfigurationError, match="search_mode 'fastest' is not a strategy search mode"):
        plan_remotely(again[0], "plan-b", g, **{**ask, "mode": "fastest"})
    with pytest.raises(errors.ConfigurationError, match="coordinator cannot decode the request"):
        again[0].plan_strategies("plan-b", b"not a graph", 2, "sharding_propagation")
    local = plan_remotely_or_locally(g, **ask)  # no coordinator: the same library in-process
    assert local.where == "in-process" and local.strategies[g.nodes[0]] == ((1, 1), (1, 2))
    fresh = again[0].cost_model("plan-b", refresh=True)  # the daemons measure again, now
    assert len(fresh.devices) == 2 and cost_model_from_proto(fresh) != model
    third = plan_remotely(again[1], "plan-b", g, **ask)  # the job keeps the plan it was given
    assert third.cached and third.strategies == second.strategies


@pytest.mark.timeout(120)
def test_a_daemon_probes_a_link_for_the_coordinator_and_only_with_the_token(cluster):
    cluster.start_daemons(2, threads=1)
    first = cluster.daemons[0][2]
    second = cluster.client().cluster_status().daemons[1]
    client = rpc.Client(first, daemon_pb2_grpc.DaemonStub, cluster.token)
    reply = client.ProbeLink(daemon_pb2.ProbeLinkRequest(data_address=second.data_address))
    assert 0 < reply.latency_s < 0.05 and reply.bandwidth > 1e7
    with pytest.raises(errors.ConfigurationError, match="not a data-plane address"):
        client.ProbeLink(daemon_pb2.ProbeLinkRequest(data_address="nowhere"))
    client.close()
    stranger = rpc.Client(first, daemon_pb2_grpc.DaemonStub, "wrong-token")
    with pytest.raises(errors.ConfigurationError, match="cluster token"):
        stranger.ProbeLink(daemon_pb2.ProbeLinkRequest(data_address=second.data_address))
    stranger.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("testbed", [{"hosts": 2, "rate": "1gbit"}], indirect=True)
def test_the_tcp_link_between_two_hosts_is_probed(testbed, make_testbed_cluster):
    cluster = make_testbed_cluster(testbed, daemons_per_host=1)
    results = cluster.run_ranks([SCRIPT], timeout_s=120)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    reports = [json.loads(r.output.strip().splitlines()[-1]) for r in results]
    assert reports[0]["tcp"] == reports[1]["tcp"]  # one model for the job, whoever asks
    tcp = reports[0]["tcp"]
    assert tcp["measured"] and reports[0]["hosts"] == [0, 1]
    assert 0.4 * 125e6 < tcp["bandwidth"] < 1.5 * 125e6, tcp  # the link's 1 Gbit/s, not loopback's GB/s
    assert 0 < tcp["latency_s"] < 0.01, tcp
    print(f"probed across the test bed: {tcp}", file=sys.stderr)
