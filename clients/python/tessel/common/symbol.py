"""`Symbol` (MindSpore `mindspore.Symbol`): what a dynamic dimension may be, for `Tensor(shape=[...])` placeholders
given to `Cell.set_inputs`, and the check of a call's inputs against those placeholders.

    >>> import tessel as ms
    >>> batch = ms.Symbol(divisor=8)                      # any multiple of 8
    >>> x = ms.Tensor(shape=[batch, 1, 28, 28], dtype=ms.float32)
    >>> x.shape
    (-1, 1, 28, 28)
    >>> net.set_inputs(x)                                 # net(...) with a batch of 12 is now a clear error

tessel compiles one graph with a symbolic batch dim for every batch size anyway, so a declaration changes no
compilation; it is checked on every call of the cell it was set on (MindSpore checks it when the graph compiles).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel.common.dtype import to_dtype
from tessel.core.errors import ConfigurationError


class Symbol:
    """A dynamic dimension's rule: min <= d <= max (when max > min) and d = divisor * N + remainder, N >= 1.

    `unique=True`: every dimension declared with this same Symbol object has the same length in one call.
    """

    def __init__(
        self, max: int = 0, min: int = 1, divisor: int = 1, remainder: int = 0, unique: bool = False, **kwargs: Any
    ):
        for name, value in (("max", max), ("min", min), ("divisor", divisor), ("remainder", remainder)):
            if not isinstance(value, int):
                raise TypeError(f"For 'Symbol', the argument '{name}' must be int, but got {type(value)}")
        if not isinstance(unique, bool):
            raise TypeError(f"For 'Symbol', the argument 'unique' must be bool, but got {type(unique)}")
        if min <= 0:
            raise ConfigurationError(f"For 'Symbol', the 'min' value should be positive, but got {min}")
        if divisor <= 0:
            raise ConfigurationError(f"For 'Symbol', the 'divisor' value should be positive, but got {divisor}")
        if not 0 <= remainder < divisor:
            raise ConfigurationError(
                f"For 'Symbol', the 'remainder' value should be in the range '[0, {divisor})', but got {remainder}"
            )
        self.max, self.min, self.divisor, self.remainder, self.unique = max, min, divisor, remainder, unique
        self.id = id(self)

    def to_dict(self) -> dict[str, int]:
        """The rule's non-default parts, as MindSpore's `Symbol.to_dict` (what `Tensor.symbolic_shape` holds)."""
        result = {}
        if self.max > self.min:
            result["max"] = self.max
        if self.min > self.divisor + self.remainder:
            result["min"] = self.min
        if self.divisor != 1:
            result["divisor"] = self.divisor
        if self.remainder != 0:
            result["remainder"] = self.remainder
        if self.unique:
            result["id"] = self.id
        return result

    def accepts(self, length: int) -> bool:
        if length < self.min or length < self.divisor + self.remainder:
            return False
        if self.max > self.min and length > self.max:
            return False
        return (length - self.remainder) % self.divisor == 0

    def rule(self) -> str:
        """The rule in words, for error messages."""
        parts = [f"a multiple of {self.divisor}" if self.divisor > 1 and not self.remainder else ""]
        if self.remainder:
            parts.append(f"{self.divisor} * N + {self.remainder} (N >= 1)")
        parts.append(f">= {self.min}" if self.min > 1 else "")
        parts.append(f"<= {self.max}" if self.max > self.min else "")
        return ", ".join(p for p in parts if p) or "any length"

    def __str__(self) -> str:
        return str(self.to_dict())

    def __repr__(self) -> str:
        return f"Symbol({self.to_dict()})"


# --- placeholders ---------------------------------------------------------------------------------------------------


def is_dynamic_shape(shape: Any) -> bool:
    """True for a Tensor(shape=...) that declares an input (a Symbol, None or -1 among its dims)."""
    if isinstance(shape, Symbol):
        return True
    return isinstance(shape, (list, tuple)) and any(d is None or isinstance(d, Symbol) or d == -1 for d in shape)


def split_shape(shape: Any) -> tuple[tuple[int, ...], tuple[Symbol | None, ...]]:
    """MindSpore's shape (Symbol and None become -1) and the Symbol of each dim."""
    dims = [shape] if isinstance(shape, Symbol) else list(shape)
    plain, symbols = [], []
    for d in dims:
        if isinstance(d, Symbol):
            plain.append(-1)
            symbols.append(d)
        elif d is None or d == -1:
            plain.append(-1)
            symbols.append(None)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
            plain.append(int(d))
            symbols.append(None)
        else:
            raise ConfigurationError(
                f"Tensor(shape={shape!r}): each dim must be an int >= 0, None (any length) or a Symbol, got {d!r}"
            )
    return tuple(plain), tuple(symbols)


