"""A semi-auto parallel train step end to end: the pass's rank graphs, extended with autodiff and SGD by the
ordinary build_train_step, gradient AllReduces bucketed, lowered to rank programs and run on the simulated world
of the rank-program simulator, train exactly like one device."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from par_testkit import by_op, close, compute, traced

from tessel.compiler import SGD, TrainStep, bucket_allreduce, build_train_step, lower_rank_program, simulate
from tessel.compiler.builder import apply
from tessel.compiler.parallel import parallelize
from tessel.compiler.parallel.layout import assemble
from tessel.compiler.tracer import TensorSpec

rng = np.random.default_rng(4)
BATCH, HIDDEN, FFN, CLASSES = 8, 8, 16, 4
PARAMS = ["w1", "w2"]


def loss_fn(x, y, w1, w2):
    logits = apply("MatMul", apply("ReLU", apply("MatMul", x, w1)), w2)
    return apply("SparseSoftmaxCrossEntropy", logits, y).mean()


def graph():
    specs = (
        TensorSpec((BATCH, HIDDEN)),
        TensorSpec((BATCH,), "int32"),
        TensorSpec((HIDDEN, FFN)),
        TensorSpec((FFN, CLASSES)),
    )
    return traced(loss_fn, *specs)


@pytest.mark.parametrize(("devices", "dp", "mp"), [(4, 2, 2), (8, 2, 4)])
def test_megatron_train_steps_equal_one_device(devices, dp, mp):
    g = graph()
    matmul1, matmul2 = by_op(g, "MatMul")
    (relu,) = by_op(g, "ReLU")
    strategies = {matmul1: ((dp, 1), (1, mp)), relu: ((dp, mp),), matmul2: ((dp, mp), (mp, 1))}
    plan = parallelize(g, strategies, devices, parameters=PARAMS)
    feeds = {
        "x": rng.standard_normal((BATCH, HIDDEN)).astype(np.float32),
        "y": rng.integers(0, CLASSES, BATCH).astype(np.int32),
        "w1": rng.standard_normal((HIDDEN, FFN)).astype(np.float32),
        "w2": rng.standard_normal((FFN, CLASSES)).astype(np.float32),
    }
    programs = []
    for rank in range(devices):
        train = build_train_step(plan.rank_graph(rank), PARAMS, SGD(0.5))
        fused = bucket_allreduce(train.graph)
        programs.append(lower_rank_program(fused, state=[s.name for s in train.state], world_size=devices))
    rank_feeds = [plan.local_feeds(feeds, r) | {"learning_rate": np.float32(0.5)} for r in range(devices)]
    stores = simulate(programs, rank_feeds, compute(), runs=3)

    single = build_train_step(g, PARAMS, SGD(0.5))
    step = TrainStep(single, compute(), {p: feeds[p] for p in PARAMS})
    for _ in range(3):
        loss = step(x=feeds["x"], y=feeds["y"])
    for name in PARAMS:
        got = assemble([s[name] for s in stores], plan.input_layout(name), feeds[name].shape)
        close(got, step.state[name], what=f"{name} after 3 steps")
    for store in stores:
        close(store[programs[0].outputs[0]], loss, what="loss of step 3")
    # forward: x's rows gathered over mp (the dataset cuts them over every rank), the partial logits
    # reduce-scattered into the cross-entropy's data-parallel rows, the loss mean all-reduced; backward: the
    # adjoint of the ReduceScatter (AllGather; the loss's AllReduce has none: its cotangent is the same on every
    # rank), and one bucket for both parameters' gradients, all-reduced over the dp ranks that hold the same pieces
    expected = Counter({"ALL_GATHER": 2, "REDUCE_SCATTER": 1, "ALL_REDUCE": 2})
    assert all(p.collective_counts() == expected for p in programs)
    last = [i.collective for i in programs[0].program.instructions if i.WhichOneof("op") == "collective"][-1]
    w1 = plan.input_layout("w1")
    assert programs[0].groups[last.group] == w1.mesh.group(0, w1.replicated_axes) == tuple(range(0, devices, mp))


def test_a_data_parallel_plan_reduces_the_loss_in_the_gradient_bucket():
    """No strategy, the batch cut over 4 ranks: the loss (partial sums) is all-reduced in the same bucket as the
    gradients, one collective a step as under DATA_PARALLEL, and the step still equals one device."""
    g = graph()
    plan = parallelize(g, {}, 4, parameters=PARAMS)
    feeds = {
        "x": rng.standard_normal((BATCH, HIDDEN)).astype(np.float32),
        "y": rng.integers(0, CLASSES, BATCH).astype(np.int32),
        "w1": rng.standard_normal((HIDDEN, FFN)).astype(np.float32),
        "w2": rng.standard_normal((FFN, CLASSES)).astype(np.float32),
    }
    programs = []
    for rank in range(4):
        train = build_train_step(plan.rank_graph(rank), PARAMS, SGD(0.5))
        programs.append(
            lower_rank_program(bucket_allreduce(train.graph), state=[s.name for s in train.state], world_size=4)
        )
    rank_feeds = [plan.local_feeds(feeds, r) | {"learning_rate": np.float32(0.5)} for r in range(4)]
    stores = simulate(programs, rank_feeds, compute(), runs=3)
    step = TrainStep(build_train_step(g, PARAMS, SGD(0.5)), compute(), {p: feeds[p] for p in PARAMS})
    for _ in range(3):
        loss = step(x=feeds["x"], y=feeds["y"])
    for name in PARAMS:
        close(stores[0][name], step.state[name], what=f"{name} after 3 steps")
    for store in stores:
        close(store[programs[0].outputs[0]], loss, what="loss of step 3")
    assert all(p.collective_counts() == Counter({"ALL_REDUCE": 1}) for p in programs)
