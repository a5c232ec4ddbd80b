"""Pipeline parallel on real daemons (scripts/pipeline_train.py): an MLP in 2 or 4 stages, with and without data
and model parallelism inside the stages, under every schedule and through every way to train (Model.train, a
TrainOneStepCell, a jit step, AutoParallel.pipeline), reproduces ONE device training the same network on the same
micro-batches to 1e-5 relative over 20 steps (every rank checks its losses and the parameters it holds against
float64 numpy; the cases of one world and stage count train in turn in one job). Errors name the cell and the fix
on every rank; a rank that dies fails the job everywhere within seconds; across two test-bed hosts the stages'
transfers go over TCP while the stages compute."""

from __future__ import annotations

import json
import re
import time

import pytest
from testbed_cluster import describe

from tests.conftest import ROOT, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "pipeline_train.py"
pytestmark = pytest.mark.slow


def _ok(tmp_path, ranks: int, flow: str, scheduler: str) -> None:
    for rank in range(ranks):
        logs = sorted((tmp_path / "log_output").glob(f"*/rank.{rank}/stdout"))
        out = logs[-1].read_text()
        assert re.search(rf"pipeline {flow} {scheduler} ok on rank {rank} of {ranks}", out), out[-2000:]


CASES = [
    ("model", "gpipe", 2, 2, []),
    ("step", "1f1b", 2, 2, []),
    ("jit", "zero_bubble_h1", 2, 2, []),
    ("auto", "1f1b", 2, 2, ["interleave"]),  # 2 chunks per stage
    ("model", "1f1b", 4, 4, []),
    ("jit", "gpipe", 4, 4, []),
    ("step", "zero_bubble_h1", 4, 4, []),
    ("model", "zero_bubble_h1", 2, 4, []),  # 2 data-parallel ranks per stage
    ("jit", "1f1b", 2, 4, ["mp"]),  # ... and the first layer cut by columns over them
    ("step", "gpipe", 2, 4, ["tied", "sync"]),  # a parameter on both stages, synchronized after a change
]


@pytest.fixture(scope="module")
def pipeline_jobs(tmp_path_factory):
    """One job per (ranks, stages) trains each of its CASES in turn (a job start per case saved); each test checks
    its case's line on every rank. A failed job fails each of its cases' tests with its output."""
    done: dict[tuple[int, int], object] = {}

    def job(ranks: int, stages: int):
        if (ranks, stages) not in done:
            tmp = tmp_path_factory.mktemp(f"pipeline-{ranks}-{stages}")
            cases = [[flow, scheduler, str(s), *options] for flow, scheduler, s, n, options in CASES
                     if (n, s) == (ranks, stages)]  # fmt: skip
            words = [word for case in cases for word in ["+", *case]][1:]
            result = run_tessel(["run", "-n", str(ranks), "--threads", "1", str(SCRIPT), *words], tmp, 540)
            failed = result.returncode != 0
            done[(ranks, stages)] = (result.stdout[-3000:] + result.stderr[-3000:]) if failed else tmp
        return done[(ranks, stages)]

    return job


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("flow", "scheduler", "stages", "ranks", "options"), CASES)
def test_stages_train_like_one_device_on_the_same_micro_batches(pipeline_jobs, flow, scheduler, stages, ranks, options):
    found = pipeline_jobs(ranks, stages)
    if isinstance(found, str):
        pytest.fail(f"the job of the {ranks}-rank {stages}-stage cases failed (checking {flow} {scheduler}):\n{found}")
    _ok(found, ranks, flow, scheduler)


