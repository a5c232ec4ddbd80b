"""MindSpore's startup methods, run as its samples run them (`startup_method/`): dynamic networking by hand, msrun
on one node and on two, a rank table, and `mpirun` with no cluster running. No `tessel run`, no coordinator or
daemons started beforehand: the job's own processes start what they need and take it down at the end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
PROBE = ROOT / "tests" / "integration" / "scripts" / "startup_probe.py"
FAULTS = ROOT / "tests" / "integration" / "scripts" / "faults.py"
SAMPLE_TABLE = {  # rank_table.md's single-server layout, placeholders and all: one server needs no address
    "version": "1.0",
    "server_count": "1",
    "server_list": [
        {
            "server_id": "10.*.*.*",
            "device": [
                {"device_id": "0", "device_ip": "192.1.*.6", "rank_id": "0"},
                {"device_id": "1", "device_ip": "192.2.*.6", "rank_id": "1"},
            ],
            "host_nic_ip": "reserve",
        }
    ],
    "status": "completed",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user_env(tmp: Path, **extra: str) -> dict[str, str]:
    """A shell with no tessel launcher variables: its own token file, nothing pointing at a cluster."""
    drop = ("TESSEL_TOKEN", "TESSEL_COORDINATOR", "TESSEL_RANK", "TESSEL_JOB_ID", "RANK_ID", "RANK_SIZE", "MS_ROLE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(TESSEL_HOME=str(tmp / "home"), PYTHONUNBUFFERED="1", TESSEL_THREADS="1", **extra)
    return env


def start(cmd: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    out = open(log, "wb")  # noqa: SIM115 (closed when the test reads it back)
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)


def finish(procs: list[subprocess.Popen], timeout_s: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    try:
        return [p.wait(max(0.1, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def no_tessel_processes_left(tmp: Path) -> None:
    """Every daemon and coordinator the job started is gone (they run with the test's TESSEL_HOME)."""
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", "tessel.(daemon|coordinator)"], capture_output=True, text=True).stdout
    mine = []
    for pid in left.split():
        try:
            if str(tmp) in Path(f"/proc/{pid}/environ").read_text(errors="replace"):
                mine.append(pid)
        except OSError:
            pass  # it ended meanwhile
    assert not mine, f"processes left behind: {mine}"


# ---------------------------------------------------------------------------------------------------- dynamic


def dynamic_env(tmp: Path, role: str, workers: int, port: int, node_id: int | None = None, **extra) -> dict:
    env = user_env(tmp, MS_ROLE=role, MS_WORKER_NUM=str(workers), MS_SCHED_HOST="127.0.0.1", MS_SCHED_PORT=str(port))
    if node_id is not None:
        env["MS_NODE_ID"] = str(node_id)
    env.update(extra)
    return env


def test_dynamic_networking_forms_one_job_and_the_scheduler_runs_no_training(tmp_path):
    # run_dynamic_cluster.sh: the workers first (with MS_NODE_ID), the scheduler last.
    port = free_port()
    workers = [
        start([sys.executable, str(PROBE)], dynamic_env(tmp_path, "MS_WORKER", 2, port, i), tmp_path / f"w{i}", ROOT)
        for i in (1, 0)
    ]
    scheduler = start([sys.executable, str(PROBE)], dynamic_env(tmp_path, "MS_SCHED", 2, port), tmp_path / "s", ROOT)
    codes = finish([*workers, scheduler])
    logs = {name: (tmp_path / name).read_text() for name in ("w0", "w1", "s")}
    assert codes == [0, 0, 0], logs
    assert "rank 0 of 2: all_reduce=3 device_target=CPU" in logs["w0"] and "This node 0 rank id: 0" in logs["w0"]
    assert "rank 1 of 2: all_reduce=3" in logs["w1"] and "This node 1 rank id: 1" in logs["w1"]
    # MindSpore's scheduler leaves init() through exit(0): the script's code before init() ran, none after it.
    assert "before init" in logs["s"] and "rank " not in logs["s"].split("tessel scheduler:", 1)[1], logs["s"]
    assert "all 2 workers finished" in logs["s"]
    no_tessel_processes_left(tmp_path)


def test_dynamic_networking_without_node_ids_ranks_workers_in_order_of_arrival(tmp_path):
    port = free_port()
    scheduler = start([sys.executable, str(PROBE)], dynamic_env(tmp_path, "MS_SCHED", 2, port), tmp_path / "s", ROOT)
    workers = [
        start([sys.executable, str(PROBE)], dynamic_env(tmp_path, "MS_WORKER", 2, port), tmp_path / f"w{i}", ROOT)
        for i in range(2)
    ]
    assert finish([scheduler, *workers]) == [0, 0, 0]
    ranks = sorted(
        int(line.split()[1])
        for i in range(2)
        for line in (tmp_path / f"w{i}").read_text().splitlines()
        if line.startswith("rank ")
    )
    assert ranks == [0, 1]


def test_dynamic_networking_missing_and_extra_workers_fail_with_the_reason(tmp_path):
    port = free_port()
    # MS_WORKER_NUM=3 but two workers: everyone waits MS_TOPO_TIMEOUT, then fails naming the missing rank.
    env = {"MS_TOPO_TIMEOUT": "4"}
    scheduler = start(
        [sys.executable, str(PROBE)], dynamic_env(tmp_path, "MS_SCHED", 3, port, **env), tmp_path / "s", ROOT
    )
    workers = [
        start(
            [sys.executable, str(PROBE)],
            dynamic_env(tmp_path, "MS_WORKER", 3, port, i, **env),
            tmp_path / f"w{i}",
            ROOT,
        )
        for i in range(2)
    ]
    started = time.monotonic()
    codes = finish([scheduler, *workers])
    assert all(code != 0 for code in codes) and time.monotonic() - started < 40
    for name in ("s", "w0", "w1"):
        text = (tmp_path / name).read_text()
        assert "has 2 of 3 ranks after 4.0 s; missing ranks [2]: start them, or lower MS_WORKER_NUM" in text, text

    # One worker more than MS_WORKER_NUM: it is refused while the job runs, the job itself is unharmed.
    port = free_port()
    scheduler = start([sys.executable, str(PROBE)], dynamic_env(tmp_path, "MS_SCHED", 1, port), tmp_path / "s2", ROOT)
    first = start([sys.executable, str(PROBE), "6"], dynamic_env(tmp_path, "MS_WORKER", 1, port), tmp_path / "a", ROOT)
    deadline = time.monotonic() + 40
    while "rank 0 of 1" not in (tmp_path / "a").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    extra = start([sys.executable, str(PROBE)], dynamic_env(tmp_path, "MS_WORKER", 1, port), tmp_path / "b", ROOT)
    assert finish([scheduler, first, extra]) == [0, 0, 1]
    assert "is already running with all 1 ranks; this process is one too many" in (tmp_path / "b").read_text()

    # A node id outside the world is refused at once.
    bad = subprocess.run(
        [sys.executable, str(PROBE)],
        env=dynamic_env(tmp_path, "MS_WORKER", 2, port, 2),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "MS_NODE_ID=2 is not a rank of MS_WORKER_NUM=2 workers (0..1)" in bad.stderr


# ---------------------------------------------------------------------------------------------------- msrun


def msrun(
    tmp: Path, *options: str, script: Path = PROBE, args: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tessel.cli", "msrun", *options, str(script), *args]
    return subprocess.run(cmd, cwd=tmp, env=user_env(tmp, **env), capture_output=True, text=True, timeout=90)


def test_msrun_on_one_node_writes_msruns_logs_and_exits_with_the_jobs_status(tmp_path):
    port = str(free_port())
    result = msrun(
        tmp_path,
        "--worker_num=2",
        "--local_worker_num=2",
        f"--master_port={port}",
        "--log_dir=msrun_log",
        "--join=True",
        "--tail_worker_log=1",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    logs = tmp_path / "msrun_log"
    assert sorted(p.name for p in logs.iterdir()) == ["scheduler.log", "worker_0.log", "worker_1.log"]
    assert "rank 0 of 2: all_reduce=3" in (logs / "worker_0.log").read_text()
    assert "rank 1 of 2: all_reduce=3" in result.stdout and "rank 0 of 2" not in result.stdout  # tailed: worker 1
    assert "all 2 workers finished" in (logs / "scheduler.log").read_text()

    failed = msrun(
        tmp_path,
        "--worker_num=2",
        "--local_worker_num=2",
        f"--master_port={free_port()}",
        "--log_dir=failed",
        "--join=True",
        script=FAULTS,
        args=("raise",),
    )
    assert failed.returncode == 1
    assert "worker 1" in failed.stdout and "ValueError: rank 1 fails on purpose" in failed.stdout, failed.stdout

    # The samples' way: `msrun … pytest -s train.py`, the training at import and no test to collect.
    sample = tmp_path / "train_at_import.py"
    sample.write_text(
        "import numpy as np\nfrom tessel.communication import comm_func, get_rank, init\ninit()\n"
        "out, _ = comm_func.all_reduce(np.ones(1, np.float32))\n"
        "print(f'rank {get_rank()}: all_reduce={float(out[0]):g}', flush=True)\n"
    )
    by_pytest = subprocess.run(
        [
            sys.executable,
            "-m",
            "tessel.cli",
            "msrun",
            "--worker_num=2",
            "--local_worker_num=2",
            f"--master_port={free_port()}",
            "--log_dir=pytest_log",
            "--join=True",
            "pytest",
            "-s",
            str(sample),
        ],
        cwd=tmp_path,
        env=user_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert by_pytest.returncode == 0, by_pytest.stdout + by_pytest.stderr
    assert "rank 1: all_reduce=2" in (tmp_path / "pytest_log" / "worker_1.log").read_text()


def test_ctrl_c_on_msrun_stops_the_scheduler_and_workers_and_exits_130(tmp_path):
    """Ctrl-C on a joined msrun once its workers run: it stops what it started and exits 130, promptly (the wait loop
    ends on the signal's flag: a KeyboardInterrupt raised inside Popen.poll could have left stopping blocked for ever).
    Should stopping or msrun's own end hang, its threads' stacks reach stderr after TESSEL_EXIT_TIMEOUT seconds and
    this test shows them."""
    script = tmp_path / "sleepy.py"
    script.write_text("from tessel.communication import init\nimport time\ninit()\nprint('up', flush=True)\n"
                      "time.sleep(300)\n")  # fmt: skip
    cmd = [sys.executable, "-m", "tessel.cli", "msrun", "--worker_num=2", "--local_worker_num=2",
           f"--master_port={free_port()}", "--log_dir=msrun_log", "--join=True", str(script)]  # fmt: skip
    env = user_env(tmp_path, TESSEL_EXIT_TIMEOUT="10")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        logs = [tmp_path / "msrun_log" / f"worker_{index}.log" for index in range(2)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(log.exists() and "up" in log.read_text().split() for log in logs):
            time.sleep(0.1)
        assert all("up" in log.read_text().split() for log in logs), "the workers did not start within 60 s"
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        stderr = proc.stderr.read().decode(errors="replace")
        assert code == 130, stderr
        assert "interrupted; stopping the scheduler and workers" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


def test_msrun_on_two_nodes_joins_node_rank_1_to_the_scheduler_of_node_rank_0(tmp_path):
    # msrun_1.sh / msrun_2.sh, both nodes on 127.0.0.1: node 0 starts the scheduler and worker 0, node 1 worker 1.
    port = str(free_port())
    common = [
        "--worker_num=2",
        "--local_worker_num=1",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "--join=True",
        "--cluster_time_out=60",
    ]
    cmd = [sys.executable, "-m", "tessel.cli", "msrun"]
    node1 = subprocess.Popen(
        [*cmd, *common, "--node_rank=1", "--log_dir=node1", str(PROBE)],
        cwd=tmp_path,
        env=user_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    node0 = msrun(tmp_path, *common, "--node_rank=0", "--log_dir=node0")
    out1 = node1.communicate(timeout=90)[0]
    assert node0.returncode == 0 and node1.returncode == 0, node0.stdout + node0.stderr + out1
    assert sorted(p.name for p in (tmp_path / "node0").iterdir()) == ["scheduler.log", "worker_0.log"]
    assert [p.name for p in (tmp_path / "node1").iterdir()] == ["worker_1.log"]
    assert "rank 1 of 2: all_reduce=3" in (tmp_path / "node1" / "worker_1.log").read_text()


def test_msrun_sim_level_plans_one_rank_of_a_world_that_is_not_running(tmp_path):
    script = ROOT / "tests" / "integration" / "scripts" / "sim_plan.py"
    options = ("--worker_num=16", "--sim_level=0", "--sim_rank_id=3", "--log_dir=sim")
    result = msrun(tmp_path, *options, script=script, args=(str(tmp_path),))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 3 of a 16-rank world planned and compiled" in (tmp_path / "sim" / "worker_3.log").read_text()
    assert (tmp_path / "strategy.json").is_file()
    result = msrun(
        tmp_path, "--worker_num=2", "--local_worker_num=2", "--sim_rank_id=1", script=script, args=(str(tmp_path),)
    )
    assert result.returncode == 2 and "--sim_rank_id needs --sim_level or MS_SIMULATION_LEVEL" in result.stderr


def test_mindspores_simulation_variables_plan_without_daemons(tmp_path):
    """MS_SIMULATION_LEVEL with RANK_SIZE / RANK_ID, as MindSpore's dry runs set them, on a plain `python` run; and
    msrun without --sim_rank_id simulates each of this node's ranks, as MindSpore's msrun does."""
    script = ROOT / "tests" / "integration" / "scripts" / "sim_plan.py"
    env = user_env(tmp_path, MS_SIMULATION_LEVEL="0", RANK_SIZE="16", RANK_ID="5")
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=90
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "simulating rank 5 of 16" in run.stdout and "rank 5 of a 16-rank world planned and compiled" in run.stdout
    result = msrun(
        tmp_path,
        "--worker_num=2",
        "--local_worker_num=2",
        "--log_dir=sim",
        script=script,
        args=(str(tmp_path),),
        MS_SIMULATION_LEVEL="0",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert f"rank {rank} of a 2-rank world planned" in (tmp_path / "sim" / f"worker_{rank}.log").read_text()
    # tessel run takes MindSpore's variable as its --sim-level: one process, rank 0 of its -n world
    env.pop("RANK_ID")
    run = subprocess.run(
        [sys.executable, "-m", "tessel.cli", "run", "-n", "8", str(script), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert run.returncode == 0 and "rank 0 of a 8-rank world planned and compiled" in run.stdout, run.stderr
    env["MS_SIMULATION_LEVEL"] = "zero"  # not a level: both launchers refuse it before starting anything
    for launcher in (["run", "-n", "2"], ["msrun", "--worker_num=2", "--local_worker_num=2"]):
        bad = subprocess.run(
            [sys.executable, "-m", "tessel.cli", *launcher, str(script), str(tmp_path)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert bad.returncode == 2 and "MS_SIMULATION_LEVEL" in bad.stderr and "integer" in bad.stderr, bad.stderr
    env["MS_SIMULATION_LEVEL"] = "1"
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=90
    )
    assert run.returncode != 0 and "not supported yet: simulation level 1 (MS_SIMULATION_LEVEL=1)" in run.stderr


# ---------------------------------------------------------------------------------------------------- rank table


def test_rank_table_processes_find_each_other(tmp_path):
    # run_rank_table.sh: one process per device, each with RANK_TABLE_FILE, RANK_ID, DEVICE_ID and RANK_SIZE.
    table = tmp_path / "rank_table_2pcs.json"
    table.write_text(json.dumps(SAMPLE_TABLE))
    procs = []
    for rank in (1, 0):
        env = user_env(tmp_path, RANK_TABLE_FILE=str(table), RANK_SIZE="2", RANK_ID=str(rank), DEVICE_ID=str(rank))
        procs.append(start([sys.executable, str(PROBE)], env, tmp_path / f"train{rank}.log", tmp_path))
    assert finish(procs) == [0, 0], [(tmp_path / f"train{r}.log").read_text() for r in (0, 1)]
    assert "rank 1 of 2: all_reduce=3" in (tmp_path / "train1.log").read_text()
    no_tessel_processes_left(tmp_path)

    table.write_text(json.dumps({**SAMPLE_TABLE, "server_count": "2"}))
    env = user_env(tmp_path, RANK_TABLE_FILE=str(table), RANK_SIZE="2", RANK_ID="0", DEVICE_ID="0")
    bad = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "server_count is '2' but server_list has 1 servers" in bad.stderr


def test_rank_table_across_servers_meets_at_rank_zeros_server(tmp_path):
    # The cross-cluster layout (server_ip, cluster_list) with two "servers" on this machine's loopback addresses:
    # rank 0 serves the coordinator at its server's address, rank 1 reaches it there.
    table = tmp_path / "rank_table_cross_cluster.json"
    servers = []
    for i in range(2):
        device = [{"device_id": "0", "device_ip": f"192.{i}.0.6", "rank_id": str(i), "dpu_ip": "", "numa_id": ""}]
        servers.append({"server_id": f"server_{i}", "server_ip": f"127.0.0.{i + 1}", "device": device})
    clusters = [{"cluster_id": f"cluster_{i}", "server_list": [{"server_id": f"server_{i}"}]} for i in range(2)]
    table.write_text(
        json.dumps(
            {
                "version": "1.0",
                "server_count": "2",
                "server_list": servers,
                "cluster_list": clusters,
                "status": "completed",
            }
        )
    )
    port = str(free_port())
    procs = []
    for rank in (1, 0):
        env = user_env(
            tmp_path,
            RANK_TABLE_FILE=str(table),
            RANK_SIZE="2",
            RANK_ID=str(rank),
            DEVICE_ID="0",
            TESSEL_COORDINATOR_PORT=port,
        )
        procs.append(start([sys.executable, str(PROBE)], env, tmp_path / f"train{rank}.log", tmp_path))
    assert finish(procs) == [0, 0], [(tmp_path / f"train{r}.log").read_text() for r in (0, 1)]
    assert "rank 1 of 2: all_reduce=3" in (tmp_path / "train1.log").read_text()


# ---------------------------------------------------------------------------------------------------- mpirun


@pytest.mark.parametrize("rendezvous", ["file", "pmix"])
def test_mpirun_with_no_cluster_running_starts_and_removes_its_own(tmp_path, rendezvous):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("OpenMPI's mpirun is not installed (apt-get install openmpi-bin)")
    env = user_env(
        tmp_path, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TESSEL_RENDEZVOUS=rendezvous
    )
    result = subprocess.run(
        [mpirun, "-n", "3", "--oversubscribe", sys.executable, str(PROBE)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(3):
        assert f"rank {rank} of 3: all_reduce=6" in result.stdout
    no_tessel_processes_left(tmp_path)


def test_a_device_target_no_daemon_of_the_job_provides_fails_naming_their_plugins(tmp_path):
    script = tmp_path / "gpu.py"
    script.write_text(
        "import tessel as ms\nms.set_context(device_target='GPU')\nms.communication.init()\nprint('ran')\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "tessel.cli", "run", "-n", "2", str(script)],
        cwd=tmp_path,
        env=user_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode != 0 and "ran" not in result.stdout
    assert (
        "set_context(device_target='GPU'): no daemon of this job provides it; the job's daemons run the plugin(s) "
        "['cpu']" in result.stderr
    ), result.stderr[-3000:]
