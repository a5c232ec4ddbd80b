"""Pipeline operations against plain-Python references over the row values, across block boundaries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import tessel.dataset as ds
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.dataset import core


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch):
    """Blocks of a few rows, so every operation meets block boundaries in the middle of the data."""
    monkeypatch.setattr(core, "TARGET_BLOCK_BYTES", 24)


def numbers(n: int, **kwargs) -> ds.Dataset:
    return ds.NumpySlicesDataset({"x": np.arange(n), "y": np.arange(n) * 10}, shuffle=False, **kwargs)


def column(dataset: ds.Dataset, name: str = "x") -> list:
    return [np.asarray(row[name]).tolist() for row in dataset.create_dict_iterator(num_epochs=1, output_numpy=True)]


def test_take_skip_and_their_sizes():
    assert column(numbers(20).take(7)) == list(range(7))
    assert column(numbers(20).skip(13)) == list(range(13, 20))
    assert column(numbers(20).skip(3).take(5)) == [3, 4, 5, 6, 7]
    assert numbers(20).skip(25).get_dataset_size() == 0 and numbers(20).take(-1).get_dataset_size() == 20
    assert column(numbers(20).batch(3).take(2)) == [[0, 1, 2], [3, 4, 5]]


def test_batch_regroups_rows_of_any_block_size():
    for size in (1, 4, 7, 20, 25):
        got = column(numbers(20).batch(size))
        assert got == [list(range(i, min(i + size, 20))) for i in range(0, 20, size)]
        assert numbers(20).batch(size).get_dataset_size() == len(got)
    assert column(numbers(20).batch(3).batch(2), "y")[0] == [[0, 10, 20], [30, 40, 50]]


def test_repeat_concatenates_epochs_and_reshuffles_each_time():
    assert column(numbers(5).repeat(3)) == list(range(5)) * 3
    shuffled = ds.NumpySlicesDataset({"x": np.arange(30)}).repeat(2)
    values = column(shuffled)
    assert sorted(values[:30]) == sorted(values[30:]) == list(range(30)) and values[:30] != values[30:]
    assert shuffled.get_dataset_size() == 60 and shuffled.get_repeat_count() == 2
    endless = numbers(4).repeat()
    iterator = endless.create_tuple_iterator(output_numpy=True)
    assert [int(next(iterator)[0]) for _ in range(10)] == [0, 1, 2, 3] * 2 + [0, 1]
    # MindSpore 2.7.0 counts an endless repeat as one pass: 4 here; and for 10 rows: 10, .batch(3) 4, .take(25) 10,
    # .take(5) 5, .skip(3) 7, .repeat(2) 20, zip with 7 rows 7, concat with 7 rows 17
    assert endless.get_dataset_size() == 4
    ten = numbers(10).repeat()
    sizes = [ten.get_dataset_size(), ten.batch(3).get_dataset_size(), ten.take(25).get_dataset_size()]
    sizes += [ten.take(5).get_dataset_size(), ten.skip(3).get_dataset_size(), ten.repeat(2).get_dataset_size()]
    seven = ds.NumpySlicesDataset({"q": np.arange(7)}, shuffle=False)
    sizes += [
        ds.zip((ten, seven)).get_dataset_size(),
        ten.project("x").concat(seven.rename("q", "x")).get_dataset_size(),
    ]
    assert sizes == [10, 4, 10, 5, 7, 20, 7, 17]


def test_shuffle_buffer_permutes_rows_per_epoch():
    data = numbers(40).shuffle(8)
    iterator = data.create_tuple_iterator(num_epochs=2, output_numpy=True)
    epochs = [[int(x) for x, _ in iterator] for _ in range(2)]
    assert all(sorted(e) == list(range(40)) for e in epochs) and epochs[0] != epochs[1]
    # A row cannot leave before it arrives: output p is drawn from the first p + 8 + 1 rows (one-row blocks here).
    assert all(value <= position + 8 for position, value in enumerate(epochs[0]))
    assert any(value < position for position, value in enumerate(epochs[0]))
    again = numbers(40).shuffle(8).create_tuple_iterator(num_epochs=2, output_numpy=True)
    assert [[int(x) for x, _ in again] for _ in range(2)] == epochs


def test_map_replaces_columns_and_keeps_the_order():
    data = numbers(6).map(lambda x: x + 1, "x")
    assert data.get_col_names() == ["x", "y"] and column(data) == [1, 2, 3, 4, 5, 6]
    # another number of outputs than inputs: the outputs first, then the columns kept (MindSpore's MapOp)
    split = numbers(6).map(lambda y: (y, -y), "y", ["pos", "neg"])
    assert split.get_col_names() == ["pos", "neg", "x"] and column(split, "neg") == [0, -10, -20, -30, -40, -50]
    merged = numbers(6).map(lambda x, y: x + y, ["x", "y"], "sum")
    assert merged.get_col_names() == ["sum"] and column(merged, "sum") == [11 * i for i in range(6)]
    assert numbers(6).map(lambda v: v * 2).get_col_names() == ["x", "y"]  # default: the first column


def test_map_after_batch_sees_the_whole_batch():
    seen = []
    data = numbers(10).batch(4).map(lambda x: (seen.append(x.shape), x.sum())[1], "x")
    assert column(data) == [6, 22, 17] and seen == [(4,), (4,), (2,)]


def test_python_rows_of_different_shapes_flow_until_batch():
    data = ds.GeneratorDataset(lambda: (np.arange(i) for i in range(1, 6)), ["v"])
    assert [len(v) for v in column(data, "v")] == [1, 2, 3, 4, 5]
    padded = data.map(lambda v: np.pad(v, (0, 5 - len(v))), "v").batch(5)
    assert column(padded, "v")[0][4] == [0, 1, 2, 3, 4]
    with pytest.raises(ConfigurationError, match="rows of different shapes"):
        column(data.batch(2), "v")


def test_project_rename_zip_concat():
    assert numbers(3).project(["y", "x"]).get_col_names() == ["y", "x"]
    renamed = numbers(3).rename("x", "a")
    assert renamed.get_col_names() == ["a", "y"] and column(renamed, "a") == [0, 1, 2]
    other = ds.NumpySlicesDataset({"z": np.arange(100, 105)}, shuffle=False)
    zipped = ds.zip((numbers(7), other))
    assert zipped.get_col_names() == ["x", "y", "z"] and zipped.get_dataset_size() == 5
    assert column(zipped, "z") == [100, 101, 102, 103, 104] and column(zipped, "x") == [0, 1, 2, 3, 4]
    joined = numbers(3) + numbers(2)
    assert column(joined) == [0, 1, 2, 0, 1] and joined.get_dataset_size() == 5


def test_concat_refuses_other_column_types_or_ranks_as_mindspore():
    """MindSpore 2.7.0: RuntimeError "Concat: the data types ... should be the same, but got: int32 and float32"
    (and int32 and int64), "the data tensor rank ... should be the same"; rows of one rank may differ in shape."""
    ints = ds.NumpySlicesDataset({"x": np.arange(3, dtype=np.int32)}, shuffle=False)
    for other in (np.array([0.5, 1.5], np.float32), np.arange(2, dtype=np.int64)):
        mixed = ints.concat(ds.NumpySlicesDataset({"x": other}, shuffle=False))
        with pytest.raises(
            ConfigurationError, match=f"'x' is int32 in dataset 0 and {other.dtype} in dataset 1.*TypeCast"
        ):
            column(mixed)
    pairs = ds.NumpySlicesDataset({"x": np.zeros((3, 2), np.int32)}, shuffle=False)
    with pytest.raises(ConfigurationError, match="rows of rank 1 in dataset 0 and 0 in dataset 1"):
        column(pairs.concat(ds.NumpySlicesDataset({"x": np.zeros(2, np.int32)}, shuffle=False)))
    wider = pairs.concat(ds.NumpySlicesDataset({"x": np.zeros((2, 3), np.int32)}, shuffle=False))
    assert column(wider) == [[0, 0]] * 3 + [[0, 0, 0]] * 2


def test_batch_size_through_zip_and_concat_is_the_last_datasets():
    """MindSpore 2.7.0 measured get_batch_size(): zip of batch(3), batch(4) gives 4; of batch(4), batch(3) 3; of
    batch(3) and an unbatched one 1; of (batch(3), batch(4)) zipped after an unbatched one 4; concat of batch(3) and
    batch(4) 4."""
    b = lambda name, size: ds.NumpySlicesDataset({name: np.arange(10)}, shuffle=False).batch(size)  # noqa: E731
    plain = ds.NumpySlicesDataset({"p": np.arange(10)}, shuffle=False)
    got = [ds.zip((b("a", 3), b("b", 4))), ds.zip((b("a", 4), b("b", 3))), ds.zip((b("a", 3), plain))]
    got += [ds.zip((plain, ds.zip((b("a", 3), b("b", 4))))), b("a", 3).concat(b("a", 4))]
    assert [d.get_batch_size() for d in got] == [4, 3, 1, 4, 4]


def test_operations_name_missing_or_colliding_columns():
    with pytest.raises(ConfigurationError, match=r"input_columns \['image'\] not found; the dataset's columns are"):
        numbers(3).map(ds.vision.HWC2CHW(), "image")
    with pytest.raises(ConfigurationError, match="project: columns"):
        numbers(3).project("z")
    with pytest.raises(ConfigurationError, match="share column names"):
        ds.zip((numbers(3), numbers(3)))
    with pytest.raises(ConfigurationError, match="must match"):
        numbers(3) + numbers(3).rename("x", "q")
    with pytest.raises(ConfigurationError, match="collide"):
        numbers(3).map(lambda x: x, "x", "y")
    with pytest.raises(ConfigurationError, match="pass an instance"):
        numbers(3).map(ds.vision.HWC2CHW, "x")
    with pytest.raises(ConfigurationError, match="batch_size must be an int >= 1"):
        numbers(3).batch(0)


def test_iterators_epochs_columns_and_the_tensor_hook(monkeypatch: pytest.MonkeyPatch):
    data = numbers(3)
    iterator = data.create_tuple_iterator(columns=["y"], num_epochs=2, output_numpy=True)
    assert [[int(v[0]) for v in iterator] for _ in range(2)] == [[0, 10, 20], [0, 10, 20]]
    with pytest.raises(ConfigurationError, match="the iterator ran all its epochs"):  # MindSpore: "EOF buffer ..."
        next(iterator)
    wrapped = []
    monkeypatch.setattr(core, "to_tensor", lambda array: wrapped.append(array) or ("tensor", array.tolist()))
    assert next(iter(data)) == [("tensor", 0), ("tensor", 0)] and len(wrapped) == 2
    assert next(data.create_dict_iterator(output_numpy=True))["y"].tolist() == 0
    with pytest.raises(ConfigurationError, match="not in the dataset"):
        data.create_tuple_iterator(columns=["nope"])
    with pytest.raises(ConfigurationError, match="num_epochs"):
        data.create_tuple_iterator(num_epochs=0)


def test_metadata_queries():
    images = np.zeros((10, 4, 4, 3), np.uint8)
    data = ds.NumpySlicesDataset((images, np.arange(10, dtype=np.int32)), ["image", "label"])
    data = data.map(ds.vision.HWC2CHW(), "image").batch(4)
    assert data.get_col_names() == ["image", "label"]
    assert data.get_dataset_size() == 3 and data.get_batch_size() == 4
    assert data.output_shapes() == [[4, 3, 4, 4], [4]]
    assert data.output_types() == [np.dtype(np.uint8), np.dtype(np.int32)]
    empty = ds.NumpySlicesDataset({"x": np.arange(5)}).skip(50)
    assert empty.output_shapes() == [] and empty.output_types() == []  # MindSpore 2.7.0 gives [] too


def test_map_arguments_num_classes_and_estimated_shapes_as_mindspore():
    """MindSpore 2.7.0: map(operations, input_columns, output_columns, column_order, num_parallel_workers), so a fifth
    positional argument is num_parallel_workers and a fourth other than None is the dropped column_order;
    num_classes() is None for these sources; output_shapes(estimate=True) gives None for a dimension that varies
    ([[None]] for 10 rows in threes; [[None], [2]] for generator rows of lengths 1..3 beside a fixed column) and
    refuses rows of another rank."""
    assert column(numbers(3).map(lambda a: a, ["x"], ["x"], None, 2)) == [0, 1, 2]
    with pytest.raises(NotSupportedYetError, match="column_order"):
        numbers(3).map(lambda a: a, ["x"], ["x"], ["x"])
    assert numbers(3).num_classes() is None
    assert numbers(10).project("x").batch(3).output_shapes(estimate=True) == [[None]]
    assert numbers(10).project("x").batch(3).output_shapes() == [[3]]
    varying = ds.GeneratorDataset(lambda: ((np.zeros(i + 1), np.zeros(2)) for i in range(3)), ["a", "b"])
    assert varying.output_shapes(estimate=True) == [[None], [2]]
    ragged = ds.GeneratorDataset(lambda: iter([(np.zeros(2),), (np.zeros((2, 3)),)]), ["a"])
    with pytest.raises(ConfigurationError, match="rows of rank 1 and 2"):
        ragged.output_shapes(estimate=True)


def test_a_python_function_in_map_gets_a_0d_array_for_a_scalar_column():
    """MindSpore 2.7.0 hands a pyfunc a 0-d numpy.ndarray per scalar value, not a numpy scalar."""
    seen = []

    def record(y):
        seen.append((type(y), y.shape, y.dtype))
        return y

    list(numbers(3).map(record, "x").create_tuple_iterator(output_numpy=True))
    assert seen and all(kind is np.ndarray and shape == () for kind, shape, _ in seen)


def test_numpy_slices_inputs_and_errors():
    assert column(ds.NumpySlicesDataset([1, 2, 3], shuffle=False), "column_0") == [1, 2, 3]
    two = ds.NumpySlicesDataset((np.arange(2), np.ones((2, 3))), shuffle=False)
    assert two.get_col_names() == ["column_0", "column_1"]
    named = ds.NumpySlicesDataset({"a": np.arange(3)}, column_names=["b"], shuffle=False)
    assert named.get_col_names() == ["b"]
    with pytest.raises(ConfigurationError, match="'b' has 2 rows but 'a' has 3"):
        ds.NumpySlicesDataset({"a": np.arange(3), "b": np.arange(2)})
    with pytest.raises(TypeError, match="must be a dict, tuple, list or numpy array"):
        ds.NumpySlicesDataset(5)


def test_generator_sources_and_their_errors():
    class Squares:
        def __getitem__(self, index):
            return np.int64(index), np.int64(index * index)

        def __len__(self):
            return 6

    data = ds.GeneratorDataset(Squares(), ["i", "sq"], shuffle=False)
    assert column(data, "sq") == [0, 1, 4, 9, 16, 25] and data.get_dataset_size() == 6
    iterable = ds.GeneratorDataset(lambda: iter([(1,), (2,)]), "v", num_samples=1)
    assert column(iterable, "v") == [1] and iterable.get_dataset_size() == 1
    dtypes = pytest.importorskip("tessel.compiler.dtypes")  # column_types takes MindSpore's dtypes (ms.int32)
    typed = ds.GeneratorDataset([(np.int32(1),)], ["v"], column_types=[dtypes.DType.int32])
    assert next(typed.create_tuple_iterator(output_numpy=True))[0].dtype == np.int32
    with pytest.raises(ConfigurationError, match="column_names is required"):
        ds.GeneratorDataset(Squares())
    with pytest.raises(ConfigurationError, match="need a random-access source"):
        ds.GeneratorDataset(lambda: iter([]), ["v"], shuffle=True)
    with pytest.raises(ConfigurationError, match="yields 2 value"):
        column(ds.GeneratorDataset(Squares(), ["only"]), "only")
    # MindSpore's _convert_row: a list is one value per column too; a Tensor its value; bytes np.array(b"ab"), which
    # MindSpore 2.7.0 gives as dtype S2 (not uint8)
    listed = ds.GeneratorDataset(lambda: iter([[np.array([i]), np.int64(i), b"ab"] for i in range(2)]), ["a", "b", "c"])
    rows = list(listed.create_tuple_iterator(output_numpy=True))
    assert [r[1].tolist() for r in rows] == [0, 1] and rows[0][2].dtype == np.dtype("S2") and rows[0][2] == b"ab"
    with pytest.raises(ConfigurationError, match="yields 3 value"):
        column(ds.GeneratorDataset(lambda: iter([[1, 2, 3]]), ["v"]), "v")


def test_generator_column_types_are_checked_not_cast():
    """MindSpore 2.7.0 does not cast to column_types: a returned int32 for ms.int64, a Python int (int64) for
    ms.int32 or a Python float (float64) for ms.float32 is a RuntimeError; numpy types or names there raise
    NotImplementedError, even when they match."""
    ms = pytest.importorskip("tessel.compiler.dtypes").DType
    rows = lambda *values: ds.GeneratorDataset(lambda: ((v,) for v in values), ["a"], column_types=[ms.int64])  # noqa: E731
    assert [int(r[0]) for r in rows(1, 2).create_tuple_iterator(output_numpy=True)] == [1, 2]
    with pytest.raises(ConfigurationError, match="'a' is declared int64 in column_types but the source returned int32"):
        list(rows(np.int32(1)))
    floats = ds.GeneratorDataset(lambda: iter([(1.5,)]), ["f"], column_types=[ms.float32])
    with pytest.raises(ConfigurationError, match=r"declared float32 .* returned float64"):
        floats.output_types()
    for numpy_type in (np.int64, np.dtype(np.int64), "int64"):
        with pytest.raises(NotImplementedError, match="column_types takes MindSpore dtypes"):
            ds.GeneratorDataset(lambda: iter([(1,)]), ["a"], column_types=[numpy_type])


def test_arrow_files_are_mapped_and_sharded_like_any_source(tmp_path: Path):
    images = np.arange(7 * 6, dtype=np.float32).reshape(7, 2, 3)
    table = pa.table({"image": pa.FixedShapeTensorArray.from_numpy_ndarray(images), "label": np.arange(7)})
    with ipc.new_file(tmp_path / "a.arrow", table.schema) as writer:
        writer.write_table(table.slice(0, 4))
    with ipc.new_stream(tmp_path / "b.arrows", table.schema) as writer:  # stream format: cached, then mapped
        writer.write_table(table.slice(4))
    data = ds.ArrowDataset([tmp_path / "a.arrow", tmp_path / "b.arrows"], shuffle=False, num_shards=2, shard_id=1)
    rows = list(data.create_tuple_iterator(output_numpy=True))
    assert [int(label) for _, label in rows] == [1, 3, 5, 0]
    np.testing.assert_array_equal(rows[1][0], images[3])
    only = ds.ArrowDataset(tmp_path, columns_list=["label"], shuffle=False)
    assert only.get_col_names() == ["label"] and only.get_dataset_size() == 7
    with pytest.raises(ConfigurationError, match="has no column"):
        ds.ArrowDataset(tmp_path / "a.arrow", columns_list=["nope"]).get_dataset_size()


def test_parquet_files_with_list_columns(tmp_path: Path):
    vectors = np.arange(10 * 4, dtype=np.int16).reshape(10, 4)
    pq.write_table(pa.table({"v": list(vectors[:6]), "k": np.arange(6)}), tmp_path / "p0.parquet")
    pq.write_table(pa.table({"v": list(vectors[6:]), "k": np.arange(6, 10)}), tmp_path / "p1.parquet")
    data = ds.ParquetDataset(tmp_path, shuffle=False).batch(4)
    batches = list(data.create_tuple_iterator(output_numpy=True))
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), vectors)
    assert batches[0][0].dtype == np.int16 and [len(b[1]) for b in batches] == [4, 4, 2]
    pq.write_table(pa.table({"v": [[1], [2, 3]]}), tmp_path / "ragged.parquet")
    with pytest.raises(ConfigurationError, match="lists of different lengths"):
        ds.ParquetDataset(tmp_path / "ragged.parquet").get_dataset_size()


def test_mindspore_names_tessel_lacks_are_not_supported_yet_not_attribute_errors():
    # core/options.py: a MindSpore API tessel does not map raises NotSupportedYetError naming it, never AttributeError
    for get in (lambda: ds.ImageFolderDataset, lambda: ds.DistributedSampler, lambda: ds.vision.Decode,
                lambda: numbers(2).filter(lambda x: True), lambda: numbers(2).split([1, 1]),
                lambda: numbers(2).padded_batch(2),
                lambda: numbers(2).bucket_batch_by_length(["x"], [2], [1, 2])):  # fmt: skip
        with pytest.raises(NotSupportedYetError, match="not supported yet"):
            get()
    with pytest.raises(AttributeError):
        ds.NoSuchDataset  # noqa: B018
    ds.config.set_num_parallel_workers(4)  # accepted as MindSpore checks it; rows are the same with or without
    assert ds.config.get_num_parallel_workers() == 4
    with pytest.raises(ConfigurationError, match="num_parallel_workers must be an int >= 1"):
        ds.config.set_num_parallel_workers(0)
    ds.config.set_num_parallel_workers(8)
