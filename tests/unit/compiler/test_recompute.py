"""Recomputation in the compiler: nodes marked `recompute` are not read by the backward pass, which reads copies
made just before their first backward reader and ordered after the cotangent that starts that part of the
backward; gradients equal the graph without recomputation (bit for bit, Dropout included) and numpy float64;
ONNX Runtime keeps the copies apart from the originals and runs the model in the order it was written."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from compiler_testkit import compute, run_graph

from tessel.compiler import registry
from tessel.compiler.autodiff import expand_gradients, grad_graph
from tessel.compiler.builder import apply, apply_all
from tessel.compiler.ir import Graph, Recompute
from tessel.compiler.lower_onnx import EXECUTION_ORDER, PRIORITY_ORDER, model_bytes, to_onnx
from tessel.compiler.tracer import TensorSpec, trace
from tessel.plugins.cpu.compute import session_options

rng = np.random.default_rng(11)
SCALE = 2.37891
# MindSpore's recompute sample (tutorials/parallel/recompute.md), small: x (batch, seq, heads, dim), y (batch, seq, seq)
BATCH, SEQ, HEADS, DIM, BLOCKS = 2, 8, 2, 4, 3


def block(x, y, index: int, p: float, marked: bool):
    """One Block of the sample; its ops are marked for recomputation except the output Transpose (the cell's
    output op, which MindSpore keeps)."""
    x.builder.recompute = Recompute.WITH_COMM if marked else None
    t1 = apply("Transpose", x, perm=(0, 2, 1, 3)) / SCALE
    t2 = apply("Transpose", x, perm=(0, 2, 3, 1)) / SCALE
    scores = apply("BatchMatMul", t1, t2)
    bias = (1.0 - apply("ExpandDims", y, axis=1)) * -0.0001
    probs = apply("Softmax", bias + scores, axis=-1)
    dropped = apply_all("Dropout", probs, p=p, seed=index + 1)[0]
    out = apply("BatchMatMul", dropped, apply("Transpose", x, perm=(0, 2, 1, 3)))
    x.builder.recompute = None
    return apply("Transpose", out, perm=(0, 2, 1, 3))


def sample_graph(marked: bool, p: float = 0.0, gradient_of: bool = False) -> Graph:
    def net(x, *ys):
        out = x
        for i, y in enumerate(ys):
            out = block(out, y, i, p, marked)
        loss = out.sum()
        if gradient_of:  # what value_and_grad records: differentiated by expand_gradients
            return loss, apply_all("GradientOf", loss, x, *ys)
        return loss

    specs = [TensorSpec((BATCH, SEQ, HEADS, DIM), name="x")]
    specs += [TensorSpec((BATCH, SEQ, SEQ), name=f"y{i}") for i in range(BLOCKS)]
    graph = trace(net, *specs).graph
    if gradient_of:
        return expand_gradients(graph)
    return grad_graph(graph, ["x"] + [f"y{i}" for i in range(BLOCKS)])


def feeds() -> dict[str, np.ndarray]:
    out = {"x": rng.standard_normal((BATCH, SEQ, HEADS, DIM)).astype(np.float32)}
    out.update({f"y{i}": rng.standard_normal((BATCH, SEQ, SEQ)).astype(np.float32) for i in range(BLOCKS)})
    return out


def numpy_gradients(x: np.ndarray, ys: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """d sum(net(x)) / d(x, ys) in float64, by hand (no dropout)."""
    saved, out = [], x.astype(np.float64)
    for y in ys:
        t1 = out.transpose(0, 2, 1, 3) / SCALE
        t2 = out.transpose(0, 2, 3, 1) / SCALE
        scores = t1 @ t2 + (1.0 - y.astype(np.float64)[:, None]) * -0.0001
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        t3 = out.transpose(0, 2, 1, 3)
        saved.append((t1, t2, probs, t3))
        out = (probs @ t3).transpose(0, 2, 1, 3)
    g = np.ones_like(out)
    gys = []
    for t1, t2, probs, t3 in reversed(saved):
        g_out = g.transpose(0, 2, 1, 3)
        g_probs = g_out @ t3.swapaxes(-1, -2)
        g_t3 = probs.swapaxes(-1, -2) @ g_out
        g_scores = probs * (g_probs - (g_probs * probs).sum(-1, keepdims=True))
        gys.append(0.0001 * g_scores.sum(1))
        g_t1 = g_scores @ t2.swapaxes(-1, -2) / SCALE
        g_t2 = t1.swapaxes(-1, -2) @ g_scores / SCALE
        g = g_t1.transpose(0, 2, 1, 3) + g_t2.transpose(0, 3, 1, 2) + g_t3.transpose(0, 2, 1, 3)
    return g, list(reversed(gys))


def test_the_backward_reads_copies_never_the_recomputed_originals():
    graph = sample_graph(marked=True, p=0.1)
    marked = [n for n in graph.nodes if n.recompute is not None and n.inputs]
    assert marked, "the trace marked nothing"
    position = {n: i for i, n in enumerate(graph.nodes)}
    first_backward = min(position[n] for n in graph.nodes if n.op == "OnesLike")
    readers: dict = {}
    for node in graph.nodes:
        for v in node.inputs:
            readers.setdefault(v, []).append(node)
    for node in marked:
        for out in node.outputs:
            late = [r.op for r in readers.get(out, []) if position[r] > first_backward]
            assert not late, f"{node.op}'s output is read by the backward ({late}) instead of a copy"
    # Every block but the first is recomputed from its kept input, which enters the copies through After.
    assert sum(n.op == "After" for n in graph.nodes) >= BLOCKS
    copies = [n for n in graph.nodes[first_backward:] if n.op == "Softmax"]
    assert len(copies) == BLOCKS


def test_the_output_op_of_a_recomputed_region_is_kept():
    graph = sample_graph(marked=True)
    transposes = [n for n in graph.nodes if n.op == "Transpose" and n.recompute is None]
    assert len([n for n in transposes if n.inputs[0].shape == (BATCH, HEADS, SEQ, DIM)]) >= BLOCKS


@pytest.mark.parametrize("gradient_of", [False, True], ids=["grad_graph", "GradientOf"])
def test_gradients_equal_the_unrecomputed_graph_and_float64(gradient_of):
    values = feeds()
    plain = run_graph(sample_graph(marked=False, gradient_of=gradient_of), values)
    recomputed = run_graph(sample_graph(marked=True, gradient_of=gradient_of), values)
    for got, want in zip(recomputed, plain):
        np.testing.assert_array_equal(got, want)  # the same ops on the same values
    gx, gys = numpy_gradients(values["x"], [values[f"y{i}"] for i in range(BLOCKS)])
    for got, want in zip(recomputed[1:], [gx, *gys]):
        scale = max(1.0, float(np.abs(want).max()))
        assert float(np.abs(got - want).max()) <= 1e-5 * scale


def test_a_recomputed_dropout_draws_the_mask_of_the_original_step_after_step():
    plain, recomputed = sample_graph(marked=False, p=0.3), sample_graph(marked=True, p=0.3)
    runs, values = {}, feeds()
    for name, graph in (("plain", plain), ("recomputed", recomputed)):
        exe = compute().compile(model_bytes(graph))
        runs[name] = [compute().run(exe, values) for _ in range(3)]
    for step, (got, want) in enumerate(zip(runs["recomputed"], runs["plain"])):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
    assert not np.array_equal(runs["plain"][0][1], runs["plain"][1][1]), "the masks should change step to step"


def test_onnx_runtime_keeps_the_copies_and_runs_the_written_order(tmp_path):
    model = to_onnx(sample_graph(marked=True, p=0.1))
    assert {p.key: p.value for p in model.metadata_props} == {EXECUTION_ORDER: PRIORITY_ORDER}
    assert not to_onnx(sample_graph(marked=False)).metadata_props
    onnx_bytes = model.SerializeToString()
    compute()  # the global thread pool the plugin's options expect
    options, disabled = session_options(onnx_bytes)
    assert options.execution_order == ort.ExecutionOrder.PRIORITY_BASED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    import onnx

    optimized = onnx.load(str(tmp_path / "optimized.onnx")).graph.node
    # Common-subexpression elimination would merge each copy with its original: the After edges prevent it.
    assert sum(n.op_type == "Softmax" for n in optimized) == 2 * BLOCKS
    assert sum(n.op_type == "Dropout" for n in optimized) == 2 * BLOCKS


@pytest.mark.parametrize(("mark", "collectives"), [(Recompute.WITH_COMM, 3), (Recompute.WITHOUT_COMM, 2)])
def test_collectives_are_recomputed_only_with_their_communication(mark, collectives):
    def f(x, w):
        x.builder.recompute = mark
        h = apply("ReLU", apply("AllReduce", apply("MatMul", x, w), reduce_op="sum", group=(0,)))
        x.builder.recompute = None
        return apply("Neg", h).sum()

    graph = grad_graph(trace(f, TensorSpec((4, 3)), TensorSpec((3, 5))).graph, ["w"])
    # forward AllReduce, its gradient (an AllReduce) and, with the communication recomputed, its copy
    assert sum(registry.get(n.op).collective is not None for n in graph.nodes) == collectives
    assert sum(n.op == "ReLU" for n in graph.nodes) == 2  # the ReLU is copied either way


def test_long_recomputed_chains_are_copied_without_recursion():
    def f(x):
        x.builder.recompute = Recompute.WITH_COMM
        h = x
        for _ in range(3000):
            h = apply("Tanh", h)
        x.builder.recompute = None
        return apply("Neg", h).sum()

    graph = grad_graph(trace(f, TensorSpec((3,))).graph, ["x"])
    assert sum(n.op == "Tanh" for n in graph.nodes) == 2 * 3000  # its gradient reads each Tanh output


def test_marks_travel_in_the_graph_json_the_coordinator_plans():
    from tessel.compiler.ir_json import graph_from_json, graph_to_json

    def net(x, *ys):
        out = x
        for i, y in enumerate(ys):
            out = block(out, y, i, 0.1, marked=True)
        return out.sum()

    specs = [TensorSpec((BATCH, SEQ, HEADS, DIM), name="x")]
    specs += [TensorSpec((BATCH, SEQ, SEQ), name=f"y{i}") for i in range(BLOCKS)]
    graph = trace(net, *specs).graph
    again = graph_from_json(graph_to_json(graph))
    assert again.hash == graph.hash
    assert [n.recompute for n in again.nodes] == [n.recompute for n in graph.nodes]
