"""Checkpoints that follow the parameters under optimizer parallel and pipeline parallel (scripts/parallel_ckpt.py,
the SEMI_AUTO counterpart is test_semi_checkpoints.py): 4 ranks train under level3 optimizer parallel and under 2
pipeline stages x 2 data parallel; ModelCheckpoint saves whole and as slices. One device loads the whole file, the
slices (load_distributed_checkpoint) and their offline merge (transform_checkpoints); the whole file equals one
device's training tensor for tensor, optimizer state included; 2 ranks data parallel load the whole file and the
slices. Every evaluation loss is the trained one to 1e-6."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "parallel_ckpt.py"
MODES = ("zero", "pipe")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pckpt")
    result = run_tessel(["run", "-n", "4", str(SCRIPT), "train", str(folder)], folder, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder


def test_one_device_loads_the_whole_file_the_slices_and_their_merge(trained):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "one", str(trained)], cwd=trained, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    for mode in MODES:
        for how in ("full", "slices", "merged"):
            assert f"parallel ckpt {mode} {how} ok on rank 0 of 1" in result.stdout, result.stdout


def test_two_ranks_data_parallel_load_the_whole_file_and_the_slices(trained, tmp_path):
    result = run_tessel(["run", "-n", "2", str(SCRIPT), "dp", str(trained)], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(2):
        out = rank_log(tmp_path, rank).read_text()
        for mode in MODES:
            for how in ("full", "slices"):
                assert f"parallel ckpt {mode} {how} ok on rank {rank} of 2" in out, out[-3000:]
