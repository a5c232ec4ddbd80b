"""SEMI_AUTO_PARALLEL through the SDK on real daemons (`tessel run -n N`): a Megatron MLP written with
Primitive.shard() and trained by Model.train equals 1-rank training on the global batch (float64 numpy reference,
checked on every rank by scripts/semi_train.py)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "semi_train.py"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("n", [2, 4])
def test_megatron_mlp_with_full_batch_trains_like_one_rank(tmp_path, n):
    result = run_tessel(["run", "-n", str(n), str(SCRIPT), "full_batch"], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(n):
        out = (tmp_path / "log_output" / "1" / f"rank.{rank}" / "stdout").read_text()
        found = re.search(rf"semi full_batch ok on rank {rank} of {n}: loss error (\S+)", out)
        assert found and float(found.group(1)) <= 1e-5, out
