"""A coordinator that survives (issue 17, point 3): kill -9 it in the middle of a 2-rank job, start it again on the
same port and store within 5 s, and the job ends as an uninterrupted run does — same losses — while the daemons
keep their ids and `tessel status` still shows the history. All parts are separate processes over gRPC."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ADDRESS, ROOT, Cluster, first_line, rank_log

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "survive_train.py"
STEPS, SLEEP_S = 40, 0.15
RUN = [sys.executable, "-m", "tessel.cli", "run", "-n", "2", "--coordinator"]
LOSSES = re.compile(r"^losses (.*)$", re.M)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launch(cluster: Cluster, tmp, name: str, sleep_s: float = SLEEP_S) -> subprocess.Popen:
    workdir = tmp / name
    workdir.mkdir()
    return subprocess.Popen(
        [*RUN, cluster.address, str(SCRIPT), str(STEPS), str(sleep_s)],
        cwd=workdir,
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _losses(tmp, name: str) -> list[str]:
    found = [LOSSES.search(rank_log(tmp / name, rank).read_text()) for rank in (0, 1)]
    assert all(found), [rank_log(tmp / name, rank).read_text()[-2000:] for rank in (0, 1)]
    assert found[0].group(1) == found[1].group(1)
    return found[0].group(1).split()


def _wait_for_step(tmp, name: str, step: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = sorted((tmp / name / "log_output").glob("*/rank.0/stdout"))
        if logs and f"step {step} loss" in logs[0].read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"job {name} did not reach step {step} within {timeout_s} s")


def _status(cluster: Cluster) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "tessel.cli", "status", "--coordinator", cluster.address],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_job_survives_kill_9_and_restart_of_the_coordinator(tmp_path):
    port = _free_port()
    store = tmp_path / "coordinator.db"
    args = ("--port", str(port), "--store", f"sqlite:{store}", "--recovery-grace-s", "15")
    cluster = Cluster(tmp_path, coordinator_args=args)
    cluster.env["TESSEL_COORDINATOR_GRACE"] = "15"  # daemons and ranks keep trying this long
    try:
        ids = cluster.start_daemons(2)
        by_address = {address: daemon_id for _, daemon_id, address in cluster.daemons}

        # The reference: the same job, uninterrupted (also the history the restarted coordinator must show); no
        # pause between its steps, which only give the other job's kill and restart the time to happen.
        reference = _launch(cluster, tmp_path, "reference", sleep_s=0.0)
        out, _ = reference.communicate(timeout=120)
        assert reference.returncode == 0, out[-3000:]
        expected = _losses(tmp_path, "reference")

        job = _launch(cluster, tmp_path, "killed")
        _wait_for_step(tmp_path, "killed", 8)
        os.kill(cluster.coordinator.pid, signal.SIGKILL)
        cluster.coordinator.wait(10)
        killed_at = time.monotonic()
        time.sleep(1.0)
        with open(tmp_path / "coordinator-2.stderr", "w") as log:
            cmd = [sys.executable, "-m", "tessel.coordinator", "--heartbeat-timeout-ms", "2000", *args]
            cluster.coordinator = cluster.spawn(cmd, stderr=log)
        assert ADDRESS.search(first_line(cluster.coordinator, "coordinator")).group(1) == cluster.address
        assert time.monotonic() - killed_at < 5.0  # restarted within 5 s
        steps_before = rank_log(tmp_path / "killed", 0).read_text().count(" loss ")
        assert steps_before < STEPS, "the job ended before the coordinator came back: kill it earlier"

        out, _ = job.communicate(timeout=120)
        assert job.returncode == 0, out[-3000:] + (tmp_path / "coordinator-2.stderr").read_text()[-3000:]
        assert _losses(tmp_path, "killed") == expected

        restarted_log = (tmp_path / "coordinator-2.stderr").read_text()
        assert "restored from sqlite:" in restarted_log and "(1 running)" in restarted_log, restarted_log[-3000:]
        for rank in (0, 1):  # the ranks' heartbeats broke and came back; no rank lost the coordinator for good
            log = rank_log(tmp_path / "killed", rank, stream="stderr").read_text()
            assert "answers again" in log and "did not come back" not in log, log[-2000:]
        status = _status(cluster)
        for address, daemon_id in by_address.items():  # the same ids at the same addresses
            assert re.search(rf"^{daemon_id}\s.*{re.escape(address)}", status, re.M), status
        assert sorted(by_address.values()) == sorted(ids)
        finished = re.findall(r"^(\S+)\s+2\s+finished", status, re.M)
        assert len(finished) == 2, status  # the reference job (from before the kill) and the one that survived
        assert "failed" not in status, status
    finally:
        cluster.close()
