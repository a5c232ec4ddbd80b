"""Optimizer parallel (compiler/optimizer_parallel.py) on the simulated world of the rank-program simulator: data
parallel and semi-auto train steps with sharded optimizer state (level1, level2) and sharded weights (level3) train
exactly like one device, for SGD, Momentum and Adam; the collectives are the ones each level promises; small or
indivisible parameters stay whole; shard groups smaller than the replica group; micro-batch accumulation."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest
from par_testkit import by_op, close, compute, traced

from tessel.compiler import (
    SGD,
    Adam,
    Momentum,
    TrainStep,
    bucket_allreduce,
    build_train_step,
    lower_rank_program,
    mirror_parameters,
)
from tessel.compiler.builder import apply
from tessel.compiler.optimizer_parallel import ShardConfig, plan_shards, shard_forward, shard_layout, split_group
from tessel.compiler.parallel import Layout, parallelize
from tessel.compiler.parallel.layout import assemble, piece
from tessel.compiler.rank_simulator import World
from tessel.compiler.tracer import TensorSpec

IN, HIDDEN, CLASSES, PER_RANK, STEPS = 6, 8, 4, 2, 3
PARAMS = ["w1", "b1", "w2", "b2"]
SHAPES = {"w1": (IN, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, CLASSES), "b2": (CLASSES,)}
OPTIMIZERS = {"sgd": SGD(0.5), "momentum": Momentum(0.2, 0.9), "adam": Adam(0.05)}


def loss_fn(x, y, w1, b1, w2, b2):
    h = apply("ReLU", apply("MatMul", x, w1) + b1)
    return apply("SparseSoftmaxCrossEntropy", apply("MatMul", h, w2) + b2, y).mean()


def mlp(batch: int):
    specs = [TensorSpec((batch, IN)), TensorSpec((batch,), "int32")] + [TensorSpec(SHAPES[p]) for p in PARAMS]
    return traced(loss_fn, *specs)


def initial(seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p: (rng.standard_normal(s) * 0.5).astype(np.float32) for p, s in SHAPES.items()}


def batches(rows: int, seed: int = 2) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((rows, IN)).astype(np.float32), rng.integers(0, CLASSES, rows).astype(np.int32))
        for _ in range(STEPS)
    ]


def single_device(optimizer, rows: int) -> tuple[list[float], dict[str, np.ndarray]]:
    """The reference: one device on the global batch."""
    step = TrainStep(build_train_step(mlp(rows), PARAMS, optimizer), compute(), initial())
    losses = [float(step(x=x, y=y)) for x, y in batches(rows)]
    return losses, {p: np.array(step.state[p]) for p in PARAMS}


def run_world(programs, trains, feeds_per_step, initial_stores):
    """Run every rank's program once per step; returns (losses of rank 0, final stores)."""
    world = World(programs, compute())
    stores = initial_stores
    losses = []
    for feeds in feeds_per_step:
        stores = world.run(feeds, stores)
        losses.append([float(s[p.outputs[0]]) for s, p in zip(stores, programs)])
    return losses, stores


def initial_store(train, values: dict[str, np.ndarray], rate: float) -> dict[str, np.ndarray]:
    store = {"learning_rate": np.float32(rate)}
    for spec in train.state:
        if spec.init is not None:
            store[spec.name] = np.full(spec.shape, spec.init, spec.dtype.numpy)
        else:
            store[spec.name] = values[spec.name]
    return store


def data_parallel(world: int, optimizer, config: ShardConfig | None):
    """Every rank's train step, programs and initial stores, data parallel with optional optimizer parallel."""
    trains, programs, stores, shards = [], [], [], []
    full = initial()
    for rank in range(world):
        forward = mirror_parameters(mlp(PER_RANK), PARAMS, tuple(range(world)), mean=True)
        plan = plan_shards(forward, PARAMS, config, rank) if config else {}
        forward = shard_forward(forward, plan)
        train = build_train_step(forward, PARAMS, optimizer, shards=plan)
        graph = bucket_allreduce(train.graph)
        programs.append(lower_rank_program(graph, state=[s.name for s in train.state], world_size=world))
        values = {p: full[p][slice(*plan[p].rows)] if p in plan and plan[p].weights_sharded else full[p] for p in full}
        trains.append(train)
        stores.append(initial_store(train, values, optimizer.learning_rate))
        shards.append(plan)
    data = batches(PER_RANK * world)
    feeds = [[{"x": x[r::world], "y": y[r::world]} for r in range(world)] for x, y in data]
    return trains, programs, stores, shards, feeds


