"""The pipeline pass: a train step's graph cut into stages, each stage's rank program run with the others in the
rank simulator (real ONNX Runtime compute, collectives in numpy), equals one device running the unsplit graph on
the same micro-batches — losses and parameters after several steps — for every schedule, 2 and 4 stages,
interleaved chunks, a parameter shared by two stages and data parallelism inside the stages. Also: the order
the pass emits keeps what each schedule promises (1F1B holds fewer activations than GPipe, the zero-bubble
schedule sends a micro-batch's input gradient before it computes its weight gradient), and what it cannot cut is
an error naming the cells."""

from __future__ import annotations

import numpy as np
import pytest
from compiler_testkit import compute

from tessel.compiler.autodiff import expand_gradients
from tessel.compiler.builder import apply, apply_all
from tessel.compiler.pipeline import actions_of, check, generate
from tessel.compiler.pipeline.split import pipeline_rank_graph
from tessel.compiler.pipeline.stages import Tag
from tessel.compiler.rank_program import lower_rank_program
from tessel.compiler.rank_simulator import World
from tessel.compiler.tracer import Trace
from tessel.core.errors import ConfigurationError

WIDTHS = (8, 16, 16, 16, 4)
LR = 0.1


def mlp_step(stage_of_layer, batch, micro, tied=False, replicas=1, square=False, skip=False):
    """A train step of a 4-layer MLP on micro-batches (rows m::M, as PipelineCell cuts them), the losses summed, SGD:
    the graph and the SDK's tags. `tied`: the last layer reads the first layer's weight too. `replicas`: each rank holds
    batch/replicas rows and reads every weight through a Mirror over the stage's data-parallel ranks, as the parallel
    pass writes it, and each rank's objective is its rows' loss divided by `replicas` (the ranks' objectives sum to the
    global loss). `square`: the step's loss is the square of the sum (its gradient needs every micro-batch's loss
    first). `skip`: the last layer also reads the first layer's output (a skip link: under interleaving, one value
    sent to two virtual stages of one rank)."""
    tags = {}

    def tag(t, stage=None, m=None, cell=""):
        tags[t.value] = Tag(stage, m, cell)
        return t

    rows = batch // replicas
    with Trace("step") as tr:
        x, y = tr.input("x", (rows, WIDTHS[0])), tr.input("y", (rows, WIDTHS[-1]))
        ws = [tr.input(f"w{i}", (WIDTHS[i], WIDTHS[i + 1])) for i in range(4)]
        reads = [apply("Mirror", w, group=tuple(range(replicas))) if replicas > 1 else w for w in ws]
        if tied:  # the last layer also reads w0 (its first rows, transposed): w0 lives on two stages
            tied_part = apply("Transpose", reads[0], perm=(1, 0))
            tied_part = apply("StridedSlice", tied_part, begin=(None, None), end=(None, WIDTHS[4]), strides=(1, 1))
            reads[3] = tied_part + reads[3]
        total = None
        for m in range(micro):
            h = tag(apply("StridedSlice", x, begin=(m, None), end=(None, None), strides=(micro, 1)), m=m)
            target = tag(apply("StridedSlice", y, begin=(m, None), end=(None, None), strides=(micro, 1)), m=m)
            outs = []
            for i, w in enumerate(reads):
                if skip and i == 3:
                    h = tag(h + outs[0], stage_of_layer[i], m, f"layer{i}")
                h = tag(apply("MatMul", h, w), stage_of_layer[i], m, f"layer{i}")
                if i < 3:
                    h = tag(apply("ReLU", h), stage_of_layer[i], m, f"layer{i}")
                outs.append(h)
            d = tag(h - target, None, m)
            loss = tag(apply("ReduceMean", d * d, axis=(0, 1), keep_dims=False), None, m)
            total = loss if total is None else total + loss
        if replicas > 1:
            total = total * (1.0 / replicas)
        if square:
            total = total * total
        grads = apply_all("GradientOf", total, *ws, seeded=False)
        for w, g in zip(ws, grads):
            apply("Assign", w, w - g * LR)
        graph, _ = tr.build([total])
    return graph, tags


def data(batch, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.normal(size=(batch, WIDTHS[0])), "y": rng.normal(size=(batch, WIDTHS[-1]))}
    for i in range(4):
        feeds[f"w{i}"] = rng.normal(size=(WIDTHS[i], WIDTHS[i + 1])) * 0.3
    return {k: v.astype(np.float32) for k, v in feeds.items()}


def one_device(graph, feeds, steps):
    program = lower_rank_program(expand_gradients(graph), state=[f"w{i}" for i in range(4)])
    world, stores, losses = World([program], compute()), [dict(feeds)], []
    for _ in range(steps):
        world.run([{}], stores)
        losses.append(float(stores[0][program.outputs[0]]))
    return losses, stores[0]


