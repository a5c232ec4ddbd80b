"""full_batch and dataset_strategy: what each rank keeps of a global batch, checked by reassembling it."""

from __future__ import annotations

import numpy as np
import pytest

import tessel.dataset as ds
from tessel.core.errors import ConfigurationError

IMAGE = np.arange(8 * 4 * 6, dtype=np.float32).reshape(8, 4, 6)
LABEL = np.arange(8, dtype=np.int32)


def test_data_parallel_slices_reassemble_the_global_batch():
    slices = [ds.shard_batch((IMAGE, LABEL), "data_parallel", rank, 4) for rank in range(4)]
    assert isinstance(slices[0], tuple) and slices[0][0].shape == (2, 4, 6)
    np.testing.assert_array_equal(np.concatenate([s[0] for s in slices]), IMAGE)
    np.testing.assert_array_equal(np.concatenate([s[1] for s in slices]), LABEL)
    same = [ds.shard_batch((IMAGE, LABEL), ((4, 1, 1), (4,)), rank, 4) for rank in range(4)]
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(slices, same))


def test_full_batch_gives_every_rank_the_global_batch():
    for rank in range(3):
        image, label = ds.shard_batch([IMAGE, LABEL], "full_batch", rank, 3)
        np.testing.assert_array_equal(image, IMAGE)
        np.testing.assert_array_equal(label, LABEL)
    assert ds.shard_options(True, 2, 4) == {"num_shards": None, "shard_id": None}
    assert ds.shard_options(False, 2, 4) == {"num_shards": 4, "shard_id": 2}


def test_strategy_slices_any_dims_and_keeps_the_container():
    pieces = {rank: ds.shard_batch({"image": IMAGE, "label": LABEL}, ((1, 2, 3), (1,)), rank, 6) for rank in range(6)}
    assert set(pieces[0]) == {"image", "label"} and pieces[0]["image"].shape == (8, 2, 2)
    grid = [[pieces[i * 3 + j]["image"] for j in range(3)] for i in range(2)]
    np.testing.assert_array_equal(np.concatenate([np.concatenate(row, axis=2) for row in grid], axis=1), IMAGE)
    assert all(np.array_equal(p["label"], LABEL) for p in pieces.values())


def test_repeated_slices_follow_the_device_matrix_convention():
    # 4 devices, strategy splits dim 1 in 2: two copies of each slice. MindSpore's default puts the repeat on the left
    # of the device matrix (ranks 0,1 hold slices 0,1; ranks 2,3 repeat them); repeat_dim_right puts it on the right.
    halves = np.split(IMAGE, 2, axis=1)
    left = [ds.shard_batch((IMAGE,), ((1, 2, 1),), rank, 4)[0] for rank in range(4)]
    right = [ds.shard_batch((IMAGE,), ((1, 2, 1),), rank, 4, repeat_dim_right=True)[0] for rank in range(4)]
    assert [next(i for i, h in enumerate(halves) if np.array_equal(h, x)) for x in left] == [0, 1, 0, 1]
    assert [next(i for i, h in enumerate(halves) if np.array_equal(h, x)) for x in right] == [0, 0, 1, 1]


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        (((1, 1, 4), (1,)), "dim 2 of size 6 is not divisible by 4"),
        (((2, 1), (1,)), "one per dim"),
        (((1, 1, 1),), "one tuple per input"),
        (((1, 3, 1), (1,)), "divide device_num=4"),
        ("model_parallel", "is not 'full_batch', 'data_parallel'"),
    ],
)
def test_bad_strategies_are_clear_errors(strategy, message):
    with pytest.raises(ConfigurationError, match=message):
        ds.shard_batch((IMAGE, LABEL), strategy, 0, 4)


def test_sharded_reading_and_global_batch_slicing_cover_the_same_rows():
    data = {"image": np.arange(24).reshape(12, 2), "label": np.arange(12)}
    global_batches = list(ds.NumpySlicesDataset(data, shuffle=False).batch(6).create_tuple_iterator(output_numpy=True))
    per_rank = [
        list(ds.NumpySlicesDataset(data, shuffle=False, **ds.shard_options(False, rank, 3)).batch(2))
        for rank in range(3)
    ]
    for step, (image, label) in enumerate(global_batches):
        read = sorted(int(v) for rank in range(3) for v in per_rank[rank][step][1])
        sliced = sorted(
            int(v) for rank in range(3) for v in ds.shard_batch((image, label), "data_parallel", rank, 3)[1]
        )
        assert read == sliced == sorted(label.tolist())
