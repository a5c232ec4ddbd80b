"""Helpers for the strategy-search tests: small nets (an MLP, a conv net, a net using one parameter in two ops), a
random-DAG builder for property tests, and an exhaustive search to check dynamic programming against."""

from __future__ import annotations

import itertools
import math

import numpy as np
from par_testkit import traced

from tessel.compiler.builder import apply
from tessel.compiler.ir import Graph
from tessel.compiler.parallel.search import CostModel, Link
from tessel.compiler.parallel.search.problem import Problem

MODES = ("sharding_propagation", "recursive_programming", "dynamic_programming")


def mlp_graph() -> tuple[Graph, list[str]]:
    def mlp(x, w1, b1, w2):
        h = apply("ReLU", apply("BiasAdd", apply("MatMul", x, w1), b1))
        return apply("MatMul", h, w2).mean()

    return traced(mlp, (8, 16), (16, 16), (16,), (16, 8)), ["w1", "b1", "w2"]


def conv_graph() -> tuple[Graph, list[str]]:
    def conv(x, w, w2):
        h = apply("ReLU", apply("Conv2D", x, w, pad_mode="same"))
        h = apply("Reshape", h, shape=(8, 4 * 4 * 4))
        return apply("MatMul", h, w2).mean()

    return traced(conv, (8, 2, 4, 4), (4, 2, 3, 3), (64, 4)), ["w", "w2"]


def shared_graph() -> tuple[Graph, list[str]]:
    """One weight used by two MatMuls and one bias by two BiasAdds (MindSpore's TmpIdentity case)."""

    def shared(x, w, b):
        h = apply("ReLU", apply("BiasAdd", apply("MatMul", x, w), b))
        h = apply("BiasAdd", apply("MatMul", h, w), b)
        return (h * h).mean()

    return traced(shared, (8, 8), (8, 8), (8,)), ["w", "b"]


def stacked_layers(layers: int, batch: int, hidden: int) -> tuple[Graph, list[str]]:
    """MatMul + BiasAdd + ReLU, `layers` times, then the mean: 3 * layers + 1 nodes."""
    from tessel.compiler.tracer import TensorSpec, trace

    def net(x, *weights):
        h = x
        for w, b in zip(weights[0::2], weights[1::2]):
            h = apply("ReLU", apply("BiasAdd", apply("MatMul", h, w), b))
        return h.mean()

    specs = [TensorSpec((batch, hidden), name="x")]
    for i in range(layers):
        specs += [TensorSpec((hidden, hidden), name=f"w{i}"), TensorSpec((hidden,), name=f"b{i}")]
    graph = trace(net, *specs).graph
    return graph, [v.name for v in graph.inputs[1:]]


NETS = {"mlp": mlp_graph, "conv": conv_graph, "shared": shared_graph}


def feeds_for(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in graph.inputs}


def cheap_links() -> CostModel:
    """A model where communication is nearly free and compute slow: the search then splits weights too."""
    return CostModel(1e8, 1e9, 1 << 30, Link(1e-7, 1e12), Link(1e-7, 1e12))


OPS = ("matmul_w0", "matmul_w1", "matmul_act", "add", "mul", "relu", "bias", "sum_rows")


def random_graph(steps: list[tuple[str, int, int]]) -> tuple[Graph, list[str]]:
    """A DAG over 12x12 tensors: each step applies an op to earlier values (picked by index modulo their count);
    w0 and w1 may be used several times (shared parameters)."""

    def net(x, w0, w1, b0):
        values = [x]
        for kind, i, j in steps:
            u, v = values[i % len(values)], values[j % len(values)]
            if kind == "matmul_w0":
                out = apply("MatMul", u, w0)
            elif kind == "matmul_w1":
                out = apply("MatMul", u, w1, transpose_b=True)
            elif kind == "matmul_act":
                out = apply("MatMul", u, v, transpose_a=True)
            elif kind == "add":
                out = u + v
            elif kind == "mul":
                out = u * v
            elif kind == "relu":
                out = apply("ReLU", u)
            elif kind == "bias":
                out = apply("BiasAdd", u, b0)
            else:
                out = apply("BroadcastTo", apply("ReduceSum", u, axis=0, keep_dims=True), shape=(12, 12))
            values.append(out)
        return values[-1].mean() + values[len(values) // 2].mean()  # two outputs keep side branches alive

    return traced(net, (12, 12), (12, 12), (12, 12), (12,)), ["w0", "w1", "b0"]


def combinations(problem: Problem) -> int:
    return math.prod(len(v.options) for v in problem.variables)


def brute_force(problem: Problem, budget: float | None = None) -> tuple[float, float] | None:
    """The least (time, memory) over every combination of options, with total memory <= budget."""
    best = None
    for assignment in itertools.product(*(range(len(v.options)) for v in problem.variables)):
        time, memory = problem.evaluate(assignment)
        if time == math.inf or (budget is not None and memory > budget):
            continue
        if best is None or time < best[0]:
            best = (time, memory)
    return best
