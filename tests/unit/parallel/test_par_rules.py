"""Sharding rules: every op in the registry has one; each op family, run with a strategy on simulated ranks,
equals one device (forward, and the gradients of its parameters)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pytest
from par_testkit import by_op, close, parallel_forward, parallel_grads, reference_grads, single_device

from tessel.compiler import registry
from tessel.compiler.builder import apply
from tessel.compiler.parallel import collective_counts, parallelize
from tessel.compiler.tracer import TensorSpec, trace

rng = np.random.default_rng(11)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def ints(high, *shape):
    return rng.integers(0, high, shape).astype(np.int32)


def test_every_registered_op_has_a_rule():
    missing = [n for n in registry.names() if registry.get(n).sharding is None]
    missing = [n for n in missing if registry.get(n).collective is None]
    assert missing == [], f"ops without a sharding rule: {missing}"


def test_matmul_shares_one_einsum_rule_across_transposes():
    def f(x, w):
        return apply("MatMul", x, w, transpose_b=True)

    graph = trace(f, TensorSpec((8, 6)), TensorSpec((4, 6))).graph
    spec = registry.get("MatMul").sharding_spec(graph.nodes[0])
    assert spec.inputs == (("m", "k"), ("n", "k")) and spec.outputs == (("m", "n"),)
    assert spec.contracted(0) == {"k"} and spec.reduce == "sum"


@dataclass
class Case:
    fn: object
    inputs: dict
    strategies: dict = field(default_factory=dict)  # op name -> strategy of its first node
    devices: int = 4
    params: tuple = ()
    dataset: str = "full_batch"


def unary(op, **attrs):
    return lambda x: apply(op, x, **attrs)


CASES = {
    "add_broadcast": Case(
        lambda x, b: apply("ReLU", x + b) * 2.0,
        {"x": f32(8, 6), "b": f32(6)},
        {"Add": ((2, 2), (2,))},
        params=("b",),
        dataset="data_parallel",
    ),
    "softmax_batch": Case(unary("Softmax"), {"x": f32(8, 6)}, {"Softmax": ((4, 1),)}, dataset="data_parallel"),
    "log_softmax_repeated": Case(unary("LogSoftmax", axis=0), {"x": f32(6, 8)}, {"LogSoftmax": ((1, 2),)}),
    "reduce_sum_split_axis": Case(unary("ReduceSum", axis=1), {"x": f32(8, 6)}, {"ReduceSum": ((2, 2),)}),
    "reduce_mean_all": Case(unary("ReduceMean"), {"x": f32(8, 6)}, {"ReduceMean": ((2, 2),)}),
    "reduce_max_split": Case(unary("ReduceMax", axis=0, keep_dims=True), {"x": f32(8, 6)}, {"ReduceMax": ((4, 1),)}),
    "argmax": Case(unary("Argmax", axis=1), {"x": f32(8, 6)}, {"Argmax": ((4, 1),)}),
    "topk_rows_split": Case(unary("TopK", k=3, axis=1), {"x": f32(8, 6)}, {"TopK": ((4, 1),)}),
    "topk_values_gathered": Case(
        lambda x: apply("GatherElements", x, apply("TopK", x, k=2, axis=0, largest=False), axis=0),
        {"x": f32(6, 8)},
        {"TopK": ((1, 4),)},
    ),
    "layer_norm": Case(
        lambda x, g, b: apply("LayerNorm", x, g, b)[0],
        {"x": f32(8, 6), "g": f32(6), "b": f32(6)},
        {"LayerNorm": ((4, 1), (1,), (1,))},
        params=("g", "b"),
    ),
    "batch_norm_inference_channels": Case(
        lambda x, s, b, m, v: apply("BatchNorm", x, s, b, m, v),
        {"x": f32(2, 4, 3, 3), "s": f32(4), "b": f32(4), "m": f32(4), "v": np.abs(f32(4)) + 1},
        {"BatchNorm": ((1, 4, 1, 1), (4,), (4,), (4,), (4,))},
        params=("s", "b"),
    ),
    "batch_norm_training_replicated": Case(
        lambda x, s, b, m, v: apply("BatchNorm", x, s, b, m, v, is_training=True)[0],
        {"x": f32(4, 2, 3, 3), "s": f32(2), "b": f32(2), "m": f32(2), "v": np.abs(f32(2)) + 1},
        params=("s", "b", "m", "v"),
        dataset="data_parallel",
    ),
    "conv_batch_and_out_channels": Case(
        lambda x, w: apply("Conv2D", x, w, pad_mode="same"),
        {"x": f32(4, 3, 6, 6), "w": f32(8, 3, 3, 3)},
        {"Conv2D": ((2, 1, 1, 1), (2, 1, 1, 1))},
        params=("w",),
    ),
    "conv_in_channels_partial": Case(
        lambda x, w: apply("Conv2D", x, w),
        {"x": f32(2, 4, 5, 5), "w": f32(3, 4, 3, 3)},
        {"Conv2D": ((1, 2, 1, 1), (1, 2, 1, 1))},
        devices=2,
        params=("w",),
    ),
    "conv_backprop_filter_batch_partial": Case(
        lambda dy, x: apply("Conv2DBackpropFilter", dy, x, filter_shape=(4, 3, 3, 3)),
        {"dy": f32(4, 4, 4, 4), "x": f32(4, 3, 6, 6)},
        {"Conv2DBackpropFilter": ((2, 2, 1, 1), (2, 1, 1, 1))},
    ),
    "conv_backprop_input": Case(
        lambda dy, w: apply("Conv2DBackpropInput", dy, w, input_shape=(4, 3, 6, 6)),
        {"dy": f32(4, 4, 4, 4), "w": f32(4, 3, 3, 3)},
        {"Conv2DBackpropInput": ((2, 2, 1, 1), (2, 1, 1, 1))},
    ),
    "max_pool": Case(
        unary("MaxPool", kernel_size=2, strides=2),
        {"x": f32(4, 4, 6, 6)},
        {"MaxPool": ((2, 2, 1, 1),)},
        dataset="data_parallel",
    ),
    "avg_pool": Case(
        unary("AvgPool", kernel_size=3, pad_mode="same"), {"x": f32(4, 4, 6, 6)}, {"AvgPool": ((1, 4, 1, 1),)}
    ),
    "reshape_compatible": Case(
        lambda x: apply("Reshape", x, shape=(8, 24)) * 3.0, {"x": f32(8, 6, 4)}, {"Reshape": ((2, 2, 1),)}
    ),
    "flatten_expand_squeeze": Case(
        lambda x: apply("Squeeze", apply("ExpandDims", apply("Flatten", x), axis=1), axis=1),
        {"x": f32(8, 2, 3)},
        dataset="data_parallel",
    ),
    "transpose": Case(lambda x: apply("Transpose", x, perm=(1, 0)) + 1.0, {"x": f32(8, 6)}, {"Transpose": ((2, 2),)}),
    "broadcast_to": Case(lambda x: apply("BroadcastTo", x, shape=(8, 6)), {"x": f32(1, 6)}, {"BroadcastTo": ((1, 2),)}),
    "embedding_vocab_split": Case(
        lambda t, i: apply("Gather", t, i),
        {"t": f32(16, 4), "i": ints(16, 8)},
        {"Gather": ((4, 1), (1,))},
        params=("t",),
    ),
    "gather_batch": Case(
        lambda t, i: apply("Gather", t, i),
        {"t": f32(16, 4), "i": ints(16, 8)},
        {"Gather": ((1, 1), (4,))},
        params=("t",),
        dataset="data_parallel",
    ),
    "gather_axis1_split": Case(
        lambda t, i: apply("Gather", t, i, axis=1),
        {"t": f32(3, 8), "i": ints(8, 2, 5)},
        {"Gather": ((1, 4), (1, 1))},
        params=("t",),
    ),
    "segment_sum_partial": Case(
        lambda d, i: apply("UnsortedSegmentSum", d, i, num_segments=5),
        {"d": f32(8, 3), "i": ints(5, 8)},
        {"UnsortedSegmentSum": ((4, 1), (4,))},
    ),
    "gather_elements": Case(
        lambda x, i: apply("GatherElements", x, i, axis=1),
        {"x": f32(8, 5), "i": ints(5, 8, 5)},
        {"GatherElements": ((4, 1), (4, 1))},
    ),
    "scatter_add": Case(
        lambda d, i, u: apply("ScatterAdd", d, i, u, axis=1),
        {"d": f32(8, 5), "i": ints(5, 8, 2), "u": f32(8, 2)},
        {"ScatterAdd": ((4, 1), (4, 1), (4, 1))},
    ),
    "one_hot": Case(lambda i: apply("OneHot", i, depth=5), {"i": ints(5, 8)}, {"OneHot": ((4,),)}),
    "sparse_cross_entropy": Case(
        lambda x, y: apply("SparseSoftmaxCrossEntropy", x, y),
        {"x": f32(8, 5), "y": ints(5, 8)},
        {"SparseSoftmaxCrossEntropy": ((4, 1), (4,))},
    ),
    "dense_cross_entropy": Case(
        lambda x, y: apply("SoftmaxCrossEntropy", x, apply("Softmax", y)),
        {"x": f32(8, 5), "y": f32(8, 5)},
        dataset="data_parallel",
    ),
    "concat": Case(
        lambda a, b: apply("Concat", a, b, axis=1), {"a": f32(8, 3), "b": f32(8, 2)}, {"Concat": ((4, 1), (4, 1))}
    ),
    "split": Case(lambda x: apply("Split", x, axis=1, output_num=2), {"x": f32(8, 6)}, {"Split": ((4, 1),)}),
    "strided_slice": Case(lambda x: x[:, 1:4] * 2.0, {"x": f32(8, 6)}, {"StridedSlice": ((4, 1),)}),
    "pad": Case(lambda x: apply("Pad", x, paddings=((0, 0), (1, 2))), {"x": f32(8, 3)}, {"Pad": ((4, 1),)}),
    "batch_matmul_partial": Case(
        lambda a, b: apply("BatchMatMul", a, b),
        {"a": f32(4, 3, 4), "b": f32(4, 4, 2)},
        {"BatchMatMul": ((2, 1, 2), (2, 2, 1))},
        params=("b",),
    ),
    "batch_matmul_broadcast": Case(
        lambda a, b: apply("BatchMatMul", a, b, transpose_a=True),
        {"a": f32(4, 5, 3), "b": f32(1, 5, 2)},
        {"BatchMatMul": ((4, 1, 1), (1, 1, 1))},
        params=("b",),
    ),
    "matmul_transposed_partial": Case(
        lambda x, w: apply("MatMul", x, w, transpose_b=True),
        {"x": f32(8, 6), "w": f32(4, 6)},
        {"MatMul": ((2, 2), (1, 2))},
        params=("w",),
    ),
    "bias_add": Case(
        lambda x, b: apply("BiasAdd", x, b),
        {"x": f32(8, 6, 2), "b": f32(6)},
        {"BiasAdd": ((2, 2, 1), (2,))},
        params=("b",),
    ),
    "select_cast_where": Case(
        lambda x, y: apply("Select", x > 0.0, apply("Cast", y, dtype="float32"), x),
        {"x": f32(8, 6), "y": f32(8, 6).astype(np.float64)},
        dataset="data_parallel",
    ),
    "dim_size_replicated": Case(
        lambda x: x / apply("DimSize", x, axes=(0,), dtype="float32"), {"x": f32(8, 6)}, dataset="data_parallel"
    ),
    "constant_depend_gelu": Case(
        lambda x, y: apply("Depend", apply("GELU", x + np.ones(6, np.float32)), y),
        {"x": f32(8, 6), "y": f32(4)},
        dataset="full_batch",
    ),
    "assign_parameter": Case(
        lambda x, p: apply("Assign", p, p * 2.0) + x,
        {"x": f32(8, 6), "p": f32(8, 6)},
        {"Mul": ((2, 2), ())},
        params=("p",),
    ),
}


# Collectives each case's rank graph holds (none when unlisted): partial results of split contracted dims are
# all-reduced; layouts that differ between ops are moved by AlltoAll; ops that cannot split gather their input.
PARTIAL = {"AllReduce": 1}
EXPECTED = {
    **dict.fromkeys(
        ["reduce_sum_split_axis", "reduce_mean_all", "reduce_max_split", "conv_in_channels_partial"], PARTIAL
    ),
    **dict.fromkeys(["conv_backprop_filter_batch_partial", "conv_backprop_input", "embedding_vocab_split"], PARTIAL),
    **dict.fromkeys(["gather_axis1_split", "segment_sum_partial", "batch_matmul_partial"], PARTIAL),
    "matmul_transposed_partial": PARTIAL,
    "add_broadcast": {"AlltoAll": 2},
    "max_pool": {"AlltoAll": 1},
    "reshape_compatible": {"AlltoAll": 1},
    "assign_parameter": {"AlltoAll": 1},
    "transpose": {"AllGather": 1},
    "batch_norm_training_replicated": {"AllGather": 1},
    "dim_size_replicated": {"AllGather": 1},
    "topk_values_gathered": {"AllGather": 1},  # GatherElements, given no strategy, runs whole: its index gathered
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_family_on_ranks_equals_one_device(name):
    case = CASES[name]
    specs = [TensorSpec.like(a, n) for n, a in case.inputs.items()]
    graph = trace(case.fn, *specs).graph
    strategies = {by_op(graph, op)[0]: s for op, s in case.strategies.items()}
    plan = parallelize(graph, strategies, case.devices, parameters=case.params, dataset=case.dataset)
    for node, strategy in strategies.items():
        assert plan.placements[node].origin == "shard()" and plan.placements[node].strategy == strategy
    assert collective_counts(plan.rank_graph(0)) == EXPECTED.get(name, {})
    want = single_device(graph, case.inputs)
    got = parallel_forward(plan, case.inputs)
    for k, (g, w) in enumerate(zip(got, want)):
        if w.dtype.kind == "f":
            close(g, w, what=f"{name} output {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{name} output {k}")
    float_params = [p for p in case.params if case.inputs[p].dtype.kind == "f"]
    if float_params and plan.graph.outputs[0].dtype.is_float:
        _, _, grads = parallel_grads(plan, case.inputs, float_params)
        _, want_grads = reference_grads(graph, case.inputs, float_params)
        for p in float_params:
            close(grads[p], want_grads[p], what=f"{name} d{p}")


@pytest.fixture
def softmax_without_rule(monkeypatch):
    without = dataclasses.replace(registry.get("Softmax"), sharding=None)  # as an op registered without a rule
    monkeypatch.setitem(registry._OPS, "Softmax", without)


def test_an_op_without_a_rule_runs_whole_after_a_gather_never_wrong(softmax_without_rule):
    graph = trace(lambda x: apply("Softmax", x * 1.0), TensorSpec((8, 6))).graph
    (softmax,) = by_op(graph, "Softmax")
    plan = parallelize(graph, {}, 4)
    assert plan.placements[softmax].origin == "replicated"
    assert collective_counts(plan.rank_graph(0)) == {"AllGather": 1}
    feeds = {"x": f32(8, 6)}
    close(parallel_forward(plan, feeds)[0], single_device(graph, feeds)[0])
    with pytest.raises(Exception, match=r"Softmax.*cannot be split \(Softmax has no sharding rule\)"):
        parallelize(graph, {softmax: ((4, 1),)}, 4)
