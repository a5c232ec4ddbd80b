"""Sink mode's data side: a daemon reads its own shard of a declarative pipeline, batch after batch, epoch after
epoch, with no round trip to the client. The pipeline is rebuilt from its DatasetSpec (protobuf, never pickle).

    reader = ShardReader("train", spec)        # spec: a DatasetSpec (Dataset.to_spec())
    image, label = reader.next()               # the next batch of this shard, across epochs
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from tessel.core.errors import ConfigurationError
from tessel.dataset.spec import InlineCache, from_spec


class ShardReader:
    """Endless iteration over epochs of a pipeline, starting at the spec's epoch."""

    def __init__(self, name: str, spec, columns: Sequence[str] = (), inline: InlineCache | None = None):
        self.name = name
        self.dataset = from_spec(spec, inline)
        names = self.dataset.get_col_names()
        self.columns = list(columns) or names
        missing = [c for c in self.columns if c not in names]
        if missing:
            raise ConfigurationError(f"dataset {name!r}: columns {missing} are not in the pipeline's {names}")
        self.batches_per_epoch = self.dataset.get_dataset_size()
        if self.batches_per_epoch == 0:
            raise ConfigurationError(f"dataset {name!r} yields no batch per epoch; check num_samples / batch size")
        self.epoch = self.dataset._claim_epoch()
        self._rows: Iterator[list[np.ndarray]] = self.dataset._iter_rows(self.epoch, self.columns)

    def next(self) -> list[np.ndarray]:
        try:
            return next(self._rows)
        except StopIteration:
            self.epoch = self.dataset._claim_epoch()
            self._rows = self.dataset._iter_rows(self.epoch, self.columns)
            return next(self._rows)
