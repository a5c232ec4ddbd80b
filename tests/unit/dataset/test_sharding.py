"""MindSpore's shard rule, and the property data parallelism relies on: N shards of an epoch partition one global
order, so the N rank batches of step s together are batch s of one device with an N-times larger batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tessel.dataset as ds
from tessel.core.errors import ConfigurationError


def labels_of(dataset: ds.Dataset, epochs: int = 1) -> list[list[int]]:
    """Per epoch, the 'row' values the dataset yields (flattened over batches)."""
    iterator = dataset.create_tuple_iterator(num_epochs=epochs, output_numpy=True)
    return [[int(v) for (batch,) in iterator for v in np.atleast_1d(batch)] for _ in range(epochs)]


def rows(n: int, **kwargs) -> ds.Dataset:
    return ds.NumpySlicesDataset({"row": np.arange(n)}, **kwargs)


def test_mindspore_example_ten_rows_three_shards(mnist_dir):
    expected = [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]  # measured on MindSpore 2.10
    for shard, want in enumerate(expected):
        assert labels_of(rows(10, shuffle=False, num_shards=3, shard_id=shard)) == [want]
    folder, written = mnist_dir
    train_labels = written["train"][1]
    for shard, want in enumerate(expected):
        data = ds.MnistDataset(folder, usage="train", shuffle=False, num_shards=3, shard_id=shard).project("label")
        assert labels_of(data) == [train_labels[want].tolist()]


def test_batch_three_of_four_rows_keeps_or_drops_the_remainder():
    assert [len(b) for b in labels_of(rows(4, shuffle=False).batch(3))[0:1]] == [4]
    batches = list(rows(4, shuffle=False).batch(3).create_tuple_iterator(output_numpy=True))
    assert [b[0].tolist() for b in batches] == [[0, 1, 2], [3]]
    assert [b[0].tolist() for b in rows(4, shuffle=False).batch(3, drop_remainder=True)] == [[0, 1, 2]]
    assert rows(4).batch(3).get_dataset_size() == 2 and rows(4).batch(3, True).get_dataset_size() == 1


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 70),
    shards=st.integers(1, 6),
    batch=st.integers(1, 5),
    shuffle=st.booleans(),
    drop=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_rank_batches_of_a_step_are_the_single_device_batch(n, shards, batch, shuffle, drop, seed):
    ds.config.set_seed(seed)
    per_rank = [
        list(rows(n, shuffle=shuffle, num_shards=shards, shard_id=k).batch(batch, drop).create_tuple_iterator())
        for k in range(shards)
    ]
    # The single-device reference: one global order (seed, epoch 0), padded by wrapping round like the shards.
    single = labels_of(rows(n, shuffle=shuffle))[0]
    per_shard = -(-n // shards)
    padded = [single[i % n] for i in range(per_shard * shards)]
    steps = per_shard // batch if drop else -(-per_shard // batch)
    assert all(len(r) == steps for r in per_rank)
    sizes = {rows(n, num_shards=shards, shard_id=k).batch(batch, drop).get_dataset_size() for k in range(shards)}
    assert sizes == {steps}
    for step in range(steps):
        union = sorted(int(v) for r in per_rank for v in r[step][0])
        width = min(batch, per_shard - step * batch)
        assert union == sorted(padded[batch * shards * step : batch * shards * step + width * shards])
    covered = {int(v) for r in per_rank for b in r for v in b[0]}
    if not drop:
        assert covered == set(range(n))  # every row is read by some rank
    if n % shards == 0 and not drop:
        assert sum(len(b[0]) for r in per_rank for b in r) == n  # and exactly once when N divides n


def test_shuffle_order_is_a_function_of_seed_and_epoch():
    ds.config.set_seed(7)
    first = labels_of(rows(50), epochs=3)
    again = labels_of(rows(50), epochs=3)
    assert first == again  # a fresh pipeline (another rank, another process) sees the same orders
    assert len({tuple(e) for e in first}) == 3  # every epoch has its own order
    assert all(sorted(e) == list(range(50)) for e in first)
    ds.config.set_seed(8)
    assert labels_of(rows(50), epochs=1)[0] != first[0]


def test_shards_of_a_shuffled_epoch_stay_disjoint_in_every_epoch():
    shards = [labels_of(rows(60, num_shards=4, shard_id=k), epochs=3) for k in range(4)]
    for epoch in range(3):
        union = [v for k in range(4) for v in shards[k][epoch]]
        assert sorted(union) == list(range(60))
    assert shards[0][0] != shards[0][1]


def test_num_samples_caps_each_shard():
    assert labels_of(rows(10, shuffle=False, num_samples=3)) == [[0, 1, 2]]
    assert labels_of(rows(10, shuffle=False, num_samples=2, num_shards=3, shard_id=1)) == [[1, 4]]
    assert rows(10, num_samples=2, num_shards=3, shard_id=1).get_dataset_size() == 2


def test_random_access_generator_shards_like_every_source():
    source = [np.int64(i) for i in range(10)]
    for shard, want in enumerate([[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]):
        data = ds.GeneratorDataset(source, ["row"], shuffle=False, num_shards=3, shard_id=shard)
        assert labels_of(data) == [want]
    ds.config.set_seed(3)
    generated = [labels_of(ds.GeneratorDataset(source, ["row"], num_shards=2, shard_id=k))[0] for k in range(2)]
    sliced = [labels_of(rows(10, num_shards=2, shard_id=k))[0] for k in range(2)]
    assert generated == sliced


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_shards": 3, "shard_id": 3}, r"shard_id=3 is not in \[0, num_shards-1\] = \[0, 2\]"),
        ({"num_shards": 2, "shard_id": -1}, "shard_id=-1 is not in"),
        ({"num_shards": 2}, "num_shards was given without shard_id"),
        ({"shard_id": 0}, "shard_id was given without num_shards"),
        ({"num_shards": 0, "shard_id": 0}, "num_shards must be >= 1"),
        ({"num_shards": 2.0, "shard_id": 0}, "num_shards must be an int"),
        ({"num_samples": -1}, "num_samples must be >= 0"),
    ],
)
def test_bad_shard_arguments_are_clear_errors(mnist_dir, kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        rows(10, **kwargs)
    with pytest.raises(ConfigurationError, match=message) as error:
        ds.MnistDataset(mnist_dir[0], **kwargs)
    assert "MnistDataset" in str(error.value)
