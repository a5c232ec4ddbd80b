"""Manual parallelism (the manual-parallel seed: get_rank()-based slicing, ops.AllReduce of the loss) trained with
Model.train on real daemons, checked by scripts/dp_manual.py against a float64 numpy simulation of MindSpore's
semantics (AllReduce(sum)' = AllReduce(sum)); step 0's loss equals the single-device loss of the whole batch."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "dp_manual.py"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("n", [2, 4])
def test_manual_parallel_seed_matches_its_single_device_reference(tmp_path, n):
    result = run_tessel(["run", "-n", str(n), str(SCRIPT)], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(n):
        out = rank_log(tmp_path, rank).read_text()
        found = re.search(rf"manual ok on rank {rank} of {n}: step-0 loss (\S+) \(single device (\S+)\)", out)
        assert found and abs(float(found.group(1)) - float(found.group(2))) <= 1e-5, out
