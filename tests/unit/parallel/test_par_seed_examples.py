"""The seed tutorial's SemiAutoParallelNet examples (002, "Semi-automatic Parallelism") and a Megatron MLP:
N simulated ranks equal one device (forward and gradients), with the collectives the pass is expected to insert,
counted in the rank graph and in the lowered rank program."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from par_testkit import by_op, close, parallel_forward, parallel_grads, reference_grads, single_device, traced

from tessel.compiler.builder import apply
from tessel.compiler.parallel import TABLE, collective_counts, parallelize
from tessel.compiler.parallel.redistribution import ALL_STEPS
from tessel.compiler.rank_program import lower_rank_program

rng = np.random.default_rng(2)
BATCH, HIDDEN = 16, 128
X = rng.random((BATCH, HIDDEN)).astype(np.float32)
W = rng.random((HIDDEN, HIDDEN)).astype(np.float32)  # the seed initializes both weights from one array
FEEDS = {"x": X, "weight": W, "weight2": W}


def semi_auto_net(x, weight, weight2):
    """SemiAutoParallelNet: fc(x, weight) -> MatMul(x, weight2) -> ReduceSum(-1)."""
    h = apply("MatMul", x, weight)
    h = apply("MatMul", h, weight2)
    return apply("ReduceSum", h, axis=-1)


def loss_net(x, weight, weight2):
    return (semi_auto_net(x, weight, weight2) * 0.01).mean()


def graph_of(fn):
    return traced(fn, (BATCH, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, HIDDEN))


def numpy_net(x, w, w2):
    return (x.astype(np.float64) @ w @ w2).sum(-1)


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_fc_sharded_then_data_parallel_matmul_equals_one_device(devices):
    graph = graph_of(semi_auto_net)
    fc, matmul = by_op(graph, "MatMul")
    plan = parallelize(graph, {fc: ((1, 1), (1, 2))}, devices, parameters=["weight", "weight2"])
    assert plan.placements[matmul].origin == "data parallel"
    assert plan.placements[matmul].strategy == ((devices, 1), (1, 1))  # MindSpore's default for the 2nd MatMul
    # weight is cut in two along dim 1 (memory halves); weight2 is replicated
    assert plan.rank_graph(0).input("weight").shape == (HIDDEN, HIDDEN // 2)
    assert plan.rank_graph(0).input("weight2").shape == (HIDDEN, HIDDEN)
    (y,) = parallel_forward(plan, FEEDS)
    close(y, numpy_net(X, W, W), what=f"{devices} devices")


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_fc_then_fc2_inserts_a_gather_or_all_to_all_and_a_slice(devices):
    graph = graph_of(semi_auto_net)
    fc, fc2 = by_op(graph, "MatMul")
    strategies = {fc: ((1, 1), (1, 2)), fc2: ((devices, 1), (1, 1))}
    plan = parallelize(graph, strategies, devices, parameters=["weight", "weight2"], dataset="full_batch")
    move = plan.redistributions[(fc2, 0)]
    # fc gives [batch, 64] per rank (dim 1 cut in 2); fc2 wants dim 0 cut `devices` ways and dim 1 whole: slice
    # dim 0 locally by the copies, then one AlltoAll over the pair of ranks holding the two halves of dim 1.
    expected = ["AlltoAll"] if devices == 2 else ["StridedSlice", "AlltoAll"]
    assert [TABLE[s.kind].op for s in move.steps] == expected
    (y,) = parallel_forward(plan, FEEDS)
    close(y, numpy_net(X, W, W))
    # Without AlltoAll the planner takes the tutorial's AllGather + StridedSlice (slicing by the copies first, so
    # that the AllGather moves less), which still moves more bytes.
    tutorial = parallelize(graph, strategies, devices, ["weight", "weight2"], "full_batch", ALL_STEPS - {"all_to_all"})
    slow = tutorial.redistributions[(fc2, 0)]
    ops = [TABLE[s.kind].op for s in slow.steps]
    assert ops == (["AllGather", "StridedSlice"] if devices == 2 else ["StridedSlice", "AllGather", "StridedSlice"])
    assert slow.sent_bytes >= move.sent_bytes
    assert collective_counts(tutorial.rank_graph(devices - 1)) == Counter({"AllGather": 1})
    (y,) = parallel_forward(tutorial, FEEDS)
    close(y, numpy_net(X, W, W))


def test_the_tutorials_eight_device_strategy_is_rejected_on_four_devices():
    graph = graph_of(semi_auto_net)
    fc, fc2 = by_op(graph, "MatMul")
    with pytest.raises(Exception, match=r"MatMul.*8 parts.*4 devices.*A valid strategy: \(\(4, 1\), \(1, 1\)\)"):
        parallelize(graph, {fc: ((1, 1), (1, 2)), fc2: ((8, 1), (1, 1))}, 4, parameters=["weight", "weight2"])


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_gradients_of_the_seed_net_equal_one_device(devices):
    graph = graph_of(loss_net)
    fc, fc2 = by_op(graph, "MatMul")
    plan = parallelize(graph, {fc: ((1, 1), (1, 2)), fc2: ((devices, 1), (1, 1))}, devices, ["weight", "weight2"])
    losses, pieces, grads = parallel_grads(plan, FEEDS, ["weight", "weight2"])
    want_loss, want = reference_grads(graph, FEEDS, ["weight", "weight2"])
    for loss in losses:  # the loss is replicated: every rank holds the whole value
        close(loss, want_loss, what="loss")
    for name in ("weight", "weight2"):
        close(grads[name], want[name], what=f"d{name}")
        layout = plan.input_layout(name)
        for rank, piece in enumerate(pieces[name]):  # replicas hold identical, already all-reduced pieces
            np.testing.assert_array_equal(piece, pieces[name][layout.mesh.group(rank, layout.replicated_axes)[0]])


def test_gradient_all_reduce_groups_are_exactly_the_replica_axes():
    graph = graph_of(loss_net)
    fc, fc2 = by_op(graph, "MatMul")
    plan = parallelize(graph, {fc: ((1, 1), (1, 2)), fc2: ((8, 1), (1, 1))}, 8, ["weight", "weight2"])
    mirrors = {n.inputs[0].name: n.attrs["group"] for n in plan.rank_graph(5).nodes if n.op == "Mirror"}
    # weight: device matrix (4, 2), cut on the axis of 2 -> rank 5 shares its piece with 1, 3, 7 (same column)
    assert mirrors == {"weight": (1, 3, 5, 7), "weight2": tuple(range(8))}


@pytest.mark.parametrize(("devices", "dp", "mp"), [(4, 2, 2), (8, 2, 4), (8, 4, 2), (8, 1, 8)])
def test_megatron_mlp_has_exactly_one_forward_all_reduce(devices, dp, mp):
    hidden, ffn = 16, 32

    def mlp(x, w1, w2):
        return apply("MatMul", apply("ReLU", apply("MatMul", x, w1)), w2)

    graph = traced(mlp, (8, hidden), (hidden, ffn), (ffn, hidden))
    matmul1, matmul2 = by_op(graph, "MatMul")
    (relu,) = by_op(graph, "ReLU")
    strategies = {matmul1: ((dp, 1), (1, mp)), relu: ((dp, mp),), matmul2: ((dp, mp), (mp, 1))}
    plan = parallelize(graph, strategies, devices, parameters=["w1", "w2"], dataset="full_batch")
    for rank in range(devices):
        rank_graph = plan.rank_graph(rank)
        assert collective_counts(rank_graph) == Counter({"AllReduce": 1})
        program = lower_rank_program(rank_graph, state=["w1", "w2"], world_size=devices)
        assert program.collective_counts() == Counter({"ALL_REDUCE": 1})
        assert rank_graph.input("w1").shape == (hidden, ffn // mp)
        assert rank_graph.input("w2").shape == (ffn // mp, hidden)
    feeds = {"x": rng.standard_normal((8, hidden)).astype(np.float32)}
    feeds |= {"w1": rng.standard_normal((hidden, ffn)).astype(np.float32)}
    feeds |= {"w2": rng.standard_normal((ffn, hidden)).astype(np.float32)}
    (y,) = parallel_forward(plan, feeds)
    close(y, single_device(graph, feeds)[0])


def test_each_rank_materializes_only_its_slice_of_the_full_initial_value():
    graph = graph_of(semi_auto_net)
    fc, _ = by_op(graph, "MatMul")
    plan = parallelize(graph, {fc: ((1, 1), (1, 8))}, 8, parameters=["weight", "weight2"])
    pieces = [plan.local_value("weight", W, r) for r in range(8)]
    assert all(p.nbytes == W.nbytes // 8 for p in pieces)
    np.testing.assert_array_equal(np.concatenate(pieces, axis=1), W)  # cut from one deterministic full value
    with pytest.raises(Exception, match=r"'weight' is \(128, 128\) in the graph, got a value of shape \(128, 64\)"):
        plan.local_value("weight", W[:, :64], 0)
