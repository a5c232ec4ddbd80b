"""Random-access sources: MNIST, CIFAR-10 and numpy slices, read through a `ColumnTable`.

All of them share MindSpore's sampling arguments: `shuffle` (None means True, as in MindSpore), `num_samples`,
`num_shards` and `shard_id`, applied by the rule in `tessel.dataset.sampling`.

>>> import numpy as np
>>> data = NumpySlicesDataset({"x": np.arange(10)}, shuffle=False, num_shards=3, shard_id=0)
>>> [int(row[0]) for row in data.create_tuple_iterator(output_numpy=True)]
[0, 3, 6, 9]
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from tessel.core.errors import ConfigurationError
from tessel.core.options import check_type, keyword_options
from tessel.dataset.core import (
    ROW_ID,
    SOURCE_UNSUPPORTED,
    Block,
    Dataset,
    EpochContext,
    block_rows,
    check_workers,
)
from tessel.dataset.formats import (
    CIFAR10_TEST_FILES,
    find_idx_file,
    read_cifar10_batch,
    read_idx,
)
from tessel.dataset.sampling import ShardShares, check_sampling_args, sharded_rows, sharded_size
from tessel.dataset.storage import ColumnTable, cache_key, cached_table, to_record_batch

USAGES = ("train", "test", "all")


def check_directory(dataset_dir: str | os.PathLike, where: str, fix: str) -> Path:
    path = Path(dataset_dir) if dataset_dir else None
    if path is None or not path.is_dir():
        state = "is not set" if path is None else "does not exist" if not path.exists() else "is not a directory"
        raise ConfigurationError(f"{where}: dataset_dir {str(dataset_dir)!r} {state}; {fix}")
    return path


def check_usage(usage: str | None, where: str) -> str:
    usage = "all" if usage is None else usage
    if usage not in USAGES:
        raise ConfigurationError(f"{where}: usage must be one of {USAGES} (or None for 'all'), got {usage!r}")
    return usage


class MappableSource(Dataset):
    """A source with a known number of rows, read by row index (shuffled and sharded by index)."""

    def __init__(self, where: str, num_samples: Any, shuffle: Any, num_shards: Any, shard_id: Any, sampler: Any):
        super().__init__()
        if sampler is not None:
            raise ConfigurationError(f"{where}: sampler= is not supported; use shuffle/num_samples/num_shards/shard_id")
        check_type(shuffle, (bool, type(None)), where, "shuffle")
        self.num_shards, self.shard_id = check_sampling_args(where, num_samples, num_shards, shard_id)
        self.num_samples = num_samples or None
        self.shuffle_flag = True if shuffle is None else shuffle
        self.shard_shares: ShardShares | None = None  # uneven shards (tessel.dataset.parallel.with_shares)
        self.where = where
        self._table: ColumnTable | None = None

    def _open(self) -> ColumnTable:
        raise NotImplementedError

    def table(self) -> ColumnTable:
        """The source's rows (opened, and materialized into the Arrow cache, on first use)."""
        if self._table is None:
            table = self._open()
            if table.num_rows == 0:
                raise ConfigurationError(f"{self.where}: the source has no rows")
            self._table = table
        return self._table

    def get_col_names(self) -> list[str]:
        return list(self.table().column_names)

    def _num_rows(self) -> int:
        return sharded_size(self, self.table().num_rows)

    def _rows_are_batches(self) -> bool:
        return False

    def _sampling_signature(self) -> str:
        # Sharding is left out: the random streams it names must be those of one device reading every shard.
        return f"shuffle={self.shuffle_flag},num_samples={self.num_samples}"

    def _where(self) -> str:
        return self.where

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        table = self.table()
        rows = sharded_rows(self, table.num_rows, ctx.seed, ctx.epoch)
        step = block_rows(table.row_bytes, ctx.row_multiple)
        for start in range(0, len(rows), step):
            picked = rows[start : start + step]
            yield {**table.gather(picked), ROW_ID: picked.astype(np.uint64)}


