"""Process-wide dataset settings: the shuffle seed and the cache directory.

The global shuffle order of every source is a function of (seed, epoch) only, so every rank that uses the same seed
sees the same permutation and its shard (rows k, k+N, k+2N, ... of that permutation) is disjoint from the others.
Unlike MindSpore, whose default seed draws a fresh random value per process (so shuffled shards would overlap unless
the user calls `set_seed`), tessel's default seed is a fixed value: data-parallel ranks agree out of the box.

>>> import tessel.dataset as ds
>>> ds.config.set_seed(42)
>>> ds.config.get_seed()
42
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tessel.core.errors import ConfigurationError
from tessel.core.options import log_once

# MindSpore's config seed default (std::mt19937's default seed); here it is used as-is instead of meaning "random".
DEFAULT_SEED = 5489
_MAX_SEED = 2**32 - 1
_seed = DEFAULT_SEED
_eager_calls = 0


def set_seed(seed: int) -> None:
    """Set the seed of every dataset shuffle, sampler and random transform (MindSpore `ds.config.set_seed`)."""
    global _seed, _eager_calls
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ConfigurationError(
            f"ds.config.set_seed: seed must be an int in [0, {_MAX_SEED}], got {seed!r}; pass e.g. set_seed(1)"
        )
    _seed = seed
    _eager_calls = 0


def get_seed() -> int:
    """The seed in effect (`DEFAULT_SEED` unless `set_seed` was called)."""
    return _seed


def next_eager_call() -> tuple[int, int]:
    """(seed, n) for the n-th eager transform call since the seed was last set: its random numbers' stream."""
    global _eager_calls
    _eager_calls += 1
    return _seed, _eager_calls


def get_cache_dir() -> Path:
    """Where sources are materialized as Arrow IPC files: $TESSEL_CACHE, else ~/.cache/tessel (read on each call)."""
    configured = os.environ.get("TESSEL_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "tessel"


_workers = 8  # MindSpore's default
_prefetch = 16  # MindSpore's default


def set_num_parallel_workers(num: int) -> None:
    """MindSpore's default worker count of every dataset op: checked as MindSpore checks it, then without effect
    (tessel reads and maps rows in the process that consumes them: the rows are those a run with workers gives)."""
    global _workers
    from tessel.dataset.core import check_workers

    check_workers("ds.config.set_num_parallel_workers", num)
    _workers = num


def get_num_parallel_workers() -> int:
    return _workers


def set_prefetch_size(size: int) -> None:
    """MindSpore's per-op queue size: checked (an int >= 1), without effect (no op queues rows here)."""
    global _prefetch
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigurationError(f"ds.config.set_prefetch_size: size must be an int >= 1, got {size!r}")
    log_once(
        "ds.config.set_prefetch_size",
        f"ds.config.set_prefetch_size({size}) has no effect in tessel: no dataset op queues rows ahead",
        logging.INFO,
    )
    _prefetch = size


def get_prefetch_size() -> int:
    return _prefetch
