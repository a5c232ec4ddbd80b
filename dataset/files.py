"""Arrow IPC and Parquet files as first-class sources.

An Arrow IPC file (file format, e.g. written with `pyarrow.ipc.new_file` or Feather v2) is memory-mapped in place;
an Arrow IPC stream or a Parquet file is materialized once into the Arrow cache and mapped from there. Rows of
several files follow one another in the order given (a directory means its matching files, sorted by name).

>>> import numpy as np, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "part-0.parquet")
>>> pq.write_table(pa.table({"x": np.arange(4), "y": np.arange(4) * 10}), path)
>>> data = ParquetDataset(path, columns_list=["y"], shuffle=False)
>>> [int(row[0]) for row in data.create_tuple_iterator(output_numpy=True)]
[0, 10, 20, 30]
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from tessel.core.errors import ConfigurationError
from tessel.dataset.core import check_workers
from tessel.dataset.ops import column_list
from tessel.dataset.sources import MappableSource
from tessel.dataset.storage import ColumnTable, cache_key, cached_arrow_table, read_ipc_table

_PARQUET_BATCH_ROWS = 65536


def file_list(dataset_files: Any, where: str, suffixes: tuple[str, ...]) -> list[Path]:
    """Paths from one path, a list of paths, or a directory (its files ending in `suffixes`, sorted)."""
    items = [dataset_files] if isinstance(dataset_files, (str, os.PathLike)) else list(dataset_files or [])
    paths: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            paths.extend(sorted(p for p in path.iterdir() if p.name.endswith(suffixes)))
        elif path.is_file():
            paths.append(path)
        else:
            raise ConfigurationError(f"{where}: dataset file {str(item)!r} does not exist; check the path")
    if not paths:
        raise ConfigurationError(f"{where}: no input files (looked for {', '.join(suffixes)} in {items})")
    return paths


class _FileSource(MappableSource):
    kind = ""
    suffixes: tuple[str, ...] = ()

    def __init__(
        self,
        dataset_files: str | os.PathLike | Sequence[str | os.PathLike],
        columns_list: Sequence[str] | None = None,
        num_samples: int | None = None,
        num_parallel_workers: int | None = None,
        shuffle: bool | None = None,
        num_shards: int | None = None,
        shard_id: int | None = None,
        sampler: Any = None,
    ):
        where = f"{type(self).__name__}({dataset_files!r})"
        super().__init__(where, num_samples, shuffle, num_shards, shard_id, sampler)
        check_workers(type(self).__name__, num_parallel_workers)
        self.files = file_list(dataset_files, where, self.suffixes)
        self.columns_list = None if columns_list is None else column_list(columns_list, where, "columns_list")

    def _file_table(self, path: Path) -> pa.Table:
        raise NotImplementedError

    def _signature(self) -> str:
        return f"{[str(p.resolve()) for p in self.files]},{self.columns_list},{self._sampling_signature()}"

    def _open(self) -> ColumnTable:
        tables = []
        for path in self.files:
            table = self._file_table(path)
            wanted = self.columns_list or table.column_names
            missing = [c for c in wanted if c not in table.column_names]
            if missing:
                raise ConfigurationError(
                    f"{self.where}: {path} has no column(s) {missing}; its columns are {table.column_names}"
                )
            if tables and table.select(wanted).schema != tables[0].schema:
                raise ConfigurationError(
                    f"{self.where}: {path} has schema {table.select(wanted).schema} but {self.files[0]} has "
                    f"{tables[0].schema}; every file must hold the same columns and types"
                )
            tables.append(table.select(wanted))
        return ColumnTable.from_arrow(pa.concat_tables(tables), self.where)


class ArrowDataset(_FileSource):
    """Rows of Arrow IPC files (.arrow, .feather, .ipc; file or stream format)."""

    kind = "arrow"
    suffixes = (".arrow", ".feather", ".ipc", ".arrows")

    def _file_table(self, path: Path) -> pa.Table:
        try:
            with pa.OSFile(str(path), "rb") as probe:
                ipc.open_file(probe)
        except pa.ArrowInvalid:
            return cached_arrow_table(cache_key("arrow-stream", [path]), lambda: _stream_batches(path), self.where)
        return read_ipc_table(path, self.where)


def _stream_batches(path: Path) -> Iterator[pa.RecordBatch]:
    try:
        with pa.OSFile(str(path), "rb") as source:
            yield from ipc.open_stream(source)
    except pa.ArrowInvalid as exc:
        raise ConfigurationError(f"{path}: neither an Arrow IPC file nor an Arrow IPC stream ({exc})") from exc


class ParquetDataset(_FileSource):
    """Rows of Parquet files (read once into the Arrow cache, then memory-mapped)."""

    kind = "parquet"
    suffixes = (".parquet", ".pq")

    def _file_table(self, path: Path) -> pa.Table:
        try:
            import pyarrow.parquet as pq  # loaded for a Parquet file only: every process would pay its import

            parquet = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ConfigurationError(f"{self.where}: cannot read Parquet file {path}: {exc}") from exc
        columns = self.columns_list
        if columns:
            missing = [c for c in columns if c not in parquet.schema_arrow.names]
            if missing:
                raise ConfigurationError(
                    f"{self.where}: {path} has no column(s) {missing}; its columns are {parquet.schema_arrow.names}"
                )
        key = cache_key("parquet", [path], str(columns))
        return cached_arrow_table(
            key, lambda: parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=columns), self.where
        )
