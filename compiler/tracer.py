"""Tracing: run a Python function on SymbolicTensors and record the Graph it computes.

Python control flow runs at trace time (loops unroll, `if` on Python values picks a branch); branching on a
tensor's value raises TraceError naming the user's file and line.

    >>> traced = trace(lambda x, w: (x @ w).sum(), TensorSpec(("N", 784)), TensorSpec((784, 10)))
    >>> traced.graph.dump()

The SDK's `Cell.__call__` in GRAPH_MODE uses the `Trace` context directly: it adds one input per argument and per
Parameter (`Trace.input`), runs `construct`, and builds the graph from what it returns.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessel.compiler.builder import GraphBuilder, SymbolicTensor, current_builder, pop_builder, push_builder
from tessel.compiler.dtypes import DType, as_dtype
from tessel.compiler.errors import TraceError
from tessel.compiler.ir import Graph
from tessel.compiler.shapes import Dim


@dataclass(frozen=True)
class TensorSpec:
    """A traced argument's shape (ints, or str symbols such as "N" for the batch) and dtype."""

    shape: tuple[Dim, ...]
    dtype: DType = DType.float32
    name: str | None = None

    @staticmethod
    def like(array: np.ndarray, name: str | None = None) -> TensorSpec:
        return TensorSpec(tuple(array.shape), as_dtype(array.dtype), name)


class Trace:
    """A trace in progress; `with Trace() as t:` makes ops applied without symbolic inputs land in it."""

    def __init__(self, name: str = "main"):
        self.builder = GraphBuilder(name)

    def __enter__(self) -> Trace:
        push_builder(self.builder)
        return self

    def __exit__(self, *exc: Any) -> None:
        pop_builder(self.builder)

    def input(self, name: str, shape: Sequence[Dim], dtype: DType | str = DType.float32) -> SymbolicTensor:
        """Add a graph input (an argument or a Parameter)."""
        return self.builder.add_input(name, shape, as_dtype(dtype))

    def build(self, outputs: Any) -> tuple[Graph, OutputTree]:
        """The graph of `outputs` (a tensor or a nested tuple/list/dict of them) and how to re-nest them."""
        leaves, tree = flatten(outputs)
        values = [self._as_value(leaf) for leaf in leaves]
        return self.builder.build(values), tree

    def _as_value(self, leaf: Any):
        if isinstance(leaf, SymbolicTensor):
            if leaf.builder is not self.builder:
                raise TraceError("a traced function returned a tensor from a different trace")
            return leaf.value
        if isinstance(leaf, (bool, int, float, np.ndarray, np.generic)):
            return self.builder.constant(leaf)
        raise TraceError(f"a traced function returned {type(leaf).__name__}; return tensors, numbers or tuples")


def current_trace_builder() -> GraphBuilder | None:
    """The builder of the innermost active trace, or None outside tracing (the SDK checks GRAPH_MODE with it)."""
    return current_builder()


@dataclass(frozen=True)
class OutputTree:
    """The nesting of a traced function's outputs: a leaf (None), or a tuple/list/dict of subtrees."""

    kind: str  # "leaf", "tuple", "list", "dict"
    children: tuple = ()
    keys: tuple = ()

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        it = iter(leaves)
        return self._build(it)

    def _build(self, it) -> Any:
        if self.kind == "leaf":
            return next(it)
        items = [c._build(it) for c in self.children]
        if self.kind == "dict":
            return dict(zip(self.keys, items))
        return tuple(items) if self.kind == "tuple" else items


def flatten(obj: Any) -> tuple[list[Any], OutputTree]:
    if isinstance(obj, (tuple, list)):
        parts = [flatten(o) for o in obj]
        kind = "tuple" if isinstance(obj, tuple) else "list"
        return [leaf for p in parts for leaf in p[0]], OutputTree(kind, tuple(p[1] for p in parts))
    if isinstance(obj, dict):
        keys = tuple(obj)
        parts = [flatten(obj[k]) for k in keys]
        return [leaf for p in parts for leaf in p[0]], OutputTree("dict", tuple(p[1] for p in parts), keys)
    return [obj], OutputTree("leaf")


@dataclass(frozen=True)
class Traced:
    """The result of `trace`: the graph and the nesting of its outputs."""

    graph: Graph
    outputs: OutputTree


def trace(fn: Callable[..., Any], *args: Any, name: str | None = None) -> Traced:
    """Trace `fn(*args)`. TensorSpec / numpy arguments become graph inputs named after fn's parameters;
    anything else is passed through unchanged (a Python constant of the trace)."""
    param_names = _param_names(fn, len(args))
    with Trace(name or getattr(fn, "__name__", "main").strip("<>")) as t:
        call_args = []
        for i, arg in enumerate(args):
            if isinstance(arg, np.ndarray):
                arg = TensorSpec.like(arg)
            if isinstance(arg, TensorSpec):
                arg = t.input(arg.name or param_names[i], arg.shape, arg.dtype)
            call_args.append(arg)
        result = fn(*call_args)
        graph, tree = t.build(result)
    return Traced(graph, tree)


def _param_names(fn: Callable, count: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else f"arg{i}" for i in range(count)]
