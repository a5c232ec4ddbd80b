"""One partitioning path for every way of training (MindSpore's samples train all of these ways): under
SEMI_AUTO_PARALLEL a functional loop (value_and_grad with or without @ms.jit, then optimizer(grads)),
nn.TrainOneStepCell, a custom train-step Cell and Model.train each slice the parameters, insert the redistributions
and reduce the gradients over the replicas, so N ranks reproduce the standalone losses; afterwards net(x) runs on
the trained slices and gives each rank its share of the standalone output (scripts/semi_ways.py checks on every
rank)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "semi_ways.py"
pytestmark = pytest.mark.slow


def _train_alone_then_on(n: int, way: str, tmp_path) -> list[str]:
    """semi_ways.py `way` standalone (its losses the reference), then on n ranks; each rank's log, checked to have
    matched the reference to 1e-5."""
    reference = tmp_path / "reference.json"
    alone = subprocess.run(
        [sys.executable, str(SCRIPT), way, str(reference)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert alone.returncode == 0, alone.stdout[-2000:] + alone.stderr[-3000:]
    result = run_tessel(["run", "-n", str(n), str(SCRIPT), way, str(reference)], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    logs = []
    for rank in range(n):
        out = rank_log(tmp_path, rank).read_text()
        found = re.search(rf"semi ways {way} ok on rank {rank} of {n}: loss error (\S+);", out)
        assert found and float(found.group(1)) <= 1e-5, out
        logs.append(out)
    return logs


@pytest.mark.parametrize("way", ["jit", "loop", "onestep", "cell", "model"])
@pytest.mark.parametrize("n", [2, 4])
def test_every_way_of_training_partitions_and_equals_standalone(tmp_path, way, n):
    _train_alone_then_on(n, way, tmp_path)


def test_a_functional_step_under_full_batch_sends_each_rank_only_the_slices_it_reads(tmp_path):
    """@ms.jit + value_and_grad with full_batch=True on 4 ranks (dp 2 x mp 2): every rank is given the whole batch,
    trains like one device, and the host sends its daemon only the rows the plan reads: half of x (the first MatMul
    cuts the batch 2 ways) and a quarter of the labels (the loss reads them data parallel), not the whole batch."""
    n = 4
    batch, features, labels = 16, 12, 8  # semi_ways.py's BATCH, IN, OUT (float32)
    slices = (batch // 2) * features * 4 + (batch // n) * labels * 4
    for out in _train_alone_then_on(n, "jit_full_batch", tmp_path):
        fed = int(re.search(r"fed (\d+) bytes in the last step", out).group(1))
        assert slices <= fed <= slices + 64, (fed, slices, out)  # + the learning rate and step count (scalars)


def test_a_model_four_times_one_ranks_share_starts_with_no_init_parameters(tmp_path):
    """no_init_parameters: each of 4 ranks draws only its slices of a 256 MB model (weights and moments)."""
    script = ROOT / "tests" / "integration" / "scripts" / "semi_big.py"
    result = run_tessel(["run", "-n", "4", str(script)], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(4):
        assert f"semi big ok on rank {rank} of 4" in rank_log(tmp_path, rank).read_text()
