"""Lowering graphs with collectives to rank programs: cutting into segments keeps a graph's meaning, state writes
stay correct across segments, groups get names, gradient buckets respect their size and order and overlap the
backward, and data/tensor parallel train steps match single-device training (simulated world and a real daemon).

The reference for "keeps the meaning" runs the unsplit graph node by node: local ops one at a time through the
eager executor, collectives in numpy across the ranks, state writes applied after the run.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from compiler_testkit import compute

from tessel.compiler import (
    SGD,
    EagerExecutor,
    Momentum,
    TensorSpec,
    TrainStep,
    bucket_allreduce,
    build_train_step,
    data_parallel_train_step,
    gradients,
    lower_rank_program,
    mirror_parameters,
    plan_buckets,
    registry,
    simulate,
    trace,
)
from tessel.compiler.buckets import set_fusion
from tessel.compiler.builder import GraphBuilder, SymbolicTensor, apply
from tessel.compiler.lower_onnx import assign_output_name
from tessel.compiler.rank_simulator import World
from tessel.core.errors import ConfigurationError

B, F = 6, 6  # divisible by group sizes 2 and 3


# --- the reference: the unsplit graph, node by node, all ranks in lockstep ----------------------------------------


def _collective_reference(op, attrs, xs):
    """Each member's outputs of one collective node, straight from its definition (any axis)."""
    n = len(xs)
    if op == "AllReduce":
        total = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[attrs["reduce_op"]]
        return [[total([x[0] for x in xs], axis=0)]] * n
    if op == "AllGather":
        return [[np.concatenate([x[0] for x in xs], axis=attrs["axis"])]] * n
    if op == "ReduceScatter":
        return [[b] for b in np.split(np.sum([x[0] for x in xs], axis=0), n, axis=attrs["axis"])]
    if op == "Broadcast":
        return [[xs[attrs["root"]][0]]] * n
    if op == "AlltoAll":
        blocks = [np.split(x[0], n, axis=attrs["split_dim"]) for x in xs]
        return [[np.concatenate([blocks[j][i] for j in range(n)], axis=attrs["concat_dim"])] for i in range(n)]
    raise AssertionError(f"no reference for {op}")


def reference_run(graphs, feeds):
    """Outputs and new state of every rank, running the unsplit graphs (one per rank) together."""
    eager = EagerExecutor(compute())
    env = [{v: np.asarray(feed[v.name]) for v in g.inputs} for g, feed in zip(graphs, feeds)]
    writes = [{} for _ in graphs]
    for nodes in zip(*(g.nodes for g in graphs)):
        node = nodes[0]
        if registry.get(node.op).collective is not None:
            for group in {n.attrs["group"] for n in nodes}:  # each rank's node names its own group
                members = {rank: [env[rank][v] for v in nodes[rank].inputs] for rank in group}
                results = _lockstep(nodes, group, members)
                for rank in group:
                    env[rank].update(zip(nodes[rank].outputs, results[rank]))
            continue
        for rank, n in enumerate(nodes):
            out = eager.run(n.op, *[env[rank][v] for v in n.inputs], **dict(n.attrs))
            env[rank].update(zip(n.outputs, out if isinstance(out, tuple) else (out,)))
            if n.op == "Assign":
                writes[rank][n.inputs[0].name] = env[rank][n.inputs[1]]
    return [[e[v] for v in g.outputs] for e, g in zip(env, graphs)], writes


def _lockstep(nodes, group, members):
    node = nodes[group[0]]
    if node.op == "NeighborExchange":  # the attributes differ by rank: each names its own neighbours
        results = {}
        for rank in group:
            senders = [group[src] for src in nodes[rank].attrs["recv_ranks"]]
            results[rank] = [members[s][nodes[s].attrs["send_ranks"].index(group.index(rank))] for s in senders]
        return results
    outs = _collective_reference(node.op, node.attrs, [members[r] for r in group])
    return dict(zip(group, outs))


# --- a random-ish graph with collectives in the middle --------------------------------------------------------------