class MnistDataset(MappableSource):
    """MNIST from IDX files (plain or .gz): columns image (28, 28, 1) uint8 and label () uint32.

    usage 'train' reads train-images-idx3-ubyte / train-labels-idx1-ubyte, 'test' the t10k-* files, 'all' (the
    default) both that are present, train first.
    """

    def __init__(
        self,
        dataset_dir: str | os.PathLike,
        usage: str | None = None,
        num_samples: int | None = None,
        num_parallel_workers: int | None = None,
        shuffle: bool | None = None,
        sampler: Any = None,
        num_shards: int | None = None,
        shard_id: int | None = None,
        cache: Any = None,
    ):
        where = f"MnistDataset({str(dataset_dir)!r})"
        super().__init__(where, num_samples, shuffle, num_shards, shard_id, sampler)
        check_workers("MnistDataset", num_parallel_workers)
        keyword_options("MnistDataset", {"cache": cache}, unsupported=SOURCE_UNSUPPORTED)
        fix = "point it at the folder with train-images-idx3-ubyte etc. (make one: python examples/make_digits.py DIR)"
        self.dataset_dir = check_directory(dataset_dir, where, fix)
        self.usage = check_usage(usage, where)
        self.files = self._find_files()

    def _find_files(self) -> list[tuple[Path, Path]]:
        splits = {"train": ["train"], "test": ["t10k"], "all": ["train", "t10k"]}[self.usage]
        pairs, missing = [], []
        for prefix in splits:
            images = find_idx_file(self.dataset_dir, prefix, "images-idx3")
            labels = find_idx_file(self.dataset_dir, prefix, "labels-idx1")
            if images and labels:
                pairs.append((images, labels))
            elif images or labels or self.usage != "all":
                missing.append(f"{prefix}-{'labels-idx1' if images else 'images-idx3'}-ubyte")
        if missing or not pairs:
            found = sorted(p.name for p in self.dataset_dir.iterdir())[:10]
            need = missing or ["train-images-idx3-ubyte + train-labels-idx1-ubyte (or the t10k-* pair)"]
            raise ConfigurationError(
                f"{self.where}: missing MNIST file(s) {need} for usage={self.usage!r} (optionally .gz); the folder "
                f"holds {found}"
            )
        return pairs

    def get_col_names(self) -> list[str]:
        return ["image", "label"]

    def _signature(self) -> str:
        return f"{self.dataset_dir.resolve()},{self.usage},{self._sampling_signature()}"

    def _open(self) -> ColumnTable:
        files = [f for pair in self.files for f in pair]
        return cached_table(cache_key("mnist", files, self.usage), self._read, self.where)

    def _read(self) -> Iterator[pa.RecordBatch]:
        # One record batch for all splits: a single chunk per column makes gathers one numpy indexing call.
        images, labels = zip(*(self._read_split(*pair) for pair in self.files))
        yield to_record_batch({"image": np.concatenate(images)[..., None], "label": np.concatenate(labels)})

    @staticmethod
    def _read_split(image_file: Path, label_file: Path) -> tuple[np.ndarray, np.ndarray]:
        images, labels = read_idx(image_file), read_idx(label_file)
        if images.ndim != 3 or images.dtype != np.uint8:
            raise ConfigurationError(
                f"{image_file}: MNIST images must be a 3-D uint8 IDX array (count, rows, cols), got shape "
                f"{images.shape} of {images.dtype}"
            )
        if labels.ndim != 1 or len(labels) != len(images):
            raise ConfigurationError(
                f"{label_file}: holds {labels.shape} labels but {image_file.name} holds {len(images)} images; "
                f"the label file must be 1-D with one label per image (are the files from the same split?)"
            )
        return images, labels.astype(np.uint32)


class Cifar10Dataset(MappableSource):
    """CIFAR-10 binary batches: columns image (32, 32, 3) uint8 (HWC) and label () uint32.

    usage 'train' reads data_batch_*.bin, 'test' test_batch.bin, 'all' (the default) both.
    """

    def __init__(
        self,
        dataset_dir: str | os.PathLike,
        usage: str | None = None,
        num_samples: int | None = None,
        num_parallel_workers: int | None = None,
        shuffle: bool | None = None,
        sampler: Any = None,
        num_shards: int | None = None,
        shard_id: int | None = None,
        cache: Any = None,
    ):
        where = f"Cifar10Dataset({str(dataset_dir)!r})"
        super().__init__(where, num_samples, shuffle, num_shards, shard_id, sampler)
        check_workers("Cifar10Dataset", num_parallel_workers)
        keyword_options("Cifar10Dataset", {"cache": cache}, unsupported=SOURCE_UNSUPPORTED)
        fix = "point it at the extracted 'cifar-10-batches-bin' folder (data_batch_1.bin ... test_batch.bin)"
        self.dataset_dir = check_directory(dataset_dir, where, fix)
        self.usage = check_usage(usage, where)
        train = sorted(self.dataset_dir.glob("data_batch_*.bin"))
        test = [self.dataset_dir / name for name in CIFAR10_TEST_FILES if (self.dataset_dir / name).is_file()]
        self.files = {"train": train, "test": test, "all": train + test}[self.usage]
        if not self.files:
            raise ConfigurationError(
                f"{where}: no CIFAR-10 binary batches for usage={self.usage!r} (data_batch_*.bin for train, "
                f"test_batch.bin for test); {fix}"
            )

    def get_col_names(self) -> list[str]:
        return ["image", "label"]

    def _signature(self) -> str:
        return f"{self.dataset_dir.resolve()},{self.usage},{self._sampling_signature()}"

    def _open(self) -> ColumnTable:
        return cached_table(cache_key("cifar10", self.files, self.usage), self._read, self.where)

    def _read(self) -> Iterator[pa.RecordBatch]:
        images, labels = zip(*(read_cifar10_batch(path) for path in self.files))
        yield to_record_batch({"image": np.concatenate(images), "label": np.concatenate(labels)})


