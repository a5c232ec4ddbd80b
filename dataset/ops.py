"""Pipeline operations: map, batch, shuffle, repeat, take, skip, project, rename, zip, concat.

Each is a `Dataset` node over its children's blocks of rows (see `tessel.dataset.core`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError
from tessel.core.options import log_once
from tessel.dataset.core import ROW_ID, Block, Dataset, EpochContext, block_length, row_keys
from tessel.dataset.sampling import RowRandom, combine_ids, tag_ids
from tessel.dataset.transforms.base import RaggedRowsError, as_operations


def column_list(value: str | Sequence[str], where: str, argument: str) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigurationError(f"{where}: {argument} must be a column name or a list of names, got {value!r}")
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{where}: {argument} names a column twice: {names}")
    return names


def check_columns_exist(names: Sequence[str], available: Sequence[str], where: str, argument: str) -> None:
    missing = [n for n in names if n not in available]
    if missing:
        raise ConfigurationError(
            f"{where}: {argument} {missing} not found; the dataset's columns are {list(available)} — fix {argument} "
            f"or rename the columns first"
        )


def positive_int(value: Any, where: str, argument: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigurationError(f"{where}: {argument} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _subtree(node: Dataset) -> Iterator[Dataset]:
    yield node
    for child in node.children:
        yield from _subtree(child)


def slice_block(block: Block, start: int, stop: int | None = None) -> Block:
    return {name: values[start:stop] for name, values in block.items()}


def concat_blocks(blocks: list[Block], where: str) -> Block:
    if len(blocks) == 1:
        return blocks[0]
    merged = {}
    for name in blocks[0]:
        try:
            merged[name] = np.concatenate([b[name] for b in blocks])
        except ValueError as exc:
            shapes = sorted({b[name].shape[1:] for b in blocks})
            raise ConfigurationError(
                f"{where}: column '{name}' has rows of different shapes {shapes[:3]}, which cannot share a batch; "
                f"resize or pad them with map() before batch()"
            ) from exc
    return merged


class MapDataset(Dataset):
    """Apply a list of transforms to some columns. As many outputs as inputs replace them in place; another number
    of outputs come first, then the columns the map keeps in their order (MindSpore's MapOp::CreateFinalColMap)."""

    def __init__(self, child: Dataset, operations: Any, input_columns: Any, output_columns: Any):
        super().__init__(child)
        where = "Dataset.map"
        self.operations = as_operations(operations, where)
        names = child.get_col_names()
        self.input_columns = names[:1] if input_columns is None else column_list(input_columns, where, "input_columns")
        check_columns_exist(self.input_columns, names, where, "input_columns")
        self.output_columns = (
            list(self.input_columns) if output_columns is None else column_list(output_columns, where, "output_columns")
        )
        if len(self.output_columns) == len(self.input_columns):
            renamed = dict(zip(self.input_columns, self.output_columns))
            self._names = [renamed.get(n, n) for n in names]
        else:
            self._names = self.output_columns + [n for n in names if n not in self.input_columns]
        if len(set(self._names)) != len(self._names):
            raise ConfigurationError(
                f"{where}: output_columns {self.output_columns} collide with other columns of {names}; pick new names"
            )

    def get_col_names(self) -> list[str]:
        return list(self._names)

    def _num_rows(self) -> int:
        return self.children[0]._num_rows()

    def _signature(self) -> str:
        return f"{self.operations!r},{self.input_columns},{self.output_columns}"

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        key = ctx.stream_key(self._salt())
        for block in self.children[0]._iter_blocks(ctx):
            yield from self._apply(block, key)

    def _apply(self, block: Block, key: int) -> Iterator[Block]:
        arrays = tuple(block[c] for c in self.input_columns)
        rng = RowRandom(key, row_keys(block))
        try:
            for op in self.operations:
                arrays = op.apply(arrays, rng)
        except RaggedRowsError:
            if block_length(block) == 1:
                raise
            for i in range(block_length(block)):  # rows of different shapes: one block per row
                yield from self._apply(slice_block(block, i, i + 1), key)
            return
        except ConfigurationError as exc:
            raise ConfigurationError(f"Dataset.map(input_columns={self.input_columns}): {exc}") from exc
        if len(arrays) != len(self.output_columns):
            raise ConfigurationError(
                f"Dataset.map(input_columns={self.input_columns}): the operations return {len(arrays)} column(s) but "
                f"output_columns names {len(self.output_columns)}: {self.output_columns}; list one name per output"
            )
        rows = block_length(block)
        out = {n: v for n, v in block.items() if n not in self.input_columns}
        for name, values in zip(self.output_columns, arrays):
            if len(values) != rows:
                raise ConfigurationError(
                    f"Dataset.map: output column '{name}' has {len(values)} rows for {rows} input rows; a map must "
                    f"return one output row per input row"
                )
            out[name] = values
        yield {**{name: out[name] for name in self._names}, ROW_ID: block[ROW_ID]}


class BatchDataset(Dataset):
    """Stack `batch_size` consecutive rows into one batch-row (whose arrays gain a leading batch axis)."""

    def __init__(self, child: Dataset, batch_size: int, drop_remainder: bool):
        super().__init__(child)
        self.batch_size = positive_int(batch_size, "Dataset.batch", "batch_size")
        self.drop_remainder = bool(drop_remainder)

    def get_col_names(self) -> list[str]:
        return self.children[0].get_col_names()

    def _rows_are_batches(self) -> bool:
        return True

    def _num_rows(self) -> int:
        rows = self.children[0]._num_rows()
        return rows // self.batch_size if self.drop_remainder else -(-rows // self.batch_size)

    def _signature(self) -> str:
        return f"{self.batch_size},{self.drop_remainder}"

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        size = self.batch_size
        pending: list[Block] = []
        count = 0
        child_ctx = replace(ctx, row_multiple=ctx.row_multiple * size)
        for block in self.children[0]._iter_blocks(child_ctx):
            pending.append(block)
            count += block_length(block)
            if count < size:
                continue
            merged = concat_blocks(pending, "Dataset.batch")
            full = count // size
            yield {n: v[: full * size].reshape((full, size, *v.shape[1:])) for n, v in merged.items()}
            pending = [slice_block(merged, full * size)] if count % size else []
            count %= size
        if count and not self.drop_remainder:
            yield {n: v[None] for n, v in concat_blocks(pending, "Dataset.batch").items()}


class ShuffleDataset(Dataset):
    """Shuffle through a buffer: each output row is drawn uniformly from the next `buffer_size` rows."""

    def __init__(self, child: Dataset, buffer_size: int):
        super().__init__(child)
        self.buffer_size = positive_int(buffer_size, "Dataset.shuffle", "buffer_size", minimum=2)
        if any((getattr(node, "num_shards", None) or 1) > 1 for node in _subtree(child)):
            log_once(
                "Dataset.shuffle.sharded",
                "Dataset.shuffle(buffer_size) over a sharded source shuffles within each shard's buffer, as "
                "MindSpore does, so N ranks' batches are not one device's global batches; for that, drop "
                "shuffle() and let the source shuffle (shuffle=True): its order is global",
                logging.WARNING,
            )

    def get_col_names(self) -> list[str]:
        return self.children[0].get_col_names()

    def _num_rows(self) -> int:
        return self.children[0]._num_rows()

    def _signature(self) -> str:
        return str(self.buffer_size)

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        rng = ctx.rng(self._salt())
        buffer: Block | None = None
        for block in self.children[0]._iter_blocks(ctx):
            buffer = block if buffer is None else concat_blocks([buffer, block], "Dataset.shuffle")
            excess = block_length(buffer) - self.buffer_size
            if excess > 0:
                chosen = rng.choice(block_length(buffer), size=excess, replace=False)
                keep = np.ones(block_length(buffer), dtype=bool)
                keep[chosen] = False
                yield {n: v[chosen] for n, v in buffer.items()}
                buffer = {n: v[keep] for n, v in buffer.items()}
        if buffer is not None and block_length(buffer):
            order = rng.permutation(block_length(buffer))
            yield {n: v[order] for n, v in buffer.items()}


class RepeatDataset(Dataset):
    """Run the child `count` times per epoch; repetition r of epoch e is the child's epoch e*count + r."""

    def __init__(self, child: Dataset, count: int | None):
        super().__init__(child)
        self.count = None if count in (None, -1) else positive_int(count, "Dataset.repeat", "count")

    def get_col_names(self) -> list[str]:
        return self.children[0].get_col_names()

    def _num_rows(self) -> int:
        # An endless repeat counts one pass, as MindSpore 2.7.0's get_dataset_size (10 rows .repeat() gives 10,
        # .repeat().batch(3) 4): what Model.train takes as the steps of an epoch that runs on endlessly.
        rows = self.children[0]._num_rows()
        return rows if self.count is None else rows * self.count

    def _signature(self) -> str:
        return str(self.count)

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        repetitions = itertools.count() if self.count is None else range(self.count)
        stride = self.count or 2**32
        for r in repetitions:
            produced = False
            for block in self.children[0]._iter_blocks(ctx.with_epoch(ctx.epoch * stride + r)):
                produced = True
                yield {**block, ROW_ID: tag_ids(block[ROW_ID], r)}
            if not produced:
                raise ConfigurationError("Dataset.repeat: the repeated pipeline yields no rows; it would never end")


class TakeDataset(Dataset):
    """The first `count` rows of each epoch."""

    def __init__(self, child: Dataset, count: int):
        super().__init__(child)
        self.count = -1 if count == -1 else positive_int(count, "Dataset.take", "count")

    def get_col_names(self) -> list[str]:
        return self.children[0].get_col_names()

    def _num_rows(self) -> int:
        rows = self.children[0]._num_rows()
        return rows if self.count == -1 else min(rows, self.count)

    def _signature(self) -> str:
        return str(self.count)

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        left = self.count
        for block in self.children[0]._iter_blocks(ctx):
            rows = block_length(block)
            if left != -1 and rows >= left:
                yield slice_block(block, 0, left)
                return
            left = left - rows if left != -1 else left
            yield block


class SkipDataset(Dataset):
    """All rows of each epoch but the first `count`."""

    def __init__(self, child: Dataset, count: int):
        super().__init__(child)
        self.count = positive_int(count, "Dataset.skip", "count", minimum=0)

    def get_col_names(self) -> list[str]:
        return self.children[0].get_col_names()

    def _num_rows(self) -> int:
        rows = self.children[0]._num_rows()
        return max(0, rows - self.count)

    def _signature(self) -> str:
        return str(self.count)

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        left = self.count
        for block in self.children[0]._iter_blocks(ctx):
            rows = block_length(block)
            if left >= rows:
                left -= rows
                continue
            yield slice_block(block, left) if left else block
            left = 0


class ProjectDataset(Dataset):
    """Keep only some columns, in the given order."""

    def __init__(self, child: Dataset, columns: str | Sequence[str]):
        super().__init__(child)
        self.columns = column_list(columns, "Dataset.project", "columns")
        check_columns_exist(self.columns, child.get_col_names(), "Dataset.project", "columns")

    def get_col_names(self) -> list[str]:
        return list(self.columns)

    def _num_rows(self) -> int:
        return self.children[0]._num_rows()

    def _signature(self) -> str:
        return str(self.columns)

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        for block in self.children[0]._iter_blocks(ctx):
            yield {**{name: block[name] for name in self.columns}, ROW_ID: block[ROW_ID]}


class RenameDataset(Dataset):
    """Rename columns (input_columns[i] becomes output_columns[i])."""

    def __init__(self, child: Dataset, input_columns: Any, output_columns: Any):
        super().__init__(child)
        where = "Dataset.rename"
        self.input_columns = column_list(input_columns, where, "input_columns")
        self.output_columns = column_list(output_columns, where, "output_columns")
        if len(self.input_columns) != len(self.output_columns):
            raise ConfigurationError(f"{where}: input_columns and output_columns need the same number of names")
        names = child.get_col_names()
        check_columns_exist(self.input_columns, names, where, "input_columns")
        self._mapping = dict(zip(self.input_columns, self.output_columns))
        self._names = [self._mapping.get(n, n) for n in names]
        if len(set(self._names)) != len(self._names):
            raise ConfigurationError(f"{where}: renaming {names} gives duplicate column names {self._names}")

    def get_col_names(self) -> list[str]:
        return list(self._names)

    def _num_rows(self) -> int:
        return self.children[0]._num_rows()

    def _signature(self) -> str:
        return f"{self.input_columns},{self.output_columns}"

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        for block in self.children[0]._iter_blocks(ctx):
            yield {self._mapping.get(name, name): values for name, values in block.items()}


class ZipDataset(Dataset):
    """Rows of several datasets side by side; as many rows as the shortest."""

    def __init__(self, children: Sequence[Dataset]):
        if len(children) < 2 or not all(isinstance(c, Dataset) for c in children):
            raise ConfigurationError("zip: pass at least two datasets, e.g. ds.zip((images, labels))")
        super().__init__(*children)
        names = [n for c in children for n in c.get_col_names()]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"zip: the datasets share column names {names}; rename() them apart first")
        self._names = names

    def get_col_names(self) -> list[str]:
        return list(self._names)

    def _num_rows(self) -> int:
        return min(c._num_rows() for c in self.children)

    def _signature(self) -> str:
        return ""

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        streams = [c._iter_blocks(ctx) for c in self.children]
        heads: list[Block | None] = [None] * len(streams)
        while True:
            for i, stream in enumerate(streams):
                if heads[i] is None:
                    heads[i] = next(stream, None)
                    if heads[i] is None:
                        return
            rows = min(block_length(h) for h in heads)  # type: ignore[arg-type]
            out: Block = {}
            ids = None
            for i, head in enumerate(heads):
                part = slice_block(head, 0, rows)  # type: ignore[arg-type]
                ids = row_keys(part) if ids is None else combine_ids(ids, row_keys(part))
                out.update(part)
                heads[i] = slice_block(head, rows) if block_length(head) > rows else None  # type: ignore[arg-type]
            out[ROW_ID] = ids
            yield out


