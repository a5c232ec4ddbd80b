"""GRAPH_MODE vs PYNATIVE_MODE, error messages a user can act on, the contexts, and single-device collectives."""

from __future__ import annotations

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
from tessel import nn, ops
from tessel.compiler import ShapeInferenceError, TraceError
from tessel.core.errors import ConfigurationError


class ConvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, has_bias=True)
        self.bn = nn.BatchNorm2d(3)
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(nn.Dense(3 * 6 * 6, 16), nn.ReLU(), nn.Dense(16, 4))

    def construct(self, x):
        return self.dense_relu_sequential(self.flatten(ops.relu(self.bn(self.conv(x)))))


def _train(mode):
    ms.set_context(mode=mode)
    ms.set_seed(11)
    net = ConvNet()
    step = nn.TrainOneStepCell(
        nn.WithLossCell(net, nn.CrossEntropyLoss()), nn.Momentum(net.trainable_params(), 0.1, 0.9)
    )
    step.set_train(True)
    x, y = rand(8, 1, 6, 6), np.arange(8, dtype=np.int32) % 4
    losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for _ in range(3)]
    net.set_train(False)
    return losses, net(ms.Tensor(x)).asnumpy(), [p.asnumpy().copy() for p in net.get_parameters()]


def test_graph_and_pynative_give_the_same_numbers():
    graph, pynative = _train(ms.GRAPH_MODE), _train(ms.PYNATIVE_MODE)
    np.testing.assert_allclose(graph[0], pynative[0], rtol=1e-5)
    np.testing.assert_allclose(graph[1], pynative[1], rtol=1e-4, atol=1e-5)
    for a, b in zip(graph[2], pynative[2]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert graph[0][2] < graph[0][0]


def test_pynative_runs_data_dependent_python_but_graph_mode_names_the_line():
    class Branchy(nn.Cell):
        def construct(self, x):
            if x.sum() > 0:
                return x * 2.0
            return x

    x = ms.Tensor(np.ones(3, np.float32))
    ms.set_context(mode=ms.PYNATIVE_MODE)
    assert Branchy()(x).asnumpy().tolist() == [2.0, 2.0, 2.0]
    ms.set_context(mode=ms.GRAPH_MODE)
    with pytest.raises(TraceError, match=r"in cell Branchy: .*test_sdk_modes.py:\d+ \(`if x.sum\(\) > 0:`\)"):
        Branchy()(x)


def test_code_that_branches_on_the_batch_size_sees_the_real_size_in_graph_mode():
    # the graph is traced once for any batch size; a comparison on its symbolic batch dim used to be silently
    # False (the 'N' == 4 of a str), so the wrong branch was compiled for every batch size
    class BySize(nn.Cell):
        def construct(self, x):
            if x.shape[0] == 4:
                return x * 2.0
            return x[0] if x.shape[0] == 1 else x * 3.0

    ms.set_context(mode=ms.GRAPH_MODE)
    net = BySize()
    for batch, want in ((4, 2.0), (5, 3.0), (1, None)):
        out = net(ms.Tensor(np.ones((batch, 2), np.float32))).asnumpy()
        assert out.shape == ((2,) if want is None else (batch, 2)) and (want is None or (out == want).all())


def test_shape_mismatch_names_the_cell_the_op_and_both_shapes():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.flatten = nn.Flatten()
            self.dense_relu_sequential = nn.SequentialCell(nn.Dense(784, 512), nn.ReLU(), nn.Dense(512, 10))

        def construct(self, x):
            return self.dense_relu_sequential(self.flatten(x))

    pattern = r"in cell Dense 'dense_relu_sequential\.0': MatMul\(f32\[\w+,100\], f32\[512,784\]\).*contraction dims"
    with pytest.raises(ShapeInferenceError, match=pattern):
        Net()(ms.Tensor(rand(4, 10, 10)))
    ms.set_context(mode=ms.PYNATIVE_MODE)
    with pytest.raises(ShapeInferenceError, match=r"in cell Dense 'dense_relu_sequential\.0': MatMul"):
        Net()(ms.Tensor(rand(4, 10, 10)))


def test_wrong_input_dtype_names_the_input():
    net = nn.SequentialCell(nn.Flatten(), nn.Dense(4, 2))
    with pytest.raises(
        ConfigurationError, match=r"in cell Dense '1': Dense input 'x' must be a float tensor, got UInt8"
    ):
        net(ms.Tensor(np.zeros((2, 2, 2), np.uint8)))
    with pytest.raises(ConfigurationError, match=r"Embedding input 'ids' must be an int tensor, got Float32"):
        nn.Embedding(5, 2)(ms.Tensor(np.zeros(3, np.float32)))


def test_context_validation():
    with pytest.raises(ConfigurationError, match="unknown option 'modee'"):
        ms.set_context(modee=0)
    with pytest.raises(ConfigurationError, match="mode must be GRAPH_MODE"):
        ms.set_context(mode=3)
    with pytest.raises(ConfigurationError, match="device_target must be one of"):
        ms.set_context(device_target="TPU")
    ms.set_context(max_device_memory="2GB")  # accepted, no effect
    assert ms.get_context("mode") == ms.GRAPH_MODE


def test_auto_parallel_context_is_validated_and_resettable():
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    assert ms.get_auto_parallel_context("parallel_mode") == "data_parallel"
    assert ms.get_auto_parallel_context("gradients_mean") is True
    ms.set_auto_parallel_context(full_batch=True)
    assert ms.get_auto_parallel_context("dataset_strategy") == "full_batch"
    ms.set_auto_parallel_context(dataset_strategy=((2, 1), (2,)))
    assert ms.get_auto_parallel_context("full_batch") is False
    for bad, message in [
        ({"parallel_mode": "model_parallel"}, "parallel_mode must be one of"),
        ({"search_mode": "greedy"}, "search_mode must be one of"),
        ({"device_num": 0}, "device_num must be an int >= 1"),
        ({"dataset_strategy": ((2, 0),)}, "dataset_strategy must be"),
        ({"gradients_mean": "yes"}, "gradients_mean must be a bool"),
        ({"pipeline_stage": 2}, "unknown option 'pipeline_stage'"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            ms.set_auto_parallel_context(**bad)
    ms.reset_auto_parallel_context()
    assert ms.get_auto_parallel_context("parallel_mode") == ms.ParallelMode.STAND_ALONE
    assert ms.get_auto_parallel_context("device_num") == 1  # the running world


def test_shard_stores_a_validated_strategy():
    matmul = ops.MatMul().shard(((1, 1), (1, 2)))
    assert matmul.in_strategy == ((1, 1), (1, 2)) and matmul.out_strategy is None
    with pytest.raises(ConfigurationError, match=r"MatMul.shard: in_strategy must be"):
        ops.MatMul().shard(((1, 0), (1, 2)))


def test_collectives_are_the_identity_on_one_device():
    x = ms.Tensor(rand(4, 3))
    np.testing.assert_array_equal(ops.AllReduce()(x).asnumpy(), x.asnumpy())
    np.testing.assert_array_equal(ops.AllGather()(x).asnumpy(), x.asnumpy())
    reduce = ops.AllReduce(ops.ReduceOp.MAX)
    dx = ms.grad(lambda t: (reduce(t) * 3.0).sum())(x)  # AllReduce' = AllReduce: over one rank, the identity
    np.testing.assert_allclose(dx.asnumpy(), np.full((4, 3), 3.0))
    grads = (x,)
    assert nn.DistributedGradReducer([]).__call__(grads) is grads
    with pytest.raises(ConfigurationError, match="op must be one of"):
        ops.AllReduce("avg")


def test_manual_parallel_seed_network_slices_the_batch():
    cur_rank, shard_size = 0, 4  # seed 003: each rank keeps its slice of the global batch

    class Network(nn.Cell):
        def __init__(self):
            super().__init__()
            self.flatten = nn.Flatten()
            self.layer1 = nn.Dense(12, 5)

        def construct(self, x):
            x = x[cur_rank * shard_size : cur_rank * shard_size + shard_size]
            return self.layer1(self.flatten(x))

    net, x = Network(), rand(8, 3, 4)
    w, b = net.layer1.weight.asnumpy(), net.layer1.bias.asnumpy()
    np.testing.assert_allclose(net(ms.Tensor(x)).asnumpy(), x[:4].reshape(4, 12) @ w.T + b, rtol=1e-5)


def test_micro_batch_interleaved_sums_the_copies_losses():
    ms.set_seed(2)
    loss_net = nn.WithLossCell(nn.Dense(3, 4), nn.CrossEntropyLoss())
    x, y = rand(8, 3), np.arange(8, dtype=np.int32) % 4
    halves = sum(float(loss_net(ms.Tensor(x[i : i + 4]), ms.Tensor(y[i : i + 4])).asnumpy()) for i in (0, 4))
    interleaved = nn.MicroBatchInterleaved(loss_net, 2)(ms.Tensor(x), ms.Tensor(y))
    assert float(interleaved.asnumpy()) == pytest.approx(halves, rel=1e-6)


def test_save_graphs_writes_one_dump_per_compiled_segment(tmp_path):
    ms.set_context(save_graphs=True, save_graphs_path=str(tmp_path))
    nn.Dense(3, 2)(ms.Tensor(rand(2, 3)))
    dumps = list(tmp_path.glob("rank_0/*.ir"))  # MindSpore's save_graphs_path/rank_<id>/
    assert dumps and "MatMul(" in dumps[0].read_text()


def test_to_float_computes_the_cell_in_half_precision():
    ms.set_seed(3)
    dense = nn.Dense(4, 3)
    x = rand(2, 4)
    full = dense(ms.Tensor(x)).asnumpy()
    dense.to_float(ms.float16)
    for mode in (ms.GRAPH_MODE, ms.PYNATIVE_MODE):
        ms.set_context(mode=mode)
        half = dense(ms.Tensor(x))
        assert half.dtype == ms.float16
        np.testing.assert_allclose(half.asnumpy(), full, rtol=5e-3, atol=5e-3)
    _, (dw, _) = ms.value_and_grad(lambda t: dense(t).sum(), None, dense.trainable_params())(ms.Tensor(x))
    assert dw.dtype == ms.float32  # parameters stay float32; their gradients flow back through the casts
    np.testing.assert_allclose(dw.asnumpy(), np.broadcast_to(x.sum(0), (3, 4)), rtol=5e-3)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_assign_is_seen_by_later_reads_in_code_order(mode):
    # MindSpore's side-effect order: reads after ops.assign see the new value; the last of two writes is kept
    class Accumulate(nn.Cell):
        def __init__(self):
            super().__init__()
            self.c = ms.Parameter(ms.Tensor(np.zeros(2, np.float32)), name="c", requires_grad=False)

        def construct(self, x):
            ops.assign(self.c, self.c + x)
            first = self.c * 1
            ops.assign_add(self.c, x)
            self.c += x  # a parameter attribute assigned in construct: an Assign too
            return first, self.c * 1

    ms.set_context(mode=mode)
    net, x = Accumulate(), ms.Tensor(np.ones(2, np.float32))
    for step in range(2):
        first, last = net(x)
        assert first.asnumpy().tolist() == [3 * step + 1] * 2 and last.asnumpy().tolist() == [3 * step + 3] * 2
    assert net.c.asnumpy().tolist() == [6.0, 6.0]


def test_jit_binds_parameter_arguments_scalar_types_and_the_cells_mode():
    ms.set_context(mode=ms.GRAPH_MODE)

    @ms.jit
    def write(p, x):
        ops.assign(p, x)
        return p + 1  # a Parameter argument is the Parameter, not a copy of its value

    p = ms.Parameter(ms.Tensor(np.zeros(2, np.float32)), name="p")
    assert write(p, ms.Tensor(np.ones(2, np.float32))).asnumpy().tolist() == [2.0, 2.0]
    assert p.asnumpy().tolist() == [1.0, 1.0]

    class Scale(nn.Cell):
        def construct(self, x, s):
            return x * s

    ints = ms.Tensor(np.array([1, 2], np.int32))
    net = Scale()
    assert net(ints, 1).dtype == ms.int32 and net(ints, 1.0).dtype == ms.float32  # 1 and 1.0 are two graphs

    class Mode(nn.Cell):
        @ms.jit
        def construct(self, x):
            return x * 2.0 if self.training else x

    cell, x = Mode(), ms.Tensor(np.ones(2, np.float32))
    cell.set_train(True)
    assert cell(x).asnumpy().tolist() == [2.0, 2.0]
    cell.set_train(False)
    assert cell(x).asnumpy().tolist() == [1.0, 1.0]


def test_a_tensor_made_outside_indexes_inside_a_graph():
    index = ms.Tensor(np.array([0, 2], np.int32))

    class Pick(nn.Cell):
        def construct(self, x):
            return x[index]

    ms.set_context(mode=ms.GRAPH_MODE)
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    np.testing.assert_array_equal(Pick()(ms.Tensor(x)).asnumpy(), x[[0, 2]])


def test_a_dropout_cell_called_twice_in_a_graph_draws_two_masks_as_eagerly():
    class Twice(nn.Cell):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(p=0.5)

        def construct(self, x):
            return self.drop(x), self.drop(x)

    x = ms.Tensor(np.ones((16, 16), np.float32))
    for mode in (ms.GRAPH_MODE, ms.PYNATIVE_MODE):
        ms.set_context(mode=mode)
        net = Twice()
        net.set_train()
        first, second = (out.asnumpy() != 0 for out in net(x))
        assert 0.3 < (first != second).mean() < 0.7, mode  # independent masks (same masks used to be 0 in graphs)


def test_assigned_weights_keep_their_gradients_and_two_gradients_update_state_twice():
    ms.set_context(mode=ms.GRAPH_MODE)
    w = ms.Parameter(ms.Tensor(np.zeros(3, np.float32)), name="w")
    x = ms.Tensor(np.array([1.0, 2.0, 3.0], np.float32))

    @ms.jit
    def step(x):
        ops.assign(w, ops.fill(ms.float32, (3,), 5.0))
        return ms.grad(lambda v: (w * v).sum(), None, [w])(x)

    (grad,) = step(x)
    assert grad.asnumpy().tolist() == [1.0, 2.0, 3.0] and w.asnumpy().tolist() == [5.0] * 3  # not a zero gradient
    bn = nn.BatchNorm1d(2, momentum=0.5)
    bn.set_train()
    value_and_grad = ms.value_and_grad(lambda v: bn(v).sum(), None, bn.trainable_params())

    @ms.jit
    def two(a, b):  # two gradients in one graph (accumulation): BatchNorm's statistics move twice
        value_and_grad(a)
        return value_and_grad(b)[0]

    two(ms.Tensor(np.full((4, 2), 20.0, np.float32)), ms.Tensor(np.full((4, 2), 20.0, np.float32)))
    np.testing.assert_allclose(bn.moving_mean.asnumpy(), [15.0, 15.0])  # 0 -> 10 -> 15 with momentum 0.5


def test_the_batch_size_passed_on_in_shapes_keeps_one_graph_for_every_batch_size():
    class Flat(nn.Cell):
        def construct(self, x):
            return ops.reshape(x, (x.shape[0], -1)) * 2.0

    ms.set_context(mode=ms.GRAPH_MODE)
    net = Flat()
    for batch in (4, 3):
        assert net(ms.Tensor(np.ones((batch, 2, 3), np.float32))).shape == (batch, 6)
    compiled = net.__dict__.get("_compiled")
    assert compiled is not None and not compiled.static  # compiled once, for any batch size


def test_indexed_parts_pickle_and_negative_integer_powers_are_refused():
    import pickle

    x = ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert pickle.loads(pickle.dumps(x[0])).asnumpy().tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ConfigurationError, match="negative power -1 is not an integer"):
        ms.Tensor(np.array([2, 3])) ** -1


def test_jit_class_objects_work_inside_a_graph_and_its_checks_are_mindspores():
    @ms.jit_class
    class UserDefinedNet:
        def __init__(self):
            self.value = 10

        def func(self, x):
            return 2 * x

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = UserDefinedNet()

        def construct(self, x):
            return self.net.value + self.net.func(x)

    ms.set_context(mode=ms.GRAPH_MODE)
    assert Net()(ms.Tensor(np.float32(5))).asnumpy() == 20  # MindSpore's docstring example: 20
    with pytest.raises(TypeError, match="can only be used for class type"):
        ms.jit_class(lambda: None)
    with pytest.raises(TypeError, match=r"cannot be used for nn\.Cell"):
        ms.jit_class(Net)
