"""Resume equals never stopping (scripts/resume.py): 2 epochs with a checkpoint per epoch, then a new process
loading the epoch-2 checkpoint and training on with initial_epoch=2, reproduce epochs 3 and 4 of the
uninterrupted run exactly — parameters, Adam's moments and beta powers, the learning-rate step (global_step) and the
dataset's shuffle order resume — on one device, data parallel and semi-auto, in feed and sink mode."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "resume.py"


def _run(mode: str, phase: str, folder, sink: str) -> None:
    if mode == "standalone":
        command = [sys.executable, str(SCRIPT), mode, phase, str(folder), sink]
        result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=120)
    else:
        result = run_tessel(["run", "-n", "2", str(SCRIPT), mode, phase, str(folder), sink], folder, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("sink", ["feed", "sink"])
@pytest.mark.parametrize("mode", ["standalone", pytest.param("dp", marks=pytest.mark.slow),
                                  pytest.param("semi", marks=pytest.mark.slow)])  # fmt: skip
def test_a_resumed_run_continues_exactly_where_it_stopped(tmp_path, mode, sink):
    for phase in ("whole", "first", "rest"):
        _run(mode, phase, tmp_path, sink)
    ranks = 1 if mode == "standalone" else 2
    for rank in range(ranks):
        whole, first, rest = (
            json.loads((tmp_path / f"{p}_{rank}.json").read_text()) for p in ("whole", "first", "rest")
        )
        assert len(first) + len(rest) == len(whole)
        assert first == whole[: len(first)] and rest == whole[len(first) :], (whole, first, rest)
