"""SEMI_AUTO_PARALLEL from the SDK: a network written with ops.MatMul().shard(...) is traced, cut for every rank
by tessel.parallel.semi_auto.partition_for_rank, and the rank graphs run on the in-process N-rank simulators
(compiler.rank_simulator, for the forward graphs and the lowered train steps). Results equal a float64
numpy reference of the whole network on one device."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import tessel as ms
from tessel import nn, ops
from tessel.compiler import SGD, bucket_allreduce, build_train_step, lower_rank_program, simulate
from tessel.compiler.parallel import assemble, collective_counts
from tessel.compiler.rank_simulator import run_graphs
from tessel.parallel import trace_network
from tessel.parallel.semi_auto import partition_for_rank
from tessel.plugins.cpu.compute import CpuCompute

BATCH, HIDDEN = 16, 128
rng = np.random.default_rng(7)
X = rng.random((BATCH, HIDDEN)).astype(np.float32)
W = rng.random((HIDDEN, HIDDEN)).astype(np.float32)  # the seed initializes both weights from one array


class SemiAutoParallelNet(nn.Cell):
    """The seed's network: fc (shard given) -> MatMul (fc2: shard given, or an unconfigured one) -> ReduceSum."""

    def __init__(self, fc2_strategy=None):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(W))
        self.weight2 = ms.Parameter(ms.Tensor(W))
        self.fc = ops.MatMul().shard(((1, 1), (1, 2)))
        self.fc2 = ops.MatMul().shard(fc2_strategy) if fc2_strategy else None
        self.reduce = ops.ReduceSum()

    def construct(self, x):
        x = self.fc(x, self.weight)
        x = self.fc2(x, self.weight2) if self.fc2 is not None else ops.MatMul()(x, self.weight2)
        return self.reduce(x, -1)


def numpy_net(x):
    return (x.astype(np.float64) @ W @ W).sum(-1)


def partitions(net, inputs, devices):
    """(global graph, every rank's RankPartition) of `net` traced on `inputs` (global shapes). Parameters are
    graph inputs named by their store keys; the test names them by parameter name (keys are unique per process)."""
    graph, trace = trace_network(net, *inputs)
    names = [p.key for p in trace.parameters()]
    full = {p.key: p.asnumpy() for p in trace.parameters()}
    parts = [partition_for_rank(graph, trace, names, full, r, devices) for r in range(devices)]
    return graph, parts, {p.name: p.key for p in trace.parameters()}


def run_forward(graph, parts, rank_feeds):
    """Every rank's forward on its feeds; output 0 assembled from the pieces (replicas checked equal)."""
    feeds = [part.params | part.slice_feeds(f) for part, f in zip(parts, rank_feeds)]
    outs = run_graphs([part.graph for part in parts], feeds, CpuCompute(threads=1))
    layout = parts[0].plan.output_layouts[0]
    return assemble([o[0] for o in outs], layout, graph.outputs[0].shape)


