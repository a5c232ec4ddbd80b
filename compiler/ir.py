"""The IR: a Graph of Nodes over Values.

A `Value` is one tensor: shape (ints and symbols), dtype and a `layout` slot that the parallel pass fills with a
device-matrix/tensor-map layout (None = not yet decided). A `Node` applies one registered op to input Values
with frozen, hashable attributes and produces output Values. A `Graph` lists its inputs, nodes (in topological
order) and outputs. Everything is immutable; `Graph.hash` keys compile caches and `Graph.dump()` is the readable
text form, one line per node:

    %3: f32[N,512] = MatMul(%x, %w1) {transpose_a=False, transpose_b=False}   # train.py:12
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

import numpy as np

from tessel.compiler.dtypes import DType, as_dtype
from tessel.compiler.shapes import Shape, as_shape


@dataclass(frozen=True)
class TensorType:
    """Shape and dtype of a tensor: what shape inference computes."""

    shape: Shape
    dtype: DType

    def __repr__(self) -> str:
        return f"{self.dtype.short}[{','.join(str(d) for d in self.shape)}]"

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, eq=False)
class Value:
    """One tensor in a graph. Compared by identity: two Values with the same type are different tensors."""

    type: TensorType
    name: str | None = None  # set on graph inputs (the feed name) and optionally on outputs
    layout: Hashable | None = None  # filled by the parallel pass; None means "not sharded / undecided"

    @property
    def shape(self) -> Shape:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.type.shape)

    def __repr__(self) -> str:
        return f"Value({self.name or '?'}: {self.type!r})"


@dataclass(frozen=True)
class ConstArray:
    """A numpy array frozen into a hashable attribute (constants, masks, index tables)."""

    dtype: DType
    shape: tuple[int, ...]
    data: bytes = field(repr=False)

    @staticmethod
    def of(array: Any, dtype: DType | None = None) -> ConstArray:
        arr = np.asarray(array, dtype=None if dtype is None else dtype.numpy)
        return ConstArray(as_dtype(arr.dtype), tuple(arr.shape), np.ascontiguousarray(arr).tobytes())

    def numpy(self) -> np.ndarray:
        return np.frombuffer(self.data, dtype=self.dtype.numpy).reshape(self.shape)

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()[:12]

    def __repr__(self) -> str:
        arr = self.numpy()
        if arr.size <= 4:
            return f"{self.dtype.short}({arr.tolist()})"
        return f"<{self.dtype.short}[{','.join(map(str, self.shape))}] sha:{self.digest}>"


def freeze(value: Any) -> Hashable:
    """Turn an attribute into a hashable value: lists to tuples, arrays to ConstArray, numpy scalars to Python."""
    if value is None or isinstance(value, (bool, int, float, str, DType, ConstArray)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return ConstArray.of(value)
    if isinstance(value, np.dtype):
        return as_dtype(value)
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    raise TypeError(f"attribute value {value!r} of type {type(value).__name__} cannot be frozen into the IR")


class Attrs(Mapping):
    """An immutable, hashable mapping of attribute name to frozen value, sorted by name."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()):
        pairs = items.items() if isinstance(items, Mapping) else items
        self._items = tuple(sorted((k, freeze(v)) for k, v in pairs))

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attrs) and self._items == other._items

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._items) + "}"


class Recompute(str, Enum):
    """How a node is recomputed for the backward pass (`Cell.recompute`, `Primitive.recompute`): its outputs are
    not kept for the gradient; the backward reads a copy computed again from the nearest kept values. WITH_COMM
    recomputes the collectives the node needs too (MindSpore's mp_comm_recompute=True, the default);
    WITHOUT_COMM keeps their results."""

    WITH_COMM = "recompute"
    WITHOUT_COMM = "recompute_without_comm"


@dataclass(frozen=True, eq=False)
class Node:
    """One application of a registered op. `source` is the user's file:line that created it (dumps, errors);
    `recompute` says whether the backward pass recomputes its outputs instead of keeping them (None: kept)."""

    op: str
    inputs: tuple[Value, ...]
    attrs: Attrs
    outputs: tuple[Value, ...]
    source: str | None = None
    recompute: Recompute | None = None

    @property
    def output(self) -> Value:
        return self.outputs[0]


@dataclass(frozen=True, eq=False)
class Graph:
    """A function: named input Values, nodes in topological order, output Values."""

    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    name: str = "main"

    def __post_init__(self):
        names = [v.name for v in self.inputs]
        if None in names or len(set(names)) != len(names):
            raise ValueError(f"graph {self.name!r}: inputs need unique names, got {names}")

    @cached_property
    def producers(self) -> dict[Value, Node]:
        return {out: node for node in self.nodes for out in node.outputs}

    def input(self, name: str) -> Value:
        for v in self.inputs:
            if v.name == name:
                return v
        raise KeyError(f"graph {self.name!r} has no input {name!r}; inputs: {[v.name for v in self.inputs]}")

    def dump(self, sources: bool = True) -> str:
        """The readable text form (MindSpore IR-dump style), one line per node."""
        ids: dict[Value, str] = {v: f"%{v.name}" for v in self.inputs}
        params = ", ".join(f"{ids[v]}: {v.type!r}{_layout(v)}" for v in self.inputs)
        lines = [f"graph {self.name}({params}) {{"]
        for node in self.nodes:
            for out in node.outputs:
                ids[out] = f"%{len(ids) - len(self.inputs)}"
            outs = ", ".join(f"{ids[o]}: {o.type!r}{_layout(o)}" for o in node.outputs)
            args = ", ".join(ids.get(v, "%<undefined>") for v in node.inputs)
            attrs = f" {node.attrs!r}" if len(node.attrs) else ""
            attrs += f" [{node.recompute.value}]" if node.recompute else ""
            where = f"   # {node.source}" if sources and node.source else ""
            lines.append(f"  {outs} = {node.op}({args}){attrs}{where}")
        rets = ", ".join(ids.get(v, "%<undefined>") + (f" as {v.name}" if v.name else "") for v in self.outputs)
        lines.append(f"  return ({rets})")
        lines.append("}")
        return "\n".join(lines)

    @cached_property
    def hash(self) -> str:
        """A stable content hash (sha256 hex) of the graph; source locations do not count."""
        text = self.dump(sources=False) + "".join(
            f"\n{v!r}={v.digest}" for n in self.nodes for v in n.attrs.values() if isinstance(v, ConstArray)
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.inputs)} inputs, {len(self.nodes)} nodes, hash={self.hash[:12]})"


def _layout(v: Value) -> str:
    return f" @{v.layout!r}" if v.layout is not None else ""


def new_value(shape: Any, dtype: Any, name: str | None = None) -> Value:
    return Value(TensorType(as_shape(shape), as_dtype(dtype)), name)
