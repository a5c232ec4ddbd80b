"""IDX and CIFAR-10 readers against hand-written bytes, plus the MNIST source built on them."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from dataset_testkit import write_mnist

import tessel.dataset as ds
from tessel.core.errors import ConfigurationError
from tessel.dataset.formats import read_cifar10_batch, read_idx, write_idx


def idx_bytes(type_code: int, shape: tuple[int, ...], body: bytes) -> bytes:
    return bytes([0, 0, type_code, len(shape)]) + struct.pack(f">{len(shape)}I", *shape) + body


def test_reads_hand_written_ubyte_images(tmp_path: Path):
    path = tmp_path / "images-idx3-ubyte"
    path.write_bytes(idx_bytes(0x08, (2, 3, 4), bytes(range(24))))
    array = read_idx(path)
    assert array.dtype == np.uint8 and array.shape == (2, 3, 4)
    assert array[1, 2, 3] == 23 and array[0, 1, 0] == 4


def test_reads_big_endian_int32_and_float32(tmp_path: Path):
    (tmp_path / "ints").write_bytes(idx_bytes(0x0C, (3,), struct.pack(">iii", -1, 2, 70000)))
    (tmp_path / "floats").write_bytes(idx_bytes(0x0D, (2,), struct.pack(">ff", 1.5, -0.25)))
    ints, floats = read_idx(tmp_path / "ints"), read_idx(tmp_path / "floats")
    assert ints.dtype == np.int32 and ints.tolist() == [-1, 2, 70000]
    assert floats.dtype == np.float32 and floats.tolist() == [1.5, -0.25]


def test_gzip_is_detected_by_content(tmp_path: Path):
    raw = idx_bytes(0x08, (5,), bytes([9, 8, 7, 6, 5]))
    (tmp_path / "labels.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "no-suffix").write_bytes(gzip.compress(raw))
    assert read_idx(tmp_path / "labels.gz").tolist() == [9, 8, 7, 6, 5]
    assert read_idx(tmp_path / "no-suffix").tolist() == [9, 8, 7, 6, 5]


def test_write_idx_produces_the_standard_bytes(tmp_path: Path):
    write_idx(tmp_path / "x", np.arange(6, dtype=np.uint8).reshape(2, 3))
    assert (tmp_path / "x").read_bytes() == idx_bytes(0x08, (2, 3), bytes(range(6)))
    write_idx(tmp_path / "y.gz", np.array([1, -2], dtype=np.int32), compress=True)
    assert gzip.decompress((tmp_path / "y.gz").read_bytes()) == idx_bytes(0x0C, (2,), struct.pack(">ii", 1, -2))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x01\x02\x08\x01" + struct.pack(">I", 1) + b"\x00", "not an IDX file"),
        (b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"\x00", "not an IDX file"),
        (b"\x00\x00\x08", "not an IDX file"),
        (b"\x00\x00\x08\x03\x00\x00", "truncated IDX header"),
        (idx_bytes(0x08, (2, 3, 4), bytes(20)), r"truncated: shape \(2, 3, 4\) of uint8 needs 24 bytes .* found 20"),
        (idx_bytes(0x08, (2,), bytes(3)), "has trailing bytes"),
    ],
)
def test_corrupt_idx_files_name_the_file_and_the_problem(tmp_path: Path, raw: bytes, message: str):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(raw)
    with pytest.raises(ConfigurationError, match=message) as error:
        read_idx(path)
    assert str(path) in str(error.value) and "make_digits" in str(error.value)


def test_truncated_gzip_is_a_clear_error(tmp_path: Path):
    packed = gzip.compress(idx_bytes(0x08, (100,), bytes(100)))
    (tmp_path / "x.gz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ConfigurationError, match="gzip stream is corrupt or truncated"):
        read_idx(tmp_path / "x.gz")


def test_cifar10_records_become_hwc_images(tmp_path: Path):
    rng = np.random.default_rng(0)
    planes = rng.integers(0, 256, (2, 3, 1024), dtype=np.uint8)  # two records: R, G, B planes of 32x32
    labels = [3, 9]
    (tmp_path / "data_batch_1.bin").write_bytes(b"".join(bytes([labels[i]]) + planes[i].tobytes() for i in range(2)))
    images, read_labels = read_cifar10_batch(tmp_path / "data_batch_1.bin")
    assert images.shape == (2, 32, 32, 3) and images.dtype == np.uint8 and read_labels.dtype == np.uint32
    assert read_labels.tolist() == labels
    assert images[1, 5, 7, 2] == planes[1, 2, 5 * 32 + 7]
    (tmp_path / "bad.bin").write_bytes(bytes(3000))
    with pytest.raises(ConfigurationError, match="records of 3073 bytes"):
        read_cifar10_batch(tmp_path / "bad.bin")


def test_cifar10_dataset_reads_train_and_test(tmp_path: Path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    from tessel.dataset.formats import write_cifar10_batch

    write_cifar10_batch(tmp_path / "data_batch_1.bin", images[:3], [0, 1, 2])
    write_cifar10_batch(tmp_path / "test_batch.bin", images[3:], [8, 9])
    rows = list(ds.Cifar10Dataset(tmp_path, shuffle=False).create_tuple_iterator(output_numpy=True))
    assert [int(label) for _, label in rows] == [0, 1, 2, 8, 9]
    np.testing.assert_array_equal(np.stack([image for image, _ in rows]), images)
    assert ds.Cifar10Dataset(tmp_path, usage="test").get_dataset_size() == 2


def test_mnist_rows_equal_the_files(mnist_dir):
    folder, written = mnist_dir
    data = ds.MnistDataset(folder, usage="train", shuffle=False)
    assert data.get_col_names() == ["image", "label"]
    rows = list(data.create_tuple_iterator(output_numpy=True))
    images, labels = written["train"]
    assert rows[0][0].shape == (28, 28, 1) and rows[0][0].dtype == np.uint8
    assert rows[0][1].shape == () and rows[0][1].dtype == np.uint32
    np.testing.assert_array_equal(np.stack([r[0][..., 0] for r in rows]), images)
    np.testing.assert_array_equal([int(r[1]) for r in rows], labels)


def test_mnist_usage_all_reads_train_then_test(mnist_dir):
    folder, written = mnist_dir
    labels = [int(r[1]) for r in ds.MnistDataset(folder, shuffle=False).create_tuple_iterator(output_numpy=True)]
    assert labels == written["train"][1].tolist() + written["t10k"][1].tolist()
    assert ds.MnistDataset(folder, usage="test").get_dataset_size() == 4


def test_mnist_reads_gz_and_dotted_names(tmp_path: Path):
    written = write_mnist(tmp_path / "gz", train=6, compress=True)
    data = ds.MnistDataset(tmp_path / "gz", usage="train", shuffle=False)
    assert [int(r[1]) for r in data.create_tuple_iterator(output_numpy=True)] == written["train"][1].tolist()
    dotted = tmp_path / "dotted"
    dotted.mkdir()
    write_idx(dotted / "train-images.idx3-ubyte", written["train"][0])
    write_idx(dotted / "train-labels.idx1-ubyte", written["train"][1])
    assert ds.MnistDataset(dotted, usage="train").get_dataset_size() == 6


def test_mnist_cache_is_an_arrow_file_keyed_by_the_source(mnist_dir, private_cache: Path):
    folder, written = mnist_dir
    first = [int(r[1]) for r in ds.MnistDataset(folder, usage="train", shuffle=False).create_tuple_iterator()]
    cached = sorted(private_cache.glob("mnist-*.arrow"))
    assert len(cached) == 1
    replaced = write_mnist(folder, train=7, seed=5)  # a changed source (size and mtime) gets a new cache file
    os.utime(folder / "train-labels-idx1-ubyte", ns=(1, 1))
    again = [int(r[1]) for r in ds.MnistDataset(folder, usage="train", shuffle=False).create_tuple_iterator()]
    assert first == written["train"][1].tolist() and again == replaced["train"][1].tolist()
    assert len(sorted(private_cache.glob("mnist-*.arrow"))) == 2


def test_digits_generator_writes_mnist_that_the_loader_reads(tmp_path: Path):
    from tessel.dataset.digits import write_mnist_digits

    write_mnist_digits(tmp_path / "a", train=200, test=50, seed=3)
    write_mnist_digits(tmp_path / "b", train=200, test=50, seed=3, compress=True)
    write_mnist_digits(tmp_path / "c", train=200, test=50, seed=4)
    assert (tmp_path / "a/train-images-idx3-ubyte").read_bytes() == gzip.decompress(
        (tmp_path / "b/train-images-idx3-ubyte.gz").read_bytes()
    )
    assert (tmp_path / "a/train-images-idx3-ubyte").read_bytes() != (
        tmp_path / "c/train-images-idx3-ubyte"
    ).read_bytes()
    train = ds.MnistDataset(tmp_path / "b", usage="train", shuffle=False)
    rows = list(train.create_tuple_iterator(output_numpy=True))
    assert len(rows) == 200 and ds.MnistDataset(tmp_path / "a", usage="test").get_dataset_size() == 50
    labels = np.array([int(r[1]) for r in rows])
    assert np.bincount(labels, minlength=10).tolist() == [20] * 10
    images = np.stack([r[0] for r in rows]).astype(np.float64)
    # Digits, not noise: dark borders, ink in the middle, and images of one class closer to each other than to others.
    assert images[:, :2].mean() < 5 and images[:, 8:20, 8:20].mean() > 40
    means = np.stack([images[labels == c].mean(0).ravel() for c in range(10)])
    nearest = [np.argmin(((means - img.ravel()) ** 2).sum(1)) for img in images]
    assert np.mean(np.array(nearest) == labels) > 0.6
