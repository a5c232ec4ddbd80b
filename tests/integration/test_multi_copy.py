"""Multi-copy parallelism on real daemons: nn.MicroBatchInterleaved(WithLossCell(net), k) trained by Model.train
under SEMI_AUTO_PARALLEL, AUTO_PARALLEL and DATA_PARALLEL equals one device training the same network with the same
k (scripts/multi_copy_train.py checks every rank against float64 numpy); across two test-bed hosts the copies'
AllReduces travel over TCP and the timeline shows them in flight while the other copy computes."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from testbed_cluster import describe

from tessel.profiler.report import summarize
from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "multi_copy_train.py"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("mode", "data", "k", "ranks"),
    [
        ("semi_auto", "full_batch", 2, 2),
        ("semi_auto", "data_parallel", 2, 4),
        ("auto", "full_batch", 4, 2),
        ("data_parallel", "data_parallel", 2, 2),
    ],
)
def test_n_ranks_with_k_copies_train_like_one_device_with_k_copies(tmp_path, mode, data, k, ranks):
    result = run_tessel(["run", "-n", str(ranks), str(SCRIPT), mode, data, str(k)], tmp_path, 120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(ranks):
        out = rank_log(tmp_path, rank).read_text()
        assert re.search(rf"multi-copy {mode} {data} k={k} ok on rank {rank} of {ranks}", out), out


def _in_flight_across_compute(trace: dict) -> list[str]:
    """Handles of collectives issued before a segment began and waited for after it ended (from a rank's trace)."""
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    issues = {(e["args"]["handle"], e["ts"]): e for e in events if e["cat"] == "issue"}
    waits = [e for e in events if e["cat"] == "wait"]
    compute = [e for e in events if e["cat"] == "compute"]
    found = []
    for (handle, ts), issue in issues.items():
        wait = min((w for w in waits if w["args"]["handle"] == handle and w["ts"] >= ts), key=lambda w: w["ts"])
        end = issue["ts"] + issue["dur"]
        if any(end <= c["ts"] and c["ts"] + c["dur"] <= wait["ts"] for c in compute):
            found.append(handle)
    return found


@pytest.mark.timeout(240)
@pytest.mark.parametrize("testbed", [{"hosts": 2, "rate": "1gbit"}], indirect=True)
def test_copies_across_two_hosts_overlap_one_copys_all_reduce_with_the_other_copys_compute(
    testbed, make_testbed_cluster, tmp_path
):
    cluster = make_testbed_cluster(testbed, daemons_per_host=1)
    timeline = tmp_path / "timeline"
    env = {"MULTI_COPY_SIZE": "large", "TESSEL_TIMELINE": str(timeline)}
    results = cluster.run_ranks([str(SCRIPT), "semi_auto", "full_batch", "2"], env=env, timeout_s=180)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    for rank, result in enumerate(results):
        assert f"multi-copy semi_auto full_batch k=2 ok on rank {rank} of 2" in result.output, result.output
    for rank in range(2):
        trace = json.loads((timeline / f"timeline_rank{rank}.json").read_text())
        tracks = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
        assert "communication: world" in tracks, tracks
        assert _in_flight_across_compute(trace), f"rank {rank}: no AllReduce in flight across a segment"
    summaries = summarize(timeline)
    assert [s.rank for s in summaries] == [0, 1] and all(s.steps >= 5 for s in summaries)
    assert all(s.hidden_share and s.hidden_share > 0 for s in summaries), summaries


def test_timeline_summary_command_reads_the_files_of_a_job(tmp_path):
    """`TESSEL_TIMELINE=DIR tessel run -n 2 ...` then `tessel timeline DIR`: one line per rank."""
    timeline = tmp_path / "timeline"
    env = {"TESSEL_TIMELINE": str(timeline), "MULTI_COPY_SIZE": "large"}
    result = run_tessel(["run", "-n", "2", str(SCRIPT), "semi_auto", "full_batch", "2"], tmp_path, 120, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(os.listdir(timeline)) == ["timeline_rank0.json", "timeline_rank1.json"]
    shown = run_tessel(["timeline", str(timeline)], tmp_path, 60)
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines() if re.match(r"\s+[01]\s+\d+\s", line)]
    assert [row[0] for row in rows] == ["0", "1"] and all(int(row[1]) == 5 for row in rows), shown.stdout
    assert Path(timeline / "timeline_rank0.json").stat().st_size > 0
