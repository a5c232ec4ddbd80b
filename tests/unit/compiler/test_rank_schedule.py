"""The rank program's schedule: a collective starts as soon as its inputs exist, work that does not need its result
runs while it is in flight (a RunSegment between its start and its wait), several may be in flight at once, the
collectives keep the graph's order, and the results do not change (simulated world against numpy)."""

from __future__ import annotations

import numpy as np
import pytest
from compiler_testkit import compute
from test_rank_program import random_graph, reference_run

from tessel.compiler import (
    SGD,
    TensorSpec,
    build_train_step,
    lower_rank_program,
    registry,
    simulate,
    trace,
)
from tessel.compiler.builder import apply
from tessel.compiler.rank_schedule import Wait, schedule, spmd_blocks

B, F, N = 128, 256, 2  # big enough to be worth overlapping (rank_plan.MIN_OVERLAP_S)
GROUP = (0, 1)


def _two_copies():
    """Two independent chains, each with an AllReduce, traced one after the other (as a Python loop would):
    copy 0's reader of its AllReduce comes before copy 1's work in the graph."""

    def body(x, w):
        outs = []
        for part in (x[: B // 2], x[B // 2 :]):
            total = apply("AllReduce", apply("Tanh", part @ w), group=GROUP)
            outs.append(apply("Tanh", total * 0.5))
        return outs[0].sum() + outs[1].sum()

    return trace(body, TensorSpec((B, F), "float64"), TensorSpec((F, F), "float64")).graph


def _kinds(program):
    return [ins.WhichOneof("op") for ins in program.program.instructions]


def _in_flight_across_a_segment(program) -> list[str]:
    """Handles of collectives that have a RunSegment between their start and their wait."""
    instructions = program.program.instructions
    started = {}
    overlapped = []
    for index, ins in enumerate(instructions):
        which = ins.WhichOneof("op")
        if which == "collective" and ins.collective.handle:
            started[ins.collective.handle] = index
        elif which == "wait":
            begin = started.pop(ins.wait.handle)
            if "run_segment" in [i.WhichOneof("op") for i in instructions[begin + 1 : index]]:
                overlapped.append(ins.wait.handle)
    return overlapped


def test_the_next_copy_runs_while_the_first_copys_all_reduce_is_in_flight():
    program = lower_rank_program(_two_copies(), world_size=N)
    kinds = _kinds(program)
    # copy 0's product, its AllReduce starts, copy 1's product runs, its AllReduce starts: two in flight; then the
    # readers, too little work to hide anything, run together after both waits
    assert kinds == ["run_segment", "collective", "run_segment", "collective", "wait", "wait", "run_segment", "free"]
    assert len(_in_flight_across_a_segment(program)) == 1


def test_the_schedule_keeps_the_results():
    graphs = [_two_copies() for _ in range(N)]
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((B, F)), "w": rng.standard_normal((F, F))} for _ in range(N)]
    want, _ = reference_run(graphs, feeds)
    programs = [lower_rank_program(g, world_size=N) for g in graphs]
    stores = simulate(programs, feeds, compute())
    for rank in range(N):
        np.testing.assert_allclose(stores[rank][programs[rank].outputs[0]], want[rank][0], rtol=1e-12)


@pytest.mark.parametrize(("seed", "n"), [(0, 2), (2, 3), (4, 2), (5, 3)])
def test_collectives_keep_the_graphs_order_and_every_read_follows_its_wait(seed, n):
    graph = random_graph(seed, 0, n)
    nodes = list(graph.nodes)
    is_collective = lambda node: registry.get(node.op).collective is not None  # noqa: E731
    items = schedule(nodes, is_collective)
    assert sorted((i for i in items if not isinstance(i, Wait)), key=nodes.index) == [*nodes]  # each node once
    order = [i for i in items if not isinstance(i, Wait) and is_collective(i)]
    assert order == [node for node in nodes if is_collective(node)]
    have, in_flight = {*graph.inputs}, set()
    for item in items:
        if isinstance(item, Wait):
            in_flight.discard(item.collective)
            have.update(item.collective.outputs)
            continue
        assert all(v in have for v in item.inputs), f"{item.op} reads a value not yet there (or still in flight)"
        if is_collective(item):
            in_flight.add(item)
        else:
            have.update(item.outputs)
    assert not in_flight or all(c.outputs == () or not set(c.outputs) & set(graph.outputs) for c in in_flight)


