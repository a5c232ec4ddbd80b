"""How fast AUTO_PARALLEL's strategy planner is, and how good recursive programming's plans are.

Synthetic graphs: a stack of MatMul + BiasAdd + ReLU layers with their weights and biases as parameters, then the
mean (3 * layers + 1 nodes), traced with tessel.compiler.tracer.trace and builder.apply. Timed, each the median of
a few runs, each from a cold start (the whole search: building the problem, searching, pricing the plan):
- recursive_programming and sharding_propagation on a ~1000-op graph for 64 devices (target <= 1 s);
- dynamic_programming on a ~60-op graph for 8 devices (target <= 10 s);
and recursive_programming's plan cost (the predicted step time) against dynamic_programming's, which is the
optimum of the cost model, wherever both run (target: within 10 %): on the default shapes at 2 to 16 devices and on
small, latency-bound layers, where recursive programming's symbolic costs (bytes, no host boundaries) know least.

The cost model is CostModel.default_cpu with 8 devices per host (groups beyond 8 ranks cross TCP). Pure Python,
one process: figures vary with the machine's load; nothing here runs a collective.

    python benchmarks/auto_parallel_planner.py
    python benchmarks/auto_parallel_planner.py --hidden 512 --batch 256 --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from tessel.compiler.builder import apply
from tessel.compiler.parallel.search import CostModel, search
from tessel.compiler.parallel.search.objective import clear_caches
from tessel.compiler.tracer import TensorSpec, trace


def stacked_layers(layers: int, batch: int, hidden: int):
    """(graph, parameter names) of `layers` MatMul + BiasAdd + ReLU layers and a mean."""

    def net(x, *weights):
        h = x
        for w, b in zip(weights[0::2], weights[1::2]):
            h = apply("ReLU", apply("BiasAdd", apply("MatMul", h, w), b))
        return h.mean()

    specs = [TensorSpec((batch, hidden), name="x")]
    for i in range(layers):
        specs += [TensorSpec((hidden, hidden), name=f"w{i}"), TensorSpec((hidden,), name=f"b{i}")]
    graph = trace(net, *specs).graph
    return graph, [v.name for v in graph.inputs[1:]]


def timed(graph, params, mode: str, devices: int, runs: int):
    """(median seconds, the last result) of `runs` searches, each from a cold start (no price remembered)."""
    model = CostModel.default_cpu(devices, devices_per_host=min(8, devices))
    seconds, result = [], None
    for _ in range(runs):
        clear_caches()
        started = time.perf_counter()
        result = search(graph, mode=mode, device_num=devices, parameters=params, cost_model=model)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def measure(batch: int = 1024, hidden: int = 1024, runs: int = 3, show=print) -> list[tuple[str, str, str, bool]]:
    """Every figure of the module docstring; `show` gets a line per measurement as it is taken. Returns the rows
    (measurement, measured, target, met) that `print_rows` prints."""
    rows = []

    big, big_params = stacked_layers(333, batch, hidden)
    for mode in ("recursive_programming", "sharding_propagation"):
        seconds, result = timed(big, big_params, mode, 64, runs)
        rows.append((f"{mode}, {len(big.nodes)} ops, 64 devices", f"{seconds:.3f} s", "<= 1 s", seconds <= 1.0))
        show(f"{mode}: {len(big.nodes)} ops on 64 devices in {seconds:.3f} s, step {result.step_time * 1e3:.2f} ms")

    small, small_params = stacked_layers(20, batch, hidden)
    seconds, _ = timed(small, small_params, "dynamic_programming", 8, runs)
    name = f"dynamic_programming, {len(small.nodes)} ops, 8 devices"
    rows.append((name, f"{seconds:.3f} s", "<= 10 s", seconds <= 10))
    show(f"dynamic_programming: {len(small.nodes)} ops on 8 devices in {seconds:.3f} s")

    # The default shapes, then small, latency-bound layers (where the symbolic costs know least).
    cases = [(20, batch, hidden, d) for d in (2, 4, 8)] + [(8, batch, hidden, 16)]
    cases += [(6, 64, 256, 8), (6, 64, 256, 16), (6, 256, 1024, 16)]
    for layers, case_batch, case_hidden, devices in cases:
        graph, params = stacked_layers(layers, case_batch, case_hidden)
        _, optimum = timed(graph, params, "dynamic_programming", devices, 1)
        _, found = timed(graph, params, "recursive_programming", devices, 1)
        _, propagated = timed(graph, params, "sharding_propagation", devices, 1)
        ratio = found.step_time / optimum.step_time
        name = f"recursive / dynamic plan cost, {len(graph.nodes)} ops {case_batch}x{case_hidden}, {devices} devices"
        rows.append((name, f"{ratio:.3f}", "<= 1.10", ratio <= 1.10))
        show(
            f"{len(graph.nodes)} ops ({case_batch}x{case_hidden}) on {devices} devices: predicted step "
            f"dynamic_programming {optimum.step_time * 1e3:.3f} ms, recursive_programming "
            f"{found.step_time * 1e3:.3f} ms, sharding_propagation {propagated.step_time * 1e3:.3f} ms"
        )
    return rows


def print_rows(rows: list[tuple[str, str, str, bool]]) -> None:
    width = max(len(row[0]) for row in rows)
    print(f"{'measurement':<{width}}  {'measured':>9}  {'target':>8}  result")
    for name, value, target, ok in rows:
        print(f"{name:<{width}}  {value:>9}  {target:>8}  {'PASS' if ok else 'FAIL'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = measure(args.batch, args.hidden, args.runs)
    print()
    print_rows(rows)


if __name__ == "__main__":
    main()
