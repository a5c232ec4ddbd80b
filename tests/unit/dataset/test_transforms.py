"""Each transform against a numpy reference written from MindSpore's per-sample definition (float64 where it
matters), applied both eagerly to one sample and vectorized over a block of rows."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tessel.dataset as ds
from tessel.core.errors import ConfigurationError
from tessel.dataset.sampling import RowRandom
from tessel.dataset.transforms.base import resolve_dtype

RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, (6, 9, 7, 3), dtype=np.uint8)


def rowwise(transform, images: np.ndarray, key: int = 0) -> np.ndarray:
    """The transform vectorized over rows (how a pipeline calls it), rows numbered 0, 1, ..."""
    return transform.apply((images,), RowRandom(key, np.arange(len(images), dtype=np.uint64)))[0]


def test_rescale_matches_x_times_scale_plus_shift():
    out = rowwise(ds.vision.Rescale(1.0 / 255.0, -0.5), IMAGES)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, IMAGES.astype(np.float64) / 255.0 - 0.5, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(ds.vision.Rescale(1.0 / 255.0, -0.5)(IMAGES[2]), out[2])


@pytest.mark.parametrize("is_hwc", [True, False])
def test_normalize_per_channel(is_hwc: bool):
    mean, std = (10.0, 100.0, 200.0), (2.0, 50.0, 25.0)
    images = IMAGES if is_hwc else np.ascontiguousarray(IMAGES.transpose(0, 3, 1, 2))
    out = rowwise(ds.vision.Normalize(mean, std, is_hwc=is_hwc), images)
    shape = (1, 1, 1, 3) if is_hwc else (1, 3, 1, 1)
    expected = (images.astype(np.float64) - np.reshape(mean, shape)) / np.reshape(std, shape)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_normalize_does_not_touch_the_callers_array_but_reuses_pipeline_blocks():
    image = IMAGES[0].astype(np.float32)
    before = image.copy()
    ds.vision.Normalize((1.0,) * 3, (2.0,) * 3)(image)
    np.testing.assert_array_equal(image, before)
    block = IMAGES.astype(np.float32)
    out = rowwise(ds.vision.Normalize((1.0,) * 3, (2.0,) * 3), block)
    assert out is block  # the pipeline's own float32 block is reused, saving an allocation and a pass


def test_normalize_channel_count_and_rank_errors():
    # MindSpore copies one mean/std to every channel (image_utils.cc Normalize); two for three channels is an error
    one = rowwise(ds.vision.Normalize((0.5,), (2.0,)), IMAGES)
    np.testing.assert_allclose(one, (IMAGES.astype(np.float32) - 0.5) / 2.0)
    with pytest.raises(ConfigurationError, match="2 channel"):
        rowwise(ds.vision.Normalize((0.5, 0.5), (0.5, 0.5)), IMAGES)
    with pytest.raises(ConfigurationError, match=r"<H, W>, <..., H, W, C>.*rows of shape \(4,\)"):
        ds.vision.Normalize((0.5,), (0.5,))(np.zeros(4, np.uint8))
    with pytest.raises(ConfigurationError, match=r"std values in \(0, 255\]"):
        ds.vision.Normalize((0.5,), (0.0,))
    with pytest.raises(ConfigurationError, match=r"mean values must be in \[0, 255\]"):
        ds.vision.Normalize((-1.0,), (1.0,))


def test_normalize_takes_batched_images_as_mindspore():
    """MindSpore 2.7.0 normalizes <..., H, W, C> and (is_hwc=False) <..., C, H, W>: eagerly and after batch();
    np.arange images of shape (2, 4, 5, 3) give (0 - 121) / 70 = -1.7285714 first, as float64 here."""
    mean, std = [121.0, 115.0, 100.0], [70.0, 68.0, 71.0]
    images = np.arange(120, dtype=np.uint8).reshape(2, 4, 5, 3)
    expected = (images - np.float64(mean)) / np.float64(std)
    for batched, is_hwc in [(images, True), (images[None], True), (images.transpose(0, 3, 1, 2), False)]:
        out = ds.vision.Normalize(mean, std, is_hwc=is_hwc)(np.ascontiguousarray(batched))
        want = expected if is_hwc else expected.transpose(0, 3, 1, 2)
        assert out.dtype == np.float32 and out.shape == batched.shape
        np.testing.assert_allclose(out.reshape(want.shape), want, rtol=1e-6)
    data = ds.NumpySlicesDataset({"im": np.ones((4, 4, 5, 3), np.uint8)}, shuffle=False).batch(2)
    first = next(data.map(ds.vision.Normalize(mean, std), "im").create_tuple_iterator(output_numpy=True))[0]
    assert first.shape == (2, 4, 5, 3)
    np.testing.assert_allclose(first[0, 0, 0], (1 - np.float64(mean)) / np.float64(std), rtol=1e-6)
    with pytest.raises(ConfigurationError, match="3 channel"):  # MindSpore: channels 2, size of mean 3
        ds.vision.Normalize(mean, std)(np.ones((2, 4, 5, 2), np.uint8))
    with pytest.raises(ConfigurationError, match="<H, W> or <H, W, C>"):  # HWC2CHW stays per image in MindSpore
        ds.vision.HWC2CHW()(images)
    np.testing.assert_allclose(ds.vision.Rescale(0.5, 1.0)(images), images * 0.5 + 1.0)  # any rank, as MindSpore


def test_resize_truncates_the_long_side_as_mindspore_and_uint8_halves_up():
    # MindSpore 2.7.0's Resize(size) measured: the long side is (int)(long / short * size)
    for (h, w), size, want in [((375, 500), 224, (224, 298)), ((480, 640), 224, (224, 298)), ((2, 3), 3, (3, 4))]:
        assert ds.vision.Resize(size)(np.zeros((h, w, 3), np.uint8)).shape == (*want, 3)
    assert ds.vision.Resize(299)(np.zeros((640, 480), np.uint8)).shape == (398, 299)
    assert ds.vision.Resize(16)(np.zeros((13, 5), np.uint8)).shape == (41, 16)
    # a 2x downscale averages pixel pairs; OpenCV rounds .5 up (np.rint took 1.5 -> 2 but 2.5 -> 2)
    row = np.array([[1, 2, 4, 5]], np.uint8).repeat(2, 0)
    assert ds.vision.Resize((1, 2))(row).tolist() == [[2, 5]]


def test_hwc2chw_transposes_and_leaves_2d_images_alone():
    out = rowwise(ds.vision.HWC2CHW(), IMAGES)
    np.testing.assert_array_equal(out, IMAGES.transpose(0, 3, 1, 2))
    assert out.flags.c_contiguous
    gray = IMAGES[..., 0]
    np.testing.assert_array_equal(rowwise(ds.vision.HWC2CHW(), gray), gray)
    assert ds.vision.HWC2CHW()(IMAGES[0]).shape == (3, 9, 7)


def test_to_tensor_scales_to_unit_range_in_chw():
    out = rowwise(ds.vision.ToTensor(), IMAGES)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, IMAGES.transpose(0, 3, 1, 2) / 255.0, rtol=1e-6)
    assert ds.vision.ToTensor()(IMAGES[0, ..., 0]).shape == (1, 9, 7)


def resize_reference(image: np.ndarray, out_h: int, out_w: int, nearest: bool) -> np.ndarray:
    """Per-pixel OpenCV-style resize in float64: pixel centres aligned, borders clamped."""
    in_h, in_w = image.shape[:2]
    out = np.zeros((out_h, out_w, *image.shape[2:]))
    for i in range(out_h):
        for j in range(out_w):
            if nearest:
                out[i, j] = image[min(int(i * in_h / out_h), in_h - 1), min(int(j * in_w / out_w), in_w - 1)]
                continue
            y = min(max((i + 0.5) * in_h / out_h - 0.5, 0), in_h - 1)
            x = min(max((j + 0.5) * in_w / out_w - 0.5, 0), in_w - 1)
            y0, x0 = int(np.floor(y)), int(np.floor(x))
            y1, x1 = min(y0 + 1, in_h - 1), min(x0 + 1, in_w - 1)
            wy, wx = y - y0, x - x0
            top = image[y0, x0] * (1 - wx) + image[y0, x1] * wx
            bottom = image[y1, x0] * (1 - wx) + image[y1, x1] * wx
            out[i, j] = top * (1 - wy) + bottom * wy
    return out


@pytest.mark.parametrize(("size", "target"), [((5, 11), (5, 11)), ((18, 3), (18, 3)), (4, (5, 4))])
def test_resize_linear_matches_the_reference(size, target):
    images = IMAGES.astype(np.float32)
    out = rowwise(ds.vision.Resize(size), images)
    assert out.shape == (6, *target, 3) and out.dtype == np.float32
    for i in range(len(images)):
        np.testing.assert_allclose(out[i], resize_reference(images[i].astype(np.float64), *target, False), atol=1e-3)
    rounded = rowwise(ds.vision.Resize(size), IMAGES)
    assert rounded.dtype == np.uint8
    # OpenCV's 11-bit fixed point (MindSpore's uint8 path) lands within one level of the exact value
    assert np.abs(rounded.astype(np.float64) - out).max() < 1.0


def test_resize_of_uint8_images_is_mindsporess_bit_for_bit():
    """MindSpore 2.7.0's Resize output for these random images (its fixed-point INTER_LINEAR)."""
    rows = [[95, 130, 194, 217, 207], [235, 15, 163, 33, 215], [217, 130, 248, 189, 16], [69, 184, 232, 205, 78]]
    image = np.array([*rows, [169, 61, 125, 10, 29]], np.uint8)[..., None]
    want = [[113, 190, 203], [171, 195, 124], [137, 238, 103], [130, 138, 35]]
    assert ds.vision.Resize((4, 3))(image)[..., 0].tolist() == want
    rows = [[108, 85, 145, 180], [40, 94, 11, 59], [136, 189, 90, 196], [154, 68, 81, 13], [171, 183, 241, 145]]
    image = np.array([*rows, [153, 181, 144, 103]], np.uint8)
    want = [
        [108, 100, 86, 115, 147, 167, 180], [86, 87, 88, 95, 105, 127, 141], [49, 65, 90, 61, 32, 59, 75],
        [79, 98, 129, 88, 48, 89, 115], [132, 150, 181, 135, 94, 153, 190], [145, 139, 130, 107, 87, 98, 105],
        [155, 125, 79, 81, 83, 44, 19], [164, 154, 138, 156, 169, 121, 91], [168, 173, 182, 205, 221, 171, 139],
        [159, 167, 180, 178, 171, 137, 116], [153, 163, 179, 162, 141, 117, 103],
    ]  # fmt: skip
    assert ds.vision.Resize((11, 7))(image).tolist() == want
    stacked = np.stack([image, image[::-1]])  # a block of two rows resizes each as alone
    np.testing.assert_array_equal(rowwise(ds.vision.Resize((11, 7)), stacked)[0], want)


