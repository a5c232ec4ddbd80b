"""MindSpore 2.7's random-number generator API (`mindspore.common.generator`) on tessel's seed machinery.

`default_generator` is tessel's global random state (tessel.common.seed): its seed is the one of `set_seed`, its
offset the number of random streams drawn since (parameter initializers, Dropout masks without a seed), and its
state also holds the eager streams of seeded ops (ops.dropout(seed=...), nn.Dropout in PYNATIVE_MODE). So
`manual_seed(s)` is `set_seed(s)`, and `get_rng_state()` / `set_rng_state(state)` replay those draws. What it does not
hold: a dataset pipeline's shuffle (seeded by set_seed as the pipeline starts) and the random ops of a compiled
graph, which keep their counters on the daemon.

The state is a uint8 Tensor as MindSpore's: the seed and the offset as little-endian int64 (MindSpore's 16 bytes),
then 56 bytes per seeded op stream. Random numbers are tessel's own, not MindSpore's.

    >>> import tessel as ms
    >>> ms.manual_seed(13).initial_seed()
    13
    >>> state = ms.get_rng_state()   # ... draw ...; ms.set_rng_state(state) draws the same again
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from tessel.common import seed as _global
from tessel.common.support import not_supported_yet
from tessel.common.tensor import Tensor

__all__ = ["Generator", "default_generator", "get_rng_state", "initial_seed", "manual_seed", "seed", "set_rng_state"]

_HEADER = 16  # seed, offset
_STREAM = 56  # op seed, PCG64 state and increment (128 bits each), has_uint32, uinteger
_MASK64 = (1 << 64) - 1


def _check_seed(seed: Any) -> int:
    if not isinstance(seed, int):  # MindSpore's check: a bool is an int there too
        raise TypeError("Seed must be an integer.")
    return int(seed)


def _state_bytes(state: Any) -> bytes:
    if not isinstance(state, Tensor):
        raise TypeError(f"set_state: the state must be a Tensor from get_state(), got {type(state).__name__}")
    data = state.asnumpy()
    if data.dtype != np.uint8 or data.ndim != 1 or data.size < _HEADER or (data.size - _HEADER) % _STREAM:
        raise ValueError(
            f"set_state: the state must be a 1-D uint8 Tensor from get_state() (16 + 56 * k bytes), got "
            f"{data.dtype} of shape {data.shape}"
        )
    return data.tobytes()


def _int64s(values: list[int]) -> bytes:
    return np.array([v if v < 1 << 63 else v - (1 << 64) for v in values], "<i8").tobytes()


def _header(seed: int, offset: int) -> bytes:
    return _int64s([seed & _MASK64, offset & _MASK64])


def _read_int64(data: bytes, start: int) -> int:
    return int(np.frombuffer(data, "<i8", 1, start)[0])


class Generator:
    """A random-number generator's seed and offset (MindSpore's Generator): manual_seed, seed, initial_seed,
    get_state and set_state. tessel's random functions draw from `default_generator` (whose seed is set_seed's);
    mint's take generator=default_generator and refuse another."""

    def __init__(self):
        self._seed, self._offset = 0, 0

    def manual_seed(self, seed: int) -> Generator:
        """Set the seed (the offset back to 0); returns this generator."""
        self._seed, self._offset = _check_seed(seed), 0
        return self

    def seed(self) -> int:
        """Seed this generator with a random number and return it."""
        value = secrets.randbits(32)
        self.manual_seed(value)
        return value

    def initial_seed(self) -> int:
        return self._seed

    def get_state(self) -> Tensor:
        return Tensor(np.frombuffer(_header(self._seed, self._offset), np.uint8).copy())

    def set_state(self, state: Tensor) -> None:
        data = _state_bytes(state)
        self._seed, self._offset = _read_int64(data, 0), _read_int64(data, 8)


class _DefaultGenerator(Generator):
    """The generator whose state is tessel's global seed (tessel.common.seed)."""

    def __init__(self):  # its seed and offset are tessel.common.seed's
        pass

    def manual_seed(self, seed: int) -> Generator:
        seed = _check_seed(seed)
        if not 0 <= seed <= _global._MAX_SEED:
            raise not_supported_yet(
                f"manual_seed({seed}) of the default generator",
                f"its seed is set_seed's, an int in [0, {_global._MAX_SEED}]; use seed % 2**32",
            )
        _global.set_seed(seed)
        return self

    def initial_seed(self) -> int:
        seed = _global.get_seed()
        return _global.DEFAULT_SEED if seed is None else seed

    def get_state(self) -> Tensor:
        parts = [_header(self.initial_seed(), _global._streams)]
        for op_seed, stream in _global._op_streams.items():
            state = stream.bit_generator.state
            inner = state["state"]
            parts.append(
                _int64s([op_seed, inner["state"] & _MASK64, inner["state"] >> 64, inner["inc"] & _MASK64])
                + _int64s([inner["inc"] >> 64, state["has_uint32"], state["uinteger"]])
            )
        return Tensor(np.frombuffer(b"".join(parts), np.uint8).copy())

    def set_state(self, state: Tensor) -> None:
        data = _state_bytes(state)
        self.manual_seed(_read_int64(data, 0))
        _global._streams = _read_int64(data, 8)
        for start in range(_HEADER, len(data), _STREAM):
            op_seed, low, high, inc_low, inc_high, has_uint32, uinteger = (
                int(v) & _MASK64 for v in np.frombuffer(data, "<i8", 7, start)
            )
            stream = np.random.default_rng()
            stream.bit_generator.state = {
                "bit_generator": "PCG64",
                "state": {"state": low | high << 64, "inc": inc_low | inc_high << 64},
                "has_uint32": has_uint32,
                "uinteger": uinteger,
            }
            _global._op_streams[op_seed] = stream


default_generator: Generator = _DefaultGenerator()


def seed() -> int:
    """Seed the default generator (set_seed) with a random number and return it."""
    return default_generator.seed()


def manual_seed(seed: int) -> Generator:
    """Set the default generator's seed, which is `set_seed(seed)`; returns default_generator."""
    return default_generator.manual_seed(seed)


def initial_seed() -> int:
    """The default generator's seed: set_seed's (or manual_seed's), tessel's fixed default 0 where none was set."""
    return default_generator.initial_seed()


def get_rng_state() -> Tensor:
    """The default generator's state, a uint8 Tensor that set_rng_state takes back."""
    return default_generator.get_state()


def set_rng_state(state: Tensor) -> None:
    """Put back a state get_rng_state returned: the draws after it repeat."""
    default_generator.set_state(state)
