"""DATA_PARALLEL through the SDK on real daemons (`tessel run -n N`): N ranks with gradients_mean equal 1-rank
training on the N-times global batch (float64 numpy reference, checked by scripts/dp_train.py on every rank),
through Model.train (feed and sink mode), the custom loop with DistributedGradReducer, PYNATIVE_MODE and
gradients_mean=False; plus the error paths (scripts/dp_errors.py)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPTS = ROOT / "tests" / "integration" / "scripts"
pytestmark = pytest.mark.slow


def _run(tmp: Path, n: int, script: str, *args: str, env: dict | None = None) -> list[str]:
    result = run_tessel(["run", "-n", str(n), str(SCRIPTS / script), *args], tmp, 300, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [rank_log(tmp, r).read_text() for r in range(n)]


def _numbers(text: str, label: str) -> np.ndarray:
    found = re.search(rf"^{label} (.+)$", text, re.M)
    assert found, text
    return np.array([float(v) for v in found.group(1).split()])


def _check(outputs: list[str], mode: str, tolerance: float = 1e-5) -> None:
    n = len(outputs)
    for rank, out in enumerate(outputs):
        found = re.search(rf"dp {mode} ok on rank {rank} of {n}: relative error (\S+)", out)
        assert found and float(found.group(1)) <= tolerance, out
    # The global batch's loss is the mean of the ranks' losses (equal shards).
    losses = np.mean([_numbers(out, "losses") for out in outputs], axis=0)
    np.testing.assert_allclose(losses, _numbers(outputs[0], "reference"), rtol=tolerance)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_model_train_data_parallel_equals_one_rank_on_the_global_batch(tmp_path, n):
    _check(_run(tmp_path, n, "dp_train.py", "model"), "model")


def test_data_parallel_over_tcp_equals_one_rank(tmp_path):
    # The inter-host transport has no shared memory: gradient buckets are laid out in private buffers and copied.
    _check(_run(tmp_path, 2, "dp_train.py", "model", env={"TESSEL_TRANSPORT": "tcp"}), "model")


@pytest.mark.parametrize("mode", ["sink", "loop", "pynative", "sum", "lossscale", "augment", "groups"])
def test_sink_custom_loop_pynative_and_sum_modes_match_the_reference(tmp_path, mode):
    _check(_run(tmp_path, 3, "dp_train.py", mode), mode)


def test_mixed_precision_with_a_fixed_loss_scale_equals_one_rank_to_float16s_rounding(tmp_path):
    # amp_level O2 and FixedLossScaleManager(128, drop_overflow_update=False): float16 compute, float32 weights and
    # gradient all-reduce; a wrong loss scale or a gradient not averaged would miss the reference by far more.
    _check(_run(tmp_path, 2, "dp_train.py", "amp"), "amp", tolerance=2e-3)


def test_dataset_without_num_shards_warns_that_every_rank_sees_the_same_data(tmp_path):
    for out in _run(tmp_path, 2, "dp_errors.py", "unsharded"):
        assert "every rank sees the same data" in out and "trained" in out, out


@pytest.mark.parametrize(
    "case, message",
    [
        ("differs", r"parameter 'weight' differs across ranks \(ranks grouped by equal value: \[\[0\], \[1\]\]\)"),
        ("count", r"different numbers of parameters \(\{0: 2, 1: 4\}\)"),
        ("mean", r"gradients_mean=True is not supported with parallel_mode='hybrid_parallel'"),
        ("pipeline", r"pipeline_stages=2 with parallel_mode='data_parallel': .* SEMI_AUTO_PARALLEL"),
    ],
)
def test_data_parallel_errors_name_the_cause_on_every_rank(tmp_path, case, message):
    for out in _run(tmp_path, 2, "dp_errors.py", case):
        assert re.search("caught: .*" + message, out), out


@pytest.mark.parametrize("mode", ["model", "sink", "loop"])
def test_a_layerwise_parallel_parameter_keeps_its_own_gradient_on_each_rank(tmp_path, mode):
    # MindSpore: no gradient all-reduce for Parameter(layerwise_parallel=True); the others get the ranks' mean.
    outputs = _run(tmp_path, 2, "dp_layerwise.py", mode)
    for rank, out in enumerate(outputs):
        found = re.search(rf"layerwise {mode} ok on rank {rank} of 2: relative error ([^,]+),", out)
        assert found and float(found.group(1)) <= 1e-5, out