def pipelined(graph, tags, feeds_of_rank, steps, name, stages, micro, virtual=1, replicas=1):
    """Every rank's pipelined program run together; returns (losses per step per rank, stores, programs, world)."""
    schedule = generate(name, stages, micro, virtual)
    programs, transfers = [], None
    for rank in range(stages * replicas):
        piped = pipeline_rank_graph(
            graph, tags, {"x", "y"}, schedule, rank // replicas, ranks_per_stage=replicas, local_rank=rank % replicas
        )
        transfers = piped.transfers
        state = [n for n in piped.parameters if n.startswith("w")]
        programs.append(lower_rank_program(piped.graph, state=state, phases=piped.phases, world_size=stages * replicas))
    check(schedule, transfers)
    world = World(programs, compute(), track_memory=True)
    stores = []
    for rank, program in enumerate(programs):
        inputs = {*program.data_inputs, *program.state_inputs}
        stores.append({k: v.copy() for k, v in feeds_of_rank(rank).items() if k in inputs})
    losses = []
    for _ in range(steps):
        world.run([{} for _ in programs], stores)
        losses.append([float(store[p.outputs[0]]) for store, p in zip(stores, programs)])
    return losses, stores, programs, world


SCHEDULES = [(name, stages, 1) for name in ("gpipe", "1f1b", "zero_bubble_h1") for stages in (2, 4)]
SCHEDULES += [("1f1b", 2, 2), ("gpipe", 2, 2)]  # interleaved: 2 stages of 2 chunks each (4 layers)