def test_after_training_the_network_runs_through_the_stages_and_a_checkpoint_holds_every_parameter(tmp_path):
    """net(x) without PipelineCell (one micro-batch, forwards only) returns numpy's logits on every rank, and
    save_checkpoint(net) on every rank writes each parameter whole, gathered from the ranks of a stage holding it."""
    args = ["run", "-n", "4", "--threads", "1", str(SCRIPT), "jit", "1f1b", "2", "mp", "infer", f"ckpt={tmp_path}"]
    result = run_tessel(args, tmp_path, 240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _ok(tmp_path, 4, "jit", "1f1b")
    assert (tmp_path / "net.ckpt").is_file()


@pytest.mark.parametrize(
    ("ranks", "stages", "options", "message"),
    [
        (4, 3, [], r"pipeline_stages=3 does not divide the 4 ranks of the job.*Fix: pipeline_stages a divisor of 4"),
        (2, 2, ["micro=1"], r"pipeline_stages=2 with 1 micro-batch\(es\).*micro_size >= pipeline_stages.*Fix"),
        (2, 2, ["stage_of=0,0,2,2"], r"cell .*layers\.2 \(Dense\) has pipeline_stage=2, but pipeline_stages=2"),
        (3, 3, ["stage_of=0,0,2,2"], r"no cell is on stage\(s\) \[1\].*Fix: set pipeline_stage 1 on a cell"),
        (
            2,
            2,
            ["stage_of=1,0,1,1"],
            r"layers\.1 \(Dense\).* stage 0 but reads what .* computes on the later stage 1.*Fix",
        ),
        (2, 2, ["batch=6"], r"PipelineCell\(WithLossCell\): input 0 has shape \(6, 12\).*micro_size=4"),
        (2, 2, ["zero"], r"not supported yet: enable_parallel_optimizer=True with pipeline_stages=2.*Fix"),
    ],
)
def test_errors_name_the_cell_the_rule_and_the_fix_before_any_step(tmp_path, ranks, stages, options, message):
    """Each is raised while the rank compiles (here one rank of the world, planned with --sim-level 0)."""
    args = ["run", "--sim-level", "0", "-n", str(ranks), str(SCRIPT), "step", "1f1b", str(stages), *options]
    result = run_tessel(args, tmp_path, 120)
    assert result.returncode != 0, result.stdout[-2000:]
    assert re.search(message, result.stdout + result.stderr), (result.stdout + result.stderr)[-3000:]


def test_a_stage_without_parameters_fails_the_job_on_every_rank_naming_its_cells(tmp_path):
    args = ["run", "-n", "2", str(SCRIPT), "step", "1f1b", "2", "relu_stage"]
    result = run_tessel(args, tmp_path, 120)
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "pipeline stage 1 holds no parameters" in out, out[-3000:]
    assert "ReLU" in out and "Fix: move a cell with parameters to stage 1" in out, out[-3000:]


def test_a_rank_that_dies_mid_training_fails_the_job_everywhere_within_seconds(tmp_path):
    start = time.monotonic()
    result = run_tessel(["run", "-n", "2", str(SCRIPT), "step", "1f1b", "2", "die=3"], tmp_path, 120)
    elapsed = time.monotonic() - start
    assert result.returncode != 0, result.stdout[-2000:]
    assert "rank 1" in result.stderr and "exit code 7" in result.stderr, result.stderr[-3000:]
    assert elapsed < 45, f"the job took {elapsed:.0f} s to fail"


def _send_in_flight_during_compute(trace: dict) -> bool:
    """A Send's transfer ran while a segment of the same rank computed (the stage went on with its work)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    sends = [e for e in events if e["cat"] == "communication" and e["name"].startswith("Send")]
    compute = [e for e in events if e["cat"] == "compute"]
    return any(
        s["ts"] < c["ts"] + c["dur"] and c["ts"] < s["ts"] + s["dur"] for s in sends for c in compute if s["dur"] > 0
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("testbed", [{"hosts": 2, "rate": "1gbit"}], indirect=True)
def test_stages_on_two_hosts_train_like_one_device_with_transfers_in_flight_while_they_compute(
    testbed, make_testbed_cluster, tmp_path
):
    cluster = make_testbed_cluster(testbed, daemons_per_host=1)
    timeline = tmp_path / "timeline"
    env = {"TESSEL_TIMELINE": str(timeline)}
    results = cluster.run_ranks([str(SCRIPT), "step", "1f1b", "2", "micro=8", "batch=64"], env=env, timeout_s=240)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    for rank, result in enumerate(results):
        assert f"pipeline step 1f1b ok on rank {rank} of 2" in result.output, result.output
    for rank in range(2):
        trace = json.loads((timeline / f"timeline_rank{rank}.json").read_text())
        groups = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
        assert any("communication" in g for g in groups), groups
        assert _send_in_flight_during_compute(trace), f"rank {rank}: no send in flight across a segment"
