"""Execute over the daemon's Unix socket (daemon/local_channel.py): same results and errors as gRPC, a token,
deadlines, and a dead daemon failing the call at once."""

from __future__ import annotations

import os
import stat
import threading
import time

import numpy as np
import pytest

from tessel.communication.daemon_handle import RemoteDaemon
from tessel.core import rpc
from tessel.core.errors import ConfigurationError, JobFailedError, RendezvousTimeoutError
from tessel.daemon import DaemonCore, service
from tessel.daemon.local_channel import LocalExecuteClient, LocalExecuteServer
from tessel.plugins import load_plugin
from tessel.v1 import collective_pb2, daemon_pb2

TOKEN = "local-channel-test-token"


@pytest.fixture(scope="module")
def core():
    running = DaemonCore(load_plugin("cpu", threads=1))
    yield running
    running.close()


@pytest.fixture
def daemon(core):
    """A RemoteDaemon factory over one in-process gRPC server, with or without the Unix socket."""
    local = service.serve_local(core, TOKEN)
    servers, clients = [], []

    def connect(unix_socket: bool) -> RemoteDaemon:
        handler = service.handler(core, TOKEN, local_socket=local.path if unix_socket else "")
        server, port = rpc.start_server([handler])
        servers.append(server)
        clients.append(RemoteDaemon(f"127.0.0.1:{port}", TOKEN))
        return clients[-1]

    yield connect
    for client in clients:
        client.close()
    for server in servers:
        server.stop(None)
    local.close()


def _program(*instructions):
    return daemon_pb2.Program(instructions=[daemon_pb2.Instruction(**i) for i in instructions])


SUM_TWICE = _program(
    {"collective": daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_REDUCE, inputs=["x"], outputs=["y"])},
    {"copy": daemon_pb2.CopyOp(source="y", target="x")},
)


def test_the_unix_socket_gives_what_grpc_gives_results_and_errors(core, daemon):
    fast, slow = daemon(unix_socket=True), daemon(unix_socket=False)
    sessions = [d.open_session(f"job-{i}", 0, 1) for i, d in enumerate((fast, slow))]
    assert fast.local is not None and slow.local is None
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    results = [
        d.execute(s, SUM_TWICE, repeat=3, feed={"x": x}, fetch=["x"], collect=["y"], timings=True)
        for d, s in zip((fast, slow), sessions)
    ]
    for got in results:
        np.testing.assert_array_equal(got.fetched["x"], x)
        assert got.collected["y"].shape == (3, 2, 3)
        assert [label for label, _ in got.timings] == ["all_reduce", "copy"]
    errors = []
    for d, s in zip((fast, slow), sessions):
        with pytest.raises(ConfigurationError) as raised:
            d.execute(s, _program({"copy": daemon_pb2.CopyOp(source="nope", target="x")}))
        errors.append(str(raised.value).replace(s, "<session>").replace(s.split("/")[0], "<job>"))
    assert errors[0] == errors[1] and "tensor 'nope' is not in the store" in errors[0]
    # A failed job: the same exception class and culprit rank over both paths.
    culprits = []
    for d, s, job in zip((fast, slow), sessions, ("job-0", "job-1")):
        core.on_job_event(job, "failed", "rank 1 died", 1)
        with pytest.raises(JobFailedError, match="rank 1 died") as raised:
            d.execute(s, _program())
        culprits.append(raised.value.culprit_rank)
    assert culprits == [1, 1]


def test_execute_steps_over_grpc_reports_every_repetition_in_order_in_few_messages(core, daemon, monkeypatch):
    """ExecuteStream sends a message at most every PROGRESS_INTERVAL_S, with every repetition that ended since the
    last (a message per step cost a sink-mode step a third of its time); the client hands out one value per
    repetition, in order, equal to what one Execute collects."""
    remote = daemon(unix_socket=False)
    session = remote.open_session("job-stream", 0, 1)
    sent = []
    progress = service._progress
    monkeypatch.setattr(service, "_progress", lambda pending: sent.append(len(pending)) or progress(pending))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    repeat = 300
    reports = list(remote.execute_steps(session, SUM_TWICE, repeat, feed={"x": x}, collect=["y"]))
    want = remote.execute(session, SUM_TWICE, repeat=repeat, feed={"x": x}, collect=["y"]).collected["y"]
    assert len(reports) == repeat and sum(sent) == repeat
    np.testing.assert_array_equal(np.stack([r["y"] for r in reports]), want)
    assert len(sent) < repeat // 10, sent


def test_execute_steps_over_grpc_hands_out_the_steps_before_a_failure_then_the_failure(core, daemon, monkeypatch):
    """A job that fails while an epoch streams: the client still gets every step that ended before (flushed ahead
    of the error, not lost with the messages not yet sent), then the job's failure, with its culprit rank."""
    remote = daemon(unix_socket=False)
    session = remote.open_session("job-stream-fails", 0, 1)
    execute = core.execute

    def failing_after_five(*args, progress=None, **kwargs):
        def report(repetition, values):
            progress(repetition, values)
            if repetition == 4:
                core.on_job_event("job-stream-fails", "failed", "rank 1 died", 1)

        return execute(*args, progress=report, **kwargs)

    monkeypatch.setattr(core, "execute", failing_after_five)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    seen = []
    with pytest.raises(JobFailedError, match="rank 1 died") as raised:
        for report in remote.execute_steps(session, SUM_TWICE, 50, feed={"x": x}, collect=["y"]):
            seen.append(report["y"])
    assert raised.value.culprit_rank == 1
    assert len(seen) == 5
    np.testing.assert_array_equal(seen[-1], x)  # a world of one: every step's sum is x itself


def test_the_socket_lives_in_a_private_directory_and_wants_the_token(core):
    server = service.serve_local(core, TOKEN)
    try:
        assert stat.S_IMODE(os.stat(server.directory).st_mode) == 0o700
        intruder = LocalExecuteClient(server.path, "wrong-token", 5.0, "daemon (test)")
        with pytest.raises(JobFailedError, match="unreachable"):
            intruder.execute(daemon_pb2.ExecuteRequest(session_id="any"))
        intruder.close()
    finally:
        server.close()
    assert not os.path.exists(server.directory)


def test_a_stuck_call_meets_its_deadline_and_a_dead_daemon_fails_the_call_at_once():
    release = threading.Event()

    def stuck(request):
        release.wait(10.0)
        return daemon_pb2.ExecuteReply()

    server = LocalExecuteServer(stuck, TOKEN, 1 << 20)
    client = LocalExecuteClient(server.path, TOKEN, 5.0, "daemon (test)")
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError, match=r"no reply within 0\.2 s"):
        client.execute(daemon_pb2.ExecuteRequest(), timeout_s=0.2)
    assert time.monotonic() - started < 2.0
    with pytest.raises(JobFailedError, match="lost earlier"):  # the late reply must not answer a later call
        client.execute(daemon_pb2.ExecuteRequest())
    release.set()

    waiting = LocalExecuteClient(server.path, TOKEN, 30.0, "daemon (test)")
    release.clear()
    threading.Timer(0.3, server.close).start()  # the daemon goes away while a call waits
    started = time.monotonic()
    with pytest.raises(JobFailedError, match="unreachable"):
        waiting.execute(daemon_pb2.ExecuteRequest())
    assert time.monotonic() - started < 5.0
    release.set()
