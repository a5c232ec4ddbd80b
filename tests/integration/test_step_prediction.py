"""The cost model's predicted step time against the measured one (`tessel run -n 2`, real daemons): for three nets
trained under SEMI_AUTO_PARALLEL with fixed strategies, the prediction for the plan `tessel.parallel.plan` gives,
priced with the model the coordinator builds from the job's daemons' measurements, is within 2x of the step time
the script measures (scripts/predict_step.py: the median over rounds, each round timed right after the daemons
measured again). On a machine whose speed moved by more than 2x during the test (other work), a miss is reported as
a skip with the figures: a 2x bound cannot hold against a device that changes speed by more than that."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "predict_step.py"
pytestmark = pytest.mark.slow
STEADY = 2.0  # the rounds' measured GEMM speeds within this factor of each other: the machine was steady enough


@pytest.mark.timeout(600)
@pytest.mark.parametrize("net", ["megatron", "data_parallel", "conv"])
def test_the_predicted_step_time_is_within_2x_of_the_measured_one(tmp_path, net):
    result = run_tessel(["run", "-n", "2", str(SCRIPT), net], tmp_path, 500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(rank_log(tmp_path, 0).read_text().strip().splitlines()[-1])
    rounds = "\n".join(
        f"  predicted {r['predicted_s'] * 1e3:.1f} ms, measured {r['measured_s'] * 1e3:.1f} ms: {r['parts']}"
        for r in report["rounds"]
    )
    print(f"{net}: predicted / measured = {report['ratio']:.2f}\n{rounds}")
    speeds = [r["gflops"] for r in report["rounds"]]
    within = 0.5 <= report["ratio"] <= 2.0
    if not within and max(speeds) > STEADY * min(speeds):
        pytest.skip(
            f"the daemons' own GEMM speed moved from {min(speeds):.0f} to {max(speeds):.0f} Gflop/s between rounds "
            "(other work on this machine): no fixed model can be within 2x of every round; run it on a quieter one"
        )
    assert within, f"{net}: the prediction misses by more than 2x:\n{rounds}"
