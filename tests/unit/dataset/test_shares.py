"""Uneven shards for speed-aware data parallelism (tessel.dataset.sampling.share_rows, parallel.with_shares): each
rank takes its share of every global batch, the ranks' step-j batches together are the one device's step-j batch,
equal shares are MindSpore's rule exactly, everything is a function of (seed, epoch, shares)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.dataset import NumpySlicesDataset
from tessel.dataset.parallel import with_shares
from tessel.dataset.sampling import ShardShares, shard_rows, share_rows, share_windows, window_owners
from tessel.dataset.spec import from_spec


@pytest.mark.parametrize("shares", [(1, 2), (1, 1, 3), (5, 3), (4, 4, 4)])
def test_every_shard_owns_its_share_of_a_global_batch_and_equal_shares_are_mindsporess_interleave(shares):
    owners = window_owners(shares)
    assert [int(np.sum(owners == k)) for k in range(len(shares))] == list(shares)
    if len(set(shares)) == 1:
        assert owners.tolist() == [p % len(shares) for p in range(sum(shares))]


@pytest.mark.parametrize("shares", [(1, 2), (1, 1, 3), (3, 5)])
@pytest.mark.parametrize("num_rows", [48, 50, 7])
def test_the_shards_step_j_batches_are_global_batch_j_of_the_epoch_permutation(shares, num_rows):
    split = ShardShares(shares)
    batch, windows = split.global_batch, share_windows(num_rows, split)
    rows = [share_rows(num_rows, split, k, True, 11, 3).reshape(windows, share) for k, share in enumerate(shares)]
    one_device = shard_rows(num_rows, None, None, True, 11, 3)
    for j in range(windows):
        together = np.sort(np.concatenate([r[j] for r in rows]))
        positions = np.arange(j * batch, (j + 1) * batch) % num_rows  # the last window wraps like MindSpore's rule
        assert together.tolist() == np.sort(one_device[positions]).tolist()
    # A function of (seed, epoch, shares): the same again, another epoch another order.
    assert np.array_equal(share_rows(num_rows, split, 0, True, 11, 3), rows[0].reshape(-1))
    assert not np.array_equal(share_rows(num_rows, split, 0, True, 11, 4), rows[0].reshape(-1)) or num_rows < 8


def test_every_shard_has_the_even_rules_number_of_batches():
    for num_rows, world, batch in [(100, 2, 8), (101, 3, 5), (64, 2, 32)]:
        even_batches = math.ceil(math.ceil(num_rows / world) / batch)
        for drop in (False, True):
            split = ShardShares((batch - 1, batch + 1) if world == 2 else (batch - 2, batch, batch + 2), drop)
            full = (world * -(-num_rows // world)) // (world * batch)
            assert share_windows(num_rows, split) == (full if drop else even_batches)


def _batches(dataset) -> list[np.ndarray]:
    return [b[0] for b in dataset.create_tuple_iterator(output_numpy=True, num_epochs=1)]


def test_with_shares_rewrites_the_pipeline_and_its_spec_reads_the_same_batches():
    data = {"x": np.arange(96, dtype=np.int64), "y": np.arange(96, dtype=np.int64) * 10}
    shares = (16, 32)
    ranks = []
    for rank in range(2):
        source = NumpySlicesDataset(data, shuffle=True, num_shards=2, shard_id=rank).map(lambda v: v, ["y"])
        pipeline = with_shares(source.project(["x"]).batch(24), shares, rank)
        ranks.append(_batches(pipeline))
        assert [len(b) for b in ranks[-1]] == [shares[rank]] * 2 and pipeline.get_dataset_size() == 2
    one = _batches(NumpySlicesDataset(data, shuffle=True).project(["x"]).batch(48))
    for step in range(2):
        assert sorted(np.concatenate([ranks[0][step], ranks[1][step]]).tolist()) == sorted(one[step].tolist())
    declarative = with_shares(NumpySlicesDataset(data, shuffle=True, num_shards=2, shard_id=1).batch(24), shares, 1)
    rebuilt = from_spec(declarative.to_spec().SerializeToString())
    assert [b.tolist() for b in _batches(rebuilt)] == [b.tolist() for b in _batches(declarative)]


def test_equal_shares_leave_the_pipeline_as_it_is():
    pipeline = NumpySlicesDataset({"x": np.arange(10)}, num_shards=2, shard_id=0).batch(3)
    assert with_shares(pipeline, (3, 3), 0) is pipeline


def test_pipelines_that_cannot_follow_shares_say_why():
    data = {"x": np.arange(40)}
    sharded = NumpySlicesDataset(data, num_shards=2, shard_id=0)
    with pytest.raises(NotSupportedYetError, match=r"not supported yet: batch_split with TakeDataset between"):
        with_shares(sharded.take(20).batch(4), (3, 5), 0)
    with pytest.raises(NotSupportedYetError, match="with a pipeline with 0 batch ops"):
        with_shares(sharded, (3, 5), 0)
    with pytest.raises(ConfigurationError, match=r"must be sharded over the 2 ranks.*num_shards=get_group_size"):
        with_shares(NumpySlicesDataset(data).batch(4), (3, 5), 0)
    with pytest.raises(ConfigurationError, match=r"add up to 9, not the global batch 4 x 2 ranks = 8"):
        with_shares(sharded.batch(4), (3, 6), 0)
