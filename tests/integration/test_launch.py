"""`tessel run` as users drive it: against a cluster started by hand as the README shows, through a pipe that
closes early, and many jobs at once on one host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ADDRESS, ROOT, first_line

pytestmark = pytest.mark.slow
HELLO = ROOT / "examples" / "hello_collectives.py"


def _tessel(*args: str) -> list[str]:
    return [sys.executable, "-m", "tessel.cli", *args]


def _user_env(home: Path) -> dict[str, str]:
    """A user's shell: their own HOME (so ~/.tessel/token is this test's), no TESSEL_TOKEN exported."""
    env = {k: v for k, v in os.environ.items() if k not in ("TESSEL_TOKEN", "TESSEL_HOME", "TESSEL_COORDINATOR")}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1")
    return env


def test_cluster_started_by_hand_runs_a_job_without_exporting_the_token(tmp_path):
    env = _user_env(tmp_path / "home")
    servers: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        proc = subprocess.Popen(_tessel(*args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        servers.append(proc)
        return first_line(proc, " ".join(args[:1]))

    try:
        address = ADDRESS.search(start("coordinator", "--port", "0")).group(1)
        assert (tmp_path / "home" / ".tessel" / "token").is_file()  # made by the coordinator's first start
        for device in (0, 1):
            start("daemon", "--coordinator", address, "--plugin", "cpu", "--device", str(device), "--threads", "1")
        result = subprocess.run(
            _tessel("run", "-n", "2", "--coordinator", address, str(HELLO)),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for proc in servers:
            proc.terminate()
        for proc in servers:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "rank 0/2" in result.stdout
    (rank1,) = tmp_path.glob("log_output/*/rank.1/stdout")
    assert "rank 1/2: all_reduce=1" in rank1.read_text()


def test_run_without_a_token_names_where_to_get_it(tmp_path):
    # No token anywhere: a running cluster's token cannot be made up, so the error says where it comes from.
    result = subprocess.run(
        _tessel("run", "-n", "1", "--coordinator", "127.0.0.1:1", str(HELLO)),
        cwd=tmp_path,
        env=_user_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "TESSEL_TOKEN" in result.stderr, result.stderr[-2000:]
