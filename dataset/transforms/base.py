"""The transform contract: vectorized over rows, registered by name, rebuilt from plain parameters.

A transform gets each input column as one array whose axis 0 runs over rows (a block of rows of the pipeline) and
returns arrays of the same number of rows; the result must equal applying MindSpore's per-sample operation to each
row. An input that owns its memory (`flags.owndata`) is the pipeline's scratch block and may be overwritten in
place; views (as in eager calls on a user's array) never are.

Registered transforms are data: `name` plus `params()` (constructor keyword arguments of plain values), so a
pipeline that uses only them serializes to a `DatasetSpec`. Any other callable runs as `PyFunc`, row by row, and
keeps its pipeline in feed mode.

Adding a transform is one class with `@register`:

>>> import numpy as np
>>> @register
... class AddOne(Transform):
...     def __init__(self):
...         self._params = {}
...     def apply_rows(self, x, rng):
...         return x + 1
>>> AddOne()(np.array([1, 2]))
array([2, 3])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from tessel.core.errors import ConfigurationError
from tessel.dataset import config
from tessel.dataset.sampling import RowRandom, salt_of, stream_key

_REGISTRY: dict[str, type[Transform]] = {}
_EAGER_SALT = salt_of("eager")

# Element types a dataset column can be cast to, by the names MindSpore and numpy both use.
_DTYPE_NAMES = {
    "bool": np.bool_,
    "bool_": np.bool_,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
}


class Transform:
    """Base class of registered transforms; subclasses set `self._params` and implement `apply_rows`."""

    random: ClassVar[bool] = False
    _params: dict[str, Any]

    def params(self) -> dict[str, Any]:
        """Constructor keyword arguments (plain values) that rebuild this transform."""
        return dict(self._params)

    def apply(self, arrays: Sequence[np.ndarray], rng: RowRandom) -> tuple[np.ndarray, ...]:
        """Apply to blocks of rows (one array per input column); returns one array per output column."""
        if len(arrays) != 1:
            raise ConfigurationError(
                f"{self!r} takes 1 input column but got {len(arrays)}; map it over one column (input_columns='x')"
            )
        return (self.apply_rows(arrays[0], rng),)

    def apply_rows(self, x: np.ndarray, rng: RowRandom) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, *samples: Any) -> Any:
        """Eager mode: apply to one sample (one argument per input column), as `vision.Rescale(...)(image)`. Random
        transforms draw from the dataset seed: the n-th eager call after `ds.config.set_seed(s)` draws the same."""
        seed, call = config.next_eager_call()
        rng = RowRandom(stream_key(seed, call, _EAGER_SALT), np.zeros(1, dtype=np.uint64))
        outputs = self.apply(tuple(np.asarray(s)[None] for s in samples), rng)
        outputs = tuple(out[0] for out in outputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def reject(self, x: np.ndarray, expected: str, fix: str) -> ConfigurationError:
        """The error for input rows this transform cannot take (raise it)."""
        return ConfigurationError(
            f"{self!r} expects {expected}, got rows of shape {x.shape[1:]} (rank {x.ndim - 1}) and dtype {x.dtype}; "
            f"{fix}"
        )

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._params.items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.params() == other.params()


def register(cls: type[Transform]) -> type[Transform]:
    """Class decorator: make a transform serializable under its class name."""
    if cls.__name__ in _REGISTRY and _REGISTRY[cls.__name__] is not cls:
        raise ConfigurationError(f"a transform named {cls.__name__!r} is already registered; rename the class")
    _REGISTRY[cls.__name__] = cls
    return cls


def is_registered(transform: object) -> bool:
    return isinstance(transform, Transform) and _REGISTRY.get(type(transform).__name__) is type(transform)


def transform_from_params(name: str, params: dict[str, Any]) -> Transform:
    """Rebuild a registered transform from its name and `params()`."""
    if name not in _REGISTRY:
        raise ConfigurationError(
            f"unknown transform {name!r} in a dataset spec; registered: {sorted(_REGISTRY)}. The sender uses a "
            f"transform this process has not imported or a newer tessel"
        )
    return _REGISTRY[name](**params)


class PyFunc(Transform):
    """A Python callable applied row by row (MindSpore's pyfunc in `map`); never serializable."""

    def __init__(self, function: Callable[..., Any]):
        self.function = function
        self._params = {"function": getattr(function, "__qualname__", repr(function))}

    def apply(self, arrays: Sequence[np.ndarray], rng: RowRandom) -> tuple[np.ndarray, ...]:
        rows = []
        for i in range(len(arrays[0])):
            out = self.function(*(a[i, ...] for a in arrays))  # a 0-d array for a scalar, as MindSpore passes
            rows.append(tuple(np.asarray(o) for o in out) if isinstance(out, tuple) else (np.asarray(out),))
        return stack_rows(rows, str(self))


class RaggedRowsError(ConfigurationError):
    """Rows of one column have different shapes, so they cannot share one array (callers fall back to 1-row blocks)."""


def stack_rows(rows: Sequence[tuple[np.ndarray, ...]], where: str) -> tuple[np.ndarray, ...]:
    """Stack per-row tuples of arrays into one array per column; RaggedRowsError if shapes differ."""
    if not rows:
        raise ConfigurationError(f"{where}: produced no rows")
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise ConfigurationError(f"{where}: rows have different numbers of columns ({sorted({len(r) for r in rows})})")
    columns = []
    for c in range(width):
        shapes = {r[c].shape for r in rows}
        if len(shapes) > 1:
            raise RaggedRowsError(f"{where}: column {c} has rows of different shapes {sorted(shapes)[:3]}")
        columns.append(np.stack([r[c] for r in rows]))
    return tuple(columns)


def as_operations(operations: Any, where: str) -> list[Transform]:
    """Normalize `map(operations=...)`: one op or a list; Compose is flattened; other callables become PyFunc."""
    items = list(operations) if isinstance(operations, (list, tuple)) else [operations]
    if not items:
        raise ConfigurationError(f"{where}: operations is empty; pass a transform or a list of transforms")
    result: list[Transform] = []
    for op in items:
        if isinstance(op, type):
            raise ConfigurationError(f"{where}: got the class {op.__name__}; pass an instance, e.g. {op.__name__}()")
        if isinstance(op, Transform):
            result.extend(getattr(op, "transforms", [op]))
        elif callable(op):
            result.append(PyFunc(op))
        else:
            raise ConfigurationError(f"{where}: {op!r} is not a transform or a callable")
    return result


def resolve_dtype(data_type: Any, where: str) -> np.dtype:
    """A numpy dtype from numpy dtypes/types, names ('int32') or dtype objects of tessel/MindSpore (`ms.int32`)."""
    if isinstance(data_type, np.dtype):
        return data_type
    for attr in ("numpy_dtype", "np_dtype", "numpy"):
        value = getattr(data_type, attr, None)
        if isinstance(value, np.dtype):
            return value
    if isinstance(data_type, type) and issubclass(data_type, (np.generic, bool, int, float)):
        return np.dtype(data_type)
    name = data_type if isinstance(data_type, str) else getattr(data_type, "value", None)
    if not isinstance(name, str):
        name = getattr(data_type, "name", None) or str(data_type)
    key = name.strip().lower().rsplit(".", 1)[-1]
    if key not in _DTYPE_NAMES:  # a TypeError, as MindSpore 2.7.0's TypeCast(5) and TypeCast("foo")
        raise TypeError(
            f"{where}: cannot resolve data type {data_type!r} to a numpy dtype; use one of {sorted(_DTYPE_NAMES)} "
            f"(e.g. ms.int32, np.int32 or 'int32')"
        )
    return np.dtype(_DTYPE_NAMES[key])
