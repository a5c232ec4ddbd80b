"""nn.Dense and nn.Conv2d shard the MindSpore way: their primitives are attributes (`fc.matmul`, `fc.bias_add`,
`conv.conv2d`), so `net.fc1.matmul.shard(((2, 1), (4, 1)))` reaches the parallel plan. The rank graphs run on the
in-process rank simulator and their assembled output equals a float64 reference of the whole network."""

from __future__ import annotations

import numpy as np
import pytest
from sdk_testkit import np_conv2d

import tessel as ms
import tessel.parallel
from tessel import nn
from tessel.compiler.parallel import assemble
from tessel.compiler.rank_simulator import run_graphs
from tessel.parallel import plan_for, trace_network
from tessel.parallel.semi_auto import partition_for_rank, strategies_of
from tessel.plugins.cpu.compute import CpuCompute

rng = np.random.default_rng(5)
X = rng.standard_normal((16, 32)).astype(np.float32)


class TwoDense(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(32, 64)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(64, 8)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def two_dense_reference(net: TwoDense, x: np.ndarray) -> np.ndarray:
    p = {name: value.asnumpy().astype(np.float64) for name, value in net.parameters_and_names()}
    h = np.maximum(x.astype(np.float64) @ p["fc1.weight"].T + p["fc1.bias"], 0)
    return h @ p["fc2.weight"].T + p["fc2.bias"]


def run_sharded(net: nn.Cell, x: np.ndarray, devices: int) -> tuple[np.ndarray, list]:
    """The network's output assembled from every rank's forward on the simulator, and the partitions."""
    graph, trace = trace_network(net, x)
    full = {p.key: p.asnumpy() for p in trace.parameters()}
    parts = [partition_for_rank(graph, trace, list(full), full, r, devices) for r in range(devices)]
    feeds = [part.params | part.slice_feeds({"x": x}) for part in parts]
    outs = run_graphs([part.graph for part in parts], feeds, CpuCompute(threads=1))
    return assemble([o[0] for o in outs], parts[0].plan.output_layouts[0], graph.outputs[0].shape), parts


@pytest.fixture(autouse=True)
def semi_auto():
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True, device_num=8)


def test_dense_holds_matmul_and_bias_add_primitives_like_mindspore():
    fc = nn.Dense(4, 3)
    assert isinstance(fc.matmul, ms.ops.MatMul) and fc.matmul.attrs["transpose_b"] is True
    assert isinstance(fc.bias_add, ms.ops.BiasAdd)
    assert [name for name, _ in fc.parameters_and_names()] == ["weight", "bias"]  # primitives are no parameters


def test_a_sharded_dense_gets_its_strategy_in_the_plan():
    net = TwoDense()
    net.fc1.matmul.shard(((2, 1), (4, 1)))  # batch in 2, fc1's output features (weight dim 0) in 4
    net.fc1.bias_add.shard(((2, 4), (4,)))
    graph, trace = trace_network(net, X)
    by_primitive = {id(s): node.op for node, s in strategies_of(graph, trace).items()}
    assert by_primitive == {id(net.fc1.matmul): "MatMul", id(net.fc1.bias_add): "BiasAdd"}
    plan = plan_for(graph, trace, [p.key for p in trace.parameters()], 8)
    weight, bias = net.fc1.weight, net.fc1.bias
    assert plan.local_value(weight.key, weight.asnumpy(), 5).shape == (16, 32)
    assert plan.local_value(bias.key, bias.asnumpy(), 5).shape == (16,)
    text = tessel.parallel.explain(net, X, show=False)
    assert "shard() ((2, 1), (4, 1))" in text and "shard() ((2, 4), (4,))" in text


@pytest.mark.parametrize(
    "fc1, fc2",
    [
        ((((2, 1), (4, 1)), ((2, 4), (4,))), None),  # Megatron column cut of fc1
        ((((1, 1), (8, 1)), ((1, 8), (8,))), (((1, 8), (1, 8)), ((1, 1), (1,)))),  # column then row cut
    ],
)
def test_sharded_dense_layers_compute_the_whole_network(fc1, fc2):
    net = TwoDense()
    net.fc1.matmul.shard(fc1[0])
    net.fc1.bias_add.shard(fc1[1])
    if fc2 is not None:
        net.fc2.matmul.shard(fc2[0])
        net.fc2.bias_add.shard(fc2[1])
    got, parts = run_sharded(net, X, 8)
    assert parts[0].params[net.fc1.weight.key].shape[0] < 64  # the weight really is cut
    np.testing.assert_allclose(got, two_dense_reference(net, X), rtol=1e-5, atol=1e-5)


class ConvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, has_bias=True)

    def construct(self, x):
        return self.conv(x)


def test_a_sharded_conv2d_cuts_batch_and_output_channels_and_computes_the_whole_convolution():
    net = ConvNet()
    net.conv.conv2d.shard(((2, 1, 1, 1), (4, 1, 1, 1)))
    net.conv.bias_add.shard(((2, 4, 1, 1), (4,)))
    x = rng.standard_normal((4, 3, 6, 6)).astype(np.float32)
    got, parts = run_sharded(net, x, 8)
    assert parts[3].params[net.conv.weight.key].shape == (1, 3, 3, 3)
    weight, bias = (p.asnumpy().astype(np.float64) for p in (net.conv.weight, net.conv.bias))
    want = np_conv2d(x.astype(np.float64), weight, bias, pad=(1, 1, 1, 1))  # "same" for a 3x3 kernel
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
