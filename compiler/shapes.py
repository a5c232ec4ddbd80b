"""Shapes: tuples of dims, where a dim is an int or a symbol (a str such as "N", the batch size unknown until run).

Symbols make one compiled graph serve every batch size. They only meet other dims in the simple ways a batch
dim does: equal symbols match, a symbol broadcasts against 1, and reshapes may carry a symbol through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tessel.compiler.errors import ShapeInferenceError

Dim = int | str
Shape = tuple[Dim, ...]


def as_shape(dims: Sequence[Dim] | int) -> Shape:
    """Normalise a user shape (ints, numpy ints or symbols) into a tuple of dims."""
    if isinstance(dims, int):
        dims = (dims,)
    shape = []
    for d in dims:
        if isinstance(d, str):
            shape.append(d)
        elif int(d) == d and d >= 0:
            shape.append(int(d))
        else:
            raise ShapeInferenceError(f"dim {d!r} of shape {tuple(dims)} is not a non-negative int or a symbol")
    return tuple(shape)


def format_shape(shape: Shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def is_static(shape: Shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def numel(shape: Shape, sizes: Mapping[str, int] | None = None) -> int:
    """Element count; symbols take their value from `sizes` (an unknown symbol is a clear error)."""
    total = 1
    for d in shape:
        if isinstance(d, str):
            if sizes is None or d not in sizes:
                raise ShapeInferenceError(
                    f"symbolic dim {d!r} needs a value to count elements; pass sizes={{{d!r}: n}}"
                )
            d = sizes[d]
        total *= d
    return total


def broadcast(a: Shape, b: Shape) -> Shape:
    """Broadcast two shapes under MindSpore's (numpy's) rule: align trailing dims; each pair equal or one is 1."""
    rank = max(len(a), len(b))
    pa, pb = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    out = []
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeInferenceError(
                f"shapes {format_shape(a)} and {format_shape(b)} do not broadcast: dim {i - rank} is {x} vs {y}; "
                "the rule: aligned from the right, each pair of dims must be equal or one of them 1. "
                "Fix: reshape or ExpandDims one input so the dims line up"
            )
    return tuple(out)


def broadcast_all(shapes: Sequence[Shape]) -> Shape:
    out: Shape = ()
    for s in shapes:
        out = broadcast(out, s)
    return out


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """Map a possibly negative axis into [0, rank); out of range is a clear error."""
    if not -rank <= axis < max(rank, 1):
        raise ShapeInferenceError(f"{what} {axis} is out of range for a tensor of rank {rank}; use -{rank}..{rank - 1}")
    return axis % rank if rank else 0


def normalize_axes(axes: int | Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """None means every axis; duplicates are an error; the result is sorted."""
    if axes is None:
        return tuple(range(rank))
    if isinstance(axes, int):
        axes = (axes,)
    out = sorted(normalize_axis(a, rank) for a in axes)
    if len(set(out)) != len(out):
        raise ShapeInferenceError(f"axes {tuple(axes)} repeat an axis")
    return tuple(out)


def infer_reshape(src: Shape, target: Sequence[Dim]) -> Shape:
    """Resolve one -1 in `target` against `src`; symbols must cancel (e.g. (N, 28, 28) -> (N, -1) gives (N, 784))."""
    target = tuple(target)
    if sum(1 for d in target if d == -1) > 1:
        raise ShapeInferenceError(f"target shape {format_shape(target)} has more than one -1")
    num, den = _split(src), _split(tuple(d for d in target if d != -1))
    if -1 not in target:
        if num != den:
            raise ShapeInferenceError(
                f"cannot reshape {format_shape(src)} into {format_shape(target)}: element counts differ"
            )
        return target
    (n_int, n_syms), (d_int, d_syms) = num, den
    rest = list(n_syms)
    for s in d_syms:
        if s not in rest:
            raise ShapeInferenceError(f"cannot reshape {format_shape(src)} into {format_shape(target)}: {s!r} unknown")
        rest.remove(s)
    if d_int == 0 or n_int % d_int or len(rest) > 1 or (rest and n_int // d_int != 1):
        raise ShapeInferenceError(
            f"cannot reshape {format_shape(src)} into {format_shape(target)}: -1 has no whole-number value"
        )
    fill: Dim = rest[0] if rest else n_int // d_int
    return tuple(fill if d == -1 else d for d in target)


def _split(shape: Shape) -> tuple[int, tuple[str, ...]]:
    ints = math.prod(d for d in shape if isinstance(d, int))
    return ints, tuple(sorted(d for d in shape if isinstance(d, str)))