def test_resize_nearest_matches_the_reference():
    out = rowwise(ds.vision.Resize((13, 4), ds.vision.Inter.NEAREST), IMAGES)
    for i in range(len(IMAGES)):
        np.testing.assert_array_equal(out[i], resize_reference(IMAGES[i], 13, 4, True))


def windows(image: np.ndarray, height: int, width: int) -> list[np.ndarray]:
    return [
        image[t : t + height, left : left + width]
        for t in range(image.shape[0] - height + 1)
        for left in range(image.shape[1] - width + 1)
    ]


def test_random_crop_takes_a_random_window_per_row():
    images = RNG.integers(0, 256, (200, 9, 7, 3), dtype=np.uint8)
    out = rowwise(ds.vision.RandomCrop((4, 5)), images, key=1)
    assert out.shape == (200, 4, 5, 3)
    positions = set()
    for i in range(len(images)):
        matches = [k for k, w in enumerate(windows(images[i], 4, 5)) if np.array_equal(w, out[i])]
        assert matches, f"row {i} is not a 4x5 window of its image"
        positions.add(matches[0])
    assert len(positions) == 6 * 3  # every possible window position is drawn over 200 rows
    again = rowwise(ds.vision.RandomCrop((4, 5)), images, key=1)
    np.testing.assert_array_equal(out, again)  # the same stream gives the same crops


