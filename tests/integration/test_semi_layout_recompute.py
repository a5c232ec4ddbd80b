"""Under SEMI_AUTO_PARALLEL with real daemons: Model.infer_train_layout / infer_predict_layout and Cell.compile
return the layouts the plan then runs with, without running and without compiling again later
(scripts/semi_layout.py); recomputation, of the inserted collectives too, trains exactly as without
(scripts/semi_recompute.py). Each rank checks and prints one line."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPTS = ROOT / "tests" / "integration" / "scripts"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize(
    ("script", "line"), [("semi_layout.py", "semi layout ok"), ("semi_recompute.py", "semi recompute ok")]
)
def test_layouts_and_recomputation_on_real_ranks(tmp_path, n, script, line):
    result = run_tessel(["run", "-n", str(n), "--threads", "1", str(SCRIPTS / script)], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(n):
        assert f"{line} on rank {rank} of {n}" in rank_log(tmp_path, rank).read_text()
