"""Inference after parallel training (issue: after and around training): under every parallel mode, Model.train,
then model.eval, model.predict and net(x) on the trained parameters — sliced where the mode slices them — give the
one-device answer, float64 numpy on the gathered parameters (scripts/infer_after.py checks on every rank)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "infer_after.py"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["data_parallel", "semi_auto", "auto_parallel", "hybrid"])
def test_eval_predict_and_call_after_training_give_the_one_device_answer(tmp_path, mode):
    result = run_tessel(["run", "-n", "4", str(SCRIPT), mode, str(tmp_path)], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(4):
        assert f"infer after {mode} ok on rank {rank} of 4" in rank_log(tmp_path, rank).read_text()