class ConcatDataset(Dataset):
    """The rows of several datasets one after another (same column names)."""

    def __init__(self, children: Sequence[Dataset]):
        if not all(isinstance(c, Dataset) for c in children):
            raise ConfigurationError("concat: every argument must be a Dataset")
        super().__init__(*children)
        first = children[0].get_col_names()
        for child in children[1:]:
            if child.get_col_names() != first:
                raise ConfigurationError(
                    f"concat: datasets have columns {first} and {child.get_col_names()}; they must match (use "
                    f"project/rename first)"
                )

    def get_col_names(self) -> list[str]:
        return self.children[0].get_col_names()

    def _num_rows(self) -> int:
        return sum(c._num_rows() for c in self.children)

    def _signature(self) -> str:
        return ""

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        # column -> (dataset index, an empty array of its first block's dtype and rank: no block is kept alive)
        first: dict[str, tuple[int, np.ndarray]] = {}
        for i, child in enumerate(self.children):
            for block in child._iter_blocks(ctx):
                for name in self.get_col_names():
                    values = block[name]
                    kind = first.setdefault(name, (i, np.empty((0, *values.shape[1:]), values.dtype)))
                    self._check_same_kind(name, *kind, i, values)
                yield {**block, ROW_ID: tag_ids(block[ROW_ID], i)}

    @staticmethod
    def _check_same_kind(name: str, i: int, a: np.ndarray, j: int, b: np.ndarray) -> None:
        """MindSpore 2.7.0's rule: a column keeps its element type and rank across the datasets concatenated (rows
        of one rank may differ in shape). Checked as rows arrive, since only then are the types known."""
        if a.dtype != b.dtype:
            raise ConfigurationError(
                f"concat: column '{name}' is {a.dtype} in dataset {i} and {b.dtype} in dataset {j}; the datasets "
                f"concatenated need the same column types — cast one side, e.g. "
                f".map(transforms.TypeCast(ms.{a.dtype}), '{name}')"
            )
        if a.ndim != b.ndim:
            raise ConfigurationError(
                f"concat: column '{name}' has rows of rank {a.ndim - 1} in dataset {i} and {b.ndim - 1} in dataset "
                f"{j}; the datasets concatenated need rows of the same rank — reshape one side with map()"
            )
