"""Bad input gets errors that name the file, column or argument and say how to fix it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dataset_testkit import write_mnist

import tessel.dataset as ds
from tessel.core.errors import ConfigurationError
from tessel.dataset.formats import write_idx


def test_missing_directory(tmp_path: Path):
    with pytest.raises(ConfigurationError, match=r"dataset_dir '.*nowhere' does not exist; point it at") as error:
        ds.MnistDataset(tmp_path / "nowhere")
    assert "make_digits.py" in str(error.value)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigurationError, match="is not a directory"):
        ds.Cifar10Dataset(tmp_path / "file")
    with pytest.raises(ConfigurationError, match="is not set"):
        ds.MnistDataset(None)


def test_missing_mnist_files_are_listed(tmp_path: Path):
    write_mnist(tmp_path, train=3)
    with pytest.raises(ConfigurationError, match=r"missing MNIST file\(s\) \['t10k-images-idx3-ubyte'\]"):
        ds.MnistDataset(tmp_path, usage="test")
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(ConfigurationError, match=r"\['train-labels-idx1-ubyte'\] for usage='all'"):
        ds.MnistDataset(tmp_path)
    with pytest.raises(ConfigurationError, match="usage must be one of"):
        ds.MnistDataset(tmp_path, usage="validation")


def test_truncated_and_mismatched_mnist_files_fail_when_read(tmp_path: Path):
    write_mnist(tmp_path, train=5)
    images = tmp_path / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-100])
    data = ds.MnistDataset(tmp_path, usage="train")
    with pytest.raises(ConfigurationError, match=r"train-images-idx3-ubyte: IDX data truncated"):
        data.get_dataset_size()
    write_mnist(tmp_path, train=5)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(4, np.uint8))
    with pytest.raises(ConfigurationError, match=r"holds \(4,\) labels but train-images-idx3-ubyte holds 5 images"):
        list(ds.MnistDataset(tmp_path, usage="train"))
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x02ab")
    with pytest.raises(ConfigurationError, match="3-D uint8 IDX array"):
        list(ds.MnistDataset(tmp_path, usage="train"))


def test_transform_on_a_missing_column(mnist_dir):
    data = ds.MnistDataset(mnist_dir[0])
    with pytest.raises(ConfigurationError, match=r"input_columns \['images'\] not found.*\['image', 'label'\]"):
        data.map(ds.vision.HWC2CHW(), "images")


def test_transform_on_the_wrong_dtype_or_rank_names_the_column(mnist_dir):
    data = ds.MnistDataset(mnist_dir[0])
    on_labels = data.map(ds.vision.HWC2CHW(), "label")
    with pytest.raises(ConfigurationError, match=r"map\(input_columns=\['label'\]\): HWC2CHW\(\) expects .*rank 0"):
        list(on_labels)
    after_batch = data.batch(2).map(ds.vision.HWC2CHW(), "image")
    with pytest.raises(ConfigurationError, match=r"shape \(2, 28, 28, 1\).*before batch"):
        list(after_batch)
    strings = ds.NumpySlicesDataset({"name": np.array(["a", "b"])}).map(ds.transforms.TypeCast("int32"))
    with pytest.raises(ConfigurationError, match=r"map\(input_columns=\['name'\]\): TypeCast.*numeric rows"):
        list(strings)
    with pytest.raises(ConfigurationError, match=r"return 1 column\(s\) but output_columns names 2"):
        list(data.map(ds.vision.HWC2CHW(), "image", ["a", "b"]))


def test_bad_seed_and_sampler_arguments(mnist_dir):
    with pytest.raises(ConfigurationError, match="seed must be an int"):
        ds.config.set_seed(-1)
    with pytest.raises(ConfigurationError, match="sampler= is not supported"):
        ds.MnistDataset(mnist_dir[0], sampler=object())
    with pytest.raises(TypeError, match="shuffle must be of type bool or NoneType, got str 'yes'"):
        ds.MnistDataset(mnist_dir[0], shuffle="yes")


def test_arguments_of_the_wrong_type_are_type_errors_as_mindspore():
    """MindSpore 2.7.0 raises TypeError for each of these (its argument type checks), not ValueError."""
    data = ds.NumpySlicesDataset({"x": np.arange(4)}, shuffle=False)
    image_ops = ds.vision.HWC2CHW()
    for call in [
        lambda: ds.transforms.TypeCast(5),
        lambda: ds.transforms.TypeCast("foo"),
        lambda: ds.transforms.Compose([1, 2]),
        lambda: ds.transforms.Compose(image_ops),
        lambda: ds.transforms.Compose((image_ops,)),
        lambda: data.batch(2.0),
        lambda: data.batch(2, drop_remainder=1),
        lambda: ds.NumpySlicesDataset(5),
        lambda: ds.NumpySlicesDataset([1, 2], shuffle="yes"),
        lambda: ds.GeneratorDataset([(1,)], ["a"], shuffle="yes"),
        lambda: ds.vision.Rescale("a", 0),
        lambda: ds.vision.Rescale(1.0, "a"),
        lambda: ds.vision.Rescale(True, 0),
        lambda: ds.vision.Normalize([1.0], [1.0], is_hwc="yes"),
        lambda: ds.vision.Normalize([1.0], [1.0], is_hwc=1),
        lambda: ds.vision.Normalize(np.array([1.0]), [1.0]),
        lambda: ds.vision.Normalize(["a"], [1.0]),
    ]:
        with pytest.raises(TypeError):
            call()
    assert ds.vision.Normalize((1.0,), (2.0,)).params()["is_hwc"] is True  # tuples are fine, as in MindSpore
