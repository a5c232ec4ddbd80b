"""vision.SlicePatches against MindSpore 2.7's behaviour (values below were measured with MindSpore 2.7.0 on CPU) and
against an independent numpy reference; its use in the dataset_slice sample (map to img0..img3, project one patch
per rank, batch) and its round trip through a sink-mode DatasetSpec."""

from __future__ import annotations

import numpy as np
import pytest

import tessel.dataset as ds
from tessel.core.errors import ConfigurationError
from tessel.dataset.sampling import RowRandom
from tessel.dataset.vision import SliceMode, SlicePatches


def reference(image: np.ndarray, num_h: int, num_w: int, pad: bool, fill: int) -> list[np.ndarray]:
    """Patches row by row; PAD pads bottom/right to multiples, DROP cuts the remainder (written from the docs)."""
    height, width = image.shape[:2]
    if pad:
        ph, pw = -(-height // num_h), -(-width // num_w)
        padded = np.full((ph * num_h, pw * num_w, *image.shape[2:]), fill, image.dtype)
        padded[:height, :width] = image
        image = padded
    else:
        ph, pw = height // num_h, width // num_w
    return [image[i * ph : (i + 1) * ph, j * pw : (j + 1) * pw] for i in range(num_h) for j in range(num_w)]


IMAGE = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)


@pytest.mark.parametrize("mode", [SliceMode.PAD, SliceMode.DROP])
@pytest.mark.parametrize("grid", [(2, 3), (5, 1), (1, 7), (3, 2)])
def test_patches_match_the_reference_eagerly_and_over_rows(mode, grid):
    op = SlicePatches(*grid, slice_mode=mode, fill_value=9)
    want = reference(IMAGE, *grid, pad=mode is SliceMode.PAD, fill=9)
    got = op(IMAGE)
    assert isinstance(got, tuple) and len(got) == grid[0] * grid[1]
    for g, w in zip(got, want):
        assert g.dtype == np.uint8
        np.testing.assert_array_equal(g, w)
    second = reference(IMAGE + 1, *grid, pad=mode is SliceMode.PAD, fill=9)
    for g, w, w2 in zip(
        op.apply((np.stack([IMAGE, IMAGE + 1]),), RowRandom(0, np.arange(2, dtype=np.uint64))), want, second
    ):
        np.testing.assert_array_equal(g, np.stack([w, w2]))


def test_values_measured_on_mindspore():
    # MindSpore 2.7.0, CPU: SlicePatches(2, 3) on arange(105).reshape(5, 7, 3), uint8.
    patches = SlicePatches(2, 3)(IMAGE)
    assert [p.shape for p in patches] == [(3, 3, 3)] * 6
    np.testing.assert_array_equal(patches[5][..., 0], [[81, 0, 0], [102, 0, 0], [0, 0, 0]])
    drop = SlicePatches(2, 3, SliceMode.DROP)(IMAGE)
    assert [p.shape for p in drop] == [(2, 2, 3)] * 6
    np.testing.assert_array_equal(drop[4][..., 0], [[48, 51], [69, 72]])
    np.testing.assert_array_equal(
        SlicePatches(2, 3, fill_value=9)(IMAGE)[5][..., 0], [[81, 9, 9], [102, 9, 9], [9] * 3]
    )
    # <H, W> images, other dtypes: fill_value saturates into int8, bool comes back as uint8.
    np.testing.assert_array_equal(
        SlicePatches(2, 2, fill_value=200)(np.arange(9, dtype=np.int8).reshape(3, 3))[3], [[8, 127], [127, 127]]
    )
    np.testing.assert_array_equal(
        SlicePatches(2, 2, fill_value=7)(np.arange(9, dtype=np.float64).reshape(3, 3))[3], [[8.0, 7.0], [7.0, 7.0]]
    )
    assert SlicePatches(2, 2)(np.zeros((4, 4), bool))[0].dtype == np.uint8


