"""Work done part by part on the rows of one tensor, done once on the whole (compiler/row_parts.py): which parts
form a partition, which nodes merge and which do not, and that the merged graph computes what the parts did."""

from __future__ import annotations

import numpy as np
from compiler_testkit import run_graph

from tessel.compiler import TensorSpec, registry, trace
from tessel.compiler.builder import apply, apply_all
from tessel.compiler.ir import Attrs, Graph, Node, Value
from tessel.compiler.rank_rewrite import merge_duplicates
from tessel.compiler.row_parts import drop_unread, merge_row_parts, row_partitions

ONE_HOST = registry.RewriteContext(one_host=True, spmd=True)  # every rank runs a copy of the graph
ROWS, WIDTH = 8, 6


def _ops(graph):
    return [n.op for n in graph.nodes]


def _same_results(before, after):
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape) for v in before.inputs}
    for want, got in zip(run_graph(before, feeds), run_graph(after, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_split_and_interleaved_slices_that_take_every_row_once_are_partitions_and_a_few_slices_are_not():
    def body(x, y):
        halves = apply_all("Split", x, axis=0, output_num=2)
        copies = [y[i::4] for i in range(4)]
        first_rows = (x[0:2], x[2:4])  # rows 4.. are not taken: no partition
        return (*halves, *copies, *first_rows)

    graph = trace(body, TensorSpec((ROWS, WIDTH), "float64"), TensorSpec((ROWS, WIDTH), "float64")).graph
    found = row_partitions(graph)
    x, y = graph.inputs
    split = found[graph.outputs[0]][0]
    assert (split.source, split.rows, split.contiguous) == (x, ((0, 4, 1), (4, 8, 1)), True)
    interleaved = found[graph.outputs[2]][0]
    assert interleaved.source is y and interleaved.rows == tuple((i, ROWS, 4) for i in range(4))
    assert not interleaved.contiguous
    assert [found[v][1] for v in graph.outputs[2:6]] == [0, 1, 2, 3]
    assert graph.outputs[6] not in found and graph.outputs[7] not in found


def _copies(x, w, scale):
    """MicroBatchInterleaved's shape: each copy's rows of x, through the same ops, then each copy's own mean."""
    total = None
    for i in range(4):
        hidden = apply("Tanh", (x[i::4] @ w) * scale)
        loss = (hidden * hidden).mean()
        total = loss if total is None else total + loss
    return total


def test_copies_on_interleaved_rows_run_as_one_on_one_host_and_compute_the_same():
    specs = [TensorSpec((ROWS, WIDTH), "float64"), TensorSpec((WIDTH, WIDTH), "float64"), TensorSpec((), "float64")]
    graph = trace(_copies, *specs).graph
    merged = merge_row_parts(graph, ONE_HOST)
    ops = _ops(merged)
    assert ops.count("MatMul") == 1 and ops.count("Tanh") == 1 and ops.count("Mul") == 2, ops
    assert ops.count("ReduceMean") == 4  # a mean over all of a part's elements is no row-wise op: it stays per copy
    assert next(n for n in merged.nodes if n.op == "MatMul").inputs[0] is graph.inputs[0]  # x itself
    _same_results(graph, merged)


def test_nothing_merges_across_hosts_where_micro_batches_run_apart_or_where_ranks_graphs_may_differ():
    specs = [TensorSpec((ROWS, WIDTH), "float64"), TensorSpec((WIDTH, WIDTH), "float64"), TensorSpec((), "float64")]
    graph = trace(_copies, *specs).graph
    assert merge_row_parts(graph) is graph
    apart = registry.RewriteContext(one_host=True, spmd=True, micro_batches_apart=True)
    assert merge_row_parts(graph, apart) is graph
    ranks_differ = registry.RewriteContext(one_host=True)  # manual parallelism: ranks' graphs may differ
    assert merge_row_parts(graph, ranks_differ) is graph


def test_a_concat_of_a_splits_parts_in_order_is_the_tensor_and_one_in_another_order_stays():
    def body(x):
        a, b = apply_all("Split", apply("Exp", x), axis=0, output_num=2)
        return apply("Concat", a, b, axis=0) + apply("Concat", b, a, axis=0)

    graph = trace(body, TensorSpec((ROWS, WIDTH), "float64")).graph
    merged = merge_row_parts(graph, ONE_HOST)
    assert _ops(merged).count("Concat") == 1
    _same_results(graph, merged)


def test_all_reduces_of_the_parts_are_one_and_a_graph_with_sends_keeps_its_parts():
    def body(x):
        parts = apply_all("Split", x, axis=0, output_num=2)
        reduced = [apply("AllReduce", apply("Tanh", p), group=(0, 1)) for p in parts]
        return reduced[0].sum() + reduced[1].sum()

    def sending(x):
        return body(x) + apply("Send", x, peer=1, group=(0, 1)).sum()

    with_send = trace(sending, TensorSpec((ROWS, WIDTH))).graph
    assert merge_row_parts(with_send, ONE_HOST) is with_send  # merging could move the send among the collectives
    graph = trace(body, TensorSpec((ROWS, WIDTH))).graph
    merged = merge_row_parts(graph, ONE_HOST)
    assert _ops(merged).count("AllReduce") == 1 and _ops(merged).count("Tanh") == 1
    whole = next(n for n in merged.nodes if n.op == "AllReduce")
    assert whole.inputs[0].shape == (ROWS, WIDTH)


def test_a_broadcast_seed_scaled_alike_in_every_copy_is_made_again_as_tall_as_the_whole():
    """Each copy's mean gradient is a scalar broadcast to the copy's rows, scaled: after merging the copies' alike
    nodes into one, the Mul that reads it and the copy's rows merges, reading the broadcast made for all rows."""

    def body(x, g):
        outs = []
        for i in range(2):
            seed = apply("BroadcastTo", g * 0.5, shape=(ROWS // 2, WIDTH)) * 3.0
            outs.append(x[i::2] * seed)
        return outs[0].sum() + outs[1].sum()

    graph = trace(body, TensorSpec((ROWS, WIDTH), "float64"), TensorSpec((), "float64")).graph
    merged = merge_row_parts(graph, ONE_HOST)
    broadcast = [n for n in merged.nodes if n.op == "BroadcastTo"]
    assert [n.outputs[0].shape for n in broadcast] == [(ROWS, WIDTH)], _ops(merged)
    assert sum(n.op == "Mul" and n.outputs[0].shape == (ROWS, WIDTH) for n in merged.nodes) == 2
    _same_results(graph, merged)


def test_random_ops_are_neither_merged_as_duplicates_nor_moved_from_the_parts_to_the_whole():
    def body(x):
        twins = [apply_all("Dropout", x, p=0.5, seed=3)[0] for _ in range(2)]
        parts = [apply_all("Dropout", p, p=0.5, seed=3)[0] for p in apply_all("Split", x, axis=0, output_num=2)]
        return twins[0] + twins[1] + apply("Concat", *parts, axis=0)

    graph = trace(body, TensorSpec((ROWS, WIDTH))).graph
    assert merge_duplicates(graph) is graph
    assert _ops(merge_row_parts(graph, ONE_HOST)).count("Dropout") == 4


def test_duplicates_are_one_node_and_unread_nodes_go():
    graph = trace(lambda x: apply("Exp", x) + apply("Exp", x), TensorSpec((ROWS, WIDTH), "float64")).graph
    merged = merge_duplicates(graph)
    assert _ops(merged) == ["Exp", "Add"]
    _same_results(graph, merged)
    x = graph.inputs[0]
    unread = Node("Tanh", (x,), Attrs(), (Value(x.type),))
    with_unread = Graph(graph.inputs, (unread, *graph.nodes), graph.outputs, graph.name)
    assert _ops(drop_unread(with_unread)) == _ops(graph)
    assert drop_unread(graph) is graph


def _random_copies(seed: int):
    """k copies of one random chain of row-wise ops (products with shared weights, element-wise ops with a scalar
    or with another partition's parts, a broadcast seed), on interleaved or contiguous parts of x, each copy reduced
    on its own; traced copy by copy as MicroBatchInterleaved does."""
    rng = np.random.default_rng(seed)
    k = int(rng.choice([2, 3, 4]))
    rows, interleaved = 4 * k, bool(rng.integers(2))
    steps = [str(rng.choice(["matmul", "tanh", "scale", "with_y", "seed", "relu"])) for _ in range(6)]

    def body(x, y, w, g):
        if interleaved:
            xs, ys = [x[i::k] for i in range(k)], [y[i::k] for i in range(k)]
        else:
            xs, ys = apply_all("Split", x, axis=0, output_num=k), apply_all("Split", y, axis=0, output_num=k)
        total = None
        for h, other in zip(xs, ys):
            for step in steps:
                if step == "matmul":
                    h = h @ w
                elif step == "tanh":
                    h = apply("Tanh", h)
                elif step == "relu":
                    h = apply("ReLU", h)
                elif step == "scale":
                    h = h * 0.5
                elif step == "with_y":
                    h = h * other + 1.0
                else:
                    h = h * apply("BroadcastTo", g * 0.25, shape=(rows // k, WIDTH))
            loss = (h * h).mean()
            total = loss if total is None else total + loss
        return total

    spec = TensorSpec((rows, WIDTH), "float64")
    return trace(body, spec, spec, TensorSpec((WIDTH, WIDTH), "float64"), TensorSpec((), "float64")).graph, steps


def test_random_chains_of_row_wise_ops_merge_and_compute_the_same():
    for seed in range(12):
        graph, steps = _random_copies(seed)
        merged = merge_row_parts(graph, ONE_HOST)
        ops = _ops(merged)
        for op, step in (("MatMul", "matmul"), ("Tanh", "tanh"), ("ReLU", "relu")):
            assert ops.count(op) == steps.count(step), (seed, steps, ops)
        broadcasts = [n.outputs[0].shape for n in merged.nodes if n.op == "BroadcastTo"]
        assert len(broadcasts) <= steps.count("seed") and all(rows > 4 for rows, _ in broadcasts), seed  # a copy: 4
        _same_results(graph, merged)
