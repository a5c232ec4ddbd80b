"""Speed-aware data parallelism (batch_split) on real daemons (`tessel run -n N`): uneven shares of the global
batch train exactly like one device on it (float64 numpy reference, ≤ 1e-5, checked by scripts/dp_split.py on
every rank) with shares 1:2 and 1:1:3, in feed and sink mode, shuffled (each epoch in its own order), and by
measured speed, in one Model.train call or one per epoch; rank 0 logs the split. A train step of the user's own
(a construct of its own, a loop of its own) is refused on every rank: its reduction knows no shares."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "dp_split.py"
pytestmark = pytest.mark.slow


def _run(tmp, n: int, *args: str) -> tuple[list[str], str]:
    """(every rank's stdout, rank 0's stderr: the log)."""
    result = run_tessel(["run", "-n", str(n), str(SCRIPT), *args], tmp, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [rank_log(tmp, r).read_text() for r in range(n)], rank_log(tmp, 0, stream="stderr").read_text()


def _shares(outputs: list[str]) -> list[list[int]]:
    per_rank = []
    for rank, out in enumerate(outputs):
        found = re.search(rf"split ok on rank {rank} of {len(outputs)}: relative error (\S+), shares (.*)$", out, re.M)
        assert found and float(found.group(1)) <= 1e-5, out
        per_rank.append([int(s) for s in found.group(2).split()])
    return per_rank


@pytest.mark.parametrize(
    "n, weights, mode, want",
    [(2, "1,2", "model", [4, 8]), (3, "1,1,3", "sink", [3, 3, 9]), (2, "1,2", "sink,shuffle", [4, 8])],
)
def test_uneven_shares_train_like_one_device_on_the_global_batch(tmp_path, n, weights, mode, want):
    outputs, log = _run(tmp_path, n, weights, mode)
    assert [s[0] for s in _shares(outputs)] == want
    assert re.search(rf"batch split for epoch 1: shares {':'.join(map(str, want))} of {sum(want)} \(weights", log)


def test_the_split_by_speed_trains_like_one_device_whatever_the_shares(tmp_path):
    outputs, log = _run(tmp_path, 2, "speed", "model")
    per_rank = _shares(outputs)
    assert all(a + b == 12 for a, b in zip(*per_rank)), per_rank
    assert re.search(r"batch split for epoch 1: shares \d+:\d+ of 12 \(device measurements", log), log
    # the first epoch at a split warms up (first runs at its shapes): the split is held and the next epoch measured
    held = r"batch split for epoch 2: shares \d+:\d+ of 12 \(kept from epoch 0 \(its first epoch warmed up"
    assert re.search(held, log), log
    assert re.search(r"batch split for epoch 3: shares \d+:\d+ of 12 \((step times of epoch 1|kept)", log), log


def test_the_split_goes_on_from_one_model_train_call_to_the_next(tmp_path):
    # Model.train(1, ...) per epoch: the coordinator's rounds and the dataset's epochs go on; the second call does
    # not get the first call's split back (it is measured and kept, then decided from step times)
    outputs, log = _run(tmp_path, 2, "speed", "model,loop,shuffle")
    assert all(a + b == 12 for a, b in zip(*_shares(outputs)))
    assert re.search(r"batch split for epoch 1: shares \d+:\d+ of 12 \(device measurements", log), log
    assert re.search(r"batch split for epoch 2: shares \d+:\d+ of 12 \(kept from epoch 0", log), log
    # each call's last epoch is reported with the next call's first ask: the split adapts to measured step times
    assert re.search(r"batch split for epoch 3: shares \d+:\d+ of 12 \(step times of epoch 1", log), log
    # sunk, each call goes on with the last call's pipeline and daemon reader: each epoch still in its own order
    sunk = tmp_path / "sunk"
    sunk.mkdir()
    assert [s[0] for s in _shares(_run(sunk, 2, "1,2", "sink,loop,shuffle")[0])] == [4, 8]


@pytest.mark.parametrize(
    "flag, message",
    [
        ("custom", "with the train network OwnStep"),
        ("own", "loop of your own"),
        ("layerwise", "with layerwise_parallel parameters ['w1']"),
    ],
)
def test_a_train_step_of_ones_own_is_refused_on_every_rank(tmp_path, flag, message):
    outputs, _ = _run(tmp_path, 2, "1,2", f"model,{flag}")
    for rank, out in enumerate(outputs):
        assert f"split refused on rank {rank}: not supported yet: batch_split=" in out and message in out, out
