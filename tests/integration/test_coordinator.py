"""The coordinator as a real process (`python -m tessel.coordinator`), driven by CoordinatorClient from this process
and from small client subprocesses: rendezvous, assignment, groups, barriers, KV, liveness, security, bad input."""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from tessel.coordinator import COORDINATOR_LOST, CoordinatorClient, status_main
from tessel.core import errors
from tessel.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

pytestmark = pytest.mark.slow

TOKEN = "integration-test-token"
HEARTBEAT = ["--heartbeat-interval-ms", "200", "--heartbeat-timeout-ms", "2000"]
LEARN_WITHIN_S = 5.0  # every member must learn of a death this fast
_fake_ports = itertools.count(41000)  # daemon addresses are opaque to the coordinator; they only must differ

# A client rank in its own process: joins, prints its reply as JSON, then heartbeats (until killed) or finishes.
CLIENT_SCRIPT = """
import json, os, sys, time
from tessel.coordinator import CoordinatorClient
from tessel.v1 import coordinator_pb2
spec = json.loads(sys.argv[1])
client = CoordinatorClient(spec["address"], timeout_s=30)
try:
    reply = client.join_job(spec["job"], spec["world"], spec.get("rank", -1), plugin=spec.get("plugin", ""),
                            hostname=spec.get("hostname", "hx"), timeout_s=spec.get("timeout", 20))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    sys.exit(1)
print(json.dumps({"rank": reply.rank, "daemons": [m.daemon_id for m in reply.members]}), flush=True)
if spec.get("then") == "heartbeat":
    ref = coordinator_pb2.ClientRef(job_id=spec["job"], rank=reply.rank, pid=os.getpid())
    handle = client.heartbeat(ref, lambda event: None, interval_s=0.2)
    print("beating", flush=True)
    time.sleep(60)  # the test kills this process long before
else:
    client.finish_rank(spec["job"], reply.rank)
"""

# A daemon stand-in: registers, prints its id, heartbeats until stopped or killed.
DAEMON_SCRIPT = """
import sys, time
from tessel.coordinator import CoordinatorClient
from tessel.v1 import coordinator_pb2
client = CoordinatorClient(sys.argv[1], timeout_s=30)
info = coordinator_pb2.DaemonInfo(address=sys.argv[2], plugin=sys.argv[3], hostname="silent-host")
daemon_id = client.register_daemon(info).daemon_id
handle = client.heartbeat(daemon_id, lambda event: None, interval_s=0.2)
print(daemon_id, flush=True)
time.sleep(60)
"""


def _env(tmp_path: Path, token: str | None = TOKEN) -> dict[str, str]:
    env = {**os.environ, "TESSEL_HOME": str(tmp_path)}
    env.pop("TESSEL_TOKEN", None)
    if token is not None:
        env["TESSEL_TOKEN"] = token
    return env


