"""Mixed plugins in one job, on one host: two `cpu` daemons and two `cpu-slow` daemons (the CPU plugin registered
as a second plugin and device kind, tests/integration/plugins/cpu_slow.py). The coordinator puts them in one world,
and every group spanning both plugins is hierarchical (daemon/hierarchy.py): each plugin's part runs its own
collectives, the host transport joins the parts. Checked against numpy, with groups whose parts interleave in
group-rank order and parts of unequal size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
SCRIPT = str(HERE / "scripts" / "multi_host.py")
PLUGINS = str(HERE / "plugins")
SLOW = "cpu_slow:SlowCpuPlugin"


@pytest.fixture
def cluster(tmp_path):
    # A generous heartbeat timeout: four daemons and four ranks on a shared 2-core machine.
    from tests.conftest import Cluster

    running = Cluster(tmp_path, heartbeat_timeout_ms=10000)
    yield running
    running.close()


def _mixed(cluster, cpu: int, slow: int) -> list[tuple]:
    cluster.env["PYTHONPATH"] = os.pathsep.join(filter(None, [PLUGINS, cluster.env.get("PYTHONPATH")]))
    cluster.start_daemons(cpu, threads=1)
    first = len(cluster.daemons)
    cluster.start_daemons(slow, threads=1, extra=("--plugin", SLOW))
    return cluster.daemons[:first], cluster.daemons[first:]


def _run(cluster, daemons, argv, env=None, timeout_s=120) -> list[subprocess.CompletedProcess]:
    job = f"mixed-{uuid.uuid4().hex[:8]}"
    procs = []
    for rank, (_, daemon_id, address) in enumerate(daemons):
        rank_env = dict(
            cluster.env,
            TESSEL_JOB_ID=job,
            TESSEL_RANK=str(rank),
            TESSEL_WORLD_SIZE=str(len(daemons)),
            TESSEL_DAEMON_ID=daemon_id,
            TESSEL_DAEMON_ADDRESS=address,
            **(env or {}),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv], env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        outputs.append((proc.returncode, out))
    return outputs


def _reports(outputs) -> list[dict]:
    text = "\n".join(f"--- rank {r} (exit {code}) ---\n{out[-3000:]}" for r, (code, out) in enumerate(outputs))
    assert [code for code, _ in outputs] == [0] * len(outputs), text
    return [json.loads(out.strip().splitlines()[-1]) for _, out in outputs]


@pytest.mark.timeout(240)
def test_a_job_of_two_plugins_runs_hierarchical_collectives_equal_to_numpy(cluster):
    cpu, slow = _mixed(cluster, 2, 2)
    # Ranks 0, 1 on cpu, 2, 3 on cpu-slow; "interleaved" lists them so that the parts alternate in group-rank
    # order; "uneven" has a part of two and a part of one (all_reduce through leaders).
    groups = {"interleaved": [0, 2, 1, 3], "uneven": [0, 1, 2], "pure": [2, 3]}
    reports = _reports(_run(cluster, cpu + slow, [SCRIPT, "collectives", json.dumps(groups)]))
    for rank, report in enumerate(reports):
        assert report["failures"] == [], report
        transports = report["transports"]
        assert transports["world"] == "hierarchical(shm+shm)", report
        assert transports["interleaved"] == "hierarchical(shm+shm)", report
        if rank < 3:
            assert transports["uneven"] == ("hierarchical(-+shm)" if rank == 2 else "hierarchical(shm+shm)"), report
        if rank >= 2:
            assert transports["pure"] == "shm", report
    plugins = {d.plugin for d in cluster.client().cluster_status().daemons}
    assert plugins == {"cpu", "cpu-slow"}


@pytest.mark.timeout(120)
def test_flat_collectives_on_request(cluster):
    cpu, slow = _mixed(cluster, 1, 2)
    reports = _reports(_run(cluster, cpu + slow, [SCRIPT, "collectives", "{}"], env={"TESSEL_COLLECTIVES": "flat"}))
    assert all(r["failures"] == [] and r["transports"] == {"world": "shm"} for r in reports), reports


@pytest.mark.timeout(180)
def test_tessel_run_starts_daemons_of_several_plugins_in_turn(tmp_path):
    from tests.conftest import ROOT, rank_log, run_tessel

    example = str(ROOT / "examples" / "hello_collectives.py")
    done = run_tessel(["run", "-n", "4", "--plugin", f"cpu,{SLOW}", example], tmp_path, env={"PYTHONPATH": PLUGINS})
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(4):
        assert "— ok" in rank_log(tmp_path, rank).read_text()
