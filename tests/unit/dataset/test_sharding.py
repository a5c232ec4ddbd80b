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


def augmented_rows(shards: int, epochs: int = 2, batch: int = 4, layout: str = "map-repeat", source: str = "slices"):
    """{(epoch, row): [its images in order of appearance]} over all shards: each row's image is cropped and flipped
    at random, and its row number rides along in a column the transforms do not touch."""
    images = np.arange(40 * 6 * 5, dtype=np.uint8).reshape(40, 6, 5, 1)  # every image differs from every other
    augment = [ds.vision.RandomCrop(4, padding=1), ds.vision.RandomHorizontalFlip()]
    seen: dict[tuple[int, int], list[np.ndarray]] = {}
    for k in range(shards):
        sharding = {"num_shards": shards, "shard_id": k} if shards > 1 else {}
        if source == "slices":
            data = ds.NumpySlicesDataset({"image": images, "row": np.arange(40)}, **sharding)
        else:
            data = ds.GeneratorDataset(list(zip(images, np.arange(40))), ["image", "row"], **sharding)
        if layout == "map-repeat":
            data = data.map(augment, "image").repeat(2)
        elif layout == "repeat-map":
            data = data.repeat(2).map(augment, "image")
        elif layout == "concat":
            data = (data + data).map(augment, "image")
        else:  # zip: the rows side by side with a second reading of the same source
            other = data.rename(["image", "row"], ["image2", "row2"])
            data = ds.zip((data, other)).map(augment, "image").project(["image", "row"])
        iterator = data.batch(batch).create_tuple_iterator(num_epochs=epochs, output_numpy=True)
        for epoch in range(epochs):
            for image_batch, row_batch in iterator:
                for image, row in zip(image_batch, row_batch):
                    seen.setdefault((epoch, int(row)), []).append(image)
    return seen


@pytest.mark.parametrize("layout", ["map-repeat", "repeat-map", "concat", "zip"])
@pytest.mark.parametrize("source", ["slices", "generator"])
def test_random_transforms_give_each_row_what_one_device_gives_it(layout, source):
    """DESIGN's contract for augmentation: a row is cropped and flipped alike on one device and on any shard of N
    ranks, whatever the batch (so the block) it travels in."""
    ds.config.set_seed(11)
    single = augmented_rows(1, batch=8, layout=layout, source=source)
    for shards in (2, 4):
        sharded = augmented_rows(shards, layout=layout, source=source)
        assert sorted(sharded) == sorted(single) == [(e, r) for e in range(2) for r in range(40)]
        for key, images in single.items():
            assert len(sharded[key]) == len(images) == (1 if layout == "zip" else 2)  # repeat, concat: 2 instances
            # a row's two instances may sit on different shards, so they compare as a multiset
            assert sorted(i.tobytes() for i in sharded[key]) == sorted(i.tobytes() for i in images), key
    # ...and the augmentation is random: the instances of a row (another epoch, repetition or concat child) differ
    distinct = [len({image.tobytes() for e in range(2) for image in single[e, r]}) for r in range(40)]
    assert np.mean(distinct) > (1.5 if layout == "zip" else 3), distinct
    ds.config.set_seed(12)
    other_seed = augmented_rows(1, layout=layout, source=source)
    assert any(not np.array_equal(other_seed[key][0], single[key][0]) for key in single)


def test_random_transforms_draw_evenly():
    """The per-row streams are uniform: crops land on every offset about equally, flips follow prob."""
    images = np.zeros((6000, 8, 8, 1), dtype=np.uint8)
    images[:, 0, 0] = 255  # a marker at the top-left corner shows the crop offset and the flip
    data = ds.NumpySlicesDataset({"image": images}, shuffle=False)
    out = next(
        data.map([ds.vision.RandomCrop(6), ds.vision.RandomHorizontalFlip(0.25)])
        .batch(6000)
        .create_tuple_iterator(output_numpy=True)
    )[0]
    marker = np.argwhere(out[..., 0] == 255)  # rows whose crop kept the corner: offset (0, 0)
    assert abs(len(marker) / 6000 - 1 / 9) < 0.02  # 3 x 3 offsets
    flipped = marker[:, 2] == 5
    assert abs(flipped.mean() - 0.25) < 0.07


def test_a_buffered_shuffle_over_shards_says_it_is_per_shard(caplog, monkeypatch):
    from tessel.core import options

    monkeypatch.setattr(options, "_logged", set())
    rows(10).shuffle(4)
    assert not caplog.records  # one device: the buffer sees every row
    rows(10, num_shards=2, shard_id=0).map(lambda r: r).shuffle(4)
    assert "shuffles within each shard's buffer" in caplog.text and "shuffle=True" in caplog.text