def close(got, want, tol=1e-5, what=""):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    scale = max(1.0, float(np.abs(want).max()))
    assert float(np.abs(got - want).max()) <= tol * scale, what


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("full_batch", [True, False])
def test_seed_net_with_one_sharded_matmul_equals_one_device(devices, full_batch):
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=full_batch)
    graph, parts, key = partitions(SemiAutoParallelNet(), [X], devices)
    # weight is cut in two along dim 1 on every rank; the unconfigured MatMul is data parallel over all devices
    assert all(part.params[key["weight"]].shape == (HIDDEN, HIDDEN // 2) for part in parts)
    assert all(part.graph.input(key["weight2"]).shape == (HIDDEN, HIDDEN) for part in parts)
    halves = [parts[0].params[key["weight"]], parts[1].params[key["weight"]]]
    np.testing.assert_array_equal(np.concatenate(halves, 1), W)
    rows = BATCH // devices
    # full_batch: every rank's dataset gives the whole batch; otherwise rank r reads rows [r*rows, (r+1)*rows)
    rank_feeds = [{"x": X if full_batch else X[r * rows : (r + 1) * rows]} for r in range(devices)]
    close(run_forward(graph, parts, rank_feeds), numpy_net(X), what=f"{devices} devices")


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_fc_then_fc2_with_the_tutorials_strategies_inserts_slice_and_exchange(devices):
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True)
    graph, parts, _ = partitions(SemiAutoParallelNet(fc2_strategy=((devices, 1), (1, 1))), [X], devices)
    for part in parts:
        ops_used = Counter(n.op for n in part.graph.nodes)
        # fc's output [batch, 64] becomes fc2's [batch/devices, 128]: the columns are exchanged between the two
        # halves (the planner's cheaper AlltoAll for the tutorial's AllGather), the rows sliced by the copies
        assert collective_counts(part.graph) == Counter({"AlltoAll": 1})
        assert ops_used["StridedSlice"] == (0 if devices == 2 else 1)
        # a weight held by several ranks is read through a Mirror (its gradient is reduced over them): weight2
        # always, weight (cut in two) only when there are more than two devices
        assert ops_used["Mirror"] == (1 if devices == 2 else 2)
    close(run_forward(graph, parts, [{"x": X}] * devices), numpy_net(X))


@pytest.mark.parametrize("devices", [2, 4])
def test_without_alltoall_the_exchange_is_the_tutorials_allgather_and_slice(devices):
    # MindSpore's enable_alltoall=False (its default): AllGather, Split and Concat instead of AlltoAll
    ms.set_auto_parallel_context(
        parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True, enable_alltoall=False
    )
    graph, trace = trace_network(SemiAutoParallelNet(fc2_strategy=((devices, 1), (1, 1))), X)
    names, full = [p.key for p in trace.parameters()], {p.key: p.asnumpy() for p in trace.parameters()}
    parts = [partition_for_rank(graph, trace, names, full, r, devices) for r in range(devices)]
    for part in parts:
        assert collective_counts(part.graph) == Counter({"AllGather": 1})
        assert Counter(n.op for n in part.graph.nodes)["StridedSlice"] >= 1  # the rows fc2 reads, cut locally
    close(run_forward(graph, parts, [{"x": X}] * devices), numpy_net(X))
    ms.set_auto_parallel_context(enable_alltoall=True)  # the same graph planned again: its cached plan had none
    again = partition_for_rank(graph, trace, names, full, 0, devices)
    assert collective_counts(again.graph) == Counter({"AlltoAll": 1})


def test_save_graphs_prices_a_plan_without_alltoall_as_it_was_made(tmp_path):
    ms.set_context(save_graphs=True, save_graphs_path=str(tmp_path))
    ms.set_auto_parallel_context(
        parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True, enable_alltoall=False
    )
    try:
        partitions(SemiAutoParallelNet(fc2_strategy=((2, 1), (1, 1))), [X], 2)
    finally:
        ms.set_context(save_graphs=False)
    (summary,) = (tmp_path / "rank_0").glob("parallel_plan_*.txt")
    text = summary.read_text()
    assert "alltoall=False" in text and "AllGather" in text and "AlltoAll" not in text, text


class MegatronMLP(nn.Cell):
    def __init__(self, dp, mp, w1, w2):
        super().__init__()
        self.w1, self.w2 = ms.Parameter(ms.Tensor(w1), "w1"), ms.Parameter(ms.Tensor(w2), "w2")
        self.matmul1 = ops.MatMul().shard(((dp, 1), (1, mp)))
        self.relu = ops.ReLU().shard(((dp, mp),))
        self.matmul2 = ops.MatMul().shard(((dp, mp), (mp, 1)))

    def construct(self, x):
        return self.matmul2(self.relu(self.matmul1(x, self.w1)), self.w2)


@pytest.mark.parametrize(("devices", "dp", "mp"), [(2, 1, 2), (4, 2, 2), (8, 2, 4)])
def test_megatron_mlp_has_exactly_one_forward_all_reduce_in_the_rank_program(devices, dp, mp):
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True)
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 16)).astype(np.float32)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    graph, parts, key = partitions(MegatronMLP(dp, mp, w1, w2), [x], devices)
    for part in parts:
        program = lower_rank_program(part.graph, state=list(part.params), world_size=devices)
        assert program.collective_counts() == Counter({"ALL_REDUCE": 1})
        assert part.params[key["w1"]].shape == (16, 32 // mp) and part.params[key["w2"]].shape == (32 // mp, 16)
    want = np.maximum(x.astype(np.float64) @ w1, 0) @ w2
    close(run_forward(graph, parts, [{"x": x}] * devices), want)


class LossNet(nn.Cell):
    """Megatron MLP + the mean cross-entropy (SparseSoftmaxCrossEntropyWithLogits) of class labels."""

    def __init__(self, dp, mp, w1, w2):
        super().__init__()
        self.mlp = MegatronMLP(dp, mp, w1, w2)
        self.loss = ops.SparseSoftmaxCrossEntropyWithLogits()

    def construct(self, x, y):
        return self.loss(self.mlp(x), y)


def numpy_sgd(x, y, w1, w2, lr, steps):
    """Float64 reference: `steps` SGD steps of the mean cross-entropy of relu(x @ w1) @ w2; returns the last loss."""
    x, w1, w2 = x.astype(np.float64), w1.astype(np.float64), w2.astype(np.float64)
    for _ in range(steps):
        h = np.maximum(x @ w1, 0)
        z = h @ w2
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        loss = -np.log(p[np.arange(len(y)), y]).mean()
        dz = p.copy()
        dz[np.arange(len(y)), y] -= 1
        dz /= len(y)
        dh = (dz @ w2.T) * (h > 0)
        w1, w2 = w1 - lr * (x.T @ dh), w2 - lr * (h.T @ dz)
    return loss, w1, w2


@pytest.mark.parametrize(("devices", "dp", "mp"), [(2, 1, 2), (4, 2, 2), (8, 2, 4)])
def test_semi_auto_train_steps_equal_one_device(devices, dp, mp):
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)  # full_batch=False
    batch, lr, steps = 16, 0.5, 3
    w1 = rng.standard_normal((8, 16)).astype(np.float32) * 0.5
    w2 = rng.standard_normal((16, 4)).astype(np.float32) * 0.5
    x = rng.standard_normal((batch, 8)).astype(np.float32)
    y = rng.integers(0, 4, batch).astype(np.int32)
    _, parts, key = partitions(LossNet(dp, mp, w1, w2), [x, y], devices)
    rows = batch // devices
    programs, feeds = [], []
    for rank, part in enumerate(parts):
        train = build_train_step(part.graph, [key["mlp.w1"], key["mlp.w2"]], SGD(lr))
        programs.append(lower_rank_program(bucket_allreduce(train.graph), state=[s.name for s in train.state]))
        mine = part.slice_feeds({"x": x[rank * rows : (rank + 1) * rows], "y": y[rank * rows : (rank + 1) * rows]})
        feeds.append(part.params | mine | {"learning_rate": np.float32(lr)})
    stores = simulate(programs, feeds, CpuCompute(threads=1), runs=steps)
    want_loss, want_w1, want_w2 = numpy_sgd(x, y, w1, w2, lr, steps)
    for name, want in ((key["mlp.w1"], want_w1), (key["mlp.w2"], want_w2)):
        got = assemble([s[name] for s in stores], parts[0].plan.input_layout(name), want.shape)
        close(got, want, what=f"{name} after {steps} steps on {devices} devices")
    for store, program in zip(stores, programs):
        close(store[program.outputs[0]], want_loss, what="loss of the last step")
