"""SEMI_AUTO_PARALLEL through the SDK on real daemons (`tessel run -n N`): a Megatron MLP written with
Primitive.shard(), and the semi-auto tutorial's SemiAutoParallelNet, trained by Model.train equal 1-rank training on
the global batch (float64 numpy reference, checked on every rank by scripts/semi_train.py and scripts/semi_seed.py)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "semi_train.py"
SEED_SCRIPT = ROOT / "tests" / "integration" / "scripts" / "semi_seed.py"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("data_import", ["full_batch", "data_parallel"])
def test_megatron_mlp_trains_like_one_rank_with_either_data_import(tmp_path, n, data_import):
    """full_batch: every rank reads the global batch (the labels, which the loss reads data parallel, are sent as
    each rank's rows); data_parallel (full_batch=False, the default): each rank's dataset is sharded with
    num_shards/shard_id and the engine traces the step at the global shape."""
    result = run_tessel(["run", "-n", str(n), str(SCRIPT), data_import], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check_ranks(tmp_path, n, rf"semi {data_import} ok on rank {{rank}} of {{n}}: loss error (\S+)")


def test_full_batch_in_sink_mode_keeps_only_the_rows_the_plan_reads(tmp_path):
    """full_batch with dataset_sink_mode=True: the daemon reads the whole global batch and stores of the labels only
    this rank's rows (the NextBatch slices; scripts/semi_train.py checks them), training as one rank does."""
    result = run_tessel(["run", "-n", "2", str(SCRIPT), "full_batch_sink"], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check_ranks(tmp_path, 2, r"semi full_batch_sink ok on rank {rank} of {n}: loss error (\S+)")


def check_ranks(tmp_path, n: int, pattern: str) -> None:
    """Every rank printed `pattern` (formatted with rank and n) with a loss error of at most 1e-5."""
    for rank in range(n):
        out = rank_log(tmp_path, rank).read_text()
        found = re.search(pattern.format(rank=rank, n=n), out)
        assert found and float(found.group(1)) <= 1e-5, out


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("variant", ["unconfigured", "reschedule"])
def test_the_seeds_semi_auto_parallel_net_trains_like_one_device(tmp_path, n, variant):
    """The tutorial's SemiAutoParallelNet: fc ((1, 1), (1, 2)) then an unconfigured MatMul (data parallel), or
    then fc2 ((N, 1), (1, 1)) (a redistribution between them), through Model.train with full_batch=False."""
    result = run_tessel(["run", "-n", str(n), str(SEED_SCRIPT), variant], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check_ranks(tmp_path, n, rf"semi seed {variant} ok on rank {{rank}} of {{n}}: loss error (\S+)")