def _slices_columns(data: Any, column_names: Any, where: str) -> dict[str, np.ndarray]:
    if isinstance(data, dict):
        names, arrays = list(data), [np.asarray(v) for v in data.values()]
    elif isinstance(data, tuple):
        names, arrays = [f"column_{i}" for i in range(len(data))], [np.asarray(v) for v in data]
    elif isinstance(data, (list, np.ndarray)):
        names, arrays = ["column_0"], [np.asarray(data)]
    else:
        raise TypeError(
            f"{where}: data must be a dict, tuple, list or numpy array (sliced along axis 0), got {type(data).__name__}"
        )
    if column_names is not None:
        given = [column_names] if isinstance(column_names, str) else list(column_names)
        if len(given) != len(arrays):
            raise ConfigurationError(f"{where}: {len(given)} column_names {given} for {len(arrays)} data column(s)")
        names = given
    for name, array in zip(names, arrays):
        if array.ndim == 0 or array.dtype == object:
            raise ConfigurationError(
                f"{where}: column '{name}' must be an array of rows with one dtype, got "
                f"{'a scalar' if array.ndim == 0 else 'ragged or mixed-type data'}; give equal-shaped numeric rows"
            )
        if len(array) != len(arrays[0]):
            raise ConfigurationError(
                f"{where}: column '{name}' has {len(array)} rows but '{names[0]}' has {len(arrays[0])}; every column "
                f"needs the same number of rows"
            )
    return dict(zip(names, arrays))


class NumpySlicesDataset(MappableSource):
    """Rows sliced from in-memory arrays: a dict (column per key), a tuple (column per item), a list or an array."""

    def __init__(
        self,
        data: Any,
        column_names: str | list[str] | None = None,
        num_samples: int | None = None,
        num_parallel_workers: int | None = None,
        shuffle: bool | None = None,
        sampler: Any = None,
        num_shards: int | None = None,
        shard_id: int | None = None,
    ):
        where = "NumpySlicesDataset"
        super().__init__(where, num_samples, shuffle, num_shards, shard_id, sampler)
        check_workers(where, num_parallel_workers)
        self.columns = _slices_columns(data, column_names, where)
        self._table = ColumnTable.from_arrays(self.columns, where)
        if self._table.num_rows == 0:
            raise ConfigurationError(f"{where}: data has no rows")

    def _contents(self) -> bytes:
        """blake2b-16 of the columns' names, shapes, dtypes and values (read in place, not copied)."""
        digest = hashlib.blake2b(digest_size=16)
        for name, array in self.columns.items():
            digest.update(f"{name}{array.shape}{array.dtype}".encode())
            digest.update(memoryview(np.ascontiguousarray(array)).cast("B"))
        return digest.digest()

    def _signature(self) -> str:
        return f"{self._contents().hex()},{self._sampling_signature()}"

    def arrow_ipc_stream(self) -> bytes:
        """The data as Arrow IPC stream bytes (how a DatasetSpec carries it)."""
        return self.inline_stream()[0]

    def inline_stream(self) -> tuple[bytes, bytes]:
        """(the data as Arrow IPC stream bytes, their 16-byte blake2b digest). Kept with the source's table, which
        the copies a pipeline makes of this node share (a new batch split copies the source with other shares), and
        made again only when the arrays' contents changed since (checked by hashing them, ~1 ms per MB, against
        serializing them again): a pipeline opened after the arrays were changed in place sends what they hold
        then, as it did when every open serialized them."""
        table, contents = self.table(), self._contents()
        kept = table.inline_stream
        if kept is None or kept[0] != contents:
            batch = to_record_batch(self.columns)
            sink = io.BytesIO()
            with ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            stream = sink.getvalue()
            kept = table.inline_stream = (contents, stream, hashlib.blake2b(stream, digest_size=16).digest())
        return kept[1], kept[2]