# --- checking a call against Cell.set_inputs -------------------------------------------------------------------------


def check_construct_args(where: str, construct: Any, count: int) -> None:
    """MindSpore's rule for set_inputs: as many inputs as construct takes (TypeError otherwise)."""
    import inspect

    try:
        params = list(inspect.signature(construct).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return
    plain = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    required = sum(p.default is p.empty for p in plain)
    if not required <= count <= len(plain):
        raise TypeError(
            f"{where}.set_inputs: construct takes {required} to {len(plain)} inputs, got {count}. When using "
            "set_inputs, give one Tensor (or placeholder Tensor(shape=..., dtype=...)) per input of construct"
        )


def check_inputs(where: str, declared: Sequence[Any], args: Sequence[Any]) -> None:
    """Check one call's tensor inputs against the Tensors given to set_inputs (None entries are not checked):
    the same dtype (TypeError), rank, fixed dims and, for dynamic dims, their Symbol's rule (ConfigurationError)."""
    seen: dict[int, tuple[int, int, int]] = {}  # Symbol id -> (length, input, dim) for unique symbols
    for index, (want, got) in enumerate(zip(declared, args)):
        if want is None or not hasattr(want, "shape"):
            continue
        if not hasattr(got, "shape") or not hasattr(got, "dtype"):
            raise TypeError(f"{where}: input {index} was declared by set_inputs as a Tensor, got {type(got).__name__}")
        got_dtype = to_dtype(got.dtype) if isinstance(got, np.ndarray) else got.dtype
        if got_dtype != want.dtype:
            raise TypeError(
                f"{where}: input {index} has dtype {got_dtype}, but set_inputs declared {want.dtype}; cast the input "
                "or declare the dtype it has"
            )
        shape, symbols = tuple(want.shape), getattr(want, "dim_symbols", (None,) * len(want.shape))
        actual = tuple(got.shape)
        if shape == (-2,):  # dynamic rank: anything goes
            continue
        if len(actual) != len(shape):
            raise ConfigurationError(
                f"{where}: input {index} has shape {list(actual)} (rank {len(actual)}), but set_inputs declared rank "
                f"{len(shape)} ({list(shape)})"
            )
        for dim, (length, want_len, symbol) in enumerate(zip(actual, shape, symbols)):
            if isinstance(length, str):  # a traced symbolic dim: known only at run time
                continue
            if want_len != -1 and length != want_len:
                raise ConfigurationError(
                    f"{where}: input {index} has shape {list(actual)}, but set_inputs declared {list(shape)}: "
                    f"dim {dim} must be {want_len}"
                )
            if symbol is None:
                continue
            if not symbol.accepts(length):
                raise ConfigurationError(
                    f"{where}: input {index} dim {dim} is {length}, but set_inputs declared it by {symbol!r}: it must "
                    f"be {symbol.rule()}"
                )
            if symbol.unique:
                first = seen.setdefault(symbol.id, (length, index, dim))
                if first[0] != length:
                    raise ConfigurationError(
                        f"{where}: input {index} dim {dim} is {length} but input {first[1]} dim {first[2]} is "
                        f"{first[0]}; set_inputs declared both with one Symbol(unique=True), so they must be equal"
                    )
