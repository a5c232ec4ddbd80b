"""The daemon's bounded work: limits on what a request opens, sessions nobody closes are closed, a run whose
caller went away or whose job failed stops, stale socket directories of dead daemons are removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tessel.core.errors import JobFailedError, LimitExceededError, TesselError
from tessel.core.limits import Limits
from tessel.daemon import DaemonCore
from tessel.daemon.local_channel import LocalExecuteServer, remove_stale_directories
from tessel.plugins import load_plugin
from tessel.v1 import coordinator_pb2, daemon_pb2


class FakeCoordinator:
    """What close_orphans asks: which (job, rank) the coordinator has this daemon serve."""

    def __init__(self):
        self.serving: tuple[str, int] | None = None

    def get_daemon(self, daemon_id, timeout_s=None):
        if self.serving is None:
            return coordinator_pb2.DaemonInfo(daemon_id=daemon_id, state="idle")
        job, rank = self.serving
        return coordinator_pb2.DaemonInfo(daemon_id=daemon_id, state="busy", job_id=job, rank=rank)


@pytest.fixture
def core():
    running = DaemonCore(load_plugin("cpu", threads=1), limits=Limits(max_sessions=3, orphan_session_s=0.2))
    yield running
    running.close()


def test_sessions_and_ids_are_bounded(core):
    for n in range(3):
        core.open_session(f"j{n}", 0, 1, [])
    with pytest.raises(LimitExceededError, match="open sessions is 4, over this server's limit of 3"):
        core.open_session("j3", 0, 1, [])
    with pytest.raises(LimitExceededError, match="job id"):
        core.open_session("j" * 100_000, 0, 1, [])
    with pytest.raises(LimitExceededError, match="world size"):
        core.open_session("k", 0, 10**9, [])
    with pytest.raises(TesselError) as missing:
        core.session("s" * 1_000_000)
    assert len(str(missing.value)) < 500


def test_sessions_whose_job_does_not_run_here_are_closed(core):
    core.coordinator = coordinator = FakeCoordinator()
    core.daemon_id = "d0"
    coordinator.serving = ("live", 1)
    live = core.open_session("live", 1, 2, [core.member(0), core.member(1)], "nonce")
    orphan = core.open_session("never-joined", 0, 1, [])
    core.close_orphans()  # the first look only notes it
    time.sleep(0.3)
    core.close_orphans()
    deadline = time.monotonic() + 5
    while orphan in [s.session_id for s in core.sessions()] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [s.session_id for s in core.sessions()] == [live]
    coordinator.serving = None  # the live job ended, and its client never closed the session
    core.close_orphans()
    time.sleep(0.3)
    core.close_orphans()
    deadline = time.monotonic() + 5
    while core.sessions() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert core.sessions() == []


def test_a_long_run_stops_when_its_caller_goes_away_or_its_job_fails(core):
    session_id = core.open_session("j", 0, 1, [])
    program = daemon_pb2.Program(instructions=[])
    gone = threading.Event()
    threading.Timer(0.2, gone.set).start()
    started = time.monotonic()
    with pytest.raises(TesselError, match="cancelled by its caller"):
        core.execute(session_id, program, repeat=2**31 - 1, cancelled=gone.is_set)
    assert time.monotonic() - started < 2
    session = core.session(session_id)
    threading.Timer(0.2, lambda: setattr(session, "abort_cause", "rank 1 died")).start()
    with pytest.raises(JobFailedError, match="rank 1 died"):
        core.execute(session_id, program, repeat=2**31 - 1)


def test_a_daemon_start_removes_the_socket_directories_of_dead_daemons(monkeypatch):
    tmp_path = Path(tempfile.mkdtemp(prefix="t-", dir="/tmp"))  # short: a socket path holds 108 bytes
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # re-read TMPDIR
    try:
        code = (
            "import os, signal, sys\n"
            "from tessel.daemon.local_channel import LocalExecuteServer\n"
            "server = LocalExecuteServer(lambda r: None, 'token', 1 << 20)\n"
            "print(server.directory, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n"
        )
        killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        left = killed.stdout.strip()
        assert killed.returncode == -9 and os.path.isdir(left), killed.stderr
        older = tmp_path / "tessel-daemon-oldnaming"  # an older daemon's, whose socket no longer answers
        older.mkdir(mode=0o700)
        os.utime(older, (time.time() - 3600, time.time() - 3600))
        server = LocalExecuteServer(lambda request: None, "token", 1 << 20)
        try:
            assert not os.path.exists(left) and not older.exists()
            assert os.path.isdir(server.directory)
            assert remove_stale_directories() == []  # a live daemon's directory stays
        finally:
            server.close()
    finally:
        tempfile.tempdir = None
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_execute_with_a_huge_collect_on_an_empty_program_is_cheap(core):
    session_id = core.open_session("j", 0, 1, [])
    core.put(session_id, {"x": np.ones(2, np.float32)})
    result = core.execute(session_id, daemon_pb2.Program(), repeat=1000, collect=["x"])
    assert result.collected["x"].shape == (1000, 2)
