"""Recomputation through the parallel pass: a recomputed op's rank-local ops (and, with its communication, the
collectives the pass inserts for it) are recomputed on every rank; gradients equal the single device's."""

from __future__ import annotations

import numpy as np
import pytest
from par_testkit import by_op, close, parallel_grads, reference_grads, traced

from tessel.compiler import registry
from tessel.compiler.autodiff import grad_graph
from tessel.compiler.builder import apply
from tessel.compiler.ir import Recompute
from tessel.compiler.parallel import parallelize

rng = np.random.default_rng(3)


def megatron(mark):
    def net(x, w1, w2):
        x.builder.recompute = mark
        h = apply("ReLU", apply("MatMul", x, w1))  # w1 cut by columns
        h = apply("Tanh", apply("MatMul", h, w2))  # w2 by rows: the partial sums are all-reduced before the Tanh
        x.builder.recompute = None
        return apply("Neg", h).sum()  # the region's output op is kept

    return traced(net, (8, 6), (6, 16), (16, 4))


def plan(mark):
    graph = megatron(mark)
    first, second = by_op(graph, "MatMul")
    strategies = {first: ((1, 1), (1, 2)), second: ((1, 2), (2, 1))}
    return graph, parallelize(graph, strategies, 2, parameters=["w1", "w2"])


def collectives(plan_, rank: int) -> int:
    graph = grad_graph(plan_.rank_graph(rank), ["w1", "w2"])
    return sum(registry.get(n.op).collective is not None for n in graph.nodes)


@pytest.mark.parametrize("mark", [Recompute.WITH_COMM, Recompute.WITHOUT_COMM])
def test_recomputed_megatron_layers_give_the_single_device_gradients(mark):
    feeds = {
        "x": rng.standard_normal((8, 6)).astype(np.float32),
        "w1": rng.standard_normal((6, 16)).astype(np.float32),
        "w2": rng.standard_normal((16, 4)).astype(np.float32),
    }
    graph, parallel = plan(mark)
    want_loss, want = reference_grads(graph, feeds, ["w1", "w2"])
    losses, _, got = parallel_grads(parallel, feeds, ["w1", "w2"])
    for loss in losses:
        close(loss, want_loss, what="loss")
    for name in ("w1", "w2"):
        close(got[name], want[name], what=name)


def test_inserted_collectives_are_recomputed_only_with_their_communication():
    base = collectives(plan(None)[1], 0)
    assert collectives(plan(Recompute.WITHOUT_COMM)[1], 0) == base
    forward = plan(Recompute.WITH_COMM)[1].rank_graph(0)
    marked = [n for n in forward.nodes if n.recompute is not None]
    assert {"MatMul", "ReLU", "Tanh"} <= {n.op for n in marked}
    # x gathered for the first MatMul, the partial sums reduce-scattered for the Tanh: the copies need them again
    moved = [n.op for n in marked if registry.get(n.op).collective is not None]
    assert "AllGather" in moved and "ReduceScatter" in moved
    assert collectives(plan(Recompute.WITH_COMM)[1], 0) == base + len(moved)
