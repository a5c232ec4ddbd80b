"""Fixtures that start real tessel processes on 127.0.0.1: a coordinator and N daemons, as subprocesses."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """One calibration store for the run: every test's daemons (each test has its own TESSEL_HOME) reuse the per-op
    factors the first daemon of the same threads calibrated on this machine (daemon/calibration.py), instead of
    each of the suite's hundreds of daemons calibrating again. Tests of the calibration itself call it directly."""
    if "TESSEL_CALIBRATION_DIR" not in os.environ:
        config._tessel_calibration = tempfile.mkdtemp(prefix="tessel-calibration-")
        os.environ["TESSEL_CALIBRATION_DIR"] = config._tessel_calibration


def pytest_unconfigure(config):
    made = getattr(config, "_tessel_calibration", None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop("TESSEL_CALIBRATION_DIR", None)


ADDRESS = re.compile(r"(\d+\.\d+\.\d+\.\d+:\d+)")


def first_line(proc: subprocess.Popen, what: str, timeout_s: float = 60.0) -> str:
    """The first stdout line of a starting server, or a failure carrying its stderr."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not lines or not lines[0]:
        proc.kill()
        stderr = proc.stderr.read() if proc.stderr else ""
        pytest.fail(f"{what} did not start within {timeout_s} s: {stderr[-3000:]}")
    return lines[0]


class Cluster:
    """A coordinator and daemons started like an operator would, torn down with the test."""

    def __init__(self, tmp: Path, heartbeat_timeout_ms: int = 2000, coordinator_args: tuple[str, ...] = ()):
        self.token = secrets.token_hex(8)
        self.env = dict(os.environ, TESSEL_TOKEN=self.token, TESSEL_HOME=str(tmp / "home"), PYTHONUNBUFFERED="1")
        self.procs: list[subprocess.Popen] = []
        self.coordinator_log = tmp / "coordinator.stderr"  # its log, which tests may read
        with open(self.coordinator_log, "w") as log:
            coordinator = self.spawn(
                [
                    sys.executable,
                    "-m",
                    "tessel.coordinator",
                    "--port",
                    "0",
                    "--heartbeat-timeout-ms",
                    str(heartbeat_timeout_ms),
                    *coordinator_args,
                ],
                stderr=log,
            )
        self.address = ADDRESS.search(first_line(coordinator, "coordinator")).group(1)
        self.coordinator = coordinator
        self.env["TESSEL_COORDINATOR"] = self.address
        self.daemons: list[tuple[subprocess.Popen, str, str]] = []  # (process, daemon id, address)

    def spawn(self, cmd: list[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("env", self.env)
        kwargs.setdefault("stderr", subprocess.PIPE)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, **kwargs)
        self.procs.append(proc)
        return proc

    def start_daemons(
        self, n: int, threads: int = 1, extra: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> list[str]:
        """Start `n` daemons (device ids 0..n-1), `env` added to their environment."""
        started = [
            self.spawn(
                [
                    sys.executable,
                    "-m",
                    "tessel.daemon",
                    "--coordinator",
                    self.address,
                    "--device",
                    str(i),
                    "--threads",
                    str(threads),
                    *extra,
                ],
                env=dict(self.env, **(env or {})),
            )
            for i in range(n)
        ]
        ids = []
        for proc in started:
            line = first_line(proc, "daemon")
            daemon_id, address = line.split()[2], ADDRESS.search(line).group(1)
            self.daemons.append((proc, daemon_id, address))
            ids.append(daemon_id)
        return ids

    def client(self):
        from tessel.coordinator import CoordinatorClient

        return CoordinatorClient(self.address, self.token)

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def cluster(tmp_path):
    running = Cluster(tmp_path)
    yield running
    running.close()


def rank_log(tmp: Path, rank: int, job: int = 1, stream: str = "stdout") -> Path:
    """The log of `rank` in the `job`-th `tessel run` in `tmp`: tmp/log_output/<job>-<nonce>/rank.<rank>/<stream>."""
    found = sorted((tmp / "log_output").glob(f"{job}-*/rank.{rank}/{stream}"))
    assert len(found) == 1, f"expected one log of job {job}, rank {rank} under {tmp / 'log_output'}; found {found}"
    return found[0]


def run_tessel(
    args: list[str], tmp: Path, timeout_s: float = 120, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`tessel ...` as a user types it, in `tmp` (logs land in tmp/log_output)."""
    full_env = dict(os.environ, TESSEL_HOME=str(tmp / "home"), PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "tessel.cli", *args],
        cwd=tmp,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
