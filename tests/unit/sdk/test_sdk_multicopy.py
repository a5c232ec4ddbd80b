"""Multi-copy parallelism (nn.MicroBatchInterleaved, and MindSpore 2.6's mindspore.parallel.nn name for it): every
input split on dim 0 into interleave_num copies (rows i, i + k, ...: StridedSlice nodes), the copies independent in
the traced graph, the result the sum of the copies' outputs; the same numbers on one device and on N simulated
ranks under SEMI_AUTO_PARALLEL, AUTO_PARALLEL and DATA_PARALLEL; each copy partitioned without communication; the
rank program overlapping one copy's AllReduce with another copy's work; clear errors.

The reference is numpy in float64: k copies of the Megatron MLP's mean cross-entropy, summed, trained with SGD."""

from __future__ import annotations

import numpy as np
import pytest
from test_sdk_semi_auto import MegatronMLP, assemble, close, partitions

import tessel as ms
from tessel import nn, ops
from tessel.compiler import (
    SGD,
    bucket_allreduce,
    build_train_step,
    data_parallel_train_step,
    lower_rank_program,
    simulate,
)
from tessel.core.errors import ConfigurationError
from tessel.parallel import explain, trace_network
from tessel.parallel.nn import MicroBatchInterleaved as ParallelMicroBatchInterleaved
from tessel.plugins.cpu.compute import CpuCompute

BATCH, IN, HIDDEN, CLASSES, LR, STEPS = 16, 8, 16, 4, 0.5, 3
rng = np.random.default_rng(11)
W1 = (rng.standard_normal((IN, HIDDEN)) * 0.5).astype(np.float32)
W2 = (rng.standard_normal((HIDDEN, CLASSES)) * 0.5).astype(np.float32)
X = rng.standard_normal((BATCH, IN)).astype(np.float32)
Y = rng.integers(0, CLASSES, BATCH).astype(np.int32)


class LossNet(nn.Cell):
    def __init__(self, dp=1, mp=1, w1=W1, w2=W2):
        super().__init__()
        self.mlp = MegatronMLP(dp, mp, w1, w2)
        self.loss = ops.SparseSoftmaxCrossEntropyWithLogits()

    def construct(self, x, y):
        return self.loss(self.mlp(x), y)


def numpy_copies(k: int, steps: int = STEPS):
    """Float64: `steps` SGD steps of the sum over copies i (rows i::k) of the copy's mean cross-entropy."""
    w1, w2 = W1.astype(np.float64), W2.astype(np.float64)
    for _ in range(steps):
        loss, g1, g2 = 0.0, 0.0, 0.0
        for i in range(k):
            x, y = X[i::k].astype(np.float64), Y[i::k]
            h = np.maximum(x @ w1, 0)
            z = h @ w2
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            loss += -np.log(p[np.arange(len(y)), y]).mean()
            dz = p.copy()
            dz[np.arange(len(y)), y] -= 1
            dz /= len(y)
            g1, g2 = g1 + x.T @ ((dz @ w2.T) * (h > 0)), g2 + h.T @ dz
        w1, w2 = w1 - LR * g1, w2 - LR * g2
    return loss, w1, w2


@pytest.mark.parametrize("k", [1, 2, 4])
def test_one_device_trains_the_sum_of_the_copies(k):
    net = LossNet()
    step = nn.TrainOneStepCell(nn.MicroBatchInterleaved(net, k), nn.SGD(net.trainable_params(), LR))
    for _ in range(STEPS):
        loss = step(ms.Tensor(X), ms.Tensor(Y))
    want_loss, want_w1, want_w2 = numpy_copies(k)  # the loss of the last step, computed before its update
    close(net.mlp.w1.asnumpy(), want_w1, what="w1")
    close(net.mlp.w2.asnumpy(), want_w2, what="w2")
    close(loss.asnumpy(), want_loss, what="loss")


def test_the_copies_are_strided_slices_with_nothing_shared_until_the_sum():
    graph, _ = trace_network(nn.MicroBatchInterleaved(LossNet(), 4), X, Y)
    slices = [n for n in graph.nodes if n.op == "StridedSlice"]
    assert len(slices) == 8  # x and y, four copies each
    assert sorted(n.attrs["begin"][0] for n in slices) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(n.attrs["strides"][0] == 4 and n.attrs["end"] == (None,) * n.inputs[0].ndim for n in slices)
    # each copy's nodes reach exactly one copy's slices: walk back from each copy's loss
    producers = graph.producers
    adds = [n for n in graph.nodes if n.op == "Add"]
    assert len(adds) == 3  # the sum of four outputs
    losses = [v for n in adds for v in n.inputs if producers.get(v) not in adds]
    for loss in losses:
        seen, todo = set(), [producers[loss]]
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo += [producers[v] for v in node.inputs if v in producers]
        assert len({n.attrs["begin"][0] for n in seen if n.op == "StridedSlice"}) == 1