def test_random_crop_pads_with_the_fill_value():
    image = np.full((1, 2, 2, 3), 9, dtype=np.uint8)
    out = rowwise(ds.vision.RandomCrop(4, padding=1, fill_value=(1, 2, 3)), image)
    padded = np.pad(image[0], ((1, 1), (1, 1), (0, 0)))
    padded[0, :], padded[-1, :], padded[:, 0], padded[:, -1] = (1, 2, 3), (1, 2, 3), (1, 2, 3), (1, 2, 3)
    np.testing.assert_array_equal(out[0], padded)
    edge = rowwise(ds.vision.RandomCrop(3, pad_if_needed=True, padding_mode=ds.vision.Border.EDGE), image)
    assert edge.shape == (1, 3, 3, 3) and (edge == 9).all()
    # MindSpore's ImagePadding pads each side by the whole shortfall, then crops at random: the 2x2 image lands
    # anywhere in the 4x4 crop, not always in its middle
    many = rowwise(ds.vision.RandomCrop(4, pad_if_needed=True), np.repeat(image, 60, axis=0))
    corners = {tuple(np.argwhere(m[..., 0] == 9).min(0)) for m in many}
    assert corners == {(r, c) for r in range(3) for c in range(3)}
    with pytest.raises(ConfigurationError, match="at least 5x5"):
        rowwise(ds.vision.RandomCrop(5), image)


