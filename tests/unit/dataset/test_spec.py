"""Sink mode: a pipeline becomes a DatasetSpec, and another process rebuilds it and yields identical batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tessel.dataset as ds
from tessel.core.errors import ConfigurationError
from tessel.dataset.storage import record_batch_columns
from tessel.v1 import dataset_pb2

# The rebuilding process: reads the spec bytes, iterates its epochs and saves every batch (no pickle anywhere).
REBUILD = """
import json, sys
import numpy as np
import tessel.dataset as ds
spec_path, out_path, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = ds.from_spec(open(spec_path, "rb").read())
iterator = data.create_tuple_iterator(num_epochs=epochs, output_numpy=True)
arrays = {}
for epoch in range(epochs):
    for step, row in enumerate(iterator):
        for column, value in enumerate(row):
            arrays[f"{epoch}/{step}/{column}"] = value
np.savez(out_path, **arrays)
print(json.dumps({"seed": data._effective_seed(), "columns": data.get_col_names()}))
"""


def batches_of(dataset: ds.Dataset, epochs: int) -> dict[str, np.ndarray]:
    iterator = dataset.create_tuple_iterator(num_epochs=epochs, output_numpy=True)
    return {
        f"{epoch}/{step}/{column}": value
        for epoch in range(epochs)
        for step, row in enumerate(iterator)
        for column, value in enumerate(row)
    }


def rebuild_in_subprocess(dataset: ds.Dataset, tmp_path: Path, epochs: int) -> tuple[dict[str, np.ndarray], dict]:
    spec_path, out_path = tmp_path / "spec.bin", tmp_path / "batches.npz"
    spec_path.write_bytes(dataset.to_spec().SerializeToString())
    env = dict(os.environ, TESSEL_CACHE=str(tmp_path / "other-cache"))
    result = subprocess.run(
        [sys.executable, "-c", REBUILD, str(spec_path), str(out_path), str(epochs)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(out_path, allow_pickle=False) as saved:
        return {key: saved[key] for key in saved.files}, json.loads(result.stdout)


def assert_same_batches(left: dict[str, np.ndarray], right: dict[str, np.ndarray]) -> None:
    assert sorted(left) == sorted(right) and left
    for key in left:
        assert left[key].dtype == right[key].dtype, key
        np.testing.assert_array_equal(left[key], right[key], err_msg=key)


def test_seed_pipeline_with_random_transforms_round_trips(mnist_dir, tmp_path: Path):
    ds.config.set_seed(1234)  # the subprocess keeps the default seed: the spec must carry this one
    folder, _ = mnist_dir
    data = ds.MnistDataset(folder, num_shards=3, shard_id=2)
    data = data.map(
        [
            ds.vision.RandomCrop(24, padding=2, fill_value=7),
            ds.vision.RandomHorizontalFlip(),
            ds.vision.Resize((20, 20)),
            ds.vision.Rescale(1.0 / 255.0, 0),
            ds.vision.Normalize(mean=(0.1307,), std=(0.3081,)),
            ds.vision.HWC2CHW(),
        ],
        "image",
    )
    data = data.map([ds.transforms.TypeCast(np.int32), ds.transforms.OneHot(10)], "label")
    data = data.shuffle(4).batch(2).repeat(2)
    theirs, info = rebuild_in_subprocess(data, tmp_path, epochs=2)
    assert info == {"seed": 1234, "columns": ["image", "label"]}
    assert_same_batches(batches_of(data, epochs=2), theirs)


def test_files_numpy_zip_concat_and_column_ops_round_trip(tmp_path: Path):
    pq.write_table(pa.table({"v": np.arange(12, dtype=np.float32), "w": np.arange(12) * 2}), tmp_path / "a.parquet")
    parquet = ds.ParquetDataset(tmp_path / "a.parquet", columns_list=["v"], num_shards=2, shard_id=0)
    inline = ds.NumpySlicesDataset({"s": np.arange(6) * 3, "t": np.ones((6, 2), np.int8)}, shuffle=False)
    data = ds.zip((parquet, inline.rename("s", "u"))).project(["u", "v"]).skip(1).take(4)
    data = (data + data).batch(3, drop_remainder=True)
    theirs, info = rebuild_in_subprocess(data, tmp_path, epochs=1)
    assert info["columns"] == ["u", "v"]
    assert_same_batches(batches_of(data, epochs=1), theirs)


def test_spec_carries_the_next_epoch():
    data = ds.NumpySlicesDataset({"x": np.arange(20)}).batch(5)
    list(data)  # one epoch consumed here
    rebuilt = ds.from_spec(data.to_spec())
    assert_same_batches(batches_of(data, 1), batches_of(rebuilt, 1))


def test_python_callables_stay_in_feed_mode():
    generated = ds.GeneratorDataset(lambda: iter([(1,), (2,)]), ["v"])
    with pytest.raises(ConfigurationError, match=r"GeneratorDataset calls Python code.*feed mode.*iter_record_batches"):
        generated.to_spec()
    lambda_map = ds.NumpySlicesDataset({"x": np.arange(3)}).map(lambda x: x * 2, "x")
    with pytest.raises(ConfigurationError, match="not a registered transform"):
        lambda_map.to_spec()
    assert not lambda_map.is_serializable() and ds.NumpySlicesDataset({"x": np.arange(3)}).is_serializable()


def test_record_batches_stream_one_batch_each():
    images = np.arange(10 * 2 * 3, dtype=np.uint8).reshape(10, 2, 3, 1)
    data = ds.NumpySlicesDataset({"image": images, "label": np.arange(10)}, shuffle=False)
    data = data.map(ds.vision.HWC2CHW(), "image").batch(4)
    record_batches = list(data.iter_record_batches(epoch=0))
    assert [rb.num_rows for rb in record_batches] == [4, 4, 2]
    assert isinstance(record_batches[0].schema.field("image").type, pa.FixedShapeTensorType)
    for record_batch, (image, label) in zip(record_batches, data.create_tuple_iterator(output_numpy=True)):
        columns = record_batch_columns(record_batch)
        np.testing.assert_array_equal(columns["image"], image)
        np.testing.assert_array_equal(columns["label"], label)
    unbatched = list(ds.NumpySlicesDataset({"x": np.arange(5)}, shuffle=False).iter_record_batches(epoch=0))
    assert sum(rb.num_rows for rb in unbatched) == 5


def test_bad_specs_are_clear_errors():
    spec = ds.NumpySlicesDataset({"x": np.arange(3)}).map(ds.vision.Rescale(2.0, 0), "x").to_spec()
    spec.root.map.operations[0].name = "Sharpen"
    with pytest.raises(ConfigurationError, match="unknown transform 'Sharpen'"):
        ds.from_spec(spec)
    with pytest.raises(ConfigurationError, match="version 99"):
        ds.from_spec(dataset_pb2.DatasetSpec(version=99))
