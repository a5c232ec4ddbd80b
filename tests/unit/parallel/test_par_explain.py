"""explain() and save_graphs(): each op's strategy and layouts, the collectives inserted with the bytes they move,
and the graph before/after the pass written as readable IR files (MindSpore's step_parallel_begin/end)."""

from __future__ import annotations

from pathlib import Path

from par_testkit import by_op, traced

from tessel.compiler.builder import apply
from tessel.compiler.parallel import explain, parallelize, save_graphs


def seed_net():
    def net(x, weight, weight2):
        h = apply("MatMul", apply("MatMul", x, weight), weight2)
        return apply("ReduceSum", h, axis=-1)

    graph = traced(net, (16, 128), (128, 128), (128, 128))
    fc, fc2 = by_op(graph, "MatMul")
    return graph, {fc: ((1, 1), (1, 2)), fc2: ((8, 1), (1, 1))}


def test_explain_shows_strategies_layouts_collectives_and_bytes():
    graph, strategies = seed_net()
    text = explain(graph, strategies, 8, parameters=["weight", "weight2"])
    lines = text.splitlines()
    assert lines[0] == "parallel plan of graph 'net' on 8 devices"
    assert "  weight: f32[128,128] parameter Layout((4, 2), (-1, 0)) [R, S(1)] on 4x2, local [128, 64]" in lines
    assert "  %0 = MatMul(%x, %weight)  shard() ((1, 1), (1, 2)), device matrix (4, 2)" in lines
    assert "  %2 = ReduceSum(%1)  data parallel ((8, 1),), device matrix (8,)" in lines
    # x arrives cut by rows over 8 ranks (data parallel dataset); fc needs it whole: an AllGather in which each
    # rank sends its 2x128 float32 rows (1024 bytes) to the 7 others
    assert "AllGather(8 ranks, dim 0, 7168 B)" in text
    # fc's output is cut by columns in 2; fc2 wants rows cut in 8: a local slice and an AlltoAll between the pair
    # holding the two column halves (each sends half of its 4x64 block: 512 bytes)
    assert "StridedSlice(dim 0 into 4), AlltoAll(2 ranks, split dim 0, concat dim 1, 512 B)" in text
    assert lines[-1] == "forward collectives per rank: AllGather x1, AlltoAll x1; bytes sent per rank: 7680"


def test_save_graphs_writes_the_graph_before_and_after_the_pass(tmp_path):
    graph, strategies = seed_net()
    plan = parallelize(graph, strategies, 8, parameters=["weight", "weight2"])
    paths = save_graphs(plan, tmp_path / "ir", ranks=(0, 5))
    assert [p.rsplit("/", 1)[1] for p in paths] == [
        "step_parallel_begin_net.ir",
        "step_parallel_end_net_rank0.ir",
        "step_parallel_end_net_rank5.ir",
        "parallel_plan_net.txt",
    ]
    summary = Path(paths[3]).read_text()
    assert "this plan" in summary and "data parallel" in summary and "AllGather" in summary
    begin = Path(paths[0]).read_text()
    assert "MatMul(%x, %weight)" in begin and "# strategy ((1, 1), (1, 2)) (shard()), device matrix (4, 2)" in begin
    assert "AllGather" not in begin
    end = Path(paths[2]).read_text()
    assert "%weight: f32[128,64] @Layout((4, 2), (-1, 0))" in end  # rank 5 holds half of weight
    assert "AllGather(%x) {axis=0, group=(0, 1, 2, 3, 4, 5, 6, 7)}" in end
    assert "Mirror(%weight) {fp32_sync=False, fusion=1, group=(1, 3, 5, 7), mean=False}" in end
    assert "test_par_explain.py" in end  # each rank node points at the user's line it implements
    assert not list((tmp_path / "ir").glob("*.tmp"))
