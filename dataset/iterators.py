"""Tuple and dict iterators over epochs (MindSpore's create_tuple_iterator / create_dict_iterator).

An iterator runs `num_epochs` epochs; a `for` loop over it ends at each epoch boundary and the next loop starts the
next epoch, as MindSpore's iterators do. Each epoch takes the dataset's next epoch number, so shuffling differs
from epoch to epoch and is the same on every rank that iterates the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError
from tessel.dataset import core


class _EpochIterator:
    def __init__(self, dataset: core.Dataset, columns: Sequence[str] | None, num_epochs: int, output_numpy: bool):
        names = dataset.get_col_names()
        self.columns = names if columns is None else ([columns] if isinstance(columns, str) else list(columns))
        missing = [c for c in self.columns if c not in names]
        if missing:
            raise ConfigurationError(
                f"create_tuple_iterator: columns {missing} are not in the dataset; its columns are {names}"
            )
        if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs == 0 or num_epochs < -1:
            raise ConfigurationError(f"num_epochs must be -1 (endless) or an int >= 1, got {num_epochs!r}")
        self._dataset = dataset
        self._epochs_left = None if num_epochs == -1 else num_epochs
        self._output_numpy = output_numpy
        self._rows: Iterator[list[np.ndarray]] | None = None
        self._stopped = False  # stop() ended it early: later loops end at once

    def __iter__(self) -> _EpochIterator:
        return self

    def _next_row(self) -> list[Any]:
        if self._rows is None:
            if self._epochs_left == 0:
                if self._stopped:
                    raise StopIteration
                raise ConfigurationError(  # MindSpore: "EOF buffer encountered. User tries to fetch data beyond ..."
                    "the iterator ran all its epochs (num_epochs of create_tuple_iterator / create_dict_iterator); a "
                    "loop over it beyond them gets no data. Pass num_epochs=-1 (endless) or the number of epochs "
                    "you loop over, or create a new iterator"
                )
            self._rows = self._dataset._iter_rows(self._dataset._claim_epoch(), self.columns)
        try:
            row = next(self._rows)
        except StopIteration:
            self._rows = None
            if self._epochs_left is not None:
                self._epochs_left -= 1
            raise
        if self._output_numpy:
            return row
        return [core.to_tensor(value) for value in row]

    def stop(self) -> None:
        """Release the current epoch's resources early."""
        if self._rows is not None:
            self._rows.close()  # type: ignore[attr-defined]
            self._rows = None
        self._epochs_left, self._stopped = 0, True


class TupleIterator(_EpochIterator):
    """Yields each row as a list with one value per column."""

    def __next__(self) -> list[Any]:
        return self._next_row()


class DictIterator(_EpochIterator):
    """Yields each row as a dict {column name: value}."""

    def __next__(self) -> dict[str, Any]:
        return dict(zip(self.columns, self._next_row()))
