"""Tensor layouts: MindSpore's device matrix + tensor map, with DTensor's Shard/Replicate/Partial view.

A `Layout` says how a tensor of some global shape is spread over the ranks of a device matrix:
- `device_matrix`: axis sizes, product = number of ranks, ranks row-major (see mesh.py);
- `tensor_map`: one entry per tensor dim, in MindSpore's numbering, counted from the *right* of the device
  matrix: -1 = the dim is not split, i = split over device-matrix axis `len(device_matrix) - 1 - i`, a tuple =
  split over several axes (major first), so `Layout((2, 4), (1, -1))` splits dim 0 over the axis of size 2;
- `partial`: device-matrix axes (same numbering) over which the ranks hold partial results still to be combined
  with `partial_op` ("sum", "max", "min"); every other axis not in the tensor map holds replicas.

`placements` gives the per-axis view (left to right): `Layout((2, 4), (1, -1)).placements == (S(0), R)`.
Layouts are frozen and hashable (redistribution plans are cached on them) and print on one line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tessel.compiler.parallel.mesh import DeviceMesh
from tessel.compiler.shapes import format_shape
from tessel.core.errors import ConfigurationError

PARTIAL_OPS = ("sum", "max", "min")


@dataclass(frozen=True)
class Shard:
    """This mesh axis splits tensor dim `dim`."""

    dim: int

    def __repr__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate:
    """Every rank along this mesh axis holds the same data."""

    def __repr__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial:
    """The ranks along this mesh axis hold parts to be combined with `op`."""

    op: str = "sum"

    def __repr__(self) -> str:
        return f"P({self.op})"


@dataclass(frozen=True)
class Layout:
    """How one tensor is spread over a device matrix (see the module docstring for the numbering)."""

    device_matrix: tuple[int, ...]
    tensor_map: tuple[int | tuple[int, ...], ...]
    partial: tuple[int, ...] = ()
    partial_op: str = "sum"

    def __post_init__(self):
        dm = tuple(int(s) for s in self.device_matrix)
        tm = tuple(tuple(int(a) for a in e) if isinstance(e, (tuple, list)) else int(e) for e in self.tensor_map)
        object.__setattr__(self, "device_matrix", dm)
        object.__setattr__(self, "tensor_map", tm)
        object.__setattr__(self, "partial", tuple(sorted(int(a) for a in self.partial)))
        used = [a for e in tm for a in (e if isinstance(e, tuple) else (e,)) if a != -1] + list(self.partial)
        if any(s < 1 for s in dm) or any(not 0 <= a < len(dm) for a in used) or len(set(used)) != len(used):
            raise ValueError(
                f"invalid layout: device matrix {dm}, tensor map {tm}, partial {self.partial}; every axis index "
                f"must lie in 0..{len(dm) - 1} (counted from the right) and be used at most once"
            )
        if self.partial_op not in PARTIAL_OPS:
            raise ValueError(f"partial_op must be one of {PARTIAL_OPS}, got {self.partial_op!r}")

    # --- constructors (axes counted from the left, the natural order for code) ------------------------------------
    @staticmethod
    def from_axes(
        device_matrix: Sequence[int],
        dim_axes: Sequence[Sequence[int]],
        partial_axes: Sequence[int] = (),
        partial_op: str = "sum",
    ) -> Layout:
        """A layout from left-numbered axes: dim_axes[d] = the mesh axes splitting dim d, major first."""
        n = len(device_matrix)
        flip = lambda a: n - 1 - a  # noqa: E731
        tm = tuple(
            -1 if not axes else (flip(axes[0]) if len(axes) == 1 else tuple(flip(a) for a in axes)) for axes in dim_axes
        )
        return Layout(tuple(device_matrix), tm, tuple(flip(a) for a in partial_axes), partial_op)

    @staticmethod
    def replicated(ndim: int, device_num: int) -> Layout:
        """Every rank holds the whole tensor."""
        return Layout((device_num,), (-1,) * ndim)

    @staticmethod
    def from_strategy(strategy: Sequence[int], device_num: int) -> Layout:
        """The layout a per-dim split tuple gives on its own (dataset_strategy, out_strategy): the split dims take
        one axis each in dim order, after a leading axis of repeated copies when the product is below device_num."""
        product = math.prod(strategy)
        if device_num % product:
            raise ConfigurationError(
                f"strategy {tuple(strategy)} splits into {product} parts, which does not divide device_num "
                f"{device_num}; use splits whose product divides {device_num}"
            )
        sizes = [device_num // product] if product < device_num else []
        dim_axes = []
        for s in strategy:
            dim_axes.append((len(sizes),) if s > 1 else ())
            if s > 1:
                sizes.append(s)
        return Layout.from_axes(tuple(sizes) or (1,), dim_axes)

    # --- views ------------------------------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.tensor_map)

    @property
    def mesh(self) -> DeviceMesh:
        return DeviceMesh(self.device_matrix)

    @cached_property
    def dim_axes(self) -> tuple[tuple[int, ...], ...]:
        """Per tensor dim, the mesh axes (counted from the left, major first) that split it."""
        n = len(self.device_matrix)
        out = []
        for e in self.tensor_map:
            entries = e if isinstance(e, tuple) else (e,)
            out.append(tuple(n - 1 - a for a in entries if a != -1))
        return tuple(out)

    @cached_property
    def partial_axes(self) -> tuple[int, ...]:
        n = len(self.device_matrix)
        return tuple(sorted(n - 1 - a for a in self.partial))

    @cached_property
    def replicated_axes(self) -> tuple[int, ...]:
        used = {a for axes in self.dim_axes for a in axes} | set(self.partial_axes)
        return tuple(a for a in range(len(self.device_matrix)) if a not in used)

    @property
    def placements(self) -> tuple[Shard | Replicate | Partial, ...]:
        """Per mesh axis, left to right: which tensor dim it splits, or replica, or partial results."""
        out: list[Shard | Replicate | Partial] = [Replicate()] * len(self.device_matrix)
        for dim, axes in enumerate(self.dim_axes):
            for a in axes:
                out[a] = Shard(dim)
        for a in self.partial_axes:
            out[a] = Partial(self.partial_op)
        return tuple(out)

    @property
    def splits(self) -> tuple[int, ...]:
        """Per tensor dim, how many pieces it is cut into."""
        return tuple(math.prod(self.device_matrix[a] for a in axes) for axes in self.dim_axes)

    @property
    def replicas(self) -> int:
        """How many ranks hold each piece (product of the replicated axes)."""
        return math.prod(self.device_matrix[a] for a in self.replicated_axes)

    @property
    def is_partial(self) -> bool:
        return bool(self.partial)

    @property
    def device_num(self) -> int:
        return math.prod(self.device_matrix)

    def without_partial(self) -> Layout:
        return Layout(self.device_matrix, self.tensor_map)

    # --- shapes and pieces ------------------------------------------------------------------------------------------
    def check(self, shape: Sequence[int], what: str = "tensor") -> None:
        """Raise unless every split dim of `shape` divides evenly."""
        if len(shape) != self.ndim:
            raise ConfigurationError(
                f"{what} {format_shape(tuple(shape))} has rank {len(shape)}; {self} has {self.ndim}"
            )
        for dim, (size, split) in enumerate(zip(shape, self.splits)):
            if not isinstance(size, int) or size % split:
                raise ConfigurationError(
                    f"{what} {format_shape(tuple(shape))}: dim {dim} of size {size} cannot be split into {split} "
                    f"equal parts ({self}); the rule: a split must divide its dim"
                )

    def local_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of each rank's piece."""
        self.check(shape)
        return tuple(size // split for size, split in zip(shape, self.splits))

    def local_slices(self, shape: Sequence[int], rank: int) -> tuple[slice, ...]:
        """Where `rank`'s piece sits in the global tensor."""
        local = self.local_shape(shape)
        mesh = self.mesh
        return tuple(
            slice(mesh.block(rank, axes) * n, (mesh.block(rank, axes) + 1) * n) for axes, n in zip(self.dim_axes, local)
        )

    # --- equivalence ------------------------------------------------------------------------------------------------
    @cached_property
    def refined(self) -> Layout:
        """The same layout on the prime refinement of its device matrix (size-1 axes dropped)."""
        primes, owned = self.mesh.refinement
        dims = tuple(tuple(p for a in axes for p in owned[a]) for axes in self.dim_axes)
        partial = tuple(p for a in self.partial_axes for p in owned[a])
        return Layout.from_axes(primes or (1,), dims, partial, self.partial_op)

    def same_as(self, other: Layout) -> bool:
        """True when both put the same data on every rank (possibly written on different device matrices)."""
        a, b = self.refined, other.refined
        if a.device_matrix == b.device_matrix and a.tensor_map == b.tensor_map and a.partial == b.partial:
            return not a.partial or a.partial_op == b.partial_op
        return False

    def __repr__(self) -> str:
        tm = ", ".join(str(e) for e in self.tensor_map) + ("," if self.ndim == 1 else "")
        extra = ""
        if self.partial:
            shown = self.partial[0] if len(self.partial) == 1 else self.partial
            extra = f", partial={shown}" + ("" if self.partial_op == "sum" else f":{self.partial_op}")
        return f"Layout({self.device_matrix}, ({tm}){extra})"

    def describe(self) -> str:
        """The per-axis view, e.g. '[S(0), R] on 2x4'."""
        return f"[{', '.join(map(repr, self.placements))}] on {'x'.join(map(str, self.device_matrix))}"


# --- numpy helpers: the reference meaning of a layout --------------------------------------------------------------


def piece(full: np.ndarray, layout: Layout, rank: int) -> np.ndarray:
    """Rank `rank`'s piece of a (non-partial) global tensor."""
    part = full[layout.local_slices(full.shape, rank)]
    return np.ascontiguousarray(part).reshape(part.shape)  # ascontiguousarray alone makes a 0-d array 1-d


def scatter(full: np.ndarray, layout: Layout, rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """Every rank's piece. For a partial layout the pieces are random parts that combine to the global tensor."""
    pieces = [piece(full, layout, r) for r in range(layout.device_num)]
    if not layout.partial:
        return pieces
    rng = rng or np.random.default_rng(0)
    mesh = layout.mesh
    done: set[int] = set()
    for r in range(layout.device_num):
        if r in done:
            continue
        group = mesh.group(r, layout.partial_axes)
        done.update(group)
        base = pieces[r]
        noise = [rng.standard_normal(base.shape).astype(base.dtype) for _ in group]
        for i, member in enumerate(group):
            if layout.partial_op == "sum":
                pieces[member] = base / len(group) + noise[i] - sum(noise) / len(group)
            else:  # one member holds the value, the others something it dominates
                shift = np.abs(noise[i]) + 1 if i else 0
                pieces[member] = base - shift if layout.partial_op == "max" else base + shift
    return [p.astype(full.dtype) for p in pieces]


_COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def assemble(pieces: Sequence[np.ndarray], layout: Layout, shape: Sequence[int]) -> np.ndarray:
    """The global tensor from every rank's piece: partial parts combined, replicas taken from the first holder."""
    mesh = layout.mesh
    full: np.ndarray | None = None
    written = set()
    for r, p in enumerate(pieces):
        coords = mesh.coords(r)
        if any(coords[a] for a in layout.replicated_axes):
            continue
        if full is None:
            full = np.zeros(tuple(shape), dtype=np.asarray(p).dtype)
        where = layout.local_slices(shape, r)
        key = tuple((s.start, s.stop) for s in where)
        if key in written:
            full[where] = _COMBINE[layout.partial_op](full[where], p)
        else:
            full[where] = p
            written.add(key)
    return full
