"""Elementwise reductions shared by the CPU transports (shared memory and TCP).

bool follows logic: sum and max are `or`, prod and min are `and`. mean is sum divided by the group size
and is defined for floating dtypes only (an integer mean would silently truncate).
"""

from __future__ import annotations

import numpy as np

from tessel.errors import ConfigurationError
from tessel.plugins.base import COLLECTIVE_DTYPES, REDUCE_OPS

_NUMERIC = {"sum": np.add, "mean": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
_LOGICAL = {"sum": np.logical_or, "mean": None, "prod": np.logical_and, "max": np.logical_or, "min": np.logical_and}


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
    """Apply the last step of an op after all operands were combined (mean divides by the group size)."""
    if op == "mean":
        np.divide(out, size, out=out, casting="unsafe")
