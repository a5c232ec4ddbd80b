"""Checkpoints without redundancy (scripts/redundancy_ckpt.py): under SEMI_AUTO (2 x 2) and DATA_PARALLEL
(ModelCheckpoint with CheckpointConfig(remove_redundancy=True)) each value or slice that several ranks hold is
written by one of them, and every rank loads back exactly what it held, even a rank whose file holds no value; values
in no rank's file come back as not loaded; a shared path, another rank's file (empty or not) and a network cut
another way or not compiled are errors on every rank; parameters laid out but never fetched back save their slices;
one device merges the shares offline."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "redundancy_ckpt.py"
pytestmark = pytest.mark.slow


def _saved(tmp_path, world: int) -> dict[int, list[str]]:
    out = {}
    for rank in range(world):
        found = re.search(rf"saved by rank {rank}: (\[.*\])", rank_log(tmp_path, rank).read_text())
        assert found, rank_log(tmp_path, rank).read_text()[-2000:]
        out[rank] = json.loads(found.group(1))
    return out


@pytest.mark.parametrize(
    "phase, writers",
    [
        # 2 x 2: w1, w2 and their moments are cut in 2 pieces, each held by 2 ranks; the optimizer's numbers
        # (global_step, learning_rate, momentum) by all 4
        (
            "semi",
            {"w1": 2, "w2": 2, "moments.w1": 2, "moments.w2": 2, "global_step": 1, "learning_rate": 1, "momentum": 1},
        ),
        # data parallel: every value is held by all 4 ranks
        (
            "dp",
            {"w1": 1, "w2": 1, "moments.w1": 1, "moments.w2": 1, "global_step": 1, "learning_rate": 1, "momentum": 1},
        ),
    ],
)
def test_each_piece_is_written_once_and_every_rank_loads_back_what_it_held(tmp_path, phase, writers):
    result = run_tessel(["run", "-n", "4", str(SCRIPT), phase, str(tmp_path / "ckpt")], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    saved = _saved(tmp_path, 4)
    counts = {name: sum(name in names for names in saved.values()) for name in writers}
    assert counts == writers, saved
    assert all(saved.values()), saved  # the shares go round: no rank writes nothing here
    for rank in range(4):
        assert f"redundancy {phase} ok on rank {rank} of 4: 7 values back" in rank_log(tmp_path, rank).read_text()
    if phase == "semi":  # on one device: a share alone is an error; the 4 shares merge into the whole values
        single, merge = (
            subprocess.run(
                [sys.executable, str(SCRIPT), what, str(tmp_path / "ckpt")],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )
            for what in ("single", "merge")
        )
        assert single.returncode == 0, single.stderr[-3000:]
        assert "single refused: load_param_into_net: this checkpoint holds rank 1's share of a 4-rank job" in (
            single.stdout
        ), single.stdout
        assert merge.returncode == 0 and "merge ok: 7 values" in merge.stdout, merge.stdout + merge.stderr[-3000:]


@pytest.mark.parametrize(
    "phase, message",
    [
        ("shared", r"ranks \[0, 1\] write the same file"),
        ("partial", r"rank 1 was given rank 0's file"),
        ("uncompiled", r"file does not fit 'w1' \(saved as a slice \(Layout.*\) but not laid out in this network yet"),
        ("restrategy", r"file does not fit 'w1' \(saved as a slice of Layout\(.*\), laid out here as Layout\("),
    ],
)
def test_a_shared_path_another_ranks_file_or_another_network_is_an_error_on_every_rank(tmp_path, phase, message):
    result = run_tessel(["run", "-n", "2", str(SCRIPT), phase, str(tmp_path / "ckpt")], tmp_path, 300)
    assert result.returncode != 0
    for rank in range(2):
        stderr = rank_log(tmp_path, rank, stream="stderr").read_text()
        assert re.search(message, stderr), stderr[-3000:]


def test_values_in_no_ranks_file_come_back_as_not_loaded(tmp_path):
    # the network's values saved without redundancy, loaded into its training cell: the optimizer's are in no file
    result = run_tessel(["run", "-n", "2", str(SCRIPT), "netonly", str(tmp_path / "ckpt")], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(2):
        assert f"redundancy netonly ok on rank {rank} of 2: 2 values back" in rank_log(tmp_path, rank).read_text()


def test_parameters_laid_out_but_never_fetched_save_their_slices(tmp_path):
    # after a forward pass only, a parameter's host copy is still its whole value: its rank's file holds the slice
    # (integrated_save=False wrote the whole value under a slice's layout before)
    result = run_tessel(["run", "-n", "2", str(SCRIPT), "unfetched", str(tmp_path / "ckpt")], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(2):
        assert f"redundancy unfetched ok on rank {rank} of 2: slices saved" in rank_log(tmp_path, rank).read_text()


def test_a_rank_whose_file_holds_nothing_still_loads_and_its_file_is_still_its_own(tmp_path):
    # data parallel, 2 values over 4 ranks: ranks 2 and 3 write empty files, and MindSpore's idiom
    # load_param_into_net(net, load_checkpoint(file)) must still take them into the collective load
    result = run_tessel(["run", "-n", "4", str(SCRIPT), "empty", str(tmp_path / "ckpt")], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert _saved(tmp_path, 4) == {0: ["w1"], 1: ["w2"], 2: [], 3: []}
    for rank in range(4):
        assert f"redundancy empty ok on rank {rank} of 4: 2 values back" in rank_log(tmp_path, rank).read_text()
    # ranks 2 and 3 swap their empty files: the file's own rank tells, on every rank
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    result = run_tessel(["run", "-n", "4", str(SCRIPT), "emptyswap", str(swapped / "ckpt")], swapped, 300)
    assert result.returncode != 0
    for rank in range(4):
        stderr = rank_log(swapped, rank, stream="stderr").read_text()
        assert "rank 2 was given rank 3's file; rank 3 was given rank 2's file" in stderr, stderr[-3000:]