def test_mindspore_2_6_name_is_the_same_cell():
    assert ParallelMicroBatchInterleaved is nn.MicroBatchInterleaved


def _semi_auto_programs(k, devices, dp, mp, mode, full_batch):
    ms.set_auto_parallel_context(parallel_mode=mode, full_batch=full_batch)
    net = nn.MicroBatchInterleaved(LossNet(dp, mp), k)
    _, parts, key = partitions(net, [X, Y], devices)
    rows = BATCH // devices
    programs, feeds = [], []
    for rank, part in enumerate(parts):
        train = build_train_step(part.graph, [key["mlp.w1"], key["mlp.w2"]], SGD(LR))
        graph = bucket_allreduce(train.graph)
        programs.append(lower_rank_program(graph, state=[s.name for s in train.state], world_size=devices))
        mine = {"x": X, "y": Y}
        if not full_batch:
            mine = {"x": X[rank * rows : (rank + 1) * rows], "y": Y[rank * rows : (rank + 1) * rows]}
        feeds.append(part.params | part.slice_feeds(mine) | {"learning_rate": np.float32(LR)})
    return programs, feeds, parts, key


@pytest.mark.parametrize("mode", [ms.ParallelMode.SEMI_AUTO_PARALLEL, ms.ParallelMode.AUTO_PARALLEL])
@pytest.mark.parametrize(("k", "devices", "dp", "mp", "full_batch"), [
    (2, 2, 1, 2, True), (4, 2, 1, 2, True), (2, 4, 2, 2, False), (2, 2, 2, 1, False)])  # fmt: skip
def test_n_ranks_with_k_copies_equal_one_device_with_k_copies(mode, k, devices, dp, mp, full_batch):
    programs, feeds, parts, key = _semi_auto_programs(k, devices, dp, mp, mode, full_batch)
    stores = simulate(programs, feeds, CpuCompute(threads=1), runs=STEPS)
    _, want_w1, want_w2 = numpy_copies(k)
    for name, want in ((key["mlp.w1"], want_w1), (key["mlp.w2"], want_w2)):
        got = assemble([s[name] for s in stores], parts[0].plan.input_layout(name), want.shape)
        close(got, want, what=f"{name}: {devices} ranks, {k} copies")
    for store, program in zip(stores, programs):
        close(store[program.outputs[0]], numpy_copies(k)[0], what="loss of the last step")


def test_each_copy_is_partitioned_in_place_and_overlaps_the_others_all_reduce():
    """Megatron on 2 ranks, the whole batch on every rank: the copies' slices need no communication (explain shows
    none on them), each copy has its one forward AllReduce, and copy 0's is in flight while copy 1 computes."""
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True)
    text = explain(nn.MicroBatchInterleaved(LossNet(1, 2), 2), X, Y, device_num=2, show=False)
    slice_lines = [line for line in text.splitlines() if "= StridedSlice(" in line]
    assert len(slice_lines) == 4 and all("shard() ((1, 1)" in line or "shard() ((1,)" in line for line in slice_lines)
    # sizes where a copy's products are worth running while the other copy's AllReduce is in flight
    big = np.random.default_rng(5)
    w1, w2 = big.standard_normal((256, 512)).astype(np.float32), big.standard_normal((512, CLASSES)).astype(np.float32)
    x, y = big.standard_normal((128, 256)).astype(np.float32), big.integers(0, CLASSES, 128).astype(np.int32)
    _, parts, key = partitions(nn.MicroBatchInterleaved(LossNet(1, 2, w1, w2), 2), [x, y], 2)
    forward = [n for n in parts[0].graph.nodes if n.op == "AllReduce"]
    assert len(forward) == 2  # one per copy (Megatron's one AllReduce per layer pair)
    train = build_train_step(parts[0].graph, [key["mlp.w1"], key["mlp.w2"]], SGD(LR))
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=2, spmd=True)
    instructions = program.program.instructions
    kinds = [i.WhichOneof("op") for i in instructions]
    first = next(i for i, ins in enumerate(instructions) if kinds[i] == "collective")
    handle = instructions[first].collective.handle
    wait = next(i for i, ins in enumerate(instructions) if kinds[i] == "wait" and ins.wait.handle == handle)
    assert handle and "run_segment" in kinds[first + 1 : wait], program.dump()


