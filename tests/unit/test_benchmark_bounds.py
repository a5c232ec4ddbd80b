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


def test_ranks_beyond_the_cores_share_the_one_thread_time_and_a_short_bound_is_flagged():
    args = argparse.Namespace(cores=2, ranks=[1, 2, 4], batches=[256])
    bounds = {(2, 256): 3.0, (1, 256): 5.0}  # ms per step
    rates = {("DDP", 1, 256): 64_000.0, ("DDP", 2, 256): 48_000.0, ("DDP", 4, 256): 37_000.0}
    rows = data_parallel.bounds_table(args, rates, bounds)[2:]
    walls = [float(row.split("|")[2].split()[0]) for row in rows]
    assert walls == [3.0, 5.0, 10.0]  # 4 ranks on 2 cores: twice the 1-thread time
    # 1 rank: 256 / 3 ms = 85.3k samples/s, 1.33x DDP, short of 2x; 4 ranks: 1024 / 10 ms = 102.4k, 2.77x
    assert "1.33x" in rows[0] and "unreachable" in rows[0]
    assert "2.77x" in rows[2] and "unreachable" not in rows[2]
    needs = float(rows[0].split("|")[1].split()[0])
    assert needs == pytest.approx(256 / (2 * 64_000) * 1e3, abs=0.01)


def test_a_cell_whose_ddp_run_failed_prints_dashes_instead_of_a_ratio():
    args = argparse.Namespace(cores=2, ranks=[2], batches=[32])
    (row,) = data_parallel.bounds_table(args, {}, {(1, 32): 0.8})[2:]
    needs, wall, reach = (cell.strip() for cell in row.split("|")[1:])
    assert needs == "-" and wall == "0.80 ms" and reach == "-"
    assert "unreachable" not in row
