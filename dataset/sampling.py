"""Which rows a shard reads in an epoch — MindSpore's DistributedSampler rule — and the seeded random streams.

Shard k of N over n rows reads positions (k + N*j) mod n for j = 0 .. ceil(n/N)-1 (short shards wrap round to the
first rows, so every shard has the same length). With shuffle the positions index a permutation of all n rows that
depends on (seed, epoch) only — never on the shard — so the N shards of an epoch are disjoint and cover the data on
every rank, exactly as MindSpore's DistributedSampler shuffles its full index list with the shared seed.

>>> shard_rows(10, num_shards=3, shard_id=1, shuffle=False, seed=0, epoch=0).tolist()
[1, 4, 7, 0]

Uneven shards (speed-aware data parallelism: set_auto_parallel_context(batch_split=...)) split every global batch
of B = sum(shares) consecutive positions by `shares`: shard k takes shares[k] of them, interleaved by
`window_owners` (equal shares give exactly the rule above), so the shards' step-j batches together are the one
device's step-j batch. Every shard has the same number of batches: the epoch's ceil(N * ceil(n/N) / B) windows
(floor with drop_remainder), the last one wrapping round to the first positions like the rule above.

>>> share_rows(12, ShardShares((2, 4)), shard_id=0, shuffle=False, seed=0, epoch=0).tolist()
[0, 3, 6, 9]

Random transforms draw through `RowRandom`: each row's numbers are a function of (seed, epoch, the operation, the
row's id) — its index in the source, tagged by the repeat, concat and zip it went through — and never of the block
or the shard the row travels in. So a row is cropped and flipped alike on one device and on any shard of N ranks,
and N-rank training with augmentation equals one-device training on the global batch.

>>> a = RowRandom(stream_key(1, 0, 7), np.array([3, 4, 5], dtype=np.uint64)).random()
>>> b = RowRandom(stream_key(1, 0, 7), np.array([5], dtype=np.uint64)).random()
>>> bool(a[2] == b[0])
True
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from tessel.core.errors import ConfigurationError


def random_stream(seed: int, epoch: int, *salt: int) -> np.random.Generator:
    """A generator that depends only on (seed, epoch, salt…): the same on every rank and in every process."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, *salt])))


def stream_key(seed: int, epoch: int, *salt: int) -> int:
    """A 64-bit key that depends only on (seed, epoch, salt…), for `RowRandom`."""
    return int(np.random.SeedSequence([seed, epoch, *salt]).generate_state(1, np.uint64)[0])


_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, SplitMix64's increment


def _golden_times(n: int) -> np.uint64:
    """n * _GOLDEN mod 2**64 (in Python ints: numpy warns on a scalar product that wraps)."""
    return np.uint64(n * _GOLDEN % 2**64)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a uint64 array: a bijection whose every output bit depends on every input bit."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def tag_ids(ids: np.ndarray, tag: int) -> np.ndarray:
    """Row ids for another instance of the same rows (repetition `tag`, concat child `tag`): distinct per tag."""
    return mix64(ids + _golden_times(tag + 1))


def combine_ids(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The id of a row made of two rows side by side (zip)."""
    return mix64(first ^ mix64(second + _golden_times(1)))


class RowRandom:
    """Random numbers for one block of rows: each call returns one value per row, and a row's value depends only
    on the stream key, the row's id and how many calls came before it — so a transform must make the same calls
    whatever the block holds (draw for every row, then use what it needs). Counter-based like SplitMix64."""

    def __init__(self, key: int, ids: np.ndarray):
        self._rows = mix64(np.asarray(ids, dtype=np.uint64).reshape(-1) ^ np.uint64(key))
        self._calls = 0

    def __len__(self) -> int:
        return len(self._rows)

    def _bits(self) -> np.ndarray:
        self._calls += 1
        return mix64(self._rows + _golden_times(self._calls))

    def random(self) -> np.ndarray:
        """One float64 per row, uniform in [0, 1) (53 random bits)."""
        return (self._bits() >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def integers(self, low: int, high: int) -> np.ndarray:
        """One int64 per row, uniform in [low, high)."""
        if high <= low:
            raise ValueError(f"RowRandom.integers: high ({high}) must exceed low ({low})")
        return low + np.minimum(np.floor(self.random() * (high - low)), high - low - 1).astype(np.int64)

    def uniform(self, low: float, high: float) -> np.ndarray:
        """One float64 per row, uniform in [low, high)."""
        return low + (high - low) * self.random()


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


@dataclass(frozen=True)
class ShardShares:
    """Rows of every global batch that each shard takes (uneven shards); `drop_remainder` as the batch op's."""

    shares: tuple[int, ...]
    drop_remainder: bool = False

    def __post_init__(self) -> None:
        if not self.shares or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in self.shares):
            raise ConfigurationError(f"shard shares must be ints >= 1, one per shard; got {self.shares!r}")

    @property
    def global_batch(self) -> int:
        return sum(self.shares)


def window_owners(shares: tuple[int, ...]) -> np.ndarray:
    """The shard of each of the sum(shares) positions of a global batch: shard k's i-th position ranks at i/shares[k]
    (ties: lower shard first), so every shard's rows spread over the batch and equal shares give position p to
    shard p mod N, MindSpore's rule.

    >>> window_owners((1, 2)).tolist(), window_owners((2, 2)).tolist()
    ([0, 1, 1], [0, 1, 0, 1])
    """
    slots = sorted((Fraction(i, share), shard) for shard, share in enumerate(shares) for i in range(share))
    return np.array([shard for _, shard in slots], dtype=np.int64)


def share_windows(num_rows: int, shares: ShardShares, num_samples: int | None = None) -> int:
    """Global batches per epoch under uneven shards (the even rule's N shards of ceil(n/N) rows, in batches)."""
    covered = len(shares.shares) * shard_size(num_rows, len(shares.shares), num_samples)
    return covered // shares.global_batch if shares.drop_remainder else -(-covered // shares.global_batch)


def share_rows(
    num_rows: int,
    shares: ShardShares,
    shard_id: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    num_samples: int | None = None,
) -> np.ndarray:
    """Row indices uneven shard `shard_id` reads in `epoch`, in reading order: its positions of every global batch."""
    if not 0 <= shard_id < len(shares.shares):
        raise ConfigurationError(f"shard_id {shard_id} is not one of the {len(shares.shares)} shards of {shares}")
    offsets = np.flatnonzero(window_owners(shares.shares) == shard_id)
    windows = np.arange(share_windows(num_rows, shares, num_samples), dtype=np.int64) * shares.global_batch
    positions = (windows[:, None] + offsets[None, :]).reshape(-1) % num_rows
    if shuffle:
        return epoch_permutation(num_rows, seed, epoch)[positions]
    return positions


def sharded_rows(source, num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """The rows a random-access source (its num_shards, shard_id, shard_shares, shuffle_flag, num_samples) reads in
    `epoch`: its shard, even (MindSpore's rule) or uneven."""
    if source.shard_shares is not None:
        shard = source.shard_id or 0
        return share_rows(num_rows, source.shard_shares, shard, source.shuffle_flag, seed, epoch, source.num_samples)
    return shard_rows(
        num_rows, source.num_shards, source.shard_id, source.shuffle_flag, seed, epoch, source.num_samples
    )


def sharded_size(source, num_rows: int) -> int:
    """How many rows `sharded_rows` gives per epoch."""
    if source.shard_shares is not None:
        windows = share_windows(num_rows, source.shard_shares, source.num_samples)
        return windows * source.shard_shares.shares[source.shard_id or 0]
    return shard_size(num_rows, source.num_shards, source.num_samples)
