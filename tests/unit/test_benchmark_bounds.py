"""The data-parallel benchmark's hardware bound: its model must hold exactly the step's matrix products (a bound
that skipped one would understate the floor), and the table must scale it the way ranks share cores."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import data_parallel


def test_the_bound_model_computes_every_matrix_product_of_the_mlp_step():
    from tessel.plugins.cpu.compute import CpuCompute  # shares the process's ONNX Runtime thread pool

    batch, dims = 4, data_parallel.DIMS
    model = data_parallel._matrix_products_model(batch)
    rng = np.random.default_rng(0)
    compute = CpuCompute()
    exe = compute.compile(model)
    feeds = {p.name: rng.standard_normal(p.shape).astype(np.float32) for p in exe.inputs}
    got = dict(zip(exe.output_names, compute.run(exe, feeds)))
    f64 = {k: v.astype(np.float64) for k, v in feeds.items()}
    for i in range(len(dims) - 1):
        np.testing.assert_allclose(got[f"z{i}"], f64[f"a{i}"] @ f64[f"w{i}"].T, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(got[f"dw{i}"], f64[f"g{i}"].T @ f64[f"a{i}"], rtol=1e-5, atol=1e-4)
        if i > 0:
            np.testing.assert_allclose(got[f"da{i}"], f64[f"g{i}"] @ f64[f"w{i}"], rtol=1e-5, atol=1e-4)
    # Multiply-adds of the nodes, from their shapes: forward + weight gradients + input gradients past layer 0.
    graph = onnx.load_from_string(model).graph
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    macs = 0
    for node in graph.node:
        attrs = {a.name: a.i for a in node.attribute}
        (m, k), (k2, n) = (
            shapes[node.input[0]][:: -1 if attrs.get("transA") else 1],
            shapes[node.input[1]][:: -1 if attrs.get("transB") else 1],
        )
        assert node.op_type == "Gemm" and k == k2
        macs += m * k * n
    layer_macs = [dims[i] * dims[i + 1] for i in range(len(dims) - 1)]
    assert macs == batch * (2 * sum(layer_macs) + sum(layer_macs[1:]))


def test_ranks_beyond_the_cores_share_the_one_thread_time_and_each_series_is_a_share_of_the_bound():
    args = argparse.Namespace(cores=2, ranks=[1, 2, 4], batches=[256])
    bounds = {(2, 256): 3.0, (1, 256): 5.0}  # ms per step
    rates = {("tessel sink", 1, 256): 64_000.0, ("tessel sink", 2, 256): 48_000.0, ("tessel zero1", 4, 256): 51_200.0}
    rows = data_parallel.bounds_table(args, rates, bounds)[2:]
    walls = [float(row.split("|")[1].split()[0]) for row in rows]
    assert walls == [3.0, 5.0, 10.0]  # 4 ranks on 2 cores: twice the 1-thread time
    allowed = [float(row.split("|")[2]) for row in rows]
    assert allowed == pytest.approx([256 / 3e-3, 512 / 5e-3, 1024 / 10e-3], abs=1)
    # 1 rank: 64k of 85.3k samples/s = 75 %, short of the 80 % target; 4 ranks: zero1 50 %, sink not run
    shares = [row.split("|")[3].split() for row in rows]
    assert shares[0][0] == "75%" and "FAIL (>= 80%)" in rows[0]
    assert shares[1][0] == "47%"
    assert shares[2] == ["-", "50%", "-"] and rows[2].rstrip().endswith("- (>= 80%)")


def test_a_cell_whose_runs_failed_prints_dashes_instead_of_shares():
    args = argparse.Namespace(cores=2, ranks=[2], batches=[32])
    (row,) = data_parallel.bounds_table(args, {}, {(1, 32): 0.8})[2:]
    wall, allowed, shares, verdict = (cell.strip() for cell in row.split("|")[1:])
    assert wall == "0.80 ms" and float(allowed) == pytest.approx(2 * 32 / 0.8e-3, abs=1)
    assert shares.split() == ["-", "-", "-"] and verdict == "- (>= 60%)"


def test_the_floor_adds_the_whole_step_and_the_all_reduce_and_says_where_a_target_lies_above_it():
    from _dp_floor import floor_table

    steps = {(2, 32): 1.0, (1, 32): 1.6}  # the whole step alone, ms: 2 threads, 1 thread
    walls = {(32, 1): 0.6, (32, 2): 1.0, (32, 4): 2.0}  # the products alone (bound), ms per step
    rates = {("tessel sink", 2, 32): 64 / 2.5e-3}  # a 2.5 ms step
    rows = floor_table([(32, 1), (32, 2), (32, 4)], 2, steps, {2: 0.5, 4: 1.4}, walls, rates, {32: 0.6})[2:]
    cells = [[c.strip() for c in row.split("|")] for row in rows]
    assert [c[3] for c in cells] == ["1.00 ms", "2.10 ms", "4.60 ms"]  # 4 ranks on 2 cores: twice the 1-thread step
    assert [c[4] for c in cells] == ["60%", "48%", "43%"]
    assert [c[5] for c in cells] == ["-", "84%", "-"]  # 2.10 of a 2.5 ms step
    assert [c[6] for c in cells] == ["within the floor", "out of reach here", "out of reach here"]
    failed = floor_table([(32, 2)], 2, steps, {}, walls, rates, {32: 0.6})[2]  # its all-reduce run failed
    assert [c.strip() for c in failed.split("|")][2] == "failed"


def test_the_floor_puts_pytorchs_eager_step_beside_the_whole_step_with_the_same_threads():
    from _dp_floor import floor_table

    steps = {(2, 256): 4.0, (1, 256): 7.0}  # ms
    walls = {(256, 1): 3.2, (256, 4): 12.8}
    eager = {(2, 256): 3.8, (1, 256): 7.7}  # PyTorch a little faster with 2 threads, slower with 1
    rows = floor_table([(256, 1), (256, 4)], 2, steps, {4: 1.4}, walls, {}, {256: 0.8}, eager)
    cells = [[c.strip() for c in row.split("|")] for row in rows[2:]]
    assert rows[0].split("|")[-1].split() == ["torch", "step", "torch/step"]
    # 4 ranks on 2 cores: twice the 1-thread time, as the whole step
    assert [c[-1].split() for c in cells] == [["3.80", "ms", "0.95x"], ["15.40", "ms", "1.10x"]]
    assert all(not row.endswith(" ") for row in floor_table([(256, 1)], 2, steps, {}, walls, {}, {256: 0.8}))


def test_the_whole_step_of_the_floor_is_the_hand_fused_mlp_step():
    from single_device import hand_fused_model

    model = onnx.load_from_string(hand_fused_model())
    products = [n for n in model.graph.node if n.op_type in ("Gemm", "MatMul")]
    assert len(products) == 8  # the same eight as the bound's model, with the rest of the step around them
    assert {o.name for o in model.graph.output} >= {f"{p}{i}_new" for p in "wb" for i in range(3)}  # the update


def test_the_verdict_is_the_median_of_each_rounds_ratio_and_the_table_prints_their_spread():
    args = argparse.Namespace(ranks=[1, 2], batches=[256])
    # Round by round tessel wins twice by 5 % and loses once by 30 %, on a machine whose speed moved; the ratio of
    # the medians, 40,000 / 41,000, would fail a cell that two rounds of three passed.
    rates = {("tessel sink", 1, 256): 40_000.0, ("DDP", 1, 256): 41_000.0, ("tessel sink", 2, 256): 50_000.0}
    ratios = {("tessel sink", 1, 256): [1.05, 0.70, 1.05]}
    first, second = data_parallel.table(args, rates, ratios)[2:]
    cells = [c.strip() for c in first.split("|")]
    assert cells[2].split()[0] == "1.05x" and cells[3] == "0.70-1.05x" and cells[-1] == "PASS"
    cells = [c.strip() for c in second.split("|")]  # DDP's runs failed at 2 ranks: no ratio, no verdict
    assert cells[2].split()[0] == "-" and cells[3] == "-" and cells[-1] == "-"


@pytest.mark.parametrize("option", ["--rounds", "--epochs", "--launches"])
def test_a_count_below_its_least_is_refused_not_replaced_by_the_default(option, capsys):
    with pytest.raises(SystemExit):
        data_parallel.parse_args([option, "0"])
    assert option in capsys.readouterr().err
