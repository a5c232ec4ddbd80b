"""force_fp32_communication (MindSpore's; AutoParallel.enable_fp32_communication): reductions of float16 values run in
float32, cast back after, so a sum over the group is rounded to float16 once instead of at every addition."""

from __future__ import annotations

import numpy as np
import pytest
from par_testkit import compute, traced

from tessel.compiler.buckets import communicate_in_fp32
from tessel.compiler.builder import apply
from tessel.compiler.rank_simulator import run_graphs
from tessel.compiler.tracer import TensorSpec

GROUP = (0, 1, 2, 3)
# 2048 + 1 + 1 + 1 in float16 (spacing 2 above 2048) rounds back to 2048 at each step; in float32 it is 2051,
# which rounds to 2052 once cast to float16. The second element is exact either way.
PARTS = [np.array(v, np.float16) for v in ([2048, 0.5], [1, 0.25], [1, 0.125], [1, 0.125])]


def reduce_graph(op: str, dtype: str = "float16"):
    if op == "AllReduce":
        return traced(lambda x: apply("AllReduce", x, group=GROUP), TensorSpec((2,), dtype))
    return traced(lambda x: apply("ReduceScatter", x, group=GROUP, axis=0), TensorSpec((4, 2), dtype))


def test_a_float16_all_reduce_is_summed_in_float32_and_rounded_once():
    graph = reduce_graph("AllReduce")
    wide = communicate_in_fp32(graph)
    assert [(n.op, n.outputs[0].dtype.value) for n in wide.nodes] == [
        ("Cast", "float32"),
        ("AllReduce", "float32"),
        ("Cast", "float16"),
    ]
    feeds = [{graph.inputs[0].name: part} for part in PARTS]
    (narrow,) = run_graphs([graph] * 4, feeds, compute())[0]
    (summed,) = run_graphs([wide] * 4, feeds, compute())[0]
    assert summed.dtype == np.float16 and summed.tolist() == [2052.0, 1.0]  # np.float32 sum, then one rounding
    assert narrow.tolist() == [2048.0, 1.0]  # the float16 reduction rounds at every addition


def test_a_float16_reduce_scatter_is_cast_too():
    wide = communicate_in_fp32(reduce_graph("ReduceScatter"))
    assert [(n.op, n.outputs[0].dtype.value) for n in wide.nodes if n.op != "Cast"] == [("ReduceScatter", "float32")]
    assert wide.outputs[0].dtype.value == "float16" and wide.outputs[0].shape == (1, 2)


@pytest.mark.parametrize("op", ["AllReduce", "ReduceScatter"])
def test_float32_reductions_are_left_as_they_are(op):
    graph = reduce_graph(op, "float32")
    assert communicate_in_fp32(graph) is graph
