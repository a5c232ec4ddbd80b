"""GeneratorDataset: rows produced by Python code (feed mode only — a daemon cannot run it).

The source is a random-access object (`__getitem__` and `__len__`: shuffled and sharded by index like every other
source), an iterable, or a callable returning an iterator (read in order; no shuffle or shards, as in MindSpore).

>>> data = GeneratorDataset(lambda: ((i, i * i) for i in range(3)), column_names=["x", "y"])
>>> [int(y) for x, y in data.create_tuple_iterator(output_numpy=True)]
[0, 1, 4]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError
from tessel.core.options import check_type, keyword_options, not_supported_yet
from tessel.dataset.core import ROW_ID, WORKER_HINTS, Block, Dataset, EpochContext, block_rows, check_workers
from tessel.dataset.ops import column_list
from tessel.dataset.sampling import ShardShares, check_sampling_args, sharded_rows, sharded_size
from tessel.dataset.transforms.base import RaggedRowsError, resolve_dtype, stack_rows


class GeneratorDataset(Dataset):
    """Rows from a Python source; each item is a tuple with one array-like per column."""

    def __init__(
        self,
        source: Any,
        column_names: str | list[str] | None = None,
        column_types: list[Any] | None = None,
        schema: Any = None,
        num_samples: int | None = None,
        num_parallel_workers: int = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        num_shards: int | None = None,
        shard_id: int | None = None,
        python_multiprocessing: bool = True,
        max_rowsize: int | None = None,
    ):
        super().__init__()
        where = "GeneratorDataset"
        check_workers(where, None if num_parallel_workers == 1 else num_parallel_workers)
        if schema is not None:
            raise not_supported_yet(
                f"{where}(schema=...)", "tessel has no dataset Schema; give column_names (and column_types) instead"
            )
        if not isinstance(python_multiprocessing, bool):
            raise ConfigurationError(
                f"{where}: python_multiprocessing must be a bool (MindSpore's default True), "
                f"got {python_multiprocessing!r}"
            )
        if not python_multiprocessing:  # True is MindSpore's default; False changes nothing here either
            keyword_options(where, {"python_multiprocessing": python_multiprocessing}, WORKER_HINTS)
        if max_rowsize is not None:
            keyword_options(where, {"max_rowsize": max_rowsize}, WORKER_HINTS)
        if column_names is None:
            raise ConfigurationError(f"{where}: column_names is required, e.g. column_names=['data', 'label']")
        if sampler is not None:
            raise ConfigurationError(f"{where}: sampler= is not supported; use shuffle/num_samples/num_shards/shard_id")
        self.column_names = column_list(column_names, where, "column_names")
        self.column_types = None
        if column_types is not None:
            if len(column_types) != len(self.column_names):
                raise ConfigurationError(
                    f"{where}: {len(column_types)} column_types for {len(self.column_names)} columns; give one each"
                )
            if any(isinstance(t, (str, type, np.dtype)) for t in column_types):
                raise not_supported_yet(
                    f"{where}(column_types={column_types!r})",
                    "column_types takes MindSpore dtypes (MindSpore 2.7.0 raises NotImplementedError for numpy types "
                    "and names too); use e.g. ms.int32",
                )
            self.column_types = [resolve_dtype(t, where) for t in column_types]
        check_type(shuffle, (bool, type(None)), where, "shuffle")
        self.source = source
        self.random_access = hasattr(source, "__getitem__") and hasattr(source, "__len__")
        self.num_shards, self.shard_id = check_sampling_args(where, num_samples, num_shards, shard_id)
        self.num_samples = num_samples or None
        if not self.random_access:
            if not (callable(source) or hasattr(source, "__iter__")):
                raise ConfigurationError(
                    f"{where}: source must be random access (__getitem__ and __len__), iterable, or a callable that "
                    f"returns an iterator; got {type(source).__name__}"
                )
            if shuffle or self.num_shards is not None:
                raise ConfigurationError(
                    f"{where}: shuffle=True and num_shards/shard_id need a random-access source (__getitem__ and "
                    f"__len__); this source is only iterable — give it both methods or pass shuffle=False"
                )
        self.shuffle_flag = self.random_access if shuffle is None else bool(shuffle)
        self.shard_shares: ShardShares | None = None  # uneven shards (tessel.dataset.parallel.with_shares)
        self._iterable_rows: int | None = None

    def get_col_names(self) -> list[str]:
        return list(self.column_names)

    def _rows_are_batches(self) -> bool:
        return False

    def _signature(self) -> str:
        name = getattr(self.source, "__qualname__", type(self.source).__qualname__)
        # Sharding is left out: the random streams it names must be those of one device reading every shard.
        return f"{name},{self.shuffle_flag},{self.num_samples}"

    def _num_rows(self) -> int:
        if self.random_access:
            return sharded_size(self, len(self.source))
        if self._iterable_rows is None:
            # Like MindSpore, an iterable's length is found by running it once.
            total = len(self.source) if hasattr(self.source, "__len__") else sum(1 for _ in self._items())
            self._iterable_rows = min(total, self.num_samples) if self.num_samples else total
        return self._iterable_rows

    def _items(self) -> Iterator[Any]:
        return iter(self.source() if callable(self.source) and not hasattr(self.source, "__iter__") else self.source)

    def _rows(self, ctx: EpochContext) -> Iterator[tuple[int, tuple[np.ndarray, ...]]]:
        """(row id, row): the index the row was read at, or its position in the iterable's stream."""
        if self.random_access:
            for index in sharded_rows(self, len(self.source), ctx.seed, ctx.epoch):
                yield int(index), self._as_row(self.source[int(index)])
            return
        for count, item in enumerate(self._items()):
            if self.num_samples and count >= self.num_samples:
                return
            yield count, self._as_row(item)

    def _as_row(self, item: Any) -> tuple[np.ndarray, ...]:
        # MindSpore's _convert_row: a tuple or a list is one value per column, anything else one column; a Tensor
        # is its numpy value, anything else np.array(value) (bytes are numpy bytes_, dtype S: MindSpore 2.7.0 gives
        # S2 for b"ab")
        values = tuple(item) if isinstance(item, (tuple, list)) else (item,)
        if len(values) != len(self.column_names):
            raise ConfigurationError(
                f"GeneratorDataset: the source yields {len(values)} value(s) per row but column_names has "
                f"{len(self.column_names)}: {self.column_names}; yield a tuple with one value per column"
            )
        row = tuple(np.asarray(_column_value(v)) for v in values)
        for name, value, dtype in zip(self.column_names, row, self.column_types or ()):
            if value.dtype != dtype:  # MindSpore 2.7.0 checks column_types, it does not cast (a Python int is int64)
                raise ConfigurationError(
                    f"GeneratorDataset: column '{name}' is declared {dtype} in column_types but the source returned "
                    f"{value.dtype}; return {dtype} values (e.g. np.{dtype}(x)) or cast with "
                    f".map(transforms.TypeCast(ms.{dtype}), '{name}')"
                )
        return row

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        ids: list[int] = []
        pending: list[tuple[np.ndarray, ...]] = []
        size = 0
        for row_id, row in self._rows(ctx):
            if not pending:
                size = block_rows(sum(v.nbytes for v in row), ctx.row_multiple)
            ids.append(row_id)
            pending.append(row)
            if len(pending) >= size:
                yield from self._blocks(ids, pending)
                ids, pending = [], []
        if pending:
            yield from self._blocks(ids, pending)

    def _blocks(self, ids: list[int], rows: list[tuple[np.ndarray, ...]]) -> Iterator[Block]:
        row_ids = np.array(ids, dtype=np.uint64)
        try:
            yield {**dict(zip(self.column_names, stack_rows(rows, "GeneratorDataset"))), ROW_ID: row_ids}
        except RaggedRowsError:
            for i, row in enumerate(rows):  # rows of different shapes cannot share an array: one block per row
                yield {**{name: value[None] for name, value in zip(self.column_names, row)}, ROW_ID: row_ids[i : i + 1]}


def _column_value(value: Any) -> Any:
    return value.asnumpy() if hasattr(value, "asnumpy") else value
