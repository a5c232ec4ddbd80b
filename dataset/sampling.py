"""Which rows a shard reads in an epoch — MindSpore's DistributedSampler rule — and the seeded random streams.

Shard k of N over n rows reads positions (k + N*j) mod n for j = 0 .. ceil(n/N)-1 (short shards wrap round to the
first rows, so every shard has the same length). With shuffle the positions index a permutation of all n rows that
depends on (seed, epoch) only — never on the shard — so the N shards of an epoch are disjoint and cover the data on
every rank, exactly as MindSpore's DistributedSampler shuffles its full index list with the shared seed.

>>> shard_rows(10, num_shards=3, shard_id=1, shuffle=False, seed=0, epoch=0).tolist()
[1, 4, 7, 0]
"""

from __future__ import annotations

import hashlib

import numpy as np

from tessel.core.errors import ConfigurationError


def random_stream(seed: int, epoch: int, *salt: int) -> np.random.Generator:
    """A generator that depends only on (seed, epoch, salt…): the same on every rank and in every process."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, *salt])))


def salt_of(description: str) -> int:
    """A stable 64-bit integer for a text (Python's hash() is randomized per process, so it cannot be used)."""
    return int.from_bytes(hashlib.blake2b(description.encode(), digest_size=8).digest(), "little")


def epoch_permutation(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """The global shuffle order of an epoch: a permutation of range(num_rows) that is a function of (seed, epoch)."""
    return random_stream(seed, epoch).permutation(num_rows)


def shard_size(num_rows: int, num_shards: int | None, num_samples: int | None) -> int:
    """Rows one shard yields per epoch: ceil(n/N), capped by num_samples (MindSpore's CalculateNumSamples)."""
    size = -(-num_rows // (num_shards or 1))
    return min(size, num_samples) if num_samples else size


def shard_rows(
    num_rows: int,
    num_shards: int | None,
    shard_id: int | None,
    shuffle: bool,
    seed: int,
    epoch: int,
    num_samples: int | None = None,
) -> np.ndarray:
    """Row indices shard `shard_id` of `num_shards` reads in `epoch`, in reading order (see the module docstring)."""
    shards, shard = num_shards or 1, shard_id or 0
    positions = (shard + shards * np.arange(shard_size(num_rows, shards, num_samples), dtype=np.int64)) % num_rows
    if shuffle:
        return epoch_permutation(num_rows, seed, epoch)[positions]
    return positions


def check_sampling_args(
    where: str, num_samples: int | None, num_shards: int | None, shard_id: int | None
) -> tuple[int | None, int | None]:
    """Validate num_samples / num_shards / shard_id as MindSpore does, with errors that name the fix."""
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)):
        raise ConfigurationError(f"{where}: num_samples must be an int or None, got {num_samples!r}")
    if num_samples is not None and num_samples < 0:
        raise ConfigurationError(f"{where}: num_samples must be >= 0 (0 or None reads every row), got {num_samples}")
    if num_shards is None and shard_id is None:
        return None, None
    if num_shards is None or shard_id is None:
        given, missing = ("num_shards", "shard_id") if shard_id is None else ("shard_id", "num_shards")
        raise ConfigurationError(
            f"{where}: {given} was given without {missing}; sharding needs both, e.g. "
            f"num_shards=get_group_size(), shard_id=get_rank()"
        )
    for name, value in (("num_shards", num_shards), ("shard_id", shard_id)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigurationError(f"{where}: {name} must be an int, got {value!r}")
    if num_shards < 1:
        raise ConfigurationError(f"{where}: num_shards must be >= 1, got {num_shards}")
    if not 0 <= shard_id < num_shards:
        raise ConfigurationError(
            f"{where}: shard_id={shard_id} is not in [0, num_shards-1] = [0, {num_shards - 1}]; shard ids are "
            f"ranks 0..num_shards-1 (use shard_id=get_rank(), num_shards=get_group_size())"
        )
    return num_shards, shard_id
