"""Checkpoints that follow the parameters, whatever the layout (scripts/semi_ckpt.py): 4 ranks trained under
SEMI_AUTO save whole and as slices; the evaluation loss after loading into one device (whole file, the slices, an
offline-merged file), 2 ranks data parallel, 4 ranks cut another way and 4 ranks cut the same way (each its own
slice file) is the trained one to 1e-6. Saving is a collective: one rank alone gets a clear error in seconds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "semi_ckpt.py"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    result = run_tessel(["run", "-n", "4", str(SCRIPT), "train", str(folder)], folder, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder


@pytest.mark.parametrize("phase", ["full", "slices", "merged"])
def test_one_device_loads_what_four_ranks_saved(trained, phase):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), phase, str(trained)], cwd=trained, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and f"semi ckpt {phase} ok" in result.stdout, result.stdout + result.stderr[-3000:]


@pytest.mark.parametrize(("phase", "n"), [("dp", 2), ("mp4", 4), ("same", 4)])
def test_other_worlds_and_strategies_load_it(trained, tmp_path, phase, n):
    result = run_tessel(["run", "-n", str(n), str(SCRIPT), phase, str(trained)], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(n):
        assert f"semi ckpt {phase} ok on rank {rank} of {n}" in rank_log(tmp_path, rank).read_text()


def test_a_save_on_a_subset_of_ranks_is_an_error_not_a_deadlock(trained, tmp_path):
    result = run_tessel(
        ["run", "-n", "2", str(SCRIPT), "subset", str(trained)], tmp_path, 120, env={"TESSEL_CHECKPOINT_TIMEOUT": "5"}
    )
    assert result.returncode != 0
    out = rank_log(tmp_path, 0).read_text() + result.stdout + result.stderr
    assert "save_checkpoint" in out and ("missing" in out or "time" in out), out[-3000:]
