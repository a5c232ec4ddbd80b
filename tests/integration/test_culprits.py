"""The right culprit, fast: a daemon killed or stopped, a rank exiting with a status, a rank skipping a collective.

A coordinator (default heartbeat settings) and three daemons run as an operator starts them; three ranks of
`scripts/supervised.py` are pinned to them. Every rank must fail within 5 s of the fault naming the rank at fault
(never -1); a rank that skips a collective is named by the stall inspector within 5 s, in the coordinator's log,
in the ranks' logs and in `tessel status`, and the job fails naming it at the stall timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tessel.coordinator import format_status
from tests.conftest import ROOT, Cluster, run_tessel

SCRIPTS = ROOT / "tests" / "integration" / "scripts"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
FAILED = re.compile(r"rank (\d+): (\w+) at ([\d.]+) culprit=(-?\d+): (.*)")
STALL_TIMEOUT_S = 6.0


@pytest.fixture
def cluster(tmp_path):
    running = Cluster(tmp_path, heartbeat_timeout_ms=3000, coordinator_args=("--stall-timeout-s", str(STALL_TIMEOUT_S)))
    running.start_daemons(3)
    yield running
    for proc, _, _ in running.daemons:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
    running.close()


class Job:
    """Three ranks of supervised.py, rank r pinned to daemon r; stdout and stderr of each go to files."""

    def __init__(self, cluster: Cluster, tmp, mode: str, name: str):
        self.tmp, self.ranks = tmp, []
        env = dict(cluster.env, TESSEL_JOB_ID=name, TESSEL_WORLD_SIZE="3")
        for rank in range(3):
            out, err = open(tmp / f"rank{rank}.out", "w"), open(tmp / f"rank{rank}.err", "w")  # noqa: SIM115
            self.ranks.append(
                subprocess.Popen(
                    [sys.executable, str(SCRIPTS / "supervised.py"), mode],
                    env=dict(env, TESSEL_RANK=str(rank), TESSEL_DAEMON_ID=cluster.daemons[rank][1]),
                    stdout=out,
                    stderr=err,
                )
            )

    def output(self, rank: int, stream: str = "out") -> str:
        return (self.tmp / f"rank{rank}.{stream}").read_text()

    def wait_looping(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(f"rank {r} looping" in self.output(r) for r in range(3)):
                return
            time.sleep(0.05)
        raise AssertionError([self.output(r) + self.output(r, "err") for r in range(3)])

    def failures(self, ranks, timeout_s: float = 30) -> dict[int, re.Match]:
        """Each rank's failure line, once all of `ranks` exited."""
        deadline = time.monotonic() + timeout_s
        for rank in ranks:
            self.ranks[rank].wait(max(0.1, deadline - time.monotonic()))
        found = {r: FAILED.search(self.output(r)) for r in ranks}
        assert all(found.values()), {r: self.output(r) + self.output(r, "err")[-2000:] for r in ranks}
        return found

    def kill(self) -> None:
        for proc in self.ranks:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _verdict(cluster: Cluster, job_id: str, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    with cluster.client() as client:
        while True:
            info = client.get_job(job_id)
            if info.state != "running" or time.monotonic() > deadline:
                return info
            time.sleep(0.1)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_dead_or_stopped_daemon_fails_every_rank_within_5_s_naming_the_rank_it_served(cluster, tmp_path, how):
    job = Job(cluster, tmp_path, "loop", f"daemon-{how.name}")
    try:
        job.wait_looping()
        cluster.daemons[1][0].send_signal(how)
        fault = time.time()
        for rank, found in job.failures(range(3)).items():
            assert float(found.group(3)) - fault < 5.0, (rank, found.group(0))
            assert found.group(4) == "1", (rank, found.group(0))  # the rank daemon d1 served, on every rank
            assert "rank 1" in found.group(5), found.group(0)
        assert _verdict(cluster, f"daemon-{how.name}").culprit_rank == 1
    finally:
        job.kill()


def test_a_rank_that_exits_with_status_3_fails_the_job(cluster, tmp_path):
    job = Job(cluster, tmp_path, "exit3", "exit3")
    try:
        job.wait_looping()
        assert job.ranks[1].wait(30) == 3
        exited = time.time()
        for found in job.failures((0, 2)).values():  # the group closed under them, or the job failed: rank 1
            assert float(found.group(3)) - exited < 5.0 and found.group(4) == "1", found.group(0)
            assert "rank 1" in found.group(5), found.group(0)
        info = _verdict(cluster, "exit3")  # a claim: decided after a second's grace
        assert (info.state, info.culprit_rank) == ("failed", 1) and "exited with status 3" in info.cause, info
    finally:
        job.kill()


def test_a_rank_that_skips_a_collective_is_named_within_5_s_and_blamed_at_the_stall_timeout(cluster, tmp_path):
    job = Job(cluster, tmp_path, "skip", "skip")
    try:
        job.wait_looping()
        skipped = time.time()
        status = ""
        with cluster.client() as client:
            while time.time() - skipped < 5.0 and "stalls (1)" not in status:
                status = format_status(client.cluster_status())  # what `tessel status` prints
                time.sleep(0.1)
        assert time.time() - skipped < 5.0, status
        assert re.search(r"ranks \[0, 2\] are in it, ranks \[1\] have not entered it", status), status
        printed = run_tessel(
            ["status", "--coordinator", cluster.address], tmp_path, 30, {"TESSEL_TOKEN": cluster.token}
        )
        assert "ranks [1] have not entered it" in printed.stdout, printed.stdout + printed.stderr
        log = cluster.coordinator_log.read_text()
        assert re.search(r"stalled: job 'skip': all_reduce #\d+ of group 'world' .* ranks \[1\] have not", log), log
        for rank, found in job.failures((0, 2)).items():
            assert found.group(4) == "1" and "never entered all_reduce" in found.group(5), found.group(0)
            assert float(found.group(3)) - skipped < STALL_TIMEOUT_S + 4.0, found.group(0)
            assert "tessel: stalled: job 'skip'" in job.output(rank, "err")  # each rank's log says it too
        info = _verdict(cluster, "skip")
        assert (info.state, info.culprit_rank) == ("failed", 1)
    finally:
        job.kill()


def test_daemons_and_ranks_print_their_deadlines_once_at_start(cluster, tmp_path):
    job = Job(cluster, tmp_path, "exit3", "deadlines")
    try:
        job.ranks[1].wait(60)
        job.failures((0, 2))
    finally:
        job.kill()
    for rank in range(3):
        lines = [line for line in job.output(rank, "err").splitlines() if "deadlines:" in line]
        assert len(lines) == 1 and "heartbeat every 0.5 s" in lines[0], lines
    cluster.close()  # the daemons' stderr can be read once they exited
    for proc, _, _ in cluster.daemons:
        lines = [line for line in proc.stderr.read().splitlines() if "deadlines:" in line]
        assert len(lines) == 1 and "collective timeout 300 s" in lines[0] and "TCP connect 5 s" in lines[0], lines
    assert os.path.exists(cluster.coordinator_log)
    assert "stall timeout 6 s" in cluster.coordinator_log.read_text()