def random_graph(seed: int, rank: int, n: int):
    """Mixes local ops with every collective kind (random order, attributes and operands); the state `p` is
    written from values computed after collectives and read again after the write."""
    rng, const = random.Random(seed), np.random.default_rng(seed)
    group = tuple(range(n))

    def body(x, w, p):
        pool = [apply("Tanh", x @ w), x * 0.5]
        for _ in range(9):
            a, b = rng.choice(pool), rng.choice(pool)
            kind = rng.choice(["local", "allreduce", "gather", "scatter", "alltoall", "broadcast", "exchange"])
            if kind == "local":
                pick = rng.randrange(3)
                pool.append(apply("Tanh", a + b) if pick == 0 else a * b if pick == 1 else apply("ReLU", a - b))
            elif kind == "allreduce":
                pool.append(apply("AllReduce", a, reduce_op=rng.choice(["sum", "max", "min"]), group=group))
            elif kind == "gather":
                axis = rng.choice([0, 1])
                gathered = apply("AllGather", a, group=group, axis=axis)
                pool.append(gathered @ const.standard_normal((F * n, F)) if axis else gathered[:B])
            elif kind == "scatter":
                mine = apply("ReduceScatter", a, group=group, axis=1)
                pool.append(mine @ const.standard_normal((F // n, F)))
            elif kind == "alltoall":
                moved = apply("AlltoAll", a, group=group, split_dim=1, concat_dim=0)
                pool.append(apply("Reshape", moved, shape=(n, B, F // n)).sum(0) @ const.standard_normal((F // n, F)))
            elif kind == "broadcast":
                pool.append(apply("Broadcast", a, root=rng.randrange(n), group=group))
            else:
                ring = {"send_ranks": ((rank + 1) % n,), "recv_ranks": ((rank - 1) % n,)}
                pool.append(apply("NeighborExchange", a, group=group, recv_shapes=((B, F),), recv_dtype="float64",
                                  **ring))  # fmt: skip
        # 0.125 is exact in float32: ONNX Runtime may fuse the scale into a MatMul's float32 alpha.
        apply("Assign", p, p - 0.125 * apply("MatMul", pool[-1], pool[-2], transpose_a=True))
        # Reads of the old p after the write in graph order, one of them past a collective.
        after = apply("AllReduce", x @ p, group=group) @ p
        return (sum(t.sum() for t in pool) + after.sum(), pool[-1], after)

    specs = [TensorSpec((B, F), "float64"), TensorSpec((F, F), "float64"), TensorSpec((F, F), "float64")]
    return trace(body, *specs).graph


@pytest.mark.parametrize(("seed", "n"), [(0, 2), (1, 2), (2, 3), (3, 3), (4, 2)])
def test_segmenting_keeps_the_meaning_of_a_random_graph(seed, n):
    graphs = [random_graph(seed, rank, n) for rank in range(n)]
    rng = np.random.default_rng(seed)
    feeds = [{"x": rng.standard_normal((B, F)), "w": rng.standard_normal((F, F)), "p": rng.standard_normal((F, F))}
             for _ in range(n)]  # fmt: skip
    programs = [lower_rank_program(g, state=["p"], world_size=n) for g in graphs]
    assert len(programs[0].segments) >= 2 and sum(programs[0].collective_counts().values()) >= 1
    want, writes = reference_run(graphs, feeds)
    stores = simulate(programs, [dict(f) for f in feeds], compute())
    for rank in range(n):
        for name, value in zip(programs[rank].outputs, want[rank]):
            np.testing.assert_allclose(stores[rank][name], value, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(stores[rank]["p"], writes[rank]["p"], rtol=1e-10, atol=1e-12)
        leftovers = [k for k in stores[rank] if "@" in k]
        assert leftovers == [], f"intermediates not freed: {leftovers}"


# --- groups ---------------------------------------------------------------------------------------------------------


def _pairs_graph(rank: int):
    """Two tensor-parallel pairs in a world of 4: ranks (0, 1) and (2, 3) each sum their partial products."""
    group = (0, 1) if rank < 2 else (2, 3)

    def body(x, w):
        partial = x @ w
        total = apply("AllReduce", partial, group=group)
        return apply("AllGather", apply("Tanh", total), group=group, axis=1).sum(), total

    return trace(body, TensorSpec((B, F), "float64"), TensorSpec((F, F), "float64")).graph


def test_groups_other_than_the_world_are_named_and_listed_for_creation():
    graphs = [_pairs_graph(rank) for rank in range(4)]
    programs = [lower_rank_program(g, world_size=4) for g in graphs]
    assert dict(programs[0].groups) == {"g_0_1": (0, 1)} == dict(programs[1].groups)
    assert dict(programs[3].groups) == {"g_2_3": (2, 3)}
    assert {i.collective.group for i in programs[2].program.instructions if i.HasField("collective")} == {"g_2_3"}
    world = lower_rank_program(random_graph(0, 0, 2), state=["p"], world_size=2)
    assert dict(world.groups) == {} and all(
        i.collective.group == "" for i in world.program.instructions if i.HasField("collective")
    )
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((B, F)), "w": rng.standard_normal((F, F))} for _ in range(4)]
    want, _ = reference_run(graphs, feeds)
    stores = simulate(programs, feeds, compute())
    for rank in range(4):
        for name, value in zip(programs[rank].outputs, want[rank]):
            np.testing.assert_allclose(stores[rank][name], value, rtol=1e-12)


# --- tensor parallel: MindSpore's measured semantics ----------------------------------------------------------------

IN, HIDDEN, OUT = 5, 12, 3


def _tp_forward(n: int):
    def body(x, y, w1, b1, w2, b2):
        h = apply("ReLU", x @ w1 + b1)  # w1: columns (hidden units) of this rank
        logits = apply("AllReduce", h @ w2, group=tuple(range(n))) + b2  # w2: the matching rows
        return apply("SparseSoftmaxCrossEntropy", logits, y).mean()

    k = HIDDEN // n
    specs = [TensorSpec(("N", IN)), TensorSpec(("N",), "int32"), TensorSpec((IN, k)), TensorSpec((k,)),
             TensorSpec((k, OUT)), TensorSpec((OUT,))]  # fmt: skip
    return trace(body, *specs).graph


def _full_params(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"w1": (IN, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, OUT), "b2": (OUT,)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def _tp_slice(full, rank, n):
    k = HIDDEN // n
    cols = slice(rank * k, (rank + 1) * k)
    return {"w1": full["w1"][:, cols], "b1": full["b1"][cols], "w2": full["w2"][cols], "b2": full["b2"]}


def _numpy_mlp(p, x, y):
    """Loss and gradients of the single-device MLP, float64."""
    p = {k: v.astype(np.float64) for k, v in p.items()}
    z = x @ p["w1"] + p["b1"]
    h = np.maximum(z, 0)
    logits = h @ p["w2"] + p["b2"]
    e = np.exp(logits - logits.max(1, keepdims=True))
    prob = e / e.sum(1, keepdims=True)
    loss = -np.log(prob[np.arange(len(y)), y]).mean()
    dlogits = (prob - np.eye(OUT)[y]) / len(y)
    dz = dlogits @ p["w2"].T * (z > 0)
    return loss, {"w1": x.T @ dz, "b1": dz.sum(0), "w2": h.T @ dlogits, "b2": dlogits.sum(0)}


@pytest.mark.parametrize("n", [2, 3])
def test_tensor_parallel_first_update_is_n_times_the_single_device_one(n):
    """MindSpore: AllReduce' = AllReduce, so every W1/W2 slice moves N times as far as on one device, and the
    replicated bias after the AllReduce moves the same distance."""
    lr = 0.25
    train = build_train_step(_tp_forward(n), ["w1", "b1", "w2", "b2"], SGD(learning_rate=lr))
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=n)
    assert program.collective_counts() == {"ALL_REDUCE": 2}  # the forward's, and its gradient
    full, rng = _full_params(), np.random.default_rng(1)
    x, y = rng.standard_normal((8, IN)).astype(np.float32), rng.integers(0, OUT, 8).astype(np.int32)
    feeds = [{**_tp_slice(full, r, n), "x": x, "y": y, "learning_rate": np.float32(lr)} for r in range(n)]
    stores = simulate([program] * n, feeds, compute())
    loss, grads = _numpy_mlp(full, x.astype(np.float64), y)
    for rank, store in enumerate(stores):
        np.testing.assert_allclose(store[program.outputs[0]], loss, rtol=1e-6)
        before, want = _tp_slice(full, rank, n), _tp_slice(grads, rank, n)
        for name in ("w1", "b1", "w2"):
            np.testing.assert_allclose(store[name], before[name] - lr * n * want[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(store["b2"], before["b2"] - lr * want["b2"], rtol=1e-5, atol=1e-6)


# --- data parallel: buckets, overlap, equivalence with one device ---------------------------------------------------

PARAMS = ["w1", "b1", "w2", "b2"]


def _dp_forward(inputs=IN, hidden=HIDDEN, out=OUT):
    def mlp(x, y, w1, b1, w2, b2):
        h = apply("ReLU", apply("MatMul", x, w1) + b1)
        logits = apply("MatMul", h, w2) + b2
        return apply("SparseSoftmaxCrossEntropy", logits, y).mean()

    specs = [TensorSpec(("N", inputs)), TensorSpec(("N",), "int32"), TensorSpec((inputs, hidden)),
             TensorSpec((hidden,)), TensorSpec((hidden, out)), TensorSpec((out,))]  # fmt: skip
    return trace(mlp, *specs).graph


@pytest.mark.parametrize("cap", [1, 60, 250, 1 << 20])
def test_buckets_respect_their_size_and_the_order_gradients_are_ready(cap):
    graph = build_train_step(mirror_parameters(_dp_forward(), PARAMS, (0, 1)), PARAMS, SGD(0.1)).graph
    reductions = [node for node in graph.nodes if node.op == "AllReduce"]  # as the backward emits them
    assert [n.inputs[0].shape for n in reductions] == [(OUT,), (HIDDEN, OUT), (HIDDEN,), (IN, HIDDEN)]
    sizes = {node: int(np.prod(node.inputs[0].shape)) * 4 for node in reductions}
    buckets = plan_buckets(graph, cap)
    flat = [node for bucket in buckets for node in bucket.reductions]
    assert flat == reductions  # every gradient once, in the order the backward computes them
    for bucket in buckets:
        assert bucket.nbytes <= cap or len(bucket.reductions) == 1
    expected, current = [], []  # the greedy rule, rebuilt from the sizes
    for node in reductions:
        if current and sum(sizes[c] for c in current) + sizes[node] > cap:
            expected.append(current)
            current = []
        current.append(node)
    assert [list(b.reductions) for b in buckets] == [*expected, current]


def test_comm_fusion_indices_bucket_only_gradients_of_one_index_and_zero_reduces_alone():
    forward = set_fusion(mirror_parameters(_dp_forward(), PARAMS, (0, 1)), {"w1": 2, "b1": 3, "w2": 2, "b2": 0})
    graph = build_train_step(forward, PARAMS, SGD(0.1)).graph
    reduced = {node: node.attrs["fusion"] for node in graph.nodes if node.op == "AllReduce"}
    assert sorted(reduced.values()) == [0, 2, 2, 3]
    buckets = plan_buckets(graph, 1 << 20)  # room for everything: only the indices split the gradients
    assert sorted(sorted(reduced[n] for n in b.reductions) for b in buckets) == [[2, 2], [3]]  # index 0: no bucket
    fused = bucket_allreduce(graph, 1 << 20)
    assert [len(n.inputs) for n in fused.nodes if n.op == "AllReduceBucket"] == [2]
    assert sum(n.op == "AllReduce" for n in fused.nodes) == 2  # b2 (index 0) and b1 (alone in index 3)
    with pytest.raises(ConfigurationError, match="fusion index"):
        set_fusion(forward, {"w1": -1})


def test_bucketed_gradients_start_early_and_each_is_awaited_just_before_its_update():
    # Sizes where the rest of the backward is worth running while a bucket is in flight (rank_plan.MIN_OVERLAP_S).
    forward, cap = _dp_forward(256, 512, 64), 64 << 10
    train = data_parallel_train_step(forward, PARAMS, Momentum(0.1, 0.9), (0, 1), bucket_bytes=cap)
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=2)
    instructions = program.program.instructions
    kinds = [i.WhichOneof("op") for i in instructions]
    starts = [i for i, kind in enumerate(kinds) if kind == "collective"]
    assert program.collective_counts()["ALL_REDUCE"] == len(plan_buckets(train.graph, cap)) >= 2
    assert all(instructions[i].collective.handle for i in starts)
    assert "run_segment" in kinds[starts[0] + 1 : starts[-1]]  # backward runs while the first bucket is in flight
    waits = [i for i, kind in enumerate(kinds) if kind == "wait"]
    assert len(waits) == len(starts) and min(waits) > max(starts)  # no bucket waited for before the last starts
    for wait in waits:  # each wait is followed by the update that reads that bucket (and writes its parameters)
        after = next(i for i in range(wait, len(kinds)) if kinds[i] == "run_segment")
        segment = program.segments[instructions[after].run_segment.segment]
        handle = instructions[wait].wait.handle
        bucket = next(instructions[i].collective for i in starts if instructions[i].collective.handle == handle)
        assert set(bucket.outputs) & {v.name for v in segment.graph.inputs} and segment.state


def test_work_too_small_to_hide_anything_does_not_make_a_collective_asynchronous():
    # The tiny MLP's one bucket: only the loss (a mean of the batch) could run while it is in flight, which is not
    # worth an asynchronous start and a segment of its own: the AllReduce runs synchronously between two segments.
    train = data_parallel_train_step(_dp_forward(), PARAMS, SGD(0.1), (0, 1), bucket_bytes=1 << 20)
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=2)
    kinds = [i.WhichOneof("op") for i in program.program.instructions]
    assert kinds == ["run_segment", "collective", "run_segment", "free"]
    assert not program.program.instructions[1].collective.handle


def test_a_bucket_travels_as_one_all_reduce_of_its_gradients_with_no_concat_or_split():
    # The daemon lays a bucket out in one buffer that the backward segment writes into (daemon/buckets.py), so the
    # segments neither concatenate the gradients nor split the result: each update reads its gradient as is.
    train = data_parallel_train_step(_dp_forward(), PARAMS, SGD(0.1), (0, 1), bucket_bytes=1 << 20)
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=2)
    (bucket,) = [i.collective for i in program.program.instructions if i.WhichOneof("op") == "collective"]
    assert len(bucket.inputs) == len(bucket.outputs) == len(PARAMS)
    backward, update = (program.segments[name] for name in program.segments)
    assert set(bucket.inputs) <= set(backward.outputs)
    assert set(bucket.outputs) <= {v.name for v in update.graph.inputs}
    ops = {n.op for segment in program.segments.values() for n in segment.graph.nodes}
    assert not ops & {"Concat", "Split", "Reshape"}


@pytest.mark.parametrize("n", [2, 3])
def test_data_parallel_training_equals_one_device_on_the_global_batch(n):
    optimizer = Momentum(learning_rate=0.1, momentum=0.9)
    train = data_parallel_train_step(_dp_forward(), PARAMS, optimizer, tuple(range(n)), bucket_bytes=100)
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=n)
    params = _full_params(2)
    reference = TrainStep(build_train_step(_dp_forward(), PARAMS, optimizer), compute(), params)
    state = {s.name: params[s.name] if s.init is None else np.full(s.shape, s.init, s.dtype.numpy) for s in train.state}
    world, rng = World([program] * n, compute()), np.random.default_rng(4)
    stores = [{**state, "learning_rate": np.float32(0.1)} for _ in range(n)]
    for _ in range(6):
        x = rng.standard_normal((4 * n, IN)).astype(np.float32)
        y = rng.integers(0, OUT, 4 * n).astype(np.int32)
        want = reference(x=x, y=y)
        world.run([{"x": x[4 * r : 4 * r + 4], "y": y[4 * r : 4 * r + 4]} for r in range(n)], stores)
        np.testing.assert_allclose(np.mean([s[program.outputs[0]] for s in stores]), want, rtol=1e-5)
    for name in PARAMS:
        for store in stores:
            np.testing.assert_allclose(store[name], reference.state[name], rtol=1e-5, atol=1e-6)


# --- on a real daemon -----------------------------------------------------------------------------------------------


def _explicitly_reduced_train_graph(lr):
    """SGD on the MLP with every gradient passed through AllReduce(fusion=1) over a world of one rank."""
    forward = _dp_forward()
    builder = GraphBuilder.extend(forward)
    rate = builder.add_input("learning_rate", (), "float32")
    values = [forward.input(name) for name in PARAMS]
    for value, grad in zip(values, gradients(builder, forward.outputs[0], values)):
        reduced = apply("AllReduce", SymbolicTensor(builder, grad), group=(0,), fusion=1)
        param = SymbolicTensor(builder, value)
        apply("Assign", param, param - rate * reduced)
    return builder.build(forward.outputs)


def test_a_rank_program_runs_on_a_daemon_like_the_in_process_train_step():
    from tessel.communication.daemon_handle import LocalDaemon
    from tessel.daemon import DaemonCore
    from tessel.plugins import load_plugin

    lr, params = 0.2, _full_params(5)
    graph = bucket_allreduce(_explicitly_reduced_train_graph(lr), bucket_bytes=60)
    program = lower_rank_program(graph, state=PARAMS, world_size=1)
    assert program.collective_counts()["ALL_REDUCE"] >= 2 and dict(program.groups) == {}
    reference = TrainStep(build_train_step(_dp_forward(), PARAMS, SGD(lr)), compute(), params)
    daemon = LocalDaemon(DaemonCore(load_plugin("cpu", threads=1)))
    try:
        session = daemon.open_session("rank-program", 0, 1)
        installed = daemon.install(program, session, initial={**params, "learning_rate": np.float32(lr)})
        rng = np.random.default_rng(6)
        for _ in range(3):
            x, y = rng.standard_normal((8, IN)).astype(np.float32), rng.integers(0, OUT, 8).astype(np.int32)
            want = reference(x=x, y=y)
            got = daemon.installed(program, session).run(feed={"x": x, "y": y}).fetched[program.outputs[0]]
            np.testing.assert_allclose(got, want, rtol=1e-6)
        for name, value in installed.state().items():
            np.testing.assert_allclose(value, reference.state[name], rtol=1e-6, atol=1e-7)
        assert not [k for k in daemon.get(session, []) if "@" in k]
    finally:
        daemon.close()


# --- bad input ------------------------------------------------------------------------------------------------------


def test_state_must_name_graph_inputs():
    with pytest.raises(ConfigurationError, match=r"state \['nope'\] are not inputs of graph"):
        lower_rank_program(_dp_forward(), state=["nope"])


def test_returning_a_parameter_that_is_also_written_is_refused():
    def body(p):
        apply("Assign", p, p * 2.0)
        return p

    graph = trace(body, TensorSpec((2,), "float32")).graph
    with pytest.raises(ConfigurationError, match=r"returns parameter 'p' and also assigns it"):
        lower_rank_program(graph)


def test_a_world_whose_programs_disagree_is_reported_stuck_not_hung():
    with_reduce = lower_rank_program(_pairs_graph(0), world_size=2)
    without = lower_rank_program(trace(lambda x: x * 2.0, TensorSpec((2,), "float64")).graph, world_size=2)
    feeds = [{"x": np.ones((B, F)), "w": np.ones((F, F))}, {"x": np.ones(2)}]
    with pytest.raises(ConfigurationError, match=r"stuck \(deadlock\): rank 0 is in collective \(instruction \d+\)$"):
        simulate([with_reduce, without], feeds, compute())


def test_bucket_size_must_be_positive():
    graph = build_train_step(mirror_parameters(_dp_forward(), PARAMS, (0, 1)), PARAMS, SGD(0.1)).graph
    with pytest.raises(ConfigurationError, match="bucket_bytes must be positive, got 0"):
        plan_buckets(graph, 0)


def _fused(body, *specs) -> float:
    graph = bucket_allreduce(trace(body, *specs).graph)
    program = lower_rank_program(graph, world_size=2)
    feeds = [{"a": np.ones(3), "b": np.full(3, 2.0)}, {"a": np.full(3, 3.0), "b": np.full(3, 4.0)}]
    return float(simulate([program] * 2, feeds, compute())[0][program.outputs[0]])


def test_buckets_whose_inputs_come_from_other_buckets_keep_every_value_produced():
    # r3's input is computed from r1's result and read before r4's input exists: bucket {r3, r4} used to start
    # after z read r3, which then read an AllReduce output nothing produced
    def chained(a, b):
        r1 = apply("AllReduce", a, group=(0, 1), fusion=1)
        r2 = apply("AllReduce", b, group=(0, 1), fusion=1)
        y = r1 * 2.0
        r3 = apply("AllReduce", y * 3.0, group=(0, 1), fusion=1)
        z = r3 + 1.0
        r4 = apply("AllReduce", apply("Tanh", y) * 5.0, group=(0, 1), fusion=1)
        return (z * r2).sum() + r4.sum()

    def crossed(a, b):  # two buckets (sum, max) that each read the other's results: they cannot fuse
        r1 = apply("AllReduce", a, reduce_op="sum", group=(0, 1), fusion=1)
        r4 = apply("AllReduce", b, reduce_op="max", group=(0, 1), fusion=1)
        r2 = apply("AllReduce", r1 * 2.0, reduce_op="max", group=(0, 1), fusion=1)
        r3 = apply("AllReduce", r4 * 3.0, reduce_op="sum", group=(0, 1), fusion=1)
        return r2.sum() + r3.sum()

    specs = (TensorSpec((3,), "float64"), TensorSpec((3,), "float64"))
    r1, r2 = 4.0, 6.0  # the sums of a and b over the two ranks
    want = 3 * ((2 * (2 * r1) * 3.0 + 1.0) * r2) + 3 * 2 * np.tanh(2 * r1) * 5.0
    assert _fused(chained, *specs) == pytest.approx(want)
    assert _fused(crossed, *specs) == pytest.approx(3 * (2 * r1) + 3 * (2 * 4.0 * 3.0))  # max(b) = 4


def test_donated_inputs_are_freed_after_the_run():
    graph = trace(lambda x: apply("AllReduce", x * 2.0, group=(0, 1)) + 1.0, TensorSpec((3,), "float64")).graph
    program = lower_rank_program(graph, donate=["x"], world_size=2)
    stores = simulate([program] * 2, [{"x": np.ones(3)}, {"x": np.full(3, 2.0)}], compute())
    for store in stores:
        assert "x" not in store
        np.testing.assert_array_equal(store[program.outputs[0]], np.full(3, 7.0))
    assert "ALL_REDUCE" in program.dump() and "free" in program.dump()


def _copies_of_inputs(segment) -> list[str]:
    """The outputs of `segment`'s ONNX model that only copy one of its inputs (state writes aside: an Assign of a
    value computed in an earlier segment is such a copy, and is the write itself)."""
    import onnx

    model = onnx.load_from_string(segment.onnx)
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output} - {assign_output_name(name) for name in segment.state}
    copies = [n for n in model.graph.node if n.op_type == "Identity" and n.input[0] in inputs]
    return [n.output[0] for n in copies if n.output[0] in outputs]


def test_a_weight_read_in_two_segments_is_read_from_the_store_not_copied_out_of_the_first():
    # Buckets small enough to split the backward: w2, read through its Mirror by the forward's product and again by
    # the backward's input-gradient product in a later segment, used to leave the first segment as a copy each step.
    forward, cap = _dp_forward(256, 512, 64), 64 << 10  # sizes where overlapping a bucket pays (see above)
    train = data_parallel_train_step(forward, PARAMS, SGD(0.1), (0, 1), bucket_bytes=cap)
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=2)
    segments = list(program.segments.values())
    assert len(segments) > 2  # the backward runs in parts between its buckets
    assert all(_copies_of_inputs(s) == [] for s in segments)
    assert any("w2" in {v.name for v in s.graph.inputs} for s in segments[1:-2])  # a backward part reads w2 itself
    assert not any(n.op == "Mirror" for s in segments for n in s.graph.nodes)


def test_a_copy_read_after_a_collective_holds_the_value_from_before_a_write_in_the_same_step():
    # Identity(w) is read before an AllReduce and again after it, in a later segment than the one that could
    # assign w: reading w itself there must still see the old value, so the write waits for that reader.
    def body(x, w):
        old = apply("Identity", w)
        apply("Assign", w, w + 1.0)
        return apply("AllReduce", x * old, group=(0, 1)) * old

    graph = trace(body, TensorSpec((3,), "float64"), TensorSpec((3,), "float64")).graph
    program = lower_rank_program(graph, state=["w"], world_size=2)
    feeds = [{"x": np.ones(3), "w": np.arange(3.0)}, {"x": np.full(3, 2.0), "w": np.arange(3.0)}]
    for store in simulate([program] * 2, feeds, compute()):
        np.testing.assert_array_equal(store[program.outputs[0]], 3.0 * np.arange(3.0) ** 2)
        np.testing.assert_array_equal(store["w"], np.arange(3.0) + 1.0)
    assert all(_copies_of_inputs(s) == [] for s in program.segments.values())


def test_a_returned_copy_of_a_written_parameter_keeps_its_identity_and_the_old_value():
    def body(p):
        before = apply("Identity", p)
        apply("Assign", p, p * 2.0)
        return before

    program = lower_rank_program(trace(body, TensorSpec((2,), "float64")).graph, state=["p"])
    (store,) = simulate([program], [{"p": np.array([1.0, 3.0])}], compute())
    np.testing.assert_array_equal(store[program.outputs[0]], [1.0, 3.0])
    np.testing.assert_array_equal(store["p"], [2.0, 6.0])


def _selections_passed_between_segments(program) -> list[str]:
    """Segment inputs that another segment computed as a selection (Transpose, StridedSlice, ...) of graph inputs."""
    made = {}
    for segment in program.segments.values():
        producer = {o: n for n in segment.graph.nodes for o in n.outputs}
        inputs = set(segment.graph.inputs)
        for out in segment.graph.outputs:
            node = producer.get(out)
            if node is not None and registry.get(node.op).selects and all(v in inputs for v in node.inputs):
                made[out.name] = segment.name
    return [
        f"{v.name} ({made[v.name]} -> {s.name})"
        for s in program.segments.values()
        for v in s.graph.inputs
        if made.get(v.name, s.name) != s.name
    ]


def test_a_parameters_block_is_taken_by_the_segment_that_updates_it_not_held_from_the_start_of_the_step():
    # Optimizer parallel (level1) updates each rank's block of a weight: the block, a StridedSlice of the weight,
    # was computed in the first segments and held in the store until the update, late in the step.
    from tessel.compiler.optimizer_parallel import ShardConfig, plan_shards

    forward = mirror_parameters(_dp_forward(256, 512, 64), PARAMS, (0, 1))
    shards = plan_shards(forward, PARAMS, ShardConfig("level1", threshold_kb=0), rank=0)
    train = build_train_step(forward, PARAMS, SGD(0.1), shards=shards)
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=2)
    assert program.collective_counts()["REDUCE_SCATTER"] >= 2
    assert _selections_passed_between_segments(program) == []
    assert any(n.op == "StridedSlice" for s in program.segments.values() for n in s.graph.nodes)  # blocks exist


