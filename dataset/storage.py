"""Column storage on Apache Arrow: sources are materialized once into an Arrow IPC file and memory-mapped.

A `ColumnTable` holds each column as numpy views over the mapped file (zero copy), so a shard that gathers its rows
touches only those rows, and repeated epochs reuse the same pages instead of growing memory. Rows of rank > 0 are
stored as Arrow's canonical `fixed_shape_tensor` extension type, so the per-row shape travels in the schema.

Cache files live in `config.get_cache_dir()`, named by a key over the source files' paths, sizes and mtimes: a
changed source file gets a new cache file. They are written to a temporary name and renamed, so ranks that
materialize the same source at once never read a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from tessel.core.errors import ConfigurationError
from tessel.dataset import config

# Bump when the layout of cache files changes, so old caches are never misread.
CACHE_FORMAT_VERSION = 1

Columns = dict[str, np.ndarray]


def to_arrow_array(name: str, values: np.ndarray) -> pa.Array:
    """One numpy column (rows on axis 0) as an Arrow array: primitive for scalar rows, fixed_shape_tensor else."""
    values = np.asarray(values)
    if values.dtype.kind in "USO":
        return pa.array(values.tolist())
    if values.dtype.byteorder == ">":
        values = values.astype(values.dtype.newbyteorder("="))
    if values.ndim == 1:
        return pa.array(values)
    if values.ndim == 0:
        raise ConfigurationError(f"column '{name}': a column needs a leading row axis, got a scalar")
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values))


def to_record_batch(columns: Mapping[str, np.ndarray]) -> pa.RecordBatch:
    """A dict of numpy columns (same number of rows) as an Arrow RecordBatch."""
    return pa.RecordBatch.from_arrays(
        [to_arrow_array(name, values) for name, values in columns.items()], names=list(columns)
    )


def _fixed_size_list_shape(arrow_type: pa.DataType) -> tuple[tuple[int, ...], pa.DataType]:
    shape: list[int] = []
    while pa.types.is_fixed_size_list(arrow_type):
        shape.append(arrow_type.list_size)
        arrow_type = arrow_type.value_type
    return tuple(shape), arrow_type


def _uniform_lists_to_numpy(name: str, array: pa.Array, place: str) -> np.ndarray:
    # Parquet has no fixed-size lists, so tensors often arrive as lists that all have the same length.
    rows, shape = len(array), []
    while pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        import pyarrow.compute as pc  # loaded on first use: its import costs every process a tenth of a second

        lengths = np.unique(pc.list_value_length(array).to_numpy(zero_copy_only=False))
        if len(lengths) > 1:
            raise ConfigurationError(
                f"{place}column '{name}' holds lists of different lengths {lengths[:5].tolist()}; rows need one "
                f"shape — pad them, or store a fixed_size_list / fixed_shape_tensor column"
            )
        shape.append(int(lengths[0]) if len(lengths) else 0)
        array = array.flatten()
    if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
        raise ConfigurationError(f"{place}column '{name}': lists of {array.type} are not supported")
    return array.to_numpy(zero_copy_only=False).reshape((rows, *shape))


def to_numpy_column(name: str, array: pa.Array, where: str = "") -> np.ndarray:
    """One Arrow array as numpy with rows on axis 0; zero copy for primitive and fixed-shape tensor columns."""
    place = f"{where}: " if where else ""
    if array.null_count:
        raise ConfigurationError(
            f"{place}column '{name}' has {array.null_count} null values; tessel datasets need dense columns — fill or "
            f"drop the nulls first (pyarrow.compute.fill_null / Table.drop_null)"
        )
    if isinstance(array.type, pa.FixedShapeTensorType):
        return array.to_numpy_ndarray()
    if pa.types.is_fixed_size_list(array.type):
        shape, value_type = _fixed_size_list_shape(array.type)
        flat = array
        for _ in shape:
            flat = flat.flatten()
        if not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)):
            raise ConfigurationError(f"{place}column '{name}': fixed-size lists of {value_type} are not supported")
        return flat.to_numpy(zero_copy_only=False).reshape((len(array), *shape))
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        return _uniform_lists_to_numpy(name, array, place)
    if pa.types.is_integer(array.type) or pa.types.is_floating(array.type) or pa.types.is_boolean(array.type):
        return array.to_numpy(zero_copy_only=False)
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return np.array(array.to_pylist(), dtype=np.str_)
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        return np.array(array.to_pylist(), dtype=np.bytes_)
    raise ConfigurationError(
        f"{place}column '{name}' has Arrow type {array.type}, which has no fixed per-row shape; store rows as "
        f"primitive values, fixed_size_list or fixed_shape_tensor (e.g. pa.FixedShapeTensorArray.from_numpy_ndarray)"
    )


def record_batch_columns(batch: pa.RecordBatch) -> Columns:
    """The inverse of `to_record_batch`: a RecordBatch as a dict of numpy columns (zero copy where possible)."""
    return {name: to_numpy_column(name, batch.column(i)) for i, name in enumerate(batch.schema.names)}


class ColumnTable:
    """Rows of named columns held as numpy chunks (views over a mapped Arrow file, or in-memory arrays)."""

    def __init__(self, chunks: Mapping[str, list[np.ndarray]], origin: str):
        self.origin = origin
        self.column_names = list(chunks)
        if not self.column_names:
            raise ConfigurationError(f"{origin}: the source has no columns")
        self._chunks = dict(chunks)
        lengths = [len(c) for c in self._chunks[self.column_names[0]]]
        self._starts = np.cumsum([0, *lengths])
        self.num_rows = int(self._starts[-1])
        self.row_bytes = sum(p[0].itemsize * int(np.prod(p[0].shape[1:])) for p in self._chunks.values())
        # (digest of the arrays, Arrow IPC stream, digest of the stream) of in-memory rows once a DatasetSpec carried
        # them (NumpySlicesDataset.inline_stream)
        self.inline_stream: tuple[bytes, bytes, bytes] | None = None
        for name, parts in self._chunks.items():
            if [len(c) for c in parts] != lengths:
                raise ConfigurationError(f"{origin}: column '{name}' has a different number of rows than the others")

    @classmethod
    def from_arrays(cls, columns: Mapping[str, np.ndarray], origin: str) -> ColumnTable:
        return cls({name: [np.asarray(values)] for name, values in columns.items()}, origin)

    @classmethod
    def from_arrow(cls, table: pa.Table, origin: str) -> ColumnTable:
        chunks = {
            name: [to_numpy_column(name, chunk, origin) for chunk in table.column(name).chunks]
            for name in table.column_names
        }
        return cls(chunks, origin)

    def row_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._chunks[name][0].shape[1:])

    def gather(self, rows: np.ndarray, columns: Iterable[str] | None = None) -> Columns:
        """The given rows (a sorted or unsorted index array) of `columns` as fresh numpy arrays."""
        names = self.column_names if columns is None else list(columns)
        if len(self._starts) == 2:
            return {name: self._chunks[name][0][rows] for name in names}
        chunk_of_row = np.searchsorted(self._starts, rows, side="right") - 1
        out = {}
        for name in names:
            first = self._chunks[name][0]
            result = np.empty((len(rows), *first.shape[1:]), dtype=first.dtype)
            for chunk_id in np.unique(chunk_of_row):
                mask = chunk_of_row == chunk_id
                result[mask] = self._chunks[name][chunk_id][rows[mask] - self._starts[chunk_id]]
            out[name] = result
        return out


def cache_key(kind: str, files: Iterable[Path], extra: str = "") -> str:
    """A file name for the cache of `files`: changes when any file's path, size or mtime changes."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{kind}|v{CACHE_FORMAT_VERSION}|{extra}".encode())
    for path in files:
        stat = path.stat()
        digest.update(f"|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return f"{kind}-{digest.hexdigest()}.arrow"


def write_ipc_file(path: Path, batches: Iterable[pa.RecordBatch]) -> None:
    """Write record batches to an Arrow IPC file atomically (temporary file in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as sink:
            writer = None
            for batch in batches:
                if writer is None:
                    writer = ipc.new_file(sink, batch.schema)
                writer.write_batch(batch)
            if writer is None:
                raise ConfigurationError(f"{path}: the source produced no rows to cache")
            writer.close()
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a cache file is as readable as its source
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_ipc_table(path: Path, origin: str) -> pa.Table:
    """Memory-map an Arrow IPC file (file format): uncompressed columns stay on the mapped pages (zero copy)."""
    try:
        with pa.memory_map(str(path), "r") as source:
            return ipc.open_file(source).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise ConfigurationError(
            f"{origin}: cannot read Arrow IPC file {path}: {exc}; check that it is an Arrow IPC *file* "
            f"(pyarrow.ipc.new_file / Feather v2)"
        ) from exc


def cached_arrow_table(key: str, build: Callable[[], Iterable[pa.RecordBatch]], origin: str) -> pa.Table:
    """The source cached under `key`, built with `build` the first time; in memory if the cache is unusable."""
    path = config.get_cache_dir() / key
    if path.is_file():
        try:
            return read_ipc_table(path, origin)
        except ConfigurationError:
            path.unlink(missing_ok=True)  # a damaged cache file is rebuilt, never trusted
    try:
        write_ipc_file(path, build())
    except OSError as exc:
        warnings.warn(
            f"{origin}: cannot write the Arrow cache {path} ({exc}); reading the source into memory instead. Set "
            f"TESSEL_CACHE to a writable directory to memory-map it.",
            stacklevel=3,
        )
        return pa.Table.from_batches(list(build()))
    return read_ipc_table(path, origin)


def cached_table(key: str, build: Callable[[], Iterable[pa.RecordBatch]], origin: str) -> ColumnTable:
    """`cached_arrow_table` as a ColumnTable."""
    return ColumnTable.from_arrow(cached_arrow_table(key, build, origin), origin)
