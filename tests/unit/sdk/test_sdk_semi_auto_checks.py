"""SEMI_AUTO_PARALLEL from the SDK, the parts around the numbers: which node gets which strategy (shard(),
set_data_parallel, primitives that emit several ops), invalid strategies failing at compile time with the op,
input, dim and a fix, the data import checks, explain() and save_graphs."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
import tessel.parallel
from tessel import nn, ops
from tessel.compiler.parallel import DATA_PARALLEL, StrategyError
from tessel.core.errors import ConfigurationError
from tessel.parallel import trace_network
from tessel.parallel.semi_auto import global_shape, partition_for_rank, strategies_of

rng = np.random.default_rng(3)
X = rng.random((16, 32)).astype(np.float32)
W = rng.random((32, 32)).astype(np.float32)


class TwoMatMuls(nn.Cell):
    def __init__(self, s1=None, s2=None, shared=False):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(W))
        self.weight2 = ms.Parameter(ms.Tensor(W))
        self.shared = shared  # both MatMuls read self.weight
        self.fc = ops.MatMul().shard(s1) if s1 else ops.MatMul()
        self.fc2 = ops.MatMul().shard(s2) if s2 else ops.MatMul()

    def construct(self, x):
        h = self.fc(x, self.weight)
        return self.fc2(h, self.weight if self.shared else self.weight2).sum()


def partition(net, devices, rank=0, inputs=(X,)):
    graph, trace = trace_network(net, *inputs)
    full = {p.key: p.asnumpy() for p in trace.parameters()}
    return partition_for_rank(graph, trace, list(full), full, rank, devices)


def semi_auto(**options):
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, **options)


# --- which node gets which strategy --------------------------------------------------------------------------------


def test_a_primitive_called_twice_gives_both_nodes_its_strategy_and_others_get_none():
    class Twice(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(W))
            self.fc = ops.MatMul().shard(((1, 1), (1, 2)))

        def construct(self, x):
            return ops.MatMul()(self.fc(self.fc(x, self.w), self.w), self.w)

    net = Twice()
    graph, trace = trace_network(net, X)
    matmuls = [n for n in graph.nodes if n.op == "MatMul"]
    strategies = strategies_of(graph, trace)
    assert strategies[matmuls[0]] is net.fc and strategies[matmuls[1]] is net.fc
    assert net.fc.in_strategy == ((1, 1), (1, 2))
    assert matmuls[2] not in strategies  # an unconfigured MatMul: left to the pass (data parallel)


def test_a_primitive_emitting_several_ops_shards_its_own_op():
    class Loss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.loss = ops.SparseSoftmaxCrossEntropyWithLogits().shard(((4, 1), (4,)))

        def construct(self, logits, labels):
            return self.loss(logits, labels)

    graph, trace = trace_network(Loss(), X, np.zeros(16, np.int32))
    strategies = strategies_of(graph, trace)
    assert {n.op for n in strategies} == {"SparseSoftmaxCrossEntropy"}  # not the mean it also emits


def test_set_data_parallel_marks_the_unconfigured_ops_of_the_cell_and_its_children():
    class Inner(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(W))
            self.fc = ops.MatMul().shard(((1, 1), (1, 2)))

        def construct(self, x):
            return ops.ReLU()(self.fc(x, self.w))

    class Outer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = Inner().set_data_parallel()

        def construct(self, x):
            return ops.Exp()(self.inner(x))

    graph, trace = trace_network(Outer(), X)
    by_op = {n.op: strategies_of(graph, trace).get(n) for n in graph.nodes}
    assert by_op["ReLU"] == DATA_PARALLEL
    assert by_op["MatMul"].in_strategy == ((1, 1), (1, 2))  # an explicit shard() wins
    assert by_op["Exp"] is None  # outside the marked cell


def test_repeated_calculation_when_the_strategy_covers_fewer_devices():
    semi_auto(full_batch=True)
    part = partition(TwoMatMuls(s1=((1, 1), (1, 2))), 8)
    fc = next(n for n in part.plan.graph.nodes if n.op == "MatMul")
    assert part.plan.placements[fc].device_matrix == (4, 2)  # 4 copies of a 2-way cut


# --- invalid strategies: at compile time, naming op, input, dim, the rule and a fix ---------------------------------


def test_a_product_that_does_not_divide_device_num_is_rejected_with_a_valid_alternative():
    semi_auto()
    with pytest.raises(StrategyError, match=r"MatMul \(at .*\): .*8 parts.*4 devices.*A valid strategy: \(\(4, 1\)"):
        partition(TwoMatMuls(s1=((1, 1), (1, 2)), s2=((8, 1), (1, 1))), 4)


def test_a_dim_that_its_cut_does_not_divide_is_rejected():
    semi_auto()
    x = rng.random((16, 30)).astype(np.float32)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(rng.random((30, 8)).astype(np.float32)))
            self.fc = ops.MatMul().shard(((1, 4), (4, 1)))

        def construct(self, x):
            return self.fc(x, self.w)

    with pytest.raises(StrategyError, match=r"MatMul .*input 0 dim 1 has size 30.*4 parts.*A valid strategy: \("):
        partition(Net(), 4, inputs=(x,))


def test_a_strategy_with_the_wrong_number_of_inputs_is_rejected():
    semi_auto()
    with pytest.raises(StrategyError, match=r"MatMul .*has 1 entries, but MatMul takes 2 inputs.*A valid strategy"):
        partition(TwoMatMuls(s1=((2, 1),)), 2)


def test_one_parameter_with_two_strategies_is_rejected():
    semi_auto()
    with pytest.raises(StrategyError, match=r"parameter 'weight.*used by MatMul.*and by MatMul.*cut it alike"):
        partition(TwoMatMuls(s1=((1, 1), (1, 2)), s2=((1, 2), (2, 1)), shared=True), 2)


def test_shard_rejects_malformed_strategies_at_once():
    with pytest.raises(ConfigurationError, match=r"MatMul.shard: in_strategy must be a tuple"):
        ops.MatMul().shard(((1, 0), (1, 1)))
    with pytest.raises(ConfigurationError, match=r"in_strategy must be a tuple"):
        ops.MatMul().shard((2, 1))


# --- data import ------------------------------------------------------------------------------------------------


def test_data_parallel_import_checks_each_ranks_slice_and_passes_it_through():
    semi_auto(full_batch=False)
    part = partition(TwoMatMuls(s1=((1, 1), (1, 2))), 4, rank=1)
    mine = X[4:8]
    assert part.slice_feeds({"x": mine})["x"] is not None
    np.testing.assert_array_equal(part.slice_feeds({"x": mine})["x"], mine)
    with pytest.raises(ConfigurationError, match=r"input 'x'.*\(16, 32\).*full_batch=False.*\(4, 32\).*Fix: batch"):
        part.slice_feeds({"x": X})


def test_full_batch_import_cuts_the_global_batch():
    semi_auto(full_batch=True)
    part = partition(TwoMatMuls(s2=((4, 1), (1, 1))), 4, rank=2)
    np.testing.assert_array_equal(part.slice_feeds({"x": X})["x"], X)  # replicated input: every rank all of it
    with pytest.raises(ConfigurationError, match=r"full_batch=True: every rank's dataset yields the whole"):
        part.slice_feeds({"x": X[:4]})
    assert part.slice_feeds({"learning_rate": np.float32(0.1)})["learning_rate"] == np.float32(0.1)


def test_dataset_strategy_tuples_cut_the_inputs_along_any_dim():
    semi_auto(dataset_strategy=((1, 4),))
    part = partition(TwoMatMuls(s1=((1, 4), (4, 1))), 4, rank=3)
    np.testing.assert_array_equal(part.slice_feeds({"x": X})["x"], X[:, 24:32])  # the global batch, sliced
    np.testing.assert_array_equal(part.slice_feeds({"x": X[:, 24:32]})["x"], X[:, 24:32])  # already the slice
    assert part.graph.input("x").shape == (16, 8)


def test_global_shape_of_each_data_import():
    assert global_shape((4, 32), 0, 8, "data_parallel") == (32, 32)
    assert global_shape((4,), 1, 8, "data_parallel") == (32,)
    assert global_shape((32, 32), 0, 8, "full_batch") == (32, 32)
    assert global_shape((16, 4), 1, 8, ((8, 1), (1, 8))) == (16, 32)
    with pytest.raises(ConfigurationError, match=r"no 2-dim entry for dataset column 2"):
        global_shape((16, 4), 2, 8, ((8, 1), (1, 8)))


# --- explain and save_graphs -----------------------------------------------------------------------------------------


def test_explain_shows_strategies_layouts_collectives_and_bytes(capsys):
    semi_auto(device_num=8, full_batch=True)
    text = tessel.parallel.explain(TwoMatMuls(s1=((1, 1), (1, 2)), s2=((8, 1), (1, 1))), X)
    assert capsys.readouterr().out.strip() == text
    assert "on 8 devices" in text
    assert "shard() ((1, 1), (1, 2)), device matrix (4, 2)" in text
    half_block = 16 // 4 * 32 // 2 * 4 // 2  # each rank sends its partner half of its [4, 16] float32 block
    assert f"StridedSlice(dim 0 into 4), AlltoAll(2 ranks, split dim 0, concat dim 1, {half_block} B)" in text
    assert "forward collectives per rank: AllReduce x1, AlltoAll x1" in text  # the AllReduce: of the partial sum


def test_save_graphs_writes_the_graph_before_and_after_the_pass(tmp_path):
    semi_auto(full_batch=True)
    ms.set_context(save_graphs=True, save_graphs_path=str(tmp_path))
    partition(TwoMatMuls(s1=((1, 1), (1, 2)), s2=((2, 1), (1, 1))), 2, rank=1)
    files = sorted(p.name for p in (tmp_path / "rank_1").iterdir())
    assert files == [
        "parallel_plan_TwoMatMuls.txt",
        "step_parallel_begin_TwoMatMuls.ir",
        "step_parallel_end_TwoMatMuls_rank1.ir",
    ]
    begin = (tmp_path / "rank_1" / files[1]).read_text()
    end = (tmp_path / "rank_1" / files[2]).read_text()
    assert "data parallel" in (tmp_path / "rank_1" / files[0]).read_text()
    assert "# strategy ((1, 1), (1, 2)) (shard())" in begin and "AlltoAll" not in begin
    assert "AlltoAll" in end and "Mirror" in end
