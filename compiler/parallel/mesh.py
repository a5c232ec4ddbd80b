"""Device meshes: ranks laid out row-major on a device matrix, as MindSpore does.

A device matrix (2, 4) puts rank r at coordinates (r // 4, r % 4): the last axis varies fastest. A *group* over
some axes is the set of ranks that differ from a rank only on those axes, ordered row-major over the axes in the
order given; every member computes the same tuple, which is what a collective's `group` attribute needs.

    >>> DeviceMesh((2, 4)).group(5, (1,))
    (4, 5, 6, 7)

Two layouts on different device matrices meet on their *refinement*: each axis split into prime factors (an axis
of 4 becomes two of 2, major first). Row-major order survives the split, so (8,), (2, 4) and (4, 2) all refine to
(2, 2, 2) with the same rank coordinates, and redistribution between them is planned axis by axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property


def prime_factors(n: int) -> tuple[int, ...]:
    """Prime factors of n in non-decreasing order (1 has none)."""
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    return tuple(factors)


def divisors(n: int) -> tuple[int, ...]:
    """Every positive divisor of n, ascending."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class DeviceMesh:
    """A device matrix: axis sizes whose product is the number of ranks, ranks numbered row-major."""

    device_matrix: tuple[int, ...]

    def __post_init__(self):
        if not all(isinstance(s, int) and s >= 1 for s in self.device_matrix):
            raise ValueError(f"device matrix {self.device_matrix} must hold positive ints")

    @property
    def size(self) -> int:
        return math.prod(self.device_matrix)

    @property
    def ndim(self) -> int:
        return len(self.device_matrix)

    def coords(self, rank: int) -> tuple[int, ...]:
        """The coordinates of `rank` (row-major: the last axis varies fastest)."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside a mesh of {self.size} devices {self.device_matrix}")
        out = []
        for size in reversed(self.device_matrix):
            out.append(rank % size)
            rank //= size
        return tuple(reversed(out))

    def rank(self, coords: tuple[int, ...]) -> int:
        r = 0
        for c, size in zip(coords, self.device_matrix):
            r = r * size + c
        return r

    def block(self, rank: int, axes: tuple[int, ...]) -> int:
        """This rank's block index over `axes` (row-major in the order given) and so its position in the group."""
        coords = self.coords(rank)
        index = 0
        for a in axes:
            index = index * self.device_matrix[a] + coords[a]
        return index

    def group(self, rank: int, axes: tuple[int, ...]) -> tuple[int, ...]:
        """The ranks that differ from `rank` only on `axes`, ordered row-major over `axes` as given."""
        base = list(self.coords(rank))
        members = []
        for i in range(math.prod(self.device_matrix[a] for a in axes)):
            coords = list(base)
            for a in reversed(axes):
                coords[a] = i % self.device_matrix[a]
                i //= self.device_matrix[a]
            members.append(self.rank(tuple(coords)))
        return tuple(members)

    @cached_property
    def refinement(self) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        """(prime device matrix, for each axis here the prime axes it became, major first)."""
        primes: list[int] = []
        owned = []
        for size in self.device_matrix:
            factors = prime_factors(size)
            owned.append(tuple(range(len(primes), len(primes) + len(factors))))
            primes.extend(factors)
        return tuple(primes), tuple(owned)

    def __repr__(self) -> str:
        return f"DeviceMesh({'x'.join(map(str, self.device_matrix))})"