def test_a_selection_read_after_a_collective_holds_the_value_from_before_a_write_in_the_same_step():
    # The transposed weight is read before an AllReduce and again after it: the later segment transposes w itself,
    # so the write of w must wait for it, and both reads see the old value.
    def body(x, w):
        flipped = apply("Transpose", w, perm=(1, 0))
        apply("Assign", w, w + 1.0)
        reduced = apply("AllReduce", apply("MatMul", x, flipped), group=(0, 1))
        return apply("MatMul", reduced, flipped)

    graph = trace(body, TensorSpec((2, 3), "float64"), TensorSpec((3, 3), "float64")).graph
    program = lower_rank_program(graph, state=["w"], world_size=2)
    assert len(program.segments) == 2 and _selections_passed_between_segments(program) == []
    w = np.arange(9.0).reshape(3, 3)
    feeds = [{"x": np.ones((2, 3)), "w": w.copy()}, {"x": np.full((2, 3), 2.0), "w": w.copy()}]
    expected = (3.0 * np.ones((2, 3)) @ w.T) @ w.T
    for store in simulate([program] * 2, feeds, compute()):
        np.testing.assert_allclose(store[program.outputs[0]], expected)
        np.testing.assert_array_equal(store["w"], w + 1.0)


@pytest.mark.parametrize("value", ["reshaped", "constant"])
def test_a_write_of_a_selection_or_a_constant_computes_it_in_the_writes_own_segment(value):
    # Copies are placed before the writes (a copy may read a write's target), and again for the writes' own reads.
    def body(x, w, v):
        new = apply("Reshape", v, shape=(3,)) if value == "reshaped" else apply("Constant", value=np.full(3, 5.0))
        apply("Assign", w, new)
        return apply("AllReduce", x * 3.0, group=(0, 1)) + 1.0

    specs = TensorSpec((3,), "float64"), TensorSpec((3,), "float64"), TensorSpec((1, 3), "float64")
    program = lower_rank_program(trace(body, *specs).graph, state=["w"], world_size=2)
    feeds = [{"x": np.ones(3), "w": np.zeros(3), "v": np.full((1, 3), 5.0)} for _ in range(2)]
    for store in simulate([program] * 2, feeds, compute()):
        np.testing.assert_array_equal(store["w"], np.full(3, 5.0))
        np.testing.assert_array_equal(store[program.outputs[0]], np.full(3, 7.0))