def test_a_tensor_parallel_train_step_with_two_copies_overlaps_and_matches_one_copy():
    """Megatron's pair (columns, then rows and an AllReduce) on two halves of the batch, trained: each copy's
    AllReduce is in flight while the other copy computes, and the step equals the one-copy step on the whole batch
    (each copy's loss is its mean over the number of copies, so the sum is the mean over the whole batch)."""
    hidden, rows, width = 512, 128, 256  # enough work per copy to be worth overlapping

    def forward(copies):
        def body(x, w1, w2):
            total = None
            size = rows // copies
            for i in range(copies):
                h = apply("ReLU", x[i * size : (i + 1) * size] @ w1)
                out = apply("AllReduce", h @ w2, group=GROUP)
                loss = (out * out).mean() / float(copies)
                total = loss if total is None else total + loss
            return total

        specs = [TensorSpec((rows, width)), TensorSpec((width, hidden // N)), TensorSpec((hidden // N, width))]
        return trace(body, *specs).graph

    programs = []
    for copies in (1, 2):
        train = build_train_step(forward(copies), ["w1", "w2"], SGD(0.1))
        programs.append(lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=N))
    assert len(_in_flight_across_a_segment(programs[1])) >= 2, programs[1].dump()
    _same_megatron_steps(programs, rows, width, hidden, seed=1)


def _same_megatron_steps(programs, rows: int, width: int, hidden: int, seed: int) -> None:
    """Each program (a Megatron pair's train step on N ranks: x, w1 cut by columns, w2 by rows) run on the same
    data gives the same loss and new weights as the first."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    w1 = (rng.standard_normal((width, hidden)) / np.sqrt(width)).astype(np.float32)
    w2 = (rng.standard_normal((hidden, width)) / np.sqrt(hidden)).astype(np.float32)
    k = hidden // N
    feeds = [{"x": x, "w1": w1[:, r * k : (r + 1) * k], "w2": w2[r * k : (r + 1) * k], "learning_rate": np.float32(0.1)}
             for r in range(N)]  # fmt: skip
    results = []
    for program in programs:
        stores = simulate([program] * N, [dict(f) for f in feeds], compute())
        results.append([(s[program.outputs[0]], s["w1"], s["w2"]) for s in stores])
    for other in results[1:]:
        for want, got in zip(results[0], other):
            for a, b in zip(want, got):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def _two_copies_of_two_pairs():
    """Two copies, each two chained AllReduces (Megatron's two layer pairs): traced copy by copy, so the graph has
    copy 0's second AllReduce before copy 1's first."""

    def body(x, w):
        total = None
        for part in (x[: B // 2], x[B // 2 :]):
            first = apply("AllReduce", apply("Tanh", part @ w), group=GROUP)
            second = apply("AllReduce", apply("Tanh", first @ w), group=GROUP)
            total = second.sum() if total is None else total + second.sum()
        return total

    return trace(body, TensorSpec((B, F), "float64"), TensorSpec((F, F), "float64")).graph


def test_ranks_running_copies_of_one_graph_start_independent_collectives_in_dependency_order():
    from tessel.compiler.rank_plan import plan_steps

    graph = _two_copies_of_two_pairs()
    copy0_first, copy0_second, copy1_first, copy1_second = [n for n in graph.nodes if n.op == "AllReduce"]
    started = lambda spmd: [s.collective for s in plan_steps(graph, spmd) if s.collective is not None]  # noqa: E731
    # graph order: copy 0's first and second, then copy 1's; as their inputs can exist: both firsts, then seconds
    assert started(False) == [copy0_first, copy0_second, copy1_first, copy1_second]
    assert started(True) == [copy0_first, copy1_first, copy0_second, copy1_second]
    spmd = lower_rank_program(graph, world_size=N, spmd=True)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((B, F)), "w": rng.standard_normal((F, F)) / 16} for _ in range(N)]
    want, _ = reference_run([graph] * N, feeds)
    stores = simulate([spmd] * N, feeds, compute())
    for rank in range(N):
        np.testing.assert_allclose(stores[rank][spmd.outputs[0]], want[rank][0], rtol=1e-10)


def test_sends_and_receives_keep_their_place_among_collectives():
    def body(x, w):
        total = apply("AllReduce", apply("Tanh", x @ w), group=GROUP)
        sent = apply("Send", x, peer=1, group=GROUP)
        gathered = apply("AllGather", x * 2.0, group=GROUP)
        return total.sum() + sent.sum() + gathered.sum()

    graph = trace(body, TensorSpec((B, F), "float64"), TensorSpec((F, F), "float64")).graph
    from tessel.compiler.rank_plan import is_collective, is_point_to_point

    blocks = spmd_blocks(graph.nodes, is_collective, is_point_to_point)
    by_op = {node.op: block for node, block in blocks.items()}
    assert by_op["AllReduce"] < by_op["Send"] < by_op["AllGather"]  # the AllGather, ready first, waits its turn
    started = [i.op for i in schedule(list(graph.nodes), is_collective, blocks) if not isinstance(i, Wait)]
    assert [op for op in started if op in by_op] == ["AllReduce", "Send", "AllGather"]


def test_a_seed_that_reads_only_the_losss_shape_waits_for_no_collective():
    """autodiff seeds the backward with OnesLike(loss): folded to a constant, it no longer makes the backward of
    one copy wait for the other copy's forward AllReduce."""
    from tessel.compiler.rank_rewrite import fold_value_free

    def forward(x, w):
        total = None
        for part in (x[: B // 2], x[B // 2 :]):
            out = apply("AllReduce", apply("ReLU", part @ w), group=GROUP)
            loss = (out * out).mean()
            total = loss if total is None else total + loss
        return total

    train = build_train_step(trace(forward, TensorSpec((B, F)), TensorSpec((F, F))).graph, ["w"], SGD(0.1))
    assert any(n.op == "OnesLike" for n in train.graph.nodes)
    folded = fold_value_free(train.graph)
    assert not any(n.op == "OnesLike" for n in folded.nodes)
    seeds = [n for n in folded.nodes if n.op == "Constant" and n.outputs[0].shape == ()]
    assert any(np.asarray(n.attrs["value"].numpy()) == 1.0 for n in seeds)


def test_a_sum_of_row_contracted_products_becomes_one_product_of_stacked_rows():
    """The weight gradient of k copies, Σ_i A_iᵀ B_i, is one MatMul of the stacked rows where that moves less
    memory than the k - 1 additions of weight-sized gradients; the result is unchanged."""
    from compiler_testkit import run_graph

    from tessel.compiler.ops.linalg import fuse_summed_products

    def grads(a0, b0, a1, b1, a2, b2):
        products = [apply("MatMul", a, b, transpose_a=True) for a, b in ((a0, b0), (a1, b1), (a2, b2))]
        return (products[0] + products[1]) + products[2]

    specs = [TensorSpec((8, 256), "float64"), TensorSpec((8, 128), "float64")] * 3
    graph = trace(grads, *specs).graph
    fused = fuse_summed_products(graph)
    assert [n.op for n in fused.nodes] == ["Concat", "Concat", "MatMul"]
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape) for v in graph.inputs}
    np.testing.assert_allclose(run_graph(fused, feeds)[0], run_graph(graph, feeds)[0], rtol=1e-10, atol=1e-12)
    # rows as many as the gradient is wide: stacking would move more than the additions save, so nothing changes
    wide = trace(grads, *[TensorSpec((512, 16), "float64"), TensorSpec((512, 16), "float64")] * 3).graph
    assert fuse_summed_products(wide) is wide


def test_products_waiting_for_different_collectives_are_not_stacked_unless_the_world_is_on_one_host():
    """Two copies' weight gradients, each after its own AllReduce: stacking them would make the first copy's product
    wait for the second copy's AllReduce, so they stay two products (and an addition); on one host, where that
    AllReduce is over shared memory, the stacked product is the quicker and they are stacked."""
    from tessel.compiler.ops.linalg import fuse_summed_products

    def grads(a0, b0, a1, b1):
        reduced = [apply("AllReduce", b, group=GROUP) for b in (b0, b1)]
        return apply("MatMul", a0, reduced[0], transpose_a=True) + apply("MatMul", a1, reduced[1], transpose_a=True)

    graph = trace(grads, *[TensorSpec((8, 256), "float64"), TensorSpec((8, 128), "float64")] * 2).graph
    assert fuse_summed_products(graph) is graph
    stacked = fuse_summed_products(graph, registry.RewriteContext(one_host=True))
    assert [n.op for n in stacked.nodes].count("Concat") == 2


def test_copies_whose_loss_gradients_meet_only_in_the_seed_keep_their_own_weight_gradient_products():
    """Two copies' summed losses seed the backward with OnesLike(loss0 + loss1): read for its shape alone, that seed
    must not make copy 0's weight gradient wait for copy 1's AllReduce, so the products are not stacked and copy
    0's runs while copy 1's AllReduce is in flight (the rewrite reads the graph after the seed is folded); on one
    host the copies run as one, with one product per weight gradient."""

    def forward(x, w, v):
        total = None
        for part in (x[: B // 2], x[B // 2 :]):
            hidden = apply("AllReduce", apply("ReLU", part @ w), group=GROUP)
            out = apply("ReLU", hidden @ v)
            loss = (out * out).mean()
            total = loss if total is None else total + loss
        return total

    graph = trace(forward, TensorSpec((B, F)), TensorSpec((F, F)), TensorSpec((F, F))).graph
    train = build_train_step(graph, ["w", "v"], SGD(0.1))
    state = [s.name for s in train.state]
    program = lower_rank_program(train.graph, state=state, world_size=N, spmd=True)
    ops = [n.op for segment in program.segments.values() for n in segment.graph.nodes]
    assert "Concat" not in ops
    products = [n for segment in program.segments.values() for n in segment.graph.nodes if n.op == "MatMul"]
    assert sum(n.attrs["transpose_a"] for n in products) == 4  # dw and dv of each copy, each a product of its own
    on_one_host = lower_rank_program(train.graph, state=state, world_size=N, spmd=True, one_host=True)
    products = [n for segment in on_one_host.segments.values() for n in segment.graph.nodes if n.op == "MatMul"]
    assert sum(n.attrs["transpose_a"] for n in products) == 2  # the copies run as one (compiler/row_parts.py)


def test_on_one_host_copies_products_of_a_shared_weight_are_one_product_and_the_step_is_unchanged():
    """Four copies of Megatron's pair, trained: on one host each weight's forward products, and w2's input-gradient
    products, are one product of the whole batch's rows (the copies' rows of x are x itself, not a Concat of its
    slices), and the step equals the unstacked one; across hosts every copy keeps its own products."""
    copies, rows, width, hidden = 4, 128, 512, 1024  # wide enough for stacking to pay (_MACS_PER_COPIED)

    def body(x, w1, w2):
        total, size = None, rows // copies
        for i in range(copies):
            out = apply("AllReduce", apply("ReLU", x[i * size : (i + 1) * size] @ w1) @ w2, group=GROUP)
            loss = (out * out).mean() / float(copies)
            total = loss if total is None else total + loss
        return total

    specs = [TensorSpec((rows, width)), TensorSpec((width, hidden // N)), TensorSpec((hidden // N, width))]
    train = build_train_step(trace(body, *specs).graph, ["w1", "w2"], SGD(0.1))
    state = [s.name for s in train.state]
    programs = {
        one_host: lower_rank_program(train.graph, state=state, world_size=N, spmd=True, one_host=one_host)
        for one_host in (False, True)
    }

    def products(program, weight):
        nodes = [n for segment in program.segments.values() for n in segment.graph.nodes]
        return [n for n in nodes if n.op == "MatMul" and not n.attrs["transpose_a"] and n.inputs[1].name == weight]

    assert [len(products(programs[False], w)) for w in ("w1", "w2")] == [copies, 2 * copies]  # forward; w2 also dx
    stacked = {w: products(programs[True], w) for w in ("w1", "w2")}
    assert [len(stacked["w1"]), len(stacked["w2"])] == [1, 2], programs[True].dump()
    assert all(n.inputs[0].shape[0] == rows for nodes in stacked.values() for n in nodes)
    assert stacked["w1"][0].inputs[0].name == "x"  # the copies' slices of x, stacked again, are x

    _same_megatron_steps(list(programs.values()), rows, width, hidden, seed=5)


def test_micro_batches_that_gradient_accumulation_marks_stay_apart_on_one_host():
    """GradAccumulation runs its micro-batches one after another so that one micro-batch's activations are held at a
    time: the one-host rewrites that run copies as one leave micro-batches marked by MicroBatchEnd apart."""
    micro, rows, width = 4, 128, 512

    def body(x, w):
        total, size = None, rows // micro
        for i in range(micro):
            out = apply("AllReduce", apply("ReLU", x[i * size : (i + 1) * size] @ w), group=GROUP)
            loss = apply("MicroBatchEnd", (out * out).mean(), index=i, count=micro)
            total = loss if total is None else total + loss
        return total

    train = build_train_step(trace(body, TensorSpec((rows, width)), TensorSpec((width, width))).graph, ["w"], SGD(0.1))
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=N, spmd=True,
                                 one_host=True)  # fmt: skip
    nodes = [n for segment in program.segments.values() for n in segment.graph.nodes]
    forward = [n for n in nodes if n.op == "MatMul" and not n.attrs["transpose_a"] and n.inputs[1].name == "w"]
    assert len(forward) == micro and all(n.inputs[0].shape[0] == rows // micro for n in forward)


def test_products_of_a_shared_weight_that_depend_on_one_another_or_have_many_rows_are_not_stacked():
    """h @ w then (h @ w) @ w: the second product reads the first, so stacking them would make a cycle; products of
    512 rows or more already run at full rate; and stacking a @ w with a later d @ w would move a@w's AllReduce
    after one that came after it (ranks whose graphs differ could then start them in different orders). None of
    these changes; two independent narrow ones are stacked."""
    from tessel.compiler.ops.linalg import stack_shared_products

    one_host = registry.RewriteContext(one_host=True)
    chained = trace(lambda h, w: (h @ w) @ w, TensorSpec((64, 512)), TensorSpec((512, 512))).graph
    assert stack_shared_products(chained, one_host) is chained

    def reordering(a, b, d, w):
        first = apply("AllReduce", a @ w, group=GROUP)
        other = apply("AllReduce", b, group=GROUP)
        return first.sum() + other.sum() + (d @ w).sum()

    spec = TensorSpec((64, 512))
    collectives = trace(reordering, spec, spec, spec, TensorSpec((512, 512))).graph
    assert stack_shared_products(collectives, one_host) is collectives

    def two(a, b, w):
        return (a @ w).sum() + (b @ w).sum()

    tall = trace(two, TensorSpec((512, 512)), TensorSpec((512, 512)), TensorSpec((512, 512))).graph
    assert stack_shared_products(tall, one_host) is tall
    narrow = trace(two, TensorSpec((64, 512)), TensorSpec((32, 512)), TensorSpec((512, 512))).graph
    assert stack_shared_products(narrow) is narrow  # the world may span hosts: nothing is known
    stacked = stack_shared_products(narrow, one_host)
    assert [n.op for n in stacked.nodes].count("MatMul") == 1
    from compiler_testkit import run_graph

    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in narrow.inputs}
    np.testing.assert_allclose(run_graph(stacked, feeds)[0], run_graph(narrow, feeds)[0], rtol=1e-5)


def test_work_on_inputs_alone_runs_with_its_reader_after_the_wait_not_before():
    """An optimizer's `beta1 * m` reads only state: run as soon as it could, every layer's would run before the
    first wait and be held until its reader (measured: 17 x 16 MiB in a data-parallel Adam step); it runs right
    before its reader instead, once the reader's collective result is there."""

    def body(x, w, m1, m2):
        g1 = apply("AllReduce", apply("Tanh", x @ w), group=GROUP)
        g2 = apply("AllReduce", apply("Tanh", x @ (w * 2.0)), group=GROUP)
        return (m1 * 0.9 + g1).sum() + (m2 * 0.9 + g2).sum()

    spec = TensorSpec((F, F), "float64")
    graph = trace(body, TensorSpec((F, F), "float64"), spec, spec, spec).graph
    from tessel.compiler.rank_plan import is_collective

    items = schedule(list(graph.nodes), is_collective)
    m1, m2 = graph.inputs[2], graph.inputs[3]
    scaled = {v: next(i for i, n in enumerate(items) if not isinstance(n, Wait) and v in n.inputs) for v in (m1, m2)}
    first_wait = next(i for i, n in enumerate(items) if isinstance(n, Wait))
    assert min(scaled.values()) > first_wait, [getattr(n, "op", "wait") for n in items]  # not before any wait
    assert sorted((i for i in items if not isinstance(i, Wait)), key=list(graph.nodes).index) == [*graph.nodes]
