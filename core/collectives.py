"""The numpy reference of every collective and reduce op: what each member of a group gets.

One definition of the semantics, used by the in-process simulator, by the plugins (their reductions are these
ufuncs) and by the tests that check a plugin's results. Arguments are the members' inputs in group-rank order;
`root`, `peer`, `send_ranks`, `recv_ranks` are group ranks; results come back in group-rank order.

Reduce ops: sum, prod, max, min, and mean (the sum divided by the group size, floating dtypes only). bool follows
logic: sum and max are `or`, prod and min are `and`.

    >>> all_reduce([np.array([1.0, 2.0]), np.array([3.0, 4.0])], "mean")
    [array([2., 3.]), array([2., 3.])]
    >>> reduce_scatter([np.arange(4.0), np.ones(4)], "sum")
    [array([1., 2.]), array([3., 4.])]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from tessel.core.errors import ConfigurationError
from tessel.core.wire import COLLECTIVE_DTYPES, REDUCE_OPS

_NUMERIC = {"sum": np.add, "mean": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
_LOGICAL = {"sum": np.logical_or, "mean": None, "prod": np.logical_and, "max": np.logical_or, "min": np.logical_and}


# --- reduce ops ---------------------------------------------------------------------------------------------------


def check(dtype: np.dtype, op: str | None = None) -> None:
    """Raise a clear error for a dtype or reduce op the collectives do not support."""
    dtype = np.dtype(dtype)
    if dtype not in COLLECTIVE_DTYPES:
        raise ConfigurationError(
            f"collectives do not support dtype {dtype}; supported: {[str(d) for d in COLLECTIVE_DTYPES]}. "
            "Cast the tensor first (e.g. ops.Cast to float32)."
        )
    if op is None:
        return
    if op not in REDUCE_OPS:
        raise ConfigurationError(f"unknown reduce op {op!r}; use one of {list(REDUCE_OPS)}")
    if op == "mean" and dtype.kind != "f":
        raise ConfigurationError(
            f"reduce op 'mean' needs a floating dtype, got {dtype}; use 'sum' and divide, or cast to float32"
        )


def ufunc(dtype: np.dtype, op: str) -> np.ufunc:
    """The binary ufunc that combines two buffers of `dtype` under `op`."""
    table = _LOGICAL if np.dtype(dtype) == np.bool_ else _NUMERIC
    return table[op]


def reduce_into(out: np.ndarray, operand: np.ndarray, op: str) -> None:
    """out = out (op) operand, in place."""
    ufunc(out.dtype, op)(out, operand, out=out)


def finish(out: np.ndarray, op: str, size: int) -> None:
    """The last step of `op` once all `size` operands are combined: mean divides by the group size."""
    if op == "mean":
        np.divide(out, size, out=out, casting="unsafe")


def reduce(xs: Sequence[np.ndarray], op: str, accumulate: np.dtype | None = None) -> np.ndarray:
    """The reduction of the members' arrays under `op`, a new array of their dtype. With `accumulate` (e.g.
    float64, as tests check plugins) numbers are combined in that dtype and cast back at the end."""
    dtype = np.asarray(xs[0]).dtype
    check(dtype, op)
    if accumulate is not None and dtype != np.bool_:
        xs = [np.asarray(x, dtype=accumulate) for x in xs]
    total = np.array(functools.reduce(ufunc(np.asarray(xs[0]).dtype, op), xs))
    finish(total, op, len(xs))
    return total.astype(dtype, copy=False)


# --- collectives --------------------------------------------------------------------------------------------------


def all_reduce(xs: Sequence[np.ndarray], op: str = "sum", accumulate: np.dtype | None = None) -> list[np.ndarray]:
    """Every member gets the reduction of all members' arrays."""
    total = reduce(xs, op, accumulate)
    return [total.copy() for _ in xs]


def all_gather(xs: Sequence[np.ndarray], axis: int = 0) -> list[np.ndarray]:
    """Every member gets the members' arrays concatenated along `axis`, in group-rank order."""
    whole = np.concatenate(xs, axis=axis)
    return [whole.copy() for _ in xs]


def reduce_scatter(
    xs: Sequence[np.ndarray], op: str = "sum", axis: int = 0, accumulate: np.dtype | None = None
) -> list[np.ndarray]:
    """Member i gets block i (of group-size blocks along `axis`) of the reduction."""
    return [block.copy() for block in np.split(reduce(xs, op, accumulate), len(xs), axis=axis)]


def broadcast(xs: Sequence[np.ndarray], root: int = 0) -> list[np.ndarray]:
    """Every member gets the root's array."""
    return [np.array(xs[root]) for _ in xs]


def all_to_all(xs: Sequence[np.ndarray], split_dim: int = 0, concat_dim: int = 0) -> list[np.ndarray]:
    """Each member splits its array into group-size blocks along split_dim and sends block i to member i; member
    i concatenates what arrives along concat_dim, in group-rank order."""
    n = len(xs)
    blocks = [np.split(x, n, axis=split_dim) for x in xs]
    return [np.concatenate([blocks[j][i] for j in range(n)], axis=concat_dim) for i in range(n)]


def neighbor_exchange(
    sends: Sequence[Sequence[np.ndarray]], send_ranks: Sequence[Sequence[int]], recv_ranks: Sequence[Sequence[int]]
) -> list[list[np.ndarray]]:
    """Member m sends sends[m][k] to send_ranks[m][k] and receives one array from each of recv_ranks[m], in that
    order; the j-th receive from a source takes the j-th array that source sends to m. A member that expects an
    array its source does not send is a clear error."""
    received: list[list[np.ndarray]] = []
    for me, sources in enumerate(recv_ranks):
        mine, taken = [], dict.fromkeys(sources, 0)
        for source in sources:
            slots = [k for k, target in enumerate(send_ranks[source]) if target == me]
            if taken[source] >= len(slots):
                raise ConfigurationError(
                    f"group rank {me} expects {taken[source] + 1} tensor(s) from {source}, which sends it {len(slots)}"
                )
            mine.append(np.array(sends[source][slots[taken[source]]]))
            taken[source] += 1
        received.append(mine)
    return received