@pytest.mark.parametrize(("name", "stages", "virtual"), SCHEDULES)
def test_every_schedule_trains_like_one_device_on_the_same_micro_batches(name, stages, virtual):
    layers = [i * stages * virtual // 4 for i in range(4)]  # virtual stage of each layer
    graph, tags = mlp_step(layers, batch=8, micro=4)
    feeds = data(8)
    reference, final = one_device(graph, feeds, steps=4)
    losses, stores, _, _ = pipelined(graph, tags, lambda r: feeds, 4, name, stages, 4, virtual)
    for step, ref in enumerate(reference):
        assert losses[step] == pytest.approx([ref] * stages, rel=1e-5)  # every rank returns the loss
    for i, layer in enumerate(layers):
        held = stores[layer % stages][f"w{i}"]
        np.testing.assert_allclose(held, final[f"w{i}"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
def test_a_value_sent_to_two_chunks_of_one_rank_gets_the_gradient_of_both(name):
    # interleaved, 2 stages x 2 chunks: layer 0 (chunk 0, rank 0) feeds layer 1 (chunk 1) and, by a skip link,
    # layer 3 (chunk 3), both on rank 1: each chunk's backward must differentiate its own Receive of it
    graph, tags = mlp_step([0, 1, 2, 3], batch=8, micro=4, skip=True)
    feeds = data(8)
    reference, final = one_device(graph, feeds, steps=3)
    losses, stores, _, _ = pipelined(graph, tags, lambda r: feeds, 3, name, 2, 4, 2)
    for step, ref in enumerate(reference):
        assert losses[step] == pytest.approx([ref] * 2, rel=1e-5)
    for i in range(4):
        np.testing.assert_allclose(stores[i % 2][f"w{i}"], final[f"w{i}"], rtol=1e-5, atol=1e-6, err_msg=f"w{i}")


def test_each_stage_holds_only_its_own_parameters():
    graph, tags = mlp_step([0, 1, 2, 3], batch=8, micro=4)
    schedule = generate("1f1b", 4, 4)
    for stage in range(4):
        piped = pipeline_rank_graph(graph, tags, {"x", "y"}, schedule, stage)
        assert [n for n in piped.parameters if n.startswith("w")] == [f"w{stage}"]
        reads_x, reads_y = "x" in piped.parameters, "y" in piped.parameters
        assert (reads_x, reads_y) == (stage == 0, stage == 3)


def test_a_parameter_shared_by_two_stages_gets_the_sum_of_both_gradients_and_stays_in_sync():
    graph, tags = mlp_step([0, 0, 1, 1], batch=8, micro=2, tied=True)
    feeds = data(8)
    reference, final = one_device(graph, feeds, steps=3)
    losses, stores, programs, _ = pipelined(graph, tags, lambda r: feeds, 3, "1f1b", 2, 2)
    assert [row[0] for row in losses] == pytest.approx(reference, rel=1e-5)
    for stage in (0, 1):
        np.testing.assert_allclose(stores[stage]["w0"], final["w0"], rtol=1e-5, atol=1e-6)
    assert programs[0].collective_counts()["ALL_REDUCE"] == 1  # w0's gradient, summed over the two stages


@pytest.mark.parametrize("name", ["1f1b", "zero_bubble_h1"])
def test_data_parallel_inside_the_stages_reduces_each_gradient_once_per_step(name):
    replicas, batch = 2, 8
    graph, tags = mlp_step([0, 0, 1, 1], batch=batch, micro=2, replicas=replicas)
    whole, _ = mlp_step([0, 0, 1, 1], batch=batch, micro=2)
    feeds = data(batch)
    reference, final = one_device(whole, feeds, steps=3)

    def shard(rank):  # stage rank // 2, data-parallel index rank % 2: rows of that index's half of the batch
        half = rank % replicas
        return {k: (v[half * 4 : half * 4 + 4] if k in ("x", "y") else v) for k, v in feeds.items()}

    losses, stores, programs, _ = pipelined(graph, tags, shard, 3, name, 2, 2, replicas=replicas)
    for step, ref in enumerate(reference):  # each data-parallel rank's loss is its half's share of the whole
        assert losses[step][0] + losses[step][1] == pytest.approx(ref, rel=1e-5)
        assert losses[step][:2] == pytest.approx(losses[step][2:], rel=1e-6)  # stage 0 got stage 1's
    for rank in range(4):
        stage = rank // 2
        for i in (2 * stage, 2 * stage + 1):
            np.testing.assert_allclose(stores[rank][f"w{i}"], final[f"w{i}"], rtol=1e-5, atol=1e-6)
        assert programs[rank].collective_counts()["ALL_REDUCE"] == 2  # one per weight, after the micro-batches


def test_1f1b_holds_fewer_activations_than_gpipe():
    graph, tags = mlp_step([0, 1, 2, 3], batch=32, micro=8)
    feeds = data(32)
    peaks = {}
    for name in ("gpipe", "1f1b"):
        _, _, _, world = pipelined(graph, tags, lambda r: feeds, 1, name, 4, 8)
        peaks[name] = world.peak_bytes
    assert all(one < gp for one, gp in zip(peaks["1f1b"], peaks["gpipe"])), peaks


def test_the_zero_bubble_schedule_sends_an_input_gradient_before_computing_the_weight_gradient():
    graph, tags = mlp_step([0, 1, 2, 3], batch=8, micro=4)
    schedule = generate("zero_bubble_h1", 4, 4)
    piped = pipeline_rank_graph(graph, tags, {"x", "y"}, schedule, 1)
    nodes = list(piped.graph.nodes)
    first_send = next(i for i, n in enumerate(nodes) if n.op == "Send" and n.inputs[0].shape == (2, 16))
    weight_grads = [i for i, n in enumerate(nodes) if n.op == "MatMul" and n.attrs["transpose_a"]]
    assert weight_grads and first_send < weight_grads[0]


def test_a_cell_reading_a_later_stage_is_an_error_naming_both_cells():
    graph, tags = mlp_step([1, 0, 1, 1], batch=8, micro=2)
    with pytest.raises(ConfigurationError, match=r"MatMul in cell 'layer1'.* stage 0 .*'layer0'.* later stage 1"):
        pipeline_rank_graph(graph, tags, {"x", "y"}, generate("1f1b", 2, 2), 0)


def test_a_stage_with_nothing_to_do_is_an_error():
    graph, tags = mlp_step([0, 0, 2, 2], batch=8, micro=4)
    with pytest.raises(ConfigurationError, match=r"pipeline stage\(s\) \[1\] of 3 compute nothing"):
        pipeline_rank_graph(graph, tags, {"x", "y"}, generate("1f1b", 3, 4), 0)


def test_a_loss_whose_gradient_needs_every_micro_batch_fails_for_1f1b_naming_the_actions_and_runs_in_gpipe():
    graph, tags = mlp_step([0, 0, 1, 1], batch=8, micro=2, square=True)
    with pytest.raises(ConfigurationError, match=r"pipeline stage 1: .* needs what .* computes later .*'1f1b'"):
        pipeline_rank_graph(graph, tags, {"x", "y"}, generate("1f1b", 2, 2), 1)
    feeds = data(8)
    reference, _ = one_device(graph, feeds, steps=2)
    losses, _, _, _ = pipelined(graph, tags, lambda r: feeds, 2, "gpipe", 2, 2)
    assert [row[1] for row in losses] == pytest.approx(reference, rel=1e-5)


def test_each_lowered_segment_runs_one_action_and_zero_bubbles_b_computes_no_weight_gradient():
    graph, tags = mlp_step([0, 1, 2, 3], batch=8, micro=4)
    schedule = generate("zero_bubble_h1", 4, 4)
    piped = pipeline_rank_graph(graph, tags, {"x", "y"}, schedule, 1)
    program = lower_rank_program(piped.graph, state=list(piped.parameters), phases=piped.phases, world_size=4)
    actions = actions_of(piped.graph)
    by_action: dict[str, list] = {}
    for name, segment in program.segments.items():
        action = actions.get(program.segment_phases.get(name, -1))
        if action is not None:
            by_action.setdefault(action, []).append(segment)
    assert set(by_action) == {repr(a) for a in schedule.orders[1]}  # every F, B and W of stage 1 is its own segment
    for action, segments in by_action.items():
        weight_grads = [n for s in segments for n in s.graph.nodes if n.op == "MatMul" and n.attrs["transpose_a"]]
        assert bool(weight_grads) == action.startswith("W"), (action, [n.op for s in segments for n in s.graph.nodes])
