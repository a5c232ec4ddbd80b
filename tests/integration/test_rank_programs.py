"""Rank programs on real daemons: `tessel run -n N` of a manual tensor-parallel MLP and a data-parallel train step
with bucketed gradient AllReduce, each checked by the script against single-device references (see
scripts/rank_mlp.py for the checks)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "rank_mlp.py"
pytestmark = pytest.mark.slow


def _stdout(tmp: Path, rank: int) -> str:
    return rank_log(tmp, rank).read_text()


@pytest.mark.parametrize("n", [2, 3, 4])
def test_tensor_and_data_parallel_rank_programs_match_one_device(tmp_path, n):
    result = run_tessel(["run", "-n", str(n), str(SCRIPT)], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(n):
        out = _stdout(tmp_path, rank)
        # MindSpore's measured semantics: every W1/W2 slice moves N times the single-device update.
        ratios = re.findall(
            rf"tensor parallel ok on rank {rank} of {n}: group \(([\d, ]+)\) update ratio ([\d.]+)", out
        )
        assert ratios, out
        for group, ratio in ratios:
            assert abs(float(ratio) - len(group.split(","))) < 1e-3, out
        assert len(ratios) == (2 if n == 4 else 1), out
        line = rf"data parallel ok on rank {rank} of {n}: (\d+) buckets \(up to (\d+) tensors\), relative error (\S+),"
        found = re.search(line, out)
        assert found, out
        buckets, largest, error = int(found.group(1)), int(found.group(2)), float(found.group(3))
        assert buckets >= 2 and largest >= 2 and error <= 1e-5, out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_collective_is_in_flight_while_the_next_segment_runs(tmp_path, transport):
    """The daemon's timeline of a program with two independent copies: each AllReduce issued before a segment
    and waited for after it, both in flight at once, results unchanged (scripts/overlap_program.py checks).
    Shared-memory collectives keep a core busy: they overlap only where the host has a core for each rank's
    collective thread beside its compute threads (tessel run gives the ranks all the cores, so they are deferred to
    the first wait and run back to back there)."""
    script = ROOT / "tests" / "integration" / "scripts" / "overlap_program.py"
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // 2)  # what tessel run -n 2 gives each daemon
    overlap = transport == "tcp" or 2 * (threads + 1) <= cores
    env = {"TESSEL_TRANSPORT": transport, "OVERLAP": "1" if overlap else "0"}
    result = run_tessel(["run", "-n", "2", str(script)], tmp_path, 120, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(2):
        assert f"overlap ok on rank {rank} of 2" in _stdout(tmp_path, rank)
