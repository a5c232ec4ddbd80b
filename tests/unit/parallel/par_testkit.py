"""Helpers for the parallel-pass tests: trace a function, run it on one device (ONNX Runtime, the reference), and
run its parallel plan on N simulated ranks (compiler.rank_simulator), assembling global outputs and gradients
from the ranks' pieces."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tessel.compiler.autodiff import grad_graph
from tessel.compiler.ir import Graph
from tessel.compiler.lower_onnx import model_bytes
from tessel.compiler.parallel import ParallelPlan, assemble, piece
from tessel.compiler.rank_simulator import run_graphs
from tessel.compiler.tracer import TensorSpec, trace
from tessel.plugins.cpu.compute import CpuCompute

_COMPUTE: CpuCompute | None = None


def compute() -> CpuCompute:
    global _COMPUTE
    if _COMPUTE is None:
        _COMPUTE = CpuCompute(threads=1)
    return _COMPUTE


def traced(fn: Callable, *shapes, dtype="float32") -> Graph:
    """The graph of fn over inputs of the given shapes (each a shape tuple or a TensorSpec)."""
    specs = [s if isinstance(s, TensorSpec) else TensorSpec(tuple(s), dtype) for s in shapes]
    return trace(fn, *specs).graph


def single_device(graph: Graph, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The graph run whole on one device: the reference every parallel result must equal."""
    exe = compute().compile(model_bytes(graph))
    return compute().run(exe, {v.name: feeds[v.name] for v in graph.inputs})


def on_ranks(plan: ParallelPlan, graphs: Sequence[Graph], feeds: Mapping[str, np.ndarray]) -> list[list[np.ndarray]]:
    return run_graphs(graphs, [plan.local_feeds(feeds, r) for r in range(plan.device_num)], compute())


def parallel_forward(plan: ParallelPlan, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The plan's outputs, each assembled from every rank's piece (and every replica checked to agree)."""
    outs = on_ranks(plan, [plan.rank_graph(r) for r in range(plan.device_num)], feeds)
    results = []
    for k, (v, layout) in enumerate(zip(plan.graph.outputs, plan.output_layouts)):
        whole = assemble([o[k] for o in outs], layout, v.shape)
        for rank, o in enumerate(outs):
            np.testing.assert_array_equal(o[k], piece(whole, layout, rank), err_msg=f"output {k} on rank {rank}")
        results.append(whole)
    return results


def parallel_grads(plan: ParallelPlan, feeds: Mapping[str, np.ndarray], wrt: Sequence[str]):
    """(loss on every rank, gradient pieces per rank, assembled gradients) of output 0 w.r.t. `wrt`."""
    graphs = [grad_graph(plan.rank_graph(r), list(wrt)) for r in range(plan.device_num)]
    outs = on_ranks(plan, graphs, feeds)
    n = len(plan.graph.outputs)
    pieces = {name: [o[n + i] for o in outs] for i, name in enumerate(wrt)}
    full = {name: assemble(pieces[name], plan.input_layout(name), plan.graph.input(name).shape) for name in wrt}
    return [o[0] for o in outs], pieces, full


def reference_grads(graph: Graph, feeds: Mapping[str, np.ndarray], wrt: Sequence[str]):
    outs = single_device(grad_graph(graph, list(wrt)), feeds)
    n = len(graph.outputs)
    return outs[0], dict(zip(wrt, outs[n:]))


def close(got: np.ndarray, want: np.ndarray, tol: float = 1e-5, what: str = "") -> None:
    """Equal to float32 rounding: max |got - want| <= tol * max(1, max |want|)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    err = float(np.abs(got - want).max(initial=0.0))
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol} * {scale:.3g}"


def by_op(graph: Graph, op: str) -> list:
    """The graph's nodes of `op`, in order (to attach strategies as a Primitive's shard() would)."""
    return [n for n in graph.nodes if n.op == op]
