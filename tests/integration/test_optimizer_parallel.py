"""Optimizer parallel (ZeRO levels 1-3: enable_parallel_optimizer + parallel_optimizer_config, AutoParallel.hsdp),
gradient accumulation (GradAccumulation, grad_accumulation_step) and parameter_broadcast through Model.train on
real daemons (`tessel run -n N`): every configuration's 20 losses, its parameters gathered whole and its optimizer
state saved whole equal 1-rank training on the global batch (float64 numpy reference, checked on every rank by
scripts/zero_train.py and scripts/broadcast_train.py). The modes share jobs: one per group of modes and world
size, each mode checked in turn on fresh networks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPTS = ROOT / "tests" / "integration" / "scripts"
pytestmark = pytest.mark.slow


def _run(tmp: Path, n: int, script: str, *args: str) -> list[str]:
    result = run_tessel(["run", "-n", str(n), str(SCRIPTS / script), *args], tmp, 540)  # within the tests' 600 s
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [rank_log(tmp, r).read_text() for r in range(n)]


# One job per group and world size checks each mode of its group in turn (a job start per mode saved); the tests
# below read their mode's lines from it. A failed job fails every test of its group with its output.
GROUPS = ("dp,accumulate,semi_loop", "semi,auto")


@pytest.fixture(scope="module")
def zero_jobs(tmp_path_factory):
    done: dict[tuple[int, str], list[str] | str] = {}

    def outputs(n: int, mode: str) -> list[str]:
        (group,) = [g for g in GROUPS if mode in g.split(",")]
        if (n, group) not in done:
            tmp = tmp_path_factory.mktemp(f"zero-{n}-{group.replace(',', '-')}")
            try:
                done[(n, group)] = _run(tmp, n, "zero_train.py", group)
            except AssertionError as failed:
                done[(n, group)] = f"the job of modes {group} on {n} ranks failed (checking {mode}):\n{failed}"
        found = done[(n, group)]
        if isinstance(found, str):
            pytest.fail(found)
        return found

    return outputs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["dp", "semi", "auto"])
@pytest.mark.parametrize("n", [2, 4])
def test_every_level_and_optimizer_equals_one_rank_on_the_global_batch(zero_jobs, n, mode):
    for rank, out in enumerate(zero_jobs(n, mode)):
        for optimizer in ("sgd", "momentum", "adam"):
            for level in ("off", "level1", "level2", "level3"):
                line = rf"^zero {mode} {optimizer} {level} ok on rank {rank} of {n}: loss error (\S+), parameter error"
                found = re.search(line, out, re.M)
                assert found and float(found.group(1)) <= 1e-5, (mode, optimizer, level, out)
        assert f"zero {mode} checkpoint ok on rank {rank} of {n}" in out, (mode, out)
        assert mode != "dp" or f"zero dp predict ok on rank {rank} of {n}" in out, out
        assert mode != "dp" or f"zero dp switch ok on rank {rank} of {n}" in out, out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [2, 4])
def test_an_optimizer_called_on_gradients_keeps_its_state_in_blocks(zero_jobs, n):
    for rank, out in enumerate(zero_jobs(n, "semi_loop")):
        for optimizer in ("momentum", "adam"):
            for level in ("off", "level1"):
                assert f"zero semi_loop loop {optimizer} {level} ok on rank {rank} of {n}" in out, out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [2, 4])
def test_gradient_accumulation_is_one_step_on_the_whole_batch(zero_jobs, n):
    for rank, out in enumerate(zero_jobs(n, "accumulate")):
        for tag in ("adam level2 accumulate=2", "momentum level1 accumulate=2 context", "sgd off accumulate=2"):
            assert f"zero accumulate {tag} ok on rank {rank} of {n}" in out, out


def test_parameter_broadcast_starts_every_rank_from_rank_0s_weights(tmp_path):
    for rank, out in enumerate(_run(tmp_path, 2, "broadcast_train.py")):
        for way in ("model", "loop"):
            found = re.search(rf"^broadcast {way} ok on rank {rank} of 2: parameter error (\S+)", out, re.M)
            assert found and float(found.group(1)) <= 1e-5, out
        assert re.search(r"unbroadcast caught on rank \d: data parallel: parameter 'weight' differs", out), out