def test_data_parallel_ranks_split_their_own_batch_like_one_device():
    """DATA_PARALLEL: each rank's network is the whole one on its rows; with gradients summed (mean=False) over
    ranks the step equals one device holding all rows, copies included (rows i::k of each rank's slice are rows
    i::k of the whole batch when k divides the rank's rows)."""
    k, devices = 2, 2
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL)
    rows = BATCH // devices
    net = nn.MicroBatchInterleaved(LossNet(), k)
    graph, trace = trace_network(net, X[:rows], Y[:rows])
    keys = [p.key for p in trace.parameters()]
    train = data_parallel_train_step(graph, keys, SGD(LR), tuple(range(devices)), mean=False)
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=devices)
    by_name = {p.name: p.key for p in trace.parameters()}
    feeds = [{"x": X[r * rows : (r + 1) * rows], "y": Y[r * rows : (r + 1) * rows], by_name["mlp.w1"]: W1,
              by_name["mlp.w2"]: W2, "learning_rate": np.float32(LR)} for r in range(devices)]  # fmt: skip
    stores = simulate([program] * devices, feeds, CpuCompute(threads=1), runs=STEPS)
    # one device, the whole batch, k * devices copies of the sum == devices ranks of k copies, gradients summed
    _, want_w1, want_w2 = numpy_copies(k * devices)
    for store in stores:
        close(store[by_name["mlp.w1"]], want_w1, what="w1")
        close(store[by_name["mlp.w2"]], want_w2, what="w2")


# --- errors ---------------------------------------------------------------------------------------------------------


def test_a_batch_that_does_not_split_names_the_cell_the_shape_and_the_fix():
    net = nn.MicroBatchInterleaved(LossNet(), 4)
    with pytest.raises(ConfigurationError) as error:
        net(ms.Tensor(X[:10]), ms.Tensor(Y[:10]))
    message = str(error.value)
    assert "MicroBatchInterleaved(LossNet)" in message and "(10, 8)" in message
    assert "interleave_num=4" in message and "divisible by 4" in message and "drop_remainder=True" in message


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_interleave_num_below_one_or_not_an_int_is_refused(bad):
    error = ConfigurationError if isinstance(bad, int) and not isinstance(bad, bool) else TypeError  # MindSpore's
    with pytest.raises(error, match=r"MicroBatchInterleaved\(LossNet\): interleave_num must be an int"):
        nn.MicroBatchInterleaved(LossNet(), bad)


def test_an_output_that_is_not_one_tensor_is_refused():
    class TwoOutputs(nn.Cell):
        def construct(self, x):
            return x * 2, x + 1

    with pytest.raises(ConfigurationError) as error:
        nn.MicroBatchInterleaved(TwoOutputs(), 2)(ms.Tensor(X))
    message = str(error.value)
    assert "MicroBatchInterleaved(TwoOutputs)" in message and "a tuple of 2 ((8, 8), (8, 8))" in message
    assert "nn.WithLossCell" in message


def test_model_train_wraps_it_in_a_train_step_and_reports_the_summed_loss():
    """Model(MicroBatchInterleaved(WithLossCell(...)), optimizer=...) trains the sum, as in the multi-copy seed."""
    from tessel.dataset import NumpySlicesDataset

    net = LossNet()
    k = 2
    model = ms.Model(nn.MicroBatchInterleaved(net, k), optimizer=nn.SGD(net.trainable_params(), LR))
    data = NumpySlicesDataset({"x": X, "y": Y}, shuffle=False).batch(BATCH)
    seen = []

    class Record(ms.train.Callback):
        def on_train_step_end(self, run_context):
            seen.append(float(run_context.original_args().net_outputs.asnumpy()))

    model.train(STEPS, data, callbacks=[Record()])
    _, want_w1, want_w2 = numpy_copies(k)
    close(net.mlp.w1.asnumpy(), want_w1, what="w1")
    close(net.mlp.w2.asnumpy(), want_w2, what="w2")
    close(seen[0], numpy_copies(k, 1)[0], what="first loss (the sum of two copies' losses)")
    assert type(model.train_network).__name__ == "TrainOneStepCell"


def test_a_plan_made_in_this_process_is_bounded_by_this_hosts_memory_unless_set(monkeypatch):
    # the generic CPU cost model's 8 GiB describes no real device; without ms.runtime.set_memory the budget of a
    # plan made here (explain, a world of 1, a simulated rank) is the host's memory
    from tessel.compiler.parallel.search.planner import MemoryBudgetError
    from tessel.parallel import planning

    monkeypatch.setattr(planning, "_host_memory", lambda: 1024)  # a host of 1 KiB: no plan fits
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.AUTO_PARALLEL, full_batch=True)
    with pytest.raises(MemoryBudgetError, match=r"memory budget of 0\.00 MiB .*ms\.runtime\.set_memory"):
        explain(LossNet(1, 2), X, Y, device_num=2, show=False)