def test_random_horizontal_flip_mirrors_about_prob_of_the_rows():
    images = RNG.integers(0, 256, (2000, 3, 4), dtype=np.uint8)
    out = rowwise(ds.vision.RandomHorizontalFlip(0.5), images)
    flipped = np.array([np.array_equal(o, i[:, ::-1]) for o, i in zip(out, images)])
    kept = np.array([np.array_equal(o, i) for o, i in zip(out, images)])
    assert (flipped | kept).all() and 900 < flipped.sum() < 1100
    np.testing.assert_array_equal(rowwise(ds.vision.RandomHorizontalFlip(1.0), IMAGES), IMAGES[:, :, ::-1])
    np.testing.assert_array_equal(rowwise(ds.vision.RandomHorizontalFlip(0.0), IMAGES), IMAGES)


class MindSporeStyleDtype:
    """What `ms.int32` looks like from here: an object whose printed name is the type."""

    def __str__(self) -> str:
        return "Int32"


@pytest.mark.parametrize("data_type", [np.int32, np.dtype("int32"), "int32", "mindspore.int32", MindSporeStyleDtype()])
def test_type_cast_accepts_numpy_names_and_framework_dtypes(data_type):
    labels = np.array([1, 2, 300], dtype=np.uint32)
    out = rowwise(ds.transforms.TypeCast(data_type), labels)
    assert out.dtype == np.int32 and out.tolist() == [1, 2, 300]


def test_type_cast_accepts_the_sdk_dtype_enum():
    dtypes = pytest.importorskip("tessel.compiler.dtypes")
    assert resolve_dtype(dtypes.DType.float16, "test") == np.float16
    with pytest.raises(TypeError, match="cannot resolve data type 'bfloat16'"):
        ds.transforms.TypeCast("bfloat16")


def test_one_hot_matches_an_identity_matrix_lookup():
    labels = np.array([0, 3, 1, 3], dtype=np.int32)
    out = rowwise(ds.transforms.OneHot(4), labels)
    np.testing.assert_array_equal(out, np.eye(4, dtype=np.int32)[labels])
    smooth = rowwise(ds.transforms.OneHot(4, smoothing_rate=0.2), labels)
    np.testing.assert_allclose(smooth, np.eye(4)[labels] * 0.8 + 0.05, rtol=1e-15)
    assert smooth.dtype == np.float64  # MindSpore 2.7.0's OneHot(n, smoothing_rate > 0) gives float64
    with pytest.raises(ConfigurationError, match=r"labels in \[0, 3\]"):
        rowwise(ds.transforms.OneHot(4), np.array([4]))
    with pytest.raises(ConfigurationError, match="integer class labels"):
        rowwise(ds.transforms.OneHot(4), np.array([1.0]))


