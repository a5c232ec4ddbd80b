"""MindSpore's ways to say how a network is cut, on real daemons under SEMI_AUTO_PARALLEL: Primitive.shard with
Layouts (named device axes), Cell.shard with a parameter_plan, ms.parallel.shard on a function and AutoParallel
around a training-step function each reproduce the standalone losses and slice the weights as they say, and so
does a split moved to another dim by AlltoAll or, under enable_alltoall=False, by AllGather and a slice
(scripts/semi_api.py checks on every rank)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "semi_api.py"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("variant", ["layout", "cellshard", "cellshard_step", "fnshard", "autoparallel", "exchange"])
def test_sharding_apis_train_like_standalone(tmp_path, variant):
    reference = tmp_path / "reference.json"
    alone = subprocess.run(
        [sys.executable, str(SCRIPT), variant, str(reference)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert alone.returncode == 0, alone.stdout[-2000:] + alone.stderr[-3000:]
    result = run_tessel(["run", "-n", "4", str(SCRIPT), variant, str(reference)], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(4):
        out = rank_log(tmp_path, rank).read_text()
        for how in ("", " without alltoall") if variant == "exchange" else ("",):  # enable_alltoall=False too
            found = re.search(rf"semi api {variant}{how} ok on rank {rank} of 4: loss error (\S+);", out)
            assert found and float(found.group(1)) <= 1e-5, out


@pytest.mark.parametrize("how", ["context", "auto_parallel"])
def test_force_fp32_communication_reduces_a_float16_network_in_float32(tmp_path, how):
    """set_auto_parallel_context(force_fp32_communication=True) or AutoParallel.enable_fp32_communication(): the
    row-parallel MatMul's reduction runs in float32 between casts (one simulated rank of two, graphs saved)."""
    import os

    script = ROOT / "tests" / "integration" / "scripts" / "fp32_communication.py"
    env = dict(os.environ, MS_SIMULATION_LEVEL="0", RANK_SIZE="2", RANK_ID="0", TESSEL_THREADS="1")
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path), how], env=env, capture_output=True, text=True, timeout=90
    )
    assert run.returncode == 0, run.stdout + run.stderr
    compiled = [p for p in tmp_path.glob("rank_0/*.ir") if not p.name.startswith("step_parallel")]
    dumps = "".join(path.read_text() for path in compiled)  # the compiled segments, not the parallel pass's dumps
    reductions = re.findall(r"= (?:AllReduce|ReduceScatter)\(", dumps)
    assert reductions and len(re.findall(r": f32\[[\d,]*\] = (?:AllReduce|ReduceScatter)\(", dumps)) == len(reductions)
    assert re.search(r": f16\[[\d,]*\] = Cast\(", dumps), dumps


def test_force_fp32_communication_set_after_the_first_run_is_an_error(tmp_path):
    script = ROOT / "tests" / "integration" / "scripts" / "fp32_communication.py"
    result = run_tessel(["run", "-n", "2", str(script), str(tmp_path / "graphs"), "toggle"], tmp_path)
    assert result.returncode != 0
    out = rank_log(tmp_path, 0).read_text() + result.stderr
    assert "first run (4, 4)" in out, out[-2000:]  # each rank holds its rows of the (8, 4) result
    assert "force_fp32_communication=True: " in out, out[-2000:]
    assert "compiled with force_fp32_communication=False" in out, out[-2000:]


def test_comm_func_reduces_float16_in_float32_under_force_fp32_communication(tmp_path):
    script = ROOT / "tests" / "integration" / "scripts" / "fp32_comm_func.py"
    result = run_tessel(["run", "-n", "4", str(script)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = rank_log(tmp_path, 3).read_text()
    # float16 adds round 2049 back to 2048 each time; float32 sums to 2051, which rounds to 2052 once
    assert "rank 3: plain [2048.0, 1.0] wide [2052.0, 1.0] float16 True" in out, out
    assert "rank 3: async refused yes" in out, out
