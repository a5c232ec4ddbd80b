"""Helpers for the compiler tests: run one op through tracing, lowering and ONNX Runtime, and check its
forward result against a numpy reference and its gradient against float64 central differences of that reference."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx

from tessel.compiler.autodiff import grad_graph
from tessel.compiler.builder import apply_all
from tessel.compiler.ir import Graph
from tessel.compiler.lower_onnx import to_onnx
from tessel.compiler.tracer import Trace
from tessel.plugins.cpu.compute import CpuCompute

_COMPUTE: CpuCompute | None = None

erf = np.vectorize(math.erf, otypes=[np.float64])


def compute() -> CpuCompute:
    global _COMPUTE
    if _COMPUTE is None:
        _COMPUTE = CpuCompute(threads=1)
    return _COMPUTE


def run_graph(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Lower (checking the model with onnx.checker, full check) and run on ONNX Runtime's CPU EP."""
    model = to_onnx(graph)
    onnx.checker.check_model(model, full_check=True)
    exe = compute().compile(model.SerializeToString())
    return compute().run(exe, feeds)


def op_graph(op: str, inputs: Sequence[np.ndarray], attrs: dict, weights: Sequence[np.ndarray] | None = None) -> Graph:
    """A graph applying `op` to inputs a0, a1, ...; with `weights`, it returns sum(out_k * w_k) over float outputs."""
    with Trace(op.lower()) as t:
        args = [t.input(f"a{i}", x.shape, x.dtype) for i, x in enumerate(inputs)]
        outs = apply_all(op, *args, **attrs)
        if weights is None:
            graph, _ = t.build(list(outs))
            return graph
        loss = None
        for out, w in zip(outs, weights):
            if w is None:
                continue
            term = (out * w).sum()
            loss = term if loss is None else loss + term
        graph, _ = t.build(loss)
    return graph


def feeds_of(inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    return {f"a{i}": x for i, x in enumerate(inputs)}


def check_forward(op: str, inputs, attrs: dict, reference: Callable, rtol=1e-5, atol=1e-6) -> list[np.ndarray]:
    """Run op on ORT and compare every output with reference(*inputs) (a tuple for multi-output ops)."""
    inputs = [np.asarray(x) for x in inputs]
    got = run_graph(op_graph(op, inputs, attrs), feeds_of(inputs))
    want = reference(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) >= len(want), f"{op}: {len(got)} outputs, reference has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.shape == w.shape, f"{op} output {i}: shape {g.shape} != reference {w.shape}"
        assert g.dtype == w.dtype or w.dtype.kind == g.dtype.kind, f"{op} output {i}: dtype {g.dtype} vs {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{op} output {i}")
    return got


def numeric_grad(fn: Callable[[list[np.ndarray]], float], inputs: list[np.ndarray], index: int, eps=1e-6):
    """Central differences of scalar fn with respect to inputs[index], in float64."""
    x = np.array(inputs[index], dtype=np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        for sign in (1, -1):
            shifted = x.copy()
            shifted[i] += sign * eps
            args = list(inputs)
            args[index] = shifted
            grad[i] += sign * fn(args)
    return grad / (2 * eps)


def check_grad(
    op: str,
    inputs: Sequence[np.ndarray],
    attrs: dict,
    reference: Callable,
    wrt: Sequence[int] | None = None,
    dtype=np.float64,
    rtol=1e-6,
    atol=1e-8,
    seed=0,
) -> None:
    """Autodiff of sum(op(inputs)_k * w_k) (random w) run on ORT in `dtype`, vs float64 differences of reference."""
    rng = np.random.default_rng(seed)
    inputs = [np.asarray(x, dtype=dtype if np.asarray(x).dtype.kind == "f" else None) for x in inputs]
    wrt = [i for i, x in enumerate(inputs) if x.dtype.kind == "f"] if wrt is None else list(wrt)
    outs = reference(*[x.astype(np.float64) if x.dtype.kind == "f" else x for x in inputs])
    outs = outs if isinstance(outs, tuple) else (outs,)
    weights = [rng.standard_normal(np.shape(o)) if np.asarray(o).dtype.kind == "f" else None for o in outs]

    def loss(args: list[np.ndarray]) -> float:
        result = reference(*args)
        result = result if isinstance(result, tuple) else (result,)
        return float(sum(np.sum(np.asarray(r) * w) for r, w in zip(result, weights) if w is not None))

    cast_weights = [None if w is None else w.astype(dtype) for w in weights]
    forward = op_graph(op, inputs, attrs, cast_weights)
    graph = grad_graph(forward, [f"a{i}" for i in wrt])
    got = run_graph(graph, feeds_of(inputs))[1:]
    base = [x.astype(np.float64) if x.dtype.kind == "f" else x for x in inputs]
    for g, i in zip(got, wrt):
        want = numeric_grad(loss, base, i)
        assert g.shape == inputs[i].shape and g.dtype == inputs[i].dtype, f"{op}: grad {i} is {g.dtype}{g.shape}"
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, err_msg=f"{op}: gradient of input {i}")
