"""Checkpoints without redundancy (scripts/redundancy_ckpt.py): under SEMI_AUTO (2 x 2) and DATA_PARALLEL
(ModelCheckpoint with CheckpointConfig(remove_redundancy=True)) each value or slice that several ranks hold is
written by one of them, and every rank loads back exactly what it held; a shared path and another rank's file are
errors on every rank."""

from __future__ import annotations

import json
import re

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
        # 2 x 2: w1, w2 and their moments are cut in 2 pieces, each held by 2 ranks; global_step by all 4
        ("semi", {"w1": 2, "w2": 2, "moments.w1": 2, "moments.w2": 2, "global_step": 1}),
        # data parallel: every value is held by all 4 ranks
        ("dp", {"w1": 1, "w2": 1, "moments.w1": 1, "moments.w2": 1, "global_step": 1}),
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
        assert f"redundancy {phase} ok on rank {rank} of 4: 5 values back" in rank_log(tmp_path, rank).read_text()


@pytest.mark.parametrize(
    "phase, message",
    [
        ("shared", r"ranks \[0, 1\] write the same file"),
        ("partial", r"rank 1 was given rank 0's file"),
        ("uncompiled", r"'w1' was saved as a slice but is not laid out in this network yet: compile the network"),
    ],
)
def test_a_shared_path_another_ranks_file_or_a_network_not_compiled_is_an_error_on_every_rank(tmp_path, phase, message):
    result = run_tessel(["run", "-n", "2", str(SCRIPT), phase, str(tmp_path / "ckpt")], tmp_path, 300)
    assert result.returncode != 0
    for rank in range(2):
        stderr = rank_log(tmp_path, rank, stream="stderr").read_text()
        assert re.search(message, stderr), stderr[-3000:]
