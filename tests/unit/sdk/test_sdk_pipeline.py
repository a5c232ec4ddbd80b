"""Pipeline parallel in the SDK: MindSpore's API surface (Cell.pipeline_stage, nn.PipelineCell and
mindspore.parallel.nn.Pipeline with stage_config, PipelineGradReducer, pipeline_config, AutoParallel.pipeline)
with MindSpore's validation, the micro-batch sum on one device, the stages the trace assigns (interleaved chunks
included), and N simulated ranks — stages x data parallel — training like one device (the SDK's trace, the
parallel pass over a stage's ranks and the pipeline pass, run in the rank simulator against float64 numpy)."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import context, nn, ops
from tessel.compiler import SGD, build_train_step, lower_rank_program
from tessel.compiler.pipeline import check
from tessel.compiler.rank_simulator import World
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.parallel import pipeline, trace_network
from tessel.parallel.auto_parallel import AutoParallel
from tessel.parallel.nn import Pipeline
from tessel.parallel.semi_auto import partition_for_rank
from tessel.plugins.cpu.compute import CpuCompute

IN, HIDDEN, OUT, BATCH, LR, STEPS = 6, 8, 4, 16, 0.3, 3
rng = np.random.default_rng(5)
X = rng.standard_normal((BATCH, IN)).astype(np.float32)
Y = rng.integers(0, OUT, BATCH).astype(np.int32)


@pytest.fixture(autouse=True)
def fresh_context():
    ms.reset_auto_parallel_context()
    yield
    ms.reset_auto_parallel_context()


class Net(nn.Cell):
    def __init__(self, stages=(0, 0, 1, 1)):
        super().__init__()
        widths = (IN, HIDDEN, HIDDEN, HIDDEN, OUT)
        self.layers = nn.CellList([nn.Dense(widths[i], widths[i + 1]) for i in range(4)])
        self.relu = ops.ReLU()
        for layer, stage in zip(self.layers, stages):
            layer.pipeline_stage = stage

    def construct(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            x = self.relu(x) if i < 3 else x
        return x


def loss_net(net, micro):
    return nn.PipelineCell(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")), micro)


def numpy_steps(weights, micro, steps=STEPS):
    """Float64 one device: `steps` SGD steps on the sum over micro-batches (rows m::M) of the mean cross-entropy."""
    w = [weights[f"layers.{i}.weight"].astype(np.float64) for i in range(4)]
    b = [weights[f"layers.{i}.bias"].astype(np.float64) for i in range(4)]
    losses = []
    for _ in range(steps):
        gw, gb, total = [0.0] * 4, [0.0] * 4, 0.0
        for m in range(micro):
            x, y = X[m::micro].astype(np.float64), Y[m::micro]
            acts, h = [x], x
            for i in range(4):
                h = h @ w[i].T + b[i]
                h = np.maximum(h, 0) if i < 3 else h
                acts.append(h)
            p = np.exp(h - h.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            total += -np.log(p[np.arange(len(y)), y]).mean()
            g = p.copy()
            g[np.arange(len(y)), y] -= 1
            g /= len(y)
            for i in reversed(range(4)):
                g = g * (acts[i + 1] > 0) if i < 3 else g
                gw[i], gb[i] = gw[i] + g.T @ acts[i], gb[i] + g.sum(0)
                g = g @ w[i]
        losses.append(total)
        w, b = [a - LR * d for a, d in zip(w, gw)], [a - LR * d for a, d in zip(b, gb)]
    return losses, {f"layers.{i}.weight": w[i] for i in range(4)} | {f"layers.{i}.bias": b[i] for i in range(4)}


# --- MindSpore's API -------------------------------------------------------------------------------------------------


def test_pipeline_stage_defaults_to_unset_and_takes_non_negative_ints_only():
    cell = nn.Dense(2, 2)
    assert cell.pipeline_stage == -1
    cell.pipeline_stage = 3
    assert cell.pipeline_stage == 3
    with pytest.raises(TypeError, match="'pipeline_stage' must be int type"):
        cell.pipeline_stage = True
    with pytest.raises(TypeError, match="'pipeline_stage' must be int type"):
        cell.pipeline_stage = "1"
    with pytest.raises(ValueError, match="can not be less than 0, but got -2"):
        cell.pipeline_stage = -2
    with pytest.raises(NotSupportedYetError, match="pipeline_segment=1, segments belong to the zero_bubble_v"):
        cell.pipeline_segment = 1


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((nn.Dense(2, 2), 0), ValueError, "'micro_size' must be large than 0, but got 0"),
        ((nn.Dense(2, 2), 2.0), TypeError, "'micro_size' must be integer"),
        (("net", 2), TypeError, "'network' must cell type"),
    ],
)
def test_pipeline_cell_arguments_are_checked_as_mindspore_does(args, error, message):
    with pytest.raises(error, match=message):
        nn.PipelineCell(*args)


def test_stage_config_sets_stages_by_cell_name_and_an_unknown_name_lists_the_cells():
    net = Net()
    wrapped = nn.WithLossCell(net, nn.MSELoss())
    Pipeline(wrapped, 2, stage_config={"_backbone.layers.0": 1, "_backbone.layers.3": 0})
    assert net.layers[0].pipeline_stage == 1 and net.layers[3].pipeline_stage == 0
    with pytest.raises(KeyError, match=r"\{'_backbone.nope': 1\} is not found in 'network'; its cells are"):
        nn.PipelineCell(wrapped, 2, stage_config={"_backbone.nope": 1})
    with pytest.raises(ValueError, match="no 'shard' on 'PipelineCell' is allowed"):
        nn.PipelineCell(wrapped, 2).shard(((1,),))
    with pytest.raises(NotSupportedYetError, match=r"PipelineCell\(segment_config=...\)"):
        nn.PipelineCell(wrapped, 2, segment_config={"_backbone.layers.0": 1})


def test_on_one_device_the_pipeline_cell_trains_the_sum_of_the_micro_batches_losses():
    net = Net()
    weights = {p.name: np.array(p.asnumpy()) for p in net.trainable_params()}
    step = nn.TrainOneStepCell(loss_net(net, 4), nn.SGD(net.trainable_params(), LR))
    losses = [float(step(ms.Tensor(X), ms.Tensor(Y)).asnumpy()) for _ in range(STEPS)]
    want, final = numpy_steps(weights, 4)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    for p in net.trainable_params():
        np.testing.assert_allclose(p.asnumpy(), final[p.name], rtol=1e-5, atol=1e-6)


def test_a_batch_micro_size_does_not_split_names_the_cell_the_shape_and_the_fix():
    with pytest.raises(ConfigurationError) as error:
        loss_net(Net(), 4)(ms.Tensor(X[:10]), ms.Tensor(Y[:10]))
    message = str(error.value)
    assert "PipelineCell(WithLossCell): input 0 has shape (10, 6)" in message
    assert "micro_size=4" in message and "divisible by 4 (e.g. 8 or 12)" in message and "drop_remainder" in message


def test_the_gradient_reducer_divides_by_scale_sense_and_refuses_optimizer_sharding():
    grads = (ms.Tensor(np.ones(2, np.float32)),)
    assert nn.PipelineGradReducer([], scale_sense=1.0)(grads) == grads
    np.testing.assert_allclose(nn.PipelineGradReducer([], scale_sense=4.0)(grads)[0].asnumpy(), [0.25, 0.25])
    with pytest.raises(NotSupportedYetError, match=r"PipelineGradReducer\(opt_shard=True\)"):
        nn.PipelineGradReducer([], opt_shard=True)


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        ({"pipeline_scheduler": "zero_bubble_v"}, NotSupportedYetError, "pipeline_scheduler='zero_bubble_v'"),
        ({"pipeline_scheduler": "seqpipe"}, NotSupportedYetError, "tessel's schedules are"),
        ({"pipeline_scheduler": "2f2b"}, ConfigurationError, "must be one of"),
        ({"pipeline_interleave": 1}, ConfigurationError, "pipeline_interleave must be a bool"),
        ({"pipeline_order": 1}, ConfigurationError, r"unknown key\(s\) \['pipeline_order'\]"),
        ("1f1b", ConfigurationError, "pipeline_config must be a dict"),
    ],
)
def test_pipeline_config_takes_the_schedules_tessel_has_and_says_why_not_the_others(config, error, message):
    with pytest.raises(error, match=message):
        ms.set_auto_parallel_context(pipeline_config=config)


def test_pipeline_config_and_auto_parallel_pipeline_set_the_same_context():
    ms.set_auto_parallel_context(pipeline_stages=2, pipeline_config={"pipeline_scheduler": "gpipe"})
    assert pipeline.scheduler() == ("gpipe", False)
    ms.reset_auto_parallel_context()
    wrapped = AutoParallel(lambda x: x, parallel_mode="semi_auto")
    wrapped.pipeline(stages=4, interleave=True, scheduler="zero_bubble_h1")
    assert context.get_auto_parallel_context("pipeline_stages") == 4
    assert pipeline.scheduler() == ("zero_bubble_h1", True)
    assert context.get_auto_parallel_context("pipeline_result_broadcast") is False
    wrapped.pipeline(stages=4, output_broadcast=True)
    assert context.get_auto_parallel_context("pipeline_result_broadcast") is True
    with pytest.raises(ValueError, match="'stages' must be larger than zero"):
        wrapped.pipeline(stages=0)
    with pytest.raises(TypeError, match="'interleave' must be bool type"):
        wrapped.pipeline(stages=2, interleave="yes")
    with pytest.raises(NotSupportedYetError, match="zero_bubble_v"):
        wrapped.pipeline(stages=2, scheduler="zero_bubble_v")


def test_the_world_must_split_into_stages_under_a_semi_auto_mode():
    ms.set_auto_parallel_context(pipeline_stages=2)
    with pytest.raises(ConfigurationError, match=r"pipeline_stages=2 with parallel_mode='stand_alone'.*SEMI_AUTO"):
        pipeline.mesh(4, 0)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, pipeline_stages=3)
    with pytest.raises(ConfigurationError, match=r"pipeline_stages=3 does not divide the 8 ranks.*e\.g\. 2"):
        pipeline.mesh(8, 0)
    ms.set_auto_parallel_context(pipeline_stages=2)
    assert pipeline.mesh(8, 5) == pipeline.Mesh(2, 4, 1, 1)


# --- stages from the trace -------------------------------------------------------------------------------------------


def _tags(net, interleave=False, stages=2):
    graph, trace = trace_network(loss_net(net, 4), X, Y)
    return pipeline.logical_tags(graph, trace, stages, interleave)


def test_the_trace_gives_each_micro_batch_s_nodes_its_cell_s_stage():
    tags, chunks, micros = _tags(Net())
    assert (chunks, micros) == (1, 4)
    dense = {(t.stage, t.micro) for t in tags.values() if t.cell.endswith("(Dense)")}
    assert dense == {(s, m) for s in (0, 1) for m in range(4)}
    assert any(t.cell == "_backbone.layers.2 (Dense)" for t in tags.values())


def test_interleaving_counts_a_stage_number_that_comes_round_again_as_the_next_chunk():
    tags, chunks, _ = _tags(Net(stages=(0, 1, 0, 1)), interleave=True)
    assert chunks == 2
    by_layer = {t.cell: t.stage for t in tags.values() if t.cell.endswith("(Dense)") and t.micro == 0}
    assert [by_layer[f"_backbone.layers.{i} (Dense)"] for i in range(4)] == [0, 1, 2, 3]


# --- stages x data parallel, simulated --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stages", "replicas", "scheduler"), [(2, 1, "1f1b"), (2, 2, "zero_bubble_h1"), (4, 1, "gpipe")]
)
def test_simulated_ranks_train_like_one_device(stages, replicas, scheduler):
    """The SDK's trace of PipelineCell, each rank's share planned over its stage's ranks (partition_for_rank), the
    fused step with gradients deferred and the pipeline pass: every rank's program, run together, equals numpy."""
    ms.set_auto_parallel_context(
        parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL,
        pipeline_stages=stages,
        pipeline_config={"pipeline_scheduler": scheduler},
    )
    net = Net(stages=tuple(i * stages // 4 for i in range(4)))
    weights = {p.name: np.array(p.asnumpy()) for p in net.trainable_params()}
    graph, trace = trace_network(loss_net(net, 4), X, Y)
    keys = [p.key for p in trace.parameters()]
    by_key = {p.key: p.name for p in trace.parameters()}
    data = [v.name for v in graph.inputs if v.name not in keys]  # the loss network's arguments: data, label
    tags, chunks, micros = pipeline.logical_tags(graph, trace, stages, False)
    schedule = pipeline.schedule_for(stages, chunks, micros, True)
    programs, feeds, holds = [], [], []
    world = stages * replicas
    for rank in range(world):
        where = pipeline.mesh(world, rank)
        part = partition_for_rank(graph, trace, keys, None, where.index, where.devices)
        train = build_train_step(part.graph, keys, SGD(LR), deferred_gradients=True)
        origins = part.plan.rank_origins(where.index)
        piped = pipeline.cut(train.graph, origins, tags, data, keys, schedule, where)
        check(schedule, piped.transfers)
        state = [s.name for s in train.state if s.name in piped.parameters]
        programs.append(lower_rank_program(piped.graph, state=state, phases=piped.phases, world_size=world))
        rows = BATCH // replicas
        mine = {"data": X[where.index * rows :][:rows], "label": Y[where.index * rows :][:rows]}
        feed = {k: v for k, v in (mine | {"learning_rate": np.float32(LR)}).items() if k in piped.parameters}
        feed |= {key: weights[by_key[key]] for key in keys if key in piped.parameters}
        feeds.append(feed)
        holds.append([by_key[k] for k in keys if k in piped.parameters])
    world, stores, losses = World(programs, CpuCompute(threads=1)), feeds, []
    for _ in range(STEPS):
        world.run([{} for _ in programs], stores)
        losses.append([float(store[p.outputs[0]]) for store, p in zip(stores, programs)])
    want, final = numpy_steps(weights, 4)
    for step, ref in enumerate(want):
        assert losses[step] == pytest.approx([ref] * len(programs), rel=1e-5)
    for rank, (store, held) in enumerate(zip(stores, holds)):
        assert held, f"rank {rank} holds nothing"
        for name in held:
            key = next(k for k, n in by_key.items() if n == name)
            np.testing.assert_allclose(store[key], final[name], rtol=1e-5, atol=1e-6)
    assert sum(len(h) for h in holds) == 8 * replicas  # each parameter on one stage (and its replicas)


def test_parameter_value_in_a_traced_function_reads_the_parameter_where_it_is_used():
    """MindSpore's shared-embedding pattern (`return out, self.table.value()`, the head on another stage): inside a
    traced function value() is the parameter itself, so the stage that uses it holds it and a later change is seen;
    eagerly it is a copy."""

    class Head(nn.Cell):
        def __init__(self):
            super().__init__()
            self.table = ms.Parameter(ms.Tensor(np.ones((3, 2), np.float32)), name="table")

        def construct(self, x):
            return ops.matmul(x, self.table.value())

    head = Head()
    graph, trace = trace_network(head, X[:4, :3])
    assert [p.name for p in trace.parameters()] == ["table"] and not any(n.op == "Constant" for n in graph.nodes)
    x = ms.Tensor(X[:4, :3])
    np.testing.assert_allclose(ms.jit(head)(x).asnumpy(), X[:4, :3] @ np.ones((3, 2)), rtol=1e-6)
    head.table.set_data(ms.Tensor(np.full((3, 2), 2, np.float32)))
    np.testing.assert_allclose(ms.jit(head)(x).asnumpy(), X[:4, :3] @ np.full((3, 2), 2.0), rtol=1e-6)
    copy = head.table.value()
    assert not isinstance(copy, ms.Parameter) and float(copy.asnumpy()[0, 0]) == 2.0


def test_a_pipeline_step_over_grad_accumulation_is_not_supported_yet():
    """GradAccumulation's micro-batches (MicroBatchEnd marks) inside pipeline stages: a clear error, not a step
    that accumulates differently; PipelineCell already sums its micro-batches' gradients."""
    from tessel.parallel.nn import GradAccumulation

    net = Net()
    accumulated = GradAccumulation(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True)), 2)
    graph, trace = trace_network(accumulated, X, Y)
    keys = [p.key for p in trace.parameters()]
    with pytest.raises(NotSupportedYetError, match=r"not supported yet: pipeline parallel with .*GradAccumulation"):
        build_train_step(graph, keys, SGD(LR), deferred_gradients=True)
    build_train_step(graph, keys, SGD(LR))  # without stages it accumulates