class Output:
    """A process's stdout lines, read on a thread so that every wait for a line has a deadline."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, queue.SimpleQueue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def next(self, timeout_s: float) -> str:
        try:
            return self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no output from {self.proc.args[:2]} within {timeout_s} s") from None

    def empty_for(self, seconds: float) -> bool:
        time.sleep(seconds)
        return self.lines.empty()


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    proc.wait(timeout=10)


class Coordinator:
    """`python -m tessel.coordinator --port 0` in a subprocess; its log goes to a file."""

    def __init__(self, tmp_path: Path, *args: str):
        self.log = tmp_path / "coordinator.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tessel.coordinator", "--port", "0", *args],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=_env(tmp_path),
            )
        try:
            self.address = Output(self.proc).next(30)
        except AssertionError:
            kill(self.proc)
            raise AssertionError(f"coordinator did not start: {self.log.read_text()}") from None
        self.port = int(self.address.rsplit(":", 1)[1])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=15)
        finally:
            kill(self.proc)


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    coord = Coordinator(tmp_path_factory.mktemp("coordinator"), *HEARTBEAT)
    yield coord
    assert coord.stop() == 0, coord.log.read_text()  # SIGTERM is a clean shutdown


@pytest.fixture
def client(coordinator):
    with CoordinatorClient(coordinator.address, token=TOKEN, timeout_s=30) as c:
        yield c


@pytest.fixture
def daemons(client):
    """register(n, plugin, hostnames) -> daemon ids, heartbeating from this process; events go to .events."""
    handles = []

    class Daemons:
        events: queue.SimpleQueue = queue.SimpleQueue()

        def register(self, n: int, plugin: str, hostnames=("h0",)) -> list[str]:
            ids = []
            for i in range(n):
                info = coordinator_pb2.DaemonInfo(
                    address=f"127.0.0.1:{next(_fake_ports)}",
                    plugin=plugin,
                    hostname=hostnames[i % len(hostnames)],
                    host_id=hostnames[i % len(hostnames)],
                    device_kind="cpu",
                    cores=2,
                    memory_bytes=4 << 30,
                )
                ids.append(client.register_daemon(info).daemon_id)
                handles.append(client.heartbeat(ids[-1], self.events.put, interval_s=0.2))
            return ids

    yield Daemons()
    for handle in handles:
        handle.stop()


class Run:
    """Runs fn on a thread; .result() re-raises its exception. Every join has a deadline."""

    def __init__(self, fn, *args, **kwargs):
        self.value, self.error, self.finished_at = None, None, None
        self.thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True)
        self.thread.start()

    def _run(self, fn, args, kwargs):
        try:
            self.value = fn(*args, **kwargs)
        except BaseException as exc:
            self.error = exc
        self.finished_at = time.monotonic()

    def result(self, timeout_s: float = 30.0):
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"call did not return within {timeout_s} s"
        if self.error is not None:
            raise self.error
        return self.value


def client_process(coordinator: Coordinator, tmp_path: Path, **spec) -> subprocess.Popen:
    """A client rank process (CLIENT_SCRIPT); its stdout lines are in `.output`."""
    spec["address"] = coordinator.address
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT_SCRIPT, json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(tmp_path),
    )
    proc.output = Output(proc)
    return proc


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


# ---------------------------------------------------------------------------------------------------- tests


def test_registration_and_status_table(coordinator, client, daemons, monkeypatch, capsys):
    ids = daemons.register(2, "p-status", hostnames=("alpha", "beta"))
    by_id = {d.daemon_id: d for d in client.cluster_status().daemons}
    assert [(by_id[i].plugin, by_id[i].hostname, by_id[i].state) for i in ids] == [
        ("p-status", "alpha", "idle"),
        ("p-status", "beta", "idle"),
    ]
    joins = [Run(client.join_job, "status-job", 2, r, plugin="p-status", timeout_s=20) for r in range(2)]
    [j.result() for j in joins]
    client.finish_rank("status-job", 0)
    monkeypatch.setenv("TESSEL_TOKEN", TOKEN)
    assert status_main(["--coordinator", coordinator.address]) == 0
    table = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.strip()}
    for rank, daemon_id in enumerate(ids):
        address = by_id[daemon_id].address
        assert rows[daemon_id][1:9] == [address, "p-status", "cpu:0", "2", "4.0", "GiB", "busy", f"status-job/{rank}"]
    assert rows["status-job"][1:4] == ["2", "running", "1/2"]
    client.finish_rank("status-job", 1)
    assert client.get_job("status-job").state == "finished"
    assert {d.state for d in client.cluster_status().daemons if d.daemon_id in ids} == {"idle"}


def test_join_blocks_until_world_complete(coordinator, client, daemons, tmp_path):
    ids = daemons.register(2, "p-join")
    other = client_process(coordinator, tmp_path, job="join-job", world=2, plugin="p-join")
    try:
        assert other.output.empty_for(1.5) and other.poll() is None  # alone in a world of 2, it waits
        mine = client.join_job("join-job", 2, plugin="p-join", timeout_s=20)
        theirs = json.loads(other.output.next(20))
        assert {mine.rank, theirs["rank"]} == {0, 1}
        assert [m.daemon_id for m in mine.members] == theirs["daemons"] == ids
        assert other.wait(timeout=20) == 0  # it finished its rank
        client.finish_rank("join-job", mine.rank)
        assert client.get_job("join-job").state == "finished"
    finally:
        kill(other)


def test_join_deadline_names_missing_ranks(coordinator, client, daemons, tmp_path):
    daemons.register(1, "p-deadline")
    other = client_process(coordinator, tmp_path, job="deadline-job", world=4, rank=2, plugin="p-deadline", timeout=20)
    try:
        wait_for(lambda: any(j.job_id == "deadline-job" for j in client.cluster_status().jobs), 20, "rank 2 joining")
        started = time.monotonic()
        with pytest.raises(errors.RendezvousTimeoutError) as info:
            client.join_job("deadline-job", 4, 0, plugin="p-deadline", timeout_s=1.0)
        assert time.monotonic() - started < 4.0
        expected = "job 'deadline-job' has 2 of 4 ranks after 1.0 s; missing ranks [1, 3]: start them or lower -n"
        assert str(info.value) == expected
        theirs = json.loads(other.output.next(10))  # the other rank gives up with the same diagnosis
        assert theirs == {"error": "RendezvousTimeoutError", "message": expected}
    finally:
        kill(other)


def test_a_joiner_killed_while_waiting_frees_its_rank(coordinator, client, daemons, tmp_path):
    daemons.register(2, "p-withdraw")
    doomed = client_process(coordinator, tmp_path, job="withdraw-job", world=2, rank=1, plugin="p-withdraw")
    try:
        wait_for(lambda: any(j.job_id == "withdraw-job" for j in client.cluster_status().jobs), 20, "rank 1 joining")
        doomed.kill()
        doomed.wait(timeout=10)

        def rank_1_is_free():
            try:
                client.join_job("withdraw-job", 2, 1, plugin="p-withdraw", timeout_s=0.3)
            except errors.ConfigurationError as exc:  # the coordinator has not noticed the kill yet
                assert "rank 1 of job 'withdraw-job' already joined" in str(exc)
                return False
            except errors.RendezvousTimeoutError as exc:  # rank 1 was ours: the killed process let go of it
                return "has 1 of 2 ranks after 0.3 s; missing ranks [0]" in str(exc)
            raise AssertionError("a world of 2 cannot start with one rank")

        wait_for(rank_1_is_free, LEARN_WITHIN_S, "the killed joiner's rank being freed")
    finally:
        kill(doomed)


def test_pinned_and_unpinned_assignment(client, daemons):
    first_a, only_b, second_a = daemons.register(3, "p-pin", hostnames=("ha", "hb", "ha"))
    joins = [
        Run(client.join_job, "pin-job", 3, 0, plugin="p-pin", daemon_id=second_a, hostname="hb", timeout_s=20),
        Run(client.join_job, "pin-job", 3, 1, plugin="p-pin", hostname="hb", timeout_s=20),
        Run(client.join_job, "pin-job", 3, 2, plugin="p-pin", hostname="ha", timeout_s=20),
    ]
    replies = [j.result() for j in joins]
    assert [m.daemon_id for m in replies[0].members] == [second_a, only_b, first_a]
    assert [r.daemon.daemon_id for r in replies] == [second_a, only_b, first_a]
    assert [(r.local_rank, r.local_size) for r in replies] == [(0, 2), (0, 1), (1, 2)]
    busy = {d.daemon_id: (d.state, d.job_id, d.rank) for d in client.cluster_status().daemons}
    assert [busy[d] for d in (second_a, only_b, first_a)] == [("busy", "pin-job", r) for r in range(3)]
    client.fail_job("pin-job", 0, "test over")


def test_groups_barriers_and_key_value_store(client, daemons):
    daemons.register(3, "p-rdv")
    replies = [Run(client.join_job, "rdv-job", 3, r, plugin="p-rdv", timeout_s=20) for r in range(3)]
    members = replies[0].result().members
    [r.result() for r in replies]
    # groups: members come back in the group's order
    groups = [Run(client.create_group, "rdv-job", "g", [2, 0], r, timeout_s=20) for r in (0, 2)]
    assert [list(g.result()) for g in groups] == [[members[2], members[0]]] * 2
    with pytest.raises(errors.ConfigurationError, match=r"rank 1 gave ranks \[1, 0\] but rank [02] gave \[2, 0\]"):
        client.create_group("rdv-job", "g", [1, 0], 1, timeout_s=5)
    # barrier: three passes in a row, never one rank a pass ahead
    log, lock = [], threading.Lock()

    def passes(rank):
        for step in range(3):
            with lock:
                log.append(step)
            client.barrier("rdv-job", "step", rank, timeout_s=20)

    [r.result() for r in [Run(passes, rank) for rank in range(3)]]
    assert log == sorted(log) and len(log) == 9
    with pytest.raises(errors.RendezvousTimeoutError, match=r"reached by 1 of 3 ranks .* missing ranks \[1, 2\]"):
        client.barrier("rdv-job", "lonely", 0, timeout_s=0.5)
    # key-value: a get waits for the set
    getter = Run(client.kv_get, "rdv-job", "master", timeout_s=20)
    time.sleep(0.3)
    assert getter.thread.is_alive()
    client.kv_set("rdv-job", "master", b"\x01host:123")
    assert getter.result() == b"\x01host:123"
    client.kv_delete("rdv-job", "master")
    with pytest.raises(KeyError, match="not set"):
        client.kv_get("rdv-job", "master", timeout_s=0)
    with pytest.raises(errors.RendezvousTimeoutError, match=r"not set within 0\.3 s"):
        client.kv_get("rdv-job", "master", timeout_s=0.3)
    client.fail_job("rdv-job", 0, "test over")


def test_killed_client_fails_the_job_and_every_member_learns(coordinator, client, daemons, tmp_path):
    daemons.register(2, "p-kill")
    other = client_process(coordinator, tmp_path, job="kill-job", world=2, rank=1, plugin="p-kill", then="heartbeat")
    try:
        mine = client.join_job("kill-job", 2, 0, plugin="p-kill", timeout_s=20)
        events = queue.SimpleQueue()
        ref = coordinator_pb2.ClientRef(job_id="kill-job", rank=0, pid=os.getpid())
        handle = client.heartbeat(ref, events.put, interval_s=0.2)
        assert json.loads(other.output.next(20))["rank"] == 1
        assert other.output.next(20) == "beating"
        blocked = Run(client.barrier, "kill-job", "never", 0, timeout_s=30)
        time.sleep(0.3)
        killed_at = time.monotonic()
        other.send_signal(signal.SIGKILL)
        event = events.get(timeout=LEARN_WITHIN_S)
        assert time.monotonic() - killed_at < LEARN_WITHIN_S
        assert (event.job_id, event.state, event.culprit_rank) == ("kill-job", "failed", 1)
        assert event.cause.startswith(f"rank 1 (pid {other.pid} on host hx, daemon {mine.members[1].daemon_id}) ")
        assert "closed its heartbeat stream" in event.cause
        with pytest.raises(errors.JobFailedError) as info:
            blocked.result(timeout_s=LEARN_WITHIN_S)
        assert info.value.culprit_rank == 1 and event.cause in str(info.value)
        assert blocked.finished_at - killed_at < LEARN_WITHIN_S
        daemon_events = [daemons.events.get(timeout=LEARN_WITHIN_S) for _ in range(2)]
        assert {(e.job_id, e.state, e.cause) for e in daemon_events} == {("kill-job", "failed", event.cause)}
        assert client.get_job("kill-job").state == "failed"
        handle.stop()
    finally:
        kill(other)


def test_silent_daemon_is_declared_dead_and_its_job_fails(coordinator, client, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", DAEMON_SCRIPT, coordinator.address, "127.0.0.1:1-silent", "p-silent"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(tmp_path),
    )
    try:
        daemon_id = Output(proc).next(20)
        client.join_job("silent-job", 1, 0, plugin="p-silent", timeout_s=20)
        events = queue.SimpleQueue()
        handle = client.heartbeat(coordinator_pb2.ClientRef(job_id="silent-job", rank=0), events.put, 0.2)
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGSTOP)  # alive, connected, silent
        event = events.get(timeout=2.0 + LEARN_WITHIN_S)
        assert time.monotonic() - stopped_at < 2.0 + LEARN_WITHIN_S
        assert event.state == "failed" and event.culprit_rank == 0
        prefix = f"rank 0 (daemon {daemon_id} on host silent-host) missed heartbeats for "
        assert event.cause.startswith(prefix), event.cause
        assert 2.0 <= float(event.cause.removeprefix(prefix).split()[0]) < 2.0 + LEARN_WITHIN_S
        [info] = [d for d in client.cluster_status().daemons if d.daemon_id == daemon_id]
        assert info.state == "dead"
        handle.stop()
    finally:
        kill(proc)


def test_token_is_required(coordinator, tmp_path):
    channel = grpc.insecure_channel(coordinator.address)
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    try:
        for metadata in [(), (("x-tessel-token", "wrong"),)]:
            with pytest.raises(grpc.RpcError) as info:
                stub.ClusterStatus(common_pb2.Empty(), metadata=metadata, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "TESSEL_TOKEN" in info.value.details()
        assert stub.ClusterStatus(common_pb2.Empty(), metadata=(("x-tessel-token", TOKEN),), timeout=10) is not None
    finally:
        channel.close()
    bad = CoordinatorClient(coordinator.address, token="wrong", timeout_s=10)
    with bad, pytest.raises(errors.ConfigurationError, match="cluster token"):
        bad.cluster_status()


def test_malformed_request_is_invalid_argument_and_serving_goes_on(coordinator, client):
    channel = grpc.insecure_channel(coordinator.address)
    try:
        join = channel.unary_unary("/tessel.v1.Coordinator/JoinJob")
        with pytest.raises(grpc.RpcError) as info:
            join(b"\xff\xff", metadata=(("x-tessel-token", TOKEN),), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed JoinJobRequest" in info.value.details()
    finally:
        channel.close()
    assert client.cluster_status() is not None
    assert coordinator.proc.poll() is None


def test_port_in_use_is_a_clear_error_with_exit_code_2(coordinator, tmp_path):
    second = subprocess.run(
        [sys.executable, "-m", "tessel.coordinator", "--port", str(coordinator.port)],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
    )
    assert second.returncode == 2
    assert second.stdout == ""
    assert f"cannot listen on 127.0.0.1:{coordinator.port}" in second.stderr
    assert "--port 0" in second.stderr


def test_heartbeat_reports_a_dead_coordinator(tmp_path):
    coord = Coordinator(tmp_path, *HEARTBEAT)
    try:
        # It keeps trying for its grace (a coordinator restarted from its store would take it back), then reports.
        with CoordinatorClient(coord.address, token=TOKEN, timeout_s=10, grace_s=1.0) as c:
            info = coordinator_pb2.DaemonInfo(address="127.0.0.1:1-orphan", plugin="cpu")
            daemon_id = c.register_daemon(info).daemon_id
            events = queue.SimpleQueue()
            handle = c.heartbeat(daemon_id, events.put, interval_s=0.2)
            time.sleep(0.5)
            assert handle.alive and events.empty()
            coord.proc.kill()
            event = events.get(timeout=LEARN_WITHIN_S)
            assert event.state == COORDINATOR_LOST and coord.address in event.cause
            assert "did not come back within 1 s" in event.cause
            assert handle.lost.is_set() and not handle.alive
            handle.stop()
            with pytest.raises(errors.TesselError):
                c.cluster_status()
    finally:
        kill(coord.proc)