def test_compose_equals_applying_in_order():
    steps = [ds.vision.Rescale(1 / 255, 0), ds.vision.Normalize((0.5,) * 3, (0.25,) * 3), ds.vision.HWC2CHW()]
    expected = IMAGES
    for step in steps:
        expected = rowwise(step, expected)
    np.testing.assert_array_equal(rowwise(ds.transforms.Compose(steps), IMAGES), expected)
    np.testing.assert_array_equal(ds.transforms.Compose(steps)(IMAGES[3]), expected[3])


def test_seed_pipeline_batches_equal_the_numpy_computation(mnist_dir):
    folder, written = mnist_dir
    data = ds.MnistDataset(folder, usage="train", shuffle=False)
    data = data.map(
        [ds.vision.Rescale(1.0 / 255.0, 0), ds.vision.Normalize((0.1307,), (0.3081,)), ds.vision.HWC2CHW()], "image"
    )
    data = data.map(ds.transforms.TypeCast(np.int32), "label").batch(4)
    batches = list(data.create_tuple_iterator(output_numpy=True))
    images, labels = written["train"]
    expected = ((images.astype(np.float64) / 255.0 - 0.1307) / 0.3081)[:, None]
    assert [b[0].shape for b in batches] == [(4, 1, 28, 28), (4, 1, 28, 28), (2, 1, 28, 28)]
    np.testing.assert_allclose(np.concatenate([b[0] for b in batches]), expected, rtol=1e-5, atol=1e-6)
    assert np.concatenate([b[1] for b in batches]).dtype == np.int32
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), labels)


def test_iterators_yield_tensors_whatever_the_script_imported_first():
    # The hook that makes Tensors was set only once tessel.common.tensor had been imported (by `from tessel import
    # nn`, say): a data-only script got numpy arrays and `.asnumpy()` failed.
    script = (
        "import numpy as np, tessel as ms, tessel.dataset as ds\n"
        "d = ds.NumpySlicesDataset({'label': np.arange(3, dtype=np.int32)}, shuffle=False)\n"
        "row = next(d.create_dict_iterator())\n"
        "print(type(row['label']).__name__, row['label'].asnumpy())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["Tensor", "0"], out.stdout + out.stderr


def test_mindspore_names_tessel_lacks_say_not_supported_yet():
    from tessel.core.errors import NotSupportedYetError

    with pytest.raises(NotSupportedYetError, match=r"mindspore\.dataset\.transforms\.Duplicate"):
        ds.transforms.Duplicate()
    with pytest.raises(NotSupportedYetError, match=r"Resize\(interpolation=Inter\.CUBIC\)"):
        ds.vision.Resize(4, ds.vision.Inter.CUBIC)
    with pytest.raises(AttributeError):
        ds.transforms.NoSuchTransform  # noqa: B018 - not a MindSpore name: the usual AttributeError


def test_eager_random_transforms_follow_the_dataset_seed():
    """Each eager call draws anew; ds.config.set_seed restarts the sequence, as re-seeding MindSpore's does."""
    image = np.arange(8 * 8, dtype=np.uint8).reshape(8, 8, 1)
    crop = ds.vision.RandomCrop(3)

    def calls():
        return [crop(image).tobytes() for _ in range(12)]

    ds.config.set_seed(21)
    first = calls()
    assert len(set(first)) > 6  # the calls draw different windows
    ds.config.set_seed(21)
    assert calls() == first
    ds.config.set_seed(22)
    assert calls() != first


def test_random_crop_fills_a_one_channel_image_with_the_first_value():
    """MindSpore 2.7.0 pads a (H, W, 1) or (H, W) image given fill_value=(1, 2, 3) with 1."""
    for image in (np.full((3, 3, 1), 9, np.uint8), np.full((3, 3), 9, np.uint8)):
        out = ds.vision.RandomCrop(5, padding=1, fill_value=(1, 2, 3))(image).reshape(5, 5)
        assert (out[0] == 1).all() and (out[:, 0] == 1).all() and (out[1:4, 1:4] == 9).all()


def test_row_random_numbers_wrap_without_warnings():
    import warnings

    rng = RowRandom(2**64 - 1, np.array([0, 2**64 - 1], dtype=np.uint64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns when a uint64 scalar product wraps; none may be left
        draws = np.stack([rng.random() for _ in range(50)])
    assert ((draws >= 0) & (draws < 1)).all() and len(np.unique(draws)) == draws.size