def test_chw_image_is_read_as_hwc_like_mindspore():
    # The dataset_slice sample maps SlicePatches(1, 4) over (1, 28, 28) CHW images: H=1, W=28, C=28 -> (1, 7, 28).
    image = np.arange(28 * 28, dtype=np.float32).reshape(1, 28, 28)
    patches = SlicePatches(1, 4)(image)
    assert [p.shape for p in patches] == [(1, 7, 28)] * 4
    for k, patch in enumerate(patches):
        np.testing.assert_array_equal(patch[0], image[0, 7 * k : 7 * k + 7])


def test_one_by_one_returns_the_image_unchanged():
    image = np.zeros((2, 2, 2, 2), np.float32)  # even rank 4 passes through, as MindSpore
    out = SlicePatches()(image)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, image)


@pytest.mark.parametrize(
    ("image", "op", "match"),
    [
        (np.zeros((5,), np.float32), SlicePatches(), "rank 2 or more"),
        (np.zeros((2, 2, 2, 2), np.float32), SlicePatches(2, 2), "<H, W> or <H, W, C>"),
        (np.zeros((4, 2), np.float32), SlicePatches(1, 3), "num_width=3"),
        (np.zeros((2, 4), np.float32), SlicePatches(3, 1), "num_height=3"),
        (np.zeros((4, 4), np.int64), SlicePatches(2, 2), "dtype"),
        (np.zeros((4, 4, 600), np.float32), SlicePatches(2, 2), "512 channels"),
    ],
)
def test_bad_images_are_clear_errors(image, op, match):
    with pytest.raises(ConfigurationError, match=match):
        op(image)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_height": 0}, ConfigurationError),
        ({"num_width": 1.5}, TypeError),
        ({"num_height": True}, TypeError),
        ({"fill_value": 256}, ConfigurationError),
        ({"fill_value": -1}, ConfigurationError),
        ({"slice_mode": 3}, TypeError),
        ({"slice_mode": "sideways"}, ConfigurationError),
    ],
)
def test_bad_arguments_are_errors_at_construction(kwargs, error):
    with pytest.raises(error):
        SlicePatches(**kwargs)


def sample_pipeline(rank: int) -> ds.Dataset:
    """dataset_slice/train.py's pipeline on 8 small CHW images: SlicePatches(1, 4), project rank % 4, batch."""
    images = np.arange(8 * 28 * 28, dtype=np.float32).reshape(8, 1, 28, 28)
    data = ds.NumpySlicesDataset({"image": images, "label": np.arange(8, dtype=np.int32)}, shuffle=False)
    columns = [f"img{k}" for k in range(4)]
    data = data.map(operations=SlicePatches(1, 4), input_columns="image", output_columns=columns)
    assert data.get_col_names() == [*columns, "label"]
    return data.project([columns[rank % 4], "label"]).batch(4)


def test_sample_pipeline_gives_each_rank_its_patch_and_survives_the_spec_round_trip():
    images = np.arange(8 * 28 * 28, dtype=np.float32).reshape(8, 1, 28, 28)
    for rank in (1, 6):
        data = sample_pipeline(rank)
        assert data.get_col_names() == [f"img{rank % 4}", "label"]
        batches = list(data.create_tuple_iterator(output_numpy=True))
        assert [b[0].shape for b in batches] == [(4, 1, 7, 28)] * 2
        k = rank % 4
        np.testing.assert_array_equal(batches[1][0][:, 0], images[4:, 0, 7 * k : 7 * k + 7])
        assert data.is_serializable()
        rebuilt = ds.from_spec(data.to_spec().SerializeToString())
        for got, want in zip(rebuilt.create_tuple_iterator(output_numpy=True), batches):
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)


def test_missing_output_columns_is_a_clear_error():
    data = ds.NumpySlicesDataset({"image": np.zeros((2, 4, 4), np.float32)}, shuffle=False)
    with pytest.raises(ConfigurationError, match="return 4 column"):
        list(data.map(SlicePatches(2, 2), input_columns="image").create_tuple_iterator(output_numpy=True))