def whole(stores, shards, name: str) -> np.ndarray:
    """A parameter's value: level3 blocks concatenated over the shard group, else rank 0's."""
    plan = shards[0].get(name)
    if plan is None or not plan.weights_sharded:
        for store in stores[1:]:
            np.testing.assert_array_equal(store[name], stores[0][name], err_msg=f"{name} differs across ranks")
        return stores[0][name]
    return np.concatenate([stores[r][name] for r in plan.group])


@pytest.mark.parametrize("level", ["level1", "level2", "level3"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("world", [2, 4])
def test_data_parallel_optimizer_parallel_equals_one_device(world, opt, level):
    optimizer = OPTIMIZERS[opt]
    want_losses, want = single_device(optimizer, PER_RANK * world)
    trains, programs, stores, shards, feeds = data_parallel(world, optimizer, ShardConfig(level, threshold_kb=0))
    losses, stores = run_world(programs, trains, feeds, stores)
    # The local losses average to the global batch's (equal shards, mean loss).
    np.testing.assert_allclose(np.mean(losses, axis=1), want_losses, rtol=1e-5)
    for name in PARAMS:
        close(whole(stores, shards, name), want[name], what=f"{name} ({opt}, {level}, {world} ranks)")
    # w1 (6 rows) divides among 2 ranks only; the others shard at every size tried.
    sharded = {"b1", "w2"} | ({"w1", "b2"} if world == 2 else {"b2"})
    assert set(shards[0]) == sharded
    for rank, store in enumerate(stores):
        for slot in trains[rank].optimizer.slots():
            for name in sharded:
                assert store[f"{name}/{slot.name}"].shape == shards[rank][name].block_shape


def test_collectives_of_each_level():
    counts = {}
    for level in ("level1", "level3"):
        _, programs, *_ = data_parallel(2, Adam(0.05), ShardConfig(level, threshold_kb=0))
        counts[level] = programs[0].collective_counts()
    # level1: one reduce-scatter and one all-gather (of the new block) per parameter, no all-reduce
    assert counts["level1"] == Counter({"REDUCE_SCATTER": 4, "ALL_GATHER": 4})
    # level3: the four parameters gathered for the forward, and w2 again for the backward (the only one the
    # backward reads: x needs no gradient, biases none), gradients reduce-scattered, no gather after the update
    assert counts["level3"] == Counter({"REDUCE_SCATTER": 4, "ALL_GATHER": 5})


def test_threshold_keeps_small_parameters_whole():
    forward = mirror_parameters(mlp(PER_RANK), PARAMS, (0, 1), mean=True)
    # w1 is 6*8*4 = 192 bytes, w2 128, b1 32, b2 16: a threshold of 0 KB shards all four, 1 KB none
    assert set(plan_shards(forward, PARAMS, ShardConfig(threshold_kb=0), 0)) == set(PARAMS)
    assert plan_shards(forward, PARAMS, ShardConfig(threshold_kb=1), 0) == {}
    assert set(plan_shards(forward, PARAMS, ShardConfig(threshold_kb=0), 1, frozenset({"w1"}))) == {"b1", "w2", "b2"}


def test_shard_groups_tile_the_replica_group():
    assert split_group((0, 1, 2, 3), -1, 2) == ((0, 1, 2, 3), (2,))
    assert split_group((0, 1, 2, 3), 2, 3) == ((2, 3), (1, 3))
    assert split_group((0, 2, 4, 6), 2, 4) == ((4, 6), (0, 4))


def test_a_shard_size_that_does_not_divide_the_group_leaves_the_parameter_whole_and_says_so(caplog):
    # MindSpore warns ("can not be applied") and trains on; it was an error here
    caplog.set_level(logging.WARNING)
    assert split_group((0, 1, 2, 3), 3, 0) is None
    assert "optimizer_weight_shard_size=3 does not divide the 4 ranks [0, 1, 2, 3]" in caplog.text


@pytest.mark.parametrize("level", ["level1", "level3"])
def test_shard_size_smaller_than_the_group_adds_an_all_reduce_over_the_block_holders(level):
    optimizer = Adam(0.05)
    want_losses, want = single_device(optimizer, PER_RANK * 4)
    config = ShardConfig(level, threshold_kb=0, shard_size=2)
    trains, programs, stores, shards, feeds = data_parallel(4, optimizer, config)
    assert shards[1]["w2"].group == (0, 1) and shards[1]["w2"].replicas == (1, 3)
    losses, stores = run_world(programs, trains, feeds, stores)
    np.testing.assert_allclose(np.mean(losses, axis=1), want_losses, rtol=1e-5)
    for name in PARAMS:
        close(whole(stores, shards, name), want[name], what=name)


def test_checkpoint_layouts_describe_each_block():
    forward = mirror_parameters(mlp(PER_RANK), PARAMS, tuple(range(4)), mean=True)
    full = initial()["w2"]
    for shard_size in (-1, 2):
        blocks = []
        for rank in range(4):
            shard = plan_shards(forward, PARAMS, ShardConfig(threshold_kb=0, shard_size=shard_size), rank)["w2"]
            layout = shard_layout(Layout.replicated(2, 4), shard, rank)
            blocks.append(piece(full, layout, rank))
            np.testing.assert_array_equal(blocks[-1], full[slice(*shard.rows)])
        np.testing.assert_array_equal(assemble(blocks, layout, full.shape), full)


@pytest.mark.parametrize("level", ["level1", "level3"])
def test_semi_auto_shards_over_the_replica_axes(level):
    """A Megatron MLP on 2 x 2 devices: w1 cut by columns and w2 by rows over mp, replicated over dp; optimizer
    parallel shards each piece's dim 0 once more over its 2 dp replicas."""
    devices, dp, mp, batch = 4, 2, 2, 8

    def megatron(x, y, w1, w2):
        logits = apply("MatMul", apply("ReLU", apply("MatMul", x, w1)), w2)
        return apply("SparseSoftmaxCrossEntropy", logits, y).mean()

    shapes = {"w1": (IN, HIDDEN), "w2": (HIDDEN, CLASSES)}
    g = traced(megatron, TensorSpec((batch, IN)), TensorSpec((batch,), "int32"), shapes["w1"], shapes["w2"])
    matmul1, matmul2 = by_op(g, "MatMul")
    (relu,) = by_op(g, "ReLU")
    strategies = {matmul1: ((dp, 1), (1, mp)), relu: ((dp, mp),), matmul2: ((dp, mp), (mp, 1))}
    plan = parallelize(g, strategies, devices, parameters=["w1", "w2"])
    rng = np.random.default_rng(5)
    full = {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}
    data = [(rng.standard_normal((batch, IN)).astype(np.float32), rng.integers(0, CLASSES, batch).astype(np.int32))]
    data *= STEPS
    optimizer = Adam(0.05)
    programs, stores, shards, trains = [], [], [], []
    for rank in range(devices):
        forward = plan.rank_graph(rank)
        mine = plan_shards(forward, ["w1", "w2"], ShardConfig(level, threshold_kb=0), rank)
        train = build_train_step(shard_forward(forward, mine), ["w1", "w2"], optimizer, shards=mine)
        programs.append(lower_rank_program(bucket_allreduce(train.graph), state=[s.name for s in train.state]))
        values = {}
        for name in full:
            local = plan.local_value(name, full[name], rank)
            layout = shard_layout(plan.input_layout(name), mine[name], rank) if name in mine else None
            values[name] = piece(full[name], layout, rank) if level == "level3" and layout is not None else local
        stores.append(initial_store(train, values, optimizer.learning_rate))
        shards.append(mine)
        trains.append(train)
    assert all(set(s) == {"w1", "w2"} for s in shards)
    feeds = [[plan.local_feeds({"x": x, "y": y}, r) for r in range(devices)] for x, y in data]
    losses, stores = run_world(programs, trains, feeds, stores)
    single = TrainStep(build_train_step(g, ["w1", "w2"], optimizer), compute(), full)
    want = [float(single(x=x, y=y)) for x, y in data]
    for rank in range(devices):
        close(np.array([step[rank] for step in losses]), np.array(want), what=f"losses on rank {rank}")
    for name in full:
        layouts = [
            shard_layout(plan.input_layout(name), shards[r][name], r) if level == "level3" else plan.input_layout(name)
            for r in range(devices)
        ]
        got = assemble([s[name] for s in stores], layouts[0], full[name].shape)
        close(got, single.state[name], what=f"{name} ({level})")


def test_micro_batches_accumulate_before_one_reduction():
    """A loss summed over two micro-batches marked by MicroBatchEnd: one reduce-scatter per parameter at level1,
    one per micro-batch at level2; gradients and losses as one device computes them."""
    world, micro, rows = 2, PER_RANK, 2 * PER_RANK  # each rank: 2 micro-batches of PER_RANK rows

    def micro_losses(x, y, w1, b1, w2, b2, first: int):
        return [loss_fn(x[first + i * micro : first + (i + 1) * micro], y[first + i * micro : first + (i + 1) * micro],
                        w1, b1, w2, b2) for i in range(2)]  # fmt: skip

    def accumulated(x, y, w1, b1, w2, b2):
        parts = micro_losses(x, y, w1, b1, w2, b2, 0)
        return sum((apply("MicroBatchEnd", part, index=i, count=2) for i, part in enumerate(parts[1:], 1)),
                   apply("MicroBatchEnd", parts[0], index=0, count=2))  # fmt: skip

    def reference(x, y, w1, b1, w2, b2):  # the ranks' summed losses, averaged over the ranks
        parts = [p for r in range(world) for p in micro_losses(x, y, w1, b1, w2, b2, r * rows)]
        return sum(parts[1:], parts[0]) * (1.0 / world)

    weights = [TensorSpec(SHAPES[p]) for p in PARAMS]
    specs = [TensorSpec((rows, IN)), TensorSpec((rows,), "int32"), *weights]
    ref_specs = [TensorSpec((rows * world, IN)), TensorSpec((rows * world,), "int32"), *weights]
    data = batches(rows * world)
    single = TrainStep(build_train_step(traced(reference, *ref_specs), PARAMS, SGD(0.5)), compute(), initial())
    want = [float(single(x=x, y=y)) for x, y in data]
    counts = {}
    for level in ("level1", "level2"):
        programs, stores, trains = [], [], []
        for rank in range(world):
            forward = mirror_parameters(traced(accumulated, *specs), PARAMS, (0, 1), mean=True)
            mine = plan_shards(forward, PARAMS, ShardConfig(level, threshold_kb=0), rank)
            train = build_train_step(forward, PARAMS, SGD(0.5), shards=mine)
            programs.append(lower_rank_program(bucket_allreduce(train.graph), state=[s.name for s in train.state]))
            stores.append(initial_store(train, initial(), 0.5))
            trains.append(train)
        counts[level] = programs[0].collective_counts()["REDUCE_SCATTER"]
        feeds = [[{"x": x[r * rows : (r + 1) * rows], "y": y[r * rows : (r + 1) * rows]} for r in range(world)]
                 for x, y in data]  # fmt: skip
        losses, stores = run_world(programs, trains, feeds, stores)
        np.testing.assert_allclose(np.mean(losses, axis=1), want, rtol=1e-5)
        for name in PARAMS:
            close(stores[0][name], single.state[name], what=f"{name} ({level})")
    assert counts == {"level1": 4, "level2": 8}


def test_gradient_fp32_sync_reduces_float16_gradients_in_float32():
    from tessel.compiler import grad_graph
    from tessel.compiler.buckets import sync_in_fp32

    def half(x, w):
        return apply("MatMul", x, w).astype("float32").mean()

    g = traced(half, TensorSpec((4, 3), "float16"), TensorSpec((3, 2), "float16"))
    mirrored = mirror_parameters(g, ["w"], (0, 1))
    for graph, dtype in ((mirrored, "float16"), (sync_in_fp32(mirrored), "float32")):
        for built in (grad_graph(graph, ["w"]), build_train_step(graph, ["w"], Momentum(0.1), shards={}).graph):
            (reduce,) = [n for n in built.nodes if n.op == "AllReduce"]
            assert reduce.inputs[0].dtype.value == dtype
    full_precision = mirror_parameters(mlp(2), PARAMS, (0, 1))
    assert sync_in_fp32(full_precision) is full_precision


@pytest.mark.parametrize("repeated_mean", [True, False])
def test_loss_repeated_mean_divides_the_gradient_of_a_replicated_loss(repeated_mean):
    """Pure data parallelism through the parallel pass: the loss is whole on each of 2 ranks; its gradient is
    divided by 2 (the mean over the repeats, MindSpore's default) unless loss_repeated_mean is off."""
    from tessel.compiler import grad_graph
    from tessel.compiler.lower_onnx import model_bytes
    from tessel.compiler.rank_simulator import run_graphs

    g = mlp(4)
    plan = parallelize(g, {}, 2, parameters=PARAMS, loss_repeated_mean=repeated_mean)
    assert any(n.op == "VirtualDiv" for n in plan.rank_graph(0).nodes) == repeated_mean
    feeds = dict(initial(), x=batches(4)[0][0], y=batches(4)[0][1])
    outs = run_graphs([grad_graph(plan.rank_graph(r), ["w2"]) for r in range(2)], [plan.local_feeds(feeds, r) for r
                      in range(2)], compute())  # fmt: skip
    exe = compute().compile(model_bytes(grad_graph(g, ["w2"])))
    _, want = compute().run(exe, {v.name: feeds[v.name] for v in g.inputs})
    close(outs[0][-1], want * (1 if repeated_mean else 2), what="d loss / d w2")
