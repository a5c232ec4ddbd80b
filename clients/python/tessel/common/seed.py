"""The global seed: `set_seed` fixes parameter initialisation and the dataset shuffle alike.

Every initializer draws from its own stream, numbered in creation order: stream k of seed s is the same on every
rank and every run, so all ranks build identical parameters. Without `set_seed` a fixed default seed is used
(MindSpore draws a random one per process, which would give ranks different parameters).
"""

from __future__ import annotations

import numpy as np

from tessel.core.errors import ConfigurationError

DEFAULT_SEED = 0
_MAX_SEED = 2**32 - 1
_seed: int | None = None
_streams = 0
_op_streams: dict[int, np.random.Generator] = {}  # eager draws of seeded random ops, by op seed (see op_stream)


def set_seed(seed: int) -> None:
    """Seed parameter initializers, Dropout and the dataset shuffle (MindSpore `set_seed`).

    >>> import tessel as ms
    >>> ms.set_seed(1)
    """
    global _seed, _streams
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ConfigurationError(f"set_seed: seed must be an int in [0, {_MAX_SEED}], got {seed!r}; e.g. set_seed(1)")
    from tessel.dataset import config

    _seed, _streams = seed, 0
    _op_streams.clear()  # set_seed again replays the same masks
    config.set_seed(seed)


def get_seed() -> int | None:
    """The seed given to `set_seed`, or None when it was never called."""
    return _seed


def next_stream_key() -> list[int]:
    """The key of the next random stream in creation order under the global seed (np.random.default_rng(key))."""
    global _streams
    _streams += 1
    return [DEFAULT_SEED if _seed is None else _seed, _streams]


def next_stream() -> np.random.Generator:
    """A fresh random stream, the next in creation order under the global seed."""
    return np.random.default_rng(next_stream_key())


def next_op_seed() -> int:
    """A deterministic seed for a random op (Dropout), the next in creation order."""
    return int(next_stream().integers(1, 2**31 - 1))


def op_stream(op_seed: int) -> np.random.Generator:
    """The eager stream of a random op with seed `op_seed` (ops.dropout(seed=...), nn.Dropout in PYNATIVE_MODE),
    kept across calls so that each call draws the next mask: the n-th call after set_seed draws the same mask in
    every run."""
    if op_seed not in _op_streams:
        _op_streams[op_seed] = np.random.default_rng([DEFAULT_SEED if _seed is None else _seed, op_seed])
    return _op_streams[op_seed]
