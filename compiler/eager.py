"""Op-by-op execution on numpy arrays (what PYNATIVE_MODE runs): each call is a one-node graph, traced with the
same rules as graph mode, lowered and compiled once per (op, attributes, input types), then cached.

    >>> eager = EagerExecutor(CpuCompute(threads=2))
    >>> eager.run("MatMul", a, b, transpose_b=True)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from tessel.compiler import registry
from tessel.compiler.builder import apply_all
from tessel.compiler.dtypes import as_dtype
from tessel.compiler.lower_onnx import model_bytes
from tessel.compiler.tracer import Trace


class EagerExecutor:
    """Runs registered ops on numpy arrays through a ComputePlugin, caching one executable per signature."""

    def __init__(self, compute: Any, cache_size: int = 1024):
        self.compute = compute
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, tuple[Any, list[str]]] = OrderedDict()

    def run(self, op: str, *inputs: Any, **attrs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Apply `op`; Python scalars stay weakly typed (as in graph mode). Multi-output ops return a tuple."""
        bound = registry.get(op).bind(attrs)
        tensors = {f"a{i}": np.asarray(x) for i, x in enumerate(inputs) if not _is_scalar(x)}
        key = (op, bound, tuple(map(_signature, inputs)))
        entry = self._cache.get(key)
        if entry is None:
            entry = self._compile(op, inputs, bound)
            self._cache[key] = entry
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        executable, feeds = entry
        outputs = self.compute.run(executable, {name: tensors[name] for name in feeds})
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _compile(self, op: str, inputs: tuple, attrs) -> tuple[Any, list[str]]:
        with Trace(op.lower()) as trace:
            args = [
                x if _is_scalar(x) else trace.input(f"a{i}", np.shape(x), as_dtype(np.asarray(x).dtype))
                for i, x in enumerate(inputs)
            ]
            graph, _ = trace.build(list(apply_all(op, *args, **dict(attrs))))
        return self.compute.compile(model_bytes(graph)), [v.name for v in graph.inputs]

    def __len__(self) -> int:
        return len(self._cache)


def _is_scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float))


def _signature(x: Any) -> tuple:
    # Scalars are baked into the graph as constants; their type matters too (True == 1 == 1.0 in Python).
    if _is_scalar(x):
        return ("scalar", type(x).__name__, x)
    x = np.asarray(x)
    return (x.shape, x.dtype.str)
