"""The Dataset base class: a lazy tree of sources and operations that streams blocks of rows.

Every node yields *blocks*: dicts of column name -> numpy array whose axis 0 runs over rows. Blocks keep the
per-row Python work off the hot path — transforms run once per block, and `batch` regroups rows into
batch-rows by reshaping. An epoch is a pure function of (seed, epoch): sources permute and shard by it, random
operations draw from streams derived from it, so every rank and every process (the daemon rebuilding a pipeline
from its spec) sees the same data.

Every block also carries its rows' ids in the hidden column ROW_ID (see `tessel.dataset.sampling.RowRandom`): random
transforms draw by row id, so a row is augmented alike whichever shard or block it travels in. Operations keep the
column with the rows; iteration leaves it out.

Iteration hands each output array to `to_tensor`, the one hook that decides what users receive.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tessel.core import hooks
from tessel.core.errors import ConfigurationError
from tessel.core.options import check_type, keyword_options, log_once, not_supported_yet
from tessel.dataset import config
from tessel.dataset.sampling import random_stream, salt_of, stream_key

if TYPE_CHECKING:
    import pyarrow as pa

    from tessel.dataset.iterators import DictIterator, TupleIterator
    from tessel.v1 import dataset_pb2

Block = dict[str, np.ndarray]

# The hidden column of row ids (uint64; batch-rows hold one id per row batched). No user column can be named so.
ROW_ID = "\x00row_id"

# Sources cut blocks of about this many bytes: large enough to amortize per-block Python work, small enough that a
# block and its float32 transforms stay in the L2 cache (measured: 128 KiB beats 1 MiB by ~1.3x on MNIST).
TARGET_BLOCK_BYTES = 128 << 10


# MindSpore's options for its dataset workers: the rows are the same with or without them, and tessel reads and maps
# rows in the process that consumes them (the script's, or the daemon's in sink mode).
_WORKERS = "tessel reads and maps rows in the process that consumes them, with the same rows as a run with workers"
WORKER_HINTS = {"python_multiprocessing": _WORKERS, "max_rowsize": _WORKERS}
_COLUMN_ORDER = ((None,), "MindSpore 2.0 dropped it: choose and order columns with Dataset.project()")
SOURCE_UNSUPPORTED = {"cache": ((None,), "tessel has no dataset cache server; drop cache=")}
_MAP_UNSUPPORTED = {
    **SOURCE_UNSUPPORTED,
    "callbacks": ((None,), "dataset callbacks (DSCallback) are not run; watch training with a train Callback"),
    "offload": ((None, False), "tessel runs every map operation on the host; drop offload="),
    "column_order": _COLUMN_ORDER,
}
_BATCH_UNSUPPORTED = {
    "per_batch_map": ((None,), "combine or pad rows with map() before batch()"),
    "input_columns": ((None,), "it names per_batch_map's inputs; combine rows with map() before batch()"),
    "output_columns": ((None,), "it names per_batch_map's outputs; combine rows with map() before batch()"),
    "pad_info": ((None,), "pad rows to one shape with map() before batch()"),
    "column_order": _COLUMN_ORDER,
}


def check_workers(call: str, num_parallel_workers: Any) -> None:
    """MindSpore's num_parallel_workers: checked as MindSpore checks it (an int >= 1, or None), then logged once as
    changing nothing here (see WORKER_HINTS)."""
    if num_parallel_workers is None:
        return
    if isinstance(num_parallel_workers, bool) or not isinstance(num_parallel_workers, int) or num_parallel_workers < 1:
        raise ConfigurationError(
            f"{call}: num_parallel_workers must be an int >= 1 or None, got {num_parallel_workers!r}"
        )
    log_once(
        f"{call}.num_parallel_workers",
        f"{call}: num_parallel_workers={num_parallel_workers} has no effect in tessel; {_WORKERS}",
        logging.INFO,
    )


def to_tensor(array: np.ndarray) -> Any:
    """What iterators return for each column when output_numpy=False: the SDK's Tensor once `import tessel` ran
    (which any `import tessel.dataset` does), whatever the script imported next; else the numpy array."""
    return hooks.dataset_output(array)


@dataclass(frozen=True)
class EpochContext:
    """What one pass over the pipeline depends on; `row_multiple` asks sources for blocks of whole batches."""

    seed: int
    epoch: int
    row_multiple: int = 1

    def rng(self, salt: int) -> np.random.Generator:
        return random_stream(self.seed, self.epoch, salt)

    def stream_key(self, salt: int) -> int:
        """The key of the per-row random numbers (`RowRandom`) of the operation `salt` in this epoch."""
        return stream_key(self.seed, self.epoch, salt)

    def with_epoch(self, epoch: int) -> EpochContext:
        return replace(self, epoch=epoch)


def block_rows(row_bytes: int, row_multiple: int) -> int:
    """Rows per source block: about TARGET_BLOCK_BYTES, rounded down to a multiple of `row_multiple`."""
    rows = max(1, TARGET_BLOCK_BYTES // max(1, row_bytes))
    return max(row_multiple, rows // row_multiple * row_multiple)


def block_length(block: Block) -> int:
    return len(next(iter(block.values())))


def row_keys(block: Block) -> np.ndarray:
    """One id per row of `block` (a batch-row is named by its first row's id)."""
    ids = block[ROW_ID]
    return ids if ids.ndim == 1 else ids.reshape(len(ids), -1)[:, 0]


def user_columns(block: Block) -> Block:
    """The block without its hidden row ids."""
    return {name: values for name, values in block.items() if name != ROW_ID}


def block_row_bytes(block: Block) -> int:
    return sum(a.itemsize * int(np.prod(a.shape[1:])) for a in block.values())


class Dataset:
    """Base of every source and operation; the MindSpore dataset API lives here."""

    def __init__(self, *children: Dataset):
        self.children: tuple[Dataset, ...] = children
        self._next_epoch = max((c._next_epoch for c in children), default=0)
        self._seed: int | None = next((c._seed for c in children if c._seed is not None), None)
        self._probe: list[np.ndarray] | None = None
        self._salt_value: int | None = None

    # -- what subclasses provide ------------------------------------------------------------------------------
    def get_col_names(self) -> list[str]:
        """Names of the output columns, in order."""
        raise NotImplementedError

    def _iter_blocks(self, ctx: EpochContext) -> Iterator[Block]:
        raise NotImplementedError

    def _num_rows(self) -> int:
        """Rows (batches, after batch) per epoch; an endless repeat counts one pass of what it repeats."""
        raise NotImplementedError

    def _signature(self) -> str:
        """This node's parameters as stable text (names its random streams)."""
        raise NotImplementedError

    def _rows_are_batches(self) -> bool:
        return bool(self.children) and self.children[0]._rows_are_batches()

    # -- pipeline operations (MindSpore names and arguments) ---------------------------------------------------
    def map(
        self,
        operations: Any,
        input_columns: str | Sequence[str] | None = None,
        output_columns: str | Sequence[str] | None = None,
        column_order: Sequence[str] | None = None,
        num_parallel_workers: int | None = None,
        **options: Any,
    ) -> Dataset:
        """Apply transforms to `input_columns` (default: the first column) of every row. The rows come out the same
        whatever MindSpore's worker options say (num_parallel_workers, python_multiprocessing, max_rowsize): tessel
        maps rows in the process that reads them; cache, callbacks and offload are not supported yet. The arguments
        are in MindSpore 2.7.0's order, column_order (dropped: use project()) fourth."""
        from tessel.dataset.ops import MapDataset

        check_workers("Dataset.map", num_parallel_workers)
        keyword_options("Dataset.map", {**options, "column_order": column_order}, WORKER_HINTS, _MAP_UNSUPPORTED)
        return MapDataset(self, operations, input_columns, output_columns)

    def batch(
        self, batch_size: int, drop_remainder: bool = False, num_parallel_workers: int | None = None, **options: Any
    ) -> Dataset:
        """Stack `batch_size` consecutive rows into one row; the last, shorter batch is dropped if drop_remainder.
        MindSpore's worker options change nothing here (see map); per_batch_map and pad_info are not supported yet."""
        from tessel.dataset.ops import BatchDataset

        if callable(batch_size):
            raise not_supported_yet("Dataset.batch(batch_size=<callable>)", "give the batch size as an int")
        if not isinstance(batch_size, (int, np.integer)):  # MindSpore 2.7.0: TypeError for batch(2.0)
            raise TypeError(f"Dataset.batch: batch_size must be an int, got {type(batch_size).__name__} {batch_size!r}")
        check_type(drop_remainder, bool, "Dataset.batch", "drop_remainder")
        check_workers("Dataset.batch", num_parallel_workers)
        keyword_options("Dataset.batch", options, WORKER_HINTS, _BATCH_UNSUPPORTED)
        return BatchDataset(self, batch_size, drop_remainder)

    def shuffle(self, buffer_size: int) -> Dataset:
        """Shuffle rows through a buffer of `buffer_size` rows, reshuffled every epoch."""
        from tessel.dataset.ops import ShuffleDataset

        return ShuffleDataset(self, buffer_size)

    def repeat(self, count: int | None = None) -> Dataset:
        """Repeat the pipeline `count` times per epoch (None or -1: endlessly); each repetition reshuffles."""
        from tessel.dataset.ops import RepeatDataset

        return RepeatDataset(self, count)

    def take(self, count: int = -1) -> Dataset:
        """The first `count` rows (-1: all)."""
        from tessel.dataset.ops import TakeDataset

        return TakeDataset(self, count)

    def skip(self, count: int) -> Dataset:
        """All rows but the first `count`."""
        from tessel.dataset.ops import SkipDataset

        return SkipDataset(self, count)

    def project(self, columns: str | Sequence[str]) -> Dataset:
        """Keep only `columns`, in that order."""
        from tessel.dataset.ops import ProjectDataset

        return ProjectDataset(self, columns)

    def rename(self, input_columns: str | Sequence[str], output_columns: str | Sequence[str]) -> Dataset:
        """Rename columns."""
        from tessel.dataset.ops import RenameDataset

        return RenameDataset(self, input_columns, output_columns)

    def filter(self, predicate: Any = None, input_columns: Any = None, num_parallel_workers: Any = None) -> Dataset:
        raise not_supported_yet("Dataset.filter", "drop the rows before building the dataset, or map them instead")

    def split(self, sizes: Any, randomize: bool = True) -> list[Dataset]:
        raise not_supported_yet("Dataset.split", "build one dataset per part (e.g. NumpySlicesDataset of each slice)")

    def padded_batch(self, batch_size: Any, *args: Any, **kwargs: Any) -> Dataset:
        raise not_supported_yet("Dataset.padded_batch", "pad rows to one shape with map() before batch()")

    def bucket_batch_by_length(self, column_names: Any, bucket_boundaries: Any, *args: Any, **kwargs: Any) -> Dataset:
        raise not_supported_yet(
            "Dataset.bucket_batch_by_length", "pad rows to one length with map() and batch() them, or sort them first"
        )

    def zip(self, datasets: Dataset | Sequence[Dataset]) -> Dataset:
        """Rows side by side with those of `datasets` (column names must differ); as long as the shortest."""
        from tessel.dataset.ops import ZipDataset

        others = [datasets] if isinstance(datasets, Dataset) else list(datasets)
        return ZipDataset([self, *others])

    def concat(self, datasets: Dataset | Sequence[Dataset]) -> Dataset:
        """The rows of this dataset followed by those of `datasets` (same columns)."""
        from tessel.dataset.ops import ConcatDataset

        others = [datasets] if isinstance(datasets, Dataset) else list(datasets)
        return ConcatDataset([self, *others])

    def __add__(self, other: Dataset) -> Dataset:
        return self.concat(other)

    # -- metadata ---------------------------------------------------------------------------------------------
    def get_dataset_size(self) -> int:
        """Rows per epoch — batches, once batched (what one epoch of Model.train steps through)."""
        return self._num_rows()

    def get_batch_size(self) -> int:
        """The batch size of the nearest batch() (1 if none); through zip and concat, that of the last dataset."""
        from tessel.dataset.ops import BatchDataset

        node: Dataset = self
        while node.children and not isinstance(node, BatchDataset):
            node = node.children[-1]  # zip and concat: the last dataset's, as MindSpore 2.7.0 measures
        return node.batch_size if isinstance(node, BatchDataset) else 1

    def get_repeat_count(self) -> int:
        from tessel.dataset.ops import RepeatDataset

        node: Dataset = self
        while node.children and not isinstance(node, RepeatDataset):
            node = node.children[0]
        return (node.count or -1) if isinstance(node, RepeatDataset) else 1

    def output_shapes(self, estimate: bool = False) -> list[list[int]]:
        """Shape of each output column of one row (of one batch, once batched); [] when the pipeline yields no rows,
        as MindSpore. With `estimate`, one pass over the pipeline: a dimension that differs between rows is None
        (MindSpore 2.7.0: a last, shorter batch of 10 rows in threes gives [[None]])."""
        check_type(estimate, bool, "Dataset.output_shapes", "estimate")
        if not estimate:
            return [list(a.shape) for a in self._first_row()]
        shapes: list[list[int | None]] = []
        for row in self._iter_rows(self._next_epoch, self.get_col_names()):
            if not shapes:
                shapes = [list(a.shape) for a in row]
            for name, shape, array in zip(self.get_col_names(), shapes, row):
                if len(shape) != array.ndim:
                    raise ConfigurationError(
                        f"Dataset.output_shapes(estimate=True): column '{name}' has rows of rank {len(shape)} and "
                        f"{array.ndim}; every row of a column needs one rank (MindSpore's rule) — reshape with map()"
                    )
                shape[:] = [d if d == n else None for d, n in zip(shape, array.shape)]
        return shapes

    def num_classes(self) -> None:
        """None: MindSpore 2.7.0 counts classes only for folder-per-class sources (ImageFolderDataset and the like),
        which tessel does not have; for its other sources, MNIST included, it gives None too."""
        return None

    def output_types(self) -> list[np.dtype]:
        """Element type of each output column ([] when the pipeline yields no rows)."""
        return [a.dtype for a in self._first_row()]

    def _first_row(self) -> list[np.ndarray]:
        if self._probe is None:
            rows = self._iter_rows(self._next_epoch, self.get_col_names())
            first = next(rows, None)
            rows.close()
            self._probe = [] if first is None else first
        return self._probe

    def _where(self) -> str:
        return type(self).__name__

    def _describe(self) -> str:
        children = ",".join(c._describe() for c in self.children)
        return f"{type(self).__name__}({self._signature()})[{children}]"

    def _salt(self) -> int:
        """A stable number naming this node's random streams (nodes never change after construction)."""
        if self._salt_value is None:
            self._salt_value = salt_of(self._describe())
        return self._salt_value

    # -- iteration ---------------------------------------------------------------------------------------------
    def _effective_seed(self) -> int:
        return config.get_seed() if self._seed is None else self._seed

    def resume_at_epoch(self, epoch: int) -> None:
        """Resuming training at `epoch` (0-based): the next epoch this pipeline yields is that epoch, with that
        epoch's shuffle order, as if the epochs before had run here (Model.train(initial_epoch=...) calls it)."""
        if epoch < 0:
            raise ConfigurationError(f"resume_at_epoch: epoch must be >= 0, got {epoch}")
        self._next_epoch = max(self._next_epoch, epoch)

    def _claim_epoch(self) -> int:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return epoch

    def _iter_rows(self, epoch: int, columns: Sequence[str]) -> Iterator[list[np.ndarray]]:
        for block in self._iter_blocks(EpochContext(self._effective_seed(), epoch)):
            arrays = [block[c] for c in columns]
            for i in range(len(arrays[0])):
                yield [a[i, ...] for a in arrays]

    def create_tuple_iterator(
        self,
        columns: Sequence[str] | None = None,
        num_epochs: int = -1,
        output_numpy: bool = False,
        do_copy: bool = True,
    ) -> TupleIterator:
        """An iterator of rows as lists (one entry per column), over `num_epochs` epochs (-1: endless)."""
        from tessel.dataset.iterators import TupleIterator

        return TupleIterator(self, columns, num_epochs, output_numpy)

    def create_dict_iterator(
        self, num_epochs: int = -1, output_numpy: bool = False, do_copy: bool = True
    ) -> DictIterator:
        """An iterator of rows as dicts {column name: value}."""
        from tessel.dataset.iterators import DictIterator

        return DictIterator(self, None, num_epochs, output_numpy)

    def __iter__(self) -> TupleIterator:
        return self.create_tuple_iterator(num_epochs=1)

    def iter_record_batches(self, epoch: int | None = None) -> Iterator[pa.RecordBatch]:
        """Feed mode: one epoch as Arrow RecordBatches — one per batch once batched, else one per block of rows."""
        from tessel.dataset.storage import to_record_batch

        epoch = self._claim_epoch() if epoch is None else epoch
        batched = self._rows_are_batches()
        for block in self._iter_blocks(EpochContext(self._effective_seed(), epoch)):
            columns = user_columns(block)
            if not batched:
                yield to_record_batch(columns)
                continue
            for i in range(block_length(block)):
                yield to_record_batch({name: values[i] for name, values in columns.items()})

    # -- sink mode ---------------------------------------------------------------------------------------------
    def to_spec(self) -> dataset_pb2.DatasetSpec:
        """The pipeline as a protobuf DatasetSpec that `tessel.dataset.from_spec` rebuilds in another process."""
        from tessel.dataset.spec import to_spec

        return to_spec(self)

    def is_serializable(self) -> bool:
        """True when `to_spec` works (sink mode); False when the pipeline calls Python code (feed mode)."""
        from tessel.dataset.spec import unserializable_reason

        return unserializable_reason(self) is None
