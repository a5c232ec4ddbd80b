"""Random and absurd requests to every method of a live coordinator and daemon (fuzz_messages.py): each gets a
status code, the servers keep serving, what the requests left behind is cleaned up, a real job runs afterwards
and neither server's memory has grown past twice its starting size."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fuzz_messages import RequestFuzzer, send_all

from tessel.compiler import TensorSpec, apply, model_bytes, output_names, trace
from tessel.core import errors, rpc
from tessel.core.wire import to_proto
from tessel.v1 import common_pb2, coordinator_pb2, daemon_pb2, daemon_pb2_grpc
from tests.conftest import ROOT, Cluster

SCRIPTS = ROOT / "tests" / "integration" / "scripts"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
# Statuses a request may get. INTERNAL (an exception the servers did not expect, with its message) is a bug.
EXPECTED = {
    "OK", "INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED",
    "ABORTED", "CANCELLED",
}  # fmt: skip


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _job(cluster: Cluster, name: str, daemon_ids: list[str]) -> None:
    env = dict(cluster.env, TESSEL_JOB_ID=name, TESSEL_WORLD_SIZE="2")
    ranks = [
        subprocess.Popen(
            [sys.executable, str(SCRIPTS / "timed_collectives.py"), "20", "1000"],
            env=dict(env, TESSEL_RANK=str(r), TESSEL_DAEMON_ID=daemon_ids[r]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outputs = [proc.communicate(timeout=120) for proc in ranks]
    assert [proc.returncode for proc in ranks] == [0, 0], outputs


def _warm_up(daemon: rpc.Client) -> None:
    """What a training job leaves loaded in a daemon: ONNX Runtime with a compiled segment, the Arrow readers."""
    graph = trace(lambda x: apply("ReLU", x), TensorSpec(("N", 4))).graph
    session = daemon.OpenSession(daemon_pb2.OpenSessionRequest(job_id="warm", rank=0, world_size=1)).session_id
    onnx = model_bytes(graph)
    daemon.CompileSegment(daemon_pb2.CompileSegmentRequest(session_id=session, name="relu", onnx_model=onnx))
    step = daemon_pb2.RunSegment(segment="relu", outputs=list(output_names(graph)))
    program = daemon_pb2.Program(instructions=[daemon_pb2.Instruction(run_segment=step)])
    x = common_pb2.NamedTensor(name=graph.inputs[0].name, tensor=to_proto(np.ones((2, 4), np.float32)))
    daemon.Execute(daemon_pb2.ExecuteRequest(session_id=session, program=program, feed=[x]))
    with contextlib.suppress(errors.TesselError):  # loads the dataset readers (Arrow), as a sink-mode job does
        daemon.OpenDataset(daemon_pb2.OpenDatasetRequest(session_id=session, name="d"))
    daemon.CloseSession(daemon_pb2.SessionRef(session_id=session))


def test_thousands_of_random_requests_leave_both_servers_serving_and_small(tmp_path, monkeypatch):
    # Short clean-up delays, so that the test sees what the fuzz left behind go away.
    for name, value in (("ORPHAN_SESSION_S", "1"), ("FORGET_DEAD_DAEMON_S", "1")):
        monkeypatch.setenv(f"TESSEL_LIMIT_{name}", value)
    cluster = Cluster(tmp_path)
    try:
        daemon_ids = cluster.start_daemons(2)
        daemon_address = cluster.daemons[0][2]
        servers = {"coordinator": cluster.coordinator.pid, "daemon": cluster.daemons[0][0].pid}
        _job(cluster, "before", daemon_ids)
        daemon = rpc.Client(daemon_address, daemon_pb2_grpc.DaemonStub, cluster.token)
        _warm_up(daemon)
        start_rss = {name: _rss_bytes(pid) for name, pid in servers.items()}

        # Sessions and jobs that exist, so that requests get past the first lookup.
        sessions = [
            daemon.OpenSession(daemon_pb2.OpenSessionRequest(job_id=f"fz{n}", rank=0, world_size=1)).session_id
            for n in range(3)
        ]
        pools = {
            "job_id": ["before", "fz0", "fuzz-job"],
            "daemon_id": daemon_ids,
            "session_id": sessions,
            "name": ["world", "g", "x"],
            "key": ["k", "kk"],
            "plugin": ["cpu", ""],
        }
        started = time.monotonic()
        codes = {}
        for name, address, service, count in (
            ("coordinator", cluster.address, coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"], 1300),
            ("daemon", daemon_address, daemon_pb2.DESCRIPTOR.services_by_name["Daemon"], 1100),
        ):
            codes[name] = send_all(address, service, RequestFuzzer(len(name), pools), count, cluster.token)
        elapsed = time.monotonic() - started
        totals = {name: sum((c for c in by_method.values()), Counter()) for name, by_method in codes.items()}
        print(f"fuzz: {sum(sum(t.values()) for t in totals.values())} requests in {elapsed:.1f} s: {totals}")
        for name, by_method in codes.items():
            for method, seen in by_method.items():
                assert sum(seen.values()) >= 50, (name, method, seen)  # every method got its share
                assert set(seen) <= EXPECTED, (name, method, seen)

        # Both still serve; the fuzz's sessions and fake daemons go away; a real job runs.
        assert daemon.Status(common_pb2.Empty()).daemon_id == daemon_ids[0]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = cluster.client().cluster_status()
            sessions_left = daemon.Status(common_pb2.Empty()).sessions
            if len(status.daemons) == 2 and not sessions_left:
                break
            time.sleep(0.5)
        assert sorted(d.daemon_id for d in status.daemons) == sorted(daemon_ids), status.daemons
        assert not sessions_left, sessions_left
        daemon.close()
        _job(cluster, "after", daemon_ids)
        for name, pid in servers.items():
            rss = _rss_bytes(pid)
            print(f"{name}: RSS {start_rss[name] >> 20} MiB at start, {rss >> 20} MiB after the fuzz")
            assert rss < 2 * start_rss[name], (name, start_rss[name], rss)
    finally:
        cluster.close()
