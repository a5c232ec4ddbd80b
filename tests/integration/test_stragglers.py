"""A straggler in an ordinary even-split DATA_PARALLEL job is named with its measured pace within seconds.

A coordinator (straggler windows of 0.5 s, 3 running) and two daemons as an operator starts them, the second slowed
honestly with the test knob TESSEL_TEST_SLOWDOWN_S (it sleeps after every segment it runs: its own work, not time
in collectives); two ranks of scripts/dp_straggler.py pinned to them. The daemons' heartbeats carry each rank's work
counters; the coordinator must name rank 1 in its log and in `tessel status` with its own work per step, and not
rank 0, which only waits for it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from tessel.coordinator import format_status
from tests.conftest import ROOT, Cluster, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "dp_straggler.py"
SLOWDOWN_S = 0.02
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def cluster(tmp_path):
    running = Cluster(tmp_path, coordinator_args=("--straggler-window-s", "0.5", "--straggler-windows", "3"))
    running.start_daemons(1)
    running.start_daemons(1, env={"TESSEL_TEST_SLOWDOWN_S": str(SLOWDOWN_S)})
    yield running
    running.close()


def test_a_rank_slowed_on_its_daemon_is_named_with_its_pace_in_the_log_and_in_status(cluster, tmp_path):
    env = dict(cluster.env, TESSEL_JOB_ID="straggle", TESSEL_WORLD_SIZE="2")
    outs = [tmp_path / f"rank{r}.out" for r in range(2)]
    ranks = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT)],
            env=dict(env, TESSEL_RANK=str(rank), TESSEL_DAEMON_ID=cluster.daemons[rank][1]),
            stdout=open(outs[rank], "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        for rank in range(2)
    ]
    try:
        deadline = time.monotonic() + 120
        while not all(f"rank {r} training" in outs[r].read_text() for r in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in ranks), [o.read_text() for o in outs]
            time.sleep(0.1)
        training = time.monotonic()
        paces = []
        with cluster.client() as client:
            while time.monotonic() - training < 20 and not any(p.straggler for p in paces):
                reply = client.cluster_status()
                paces = [p for p in reply.paces if p.job_id == "straggle"]
                time.sleep(0.2)
        named = time.monotonic() - training
        status = format_status(reply)
        assert [p.straggler for p in paces] == [False, True], status
        assert named < 20, status  # 3 windows of 0.5 s once both ranks step, with a loaded machine's slack
        slow, fast = paces[1], paces[0]
        assert slow.own_s_per_step >= SLOWDOWN_S and slow.ratio >= 1.5, status  # at least its sleep per step
        assert fast.blocked_s_per_step > fast.own_s_per_step, status  # the fast rank waits in the collectives
        row = re.search(r"^straggle\s+1\s+([\d.]+) ms\s+([\d.]+)\s+[\d.]+ ms\s+([\d.]+)x\s+yes$", status, re.M)
        assert row and float(row.group(1)) >= SLOWDOWN_S * 1e3, status
        log = cluster.coordinator_log.read_text()
        assert re.search(
            r"job straggle: rank 1 is a straggler: [\d.]+ ms \([\d.]+ steps/s\) of its own work per step", log
        ), log
        assert "rank 0 is a straggler" not in log, log
        printed = run_tessel(
            ["status", "--coordinator", cluster.address], tmp_path, 30, {"TESSEL_TOKEN": cluster.token}
        )
        assert re.search(r"^straggle\s+1\s.*yes$", printed.stdout, re.M), printed.stdout + printed.stderr
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
