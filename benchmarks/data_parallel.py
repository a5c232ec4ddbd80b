"""Data-parallel training throughput: tessel (`tessel run`, Model.train) vs PyTorch DDP (gloo), side by side in one run.

Usage: python benchmarks/data_parallel.py [--ranks 1,2,4] [--batches 32,256] [--epochs 8] [--rounds 3] [--quick]
                                          [--json out.json]

Model, optimizer and data are the same on both sides: the seeds' MLP (Flatten + Dense 784-512-512-10 with ReLU),
SGD lr 0.01, CrossEntropyLoss, per-rank batch B, synthetic MNIST-shaped rows (normalised images, labels a fixed
linear map of the image decides) sharded MindSpore's way (rank k gets rows k, k + N, ...). Threads: the host's
C cores are shared out as max(1, C // N) compute threads per rank on both sides (tessel: `tessel run --threads
C`, which gives each local daemon C // N; DDP: torch.set_num_threads).
- tessel: `tessel run -n N benchmarks/_dp_tessel.py` (embedded coordinator + N daemons), DATA_PARALLEL with
  gradients_mean=True, `Model.train` with dataset_sink_mode=True (row "sink": the daemon reads its own shard and
  runs an epoch per Execute), then, in the same job, dataset_sink_mode=False (row "feed": one Execute per step,
  the batch sent by the script), then sink mode with optimizer parallel (enable_parallel_optimizer, MindSpore's
  default 64 KB threshold: rows "zero1", optimizer_level level1, and "zero3", level3);
- DDP: N `benchmarks/_dp_torch.py` processes, torch.distributed over gloo (init_method tcp://127.0.0.1),
  DistributedDataParallel, torch.optim.SGD.
Each side trains E epochs of S steps; epoch 1 (compilation, warm-up) is excluded and throughput is
N x B x S / (the median over epochs 2..E of the slowest rank's epoch time): the median keeps a burst of load from
other processes on a shared machine out of the figure. Each cell runs R rounds of one job per side, tessel
first in rounds 1, 3, ... and DDP first in rounds 2, 4, ...: this VM's speed moves between minutes by 20-40 %
(one tessel job's modes, the same computation at one rank, measured 4.7 and 6.3 ms a step a few seconds apart),
so a side run minutes after the other can win or lose by that much. A series' samples/s is the median over the
rounds; its ratio to DDP, and the verdict, the median of each round's ratio. Results are checked before any figure is
printed: every rank must end with the same parameters (checksums agree to 1e-6 relative), every loss must be
finite and the last epoch's mean loss must be below the first epoch's. (That N-rank training equals one device on
the global batch is tested in tests/integration/test_data_parallel.py, not here.) Scaling efficiency =
samples/s at N / (N x samples/s at 1).

Then job start-up on a standing cluster: `tessel coordinator --port 0` and 4 `tessel daemon` processes are
started once, and the whole `tessel run -n 4 --coordinator ADDR _dp_tessel.py --one-step` command (a job that
trains one step) is timed wall-clock, median of 3 (msrun pays 13-15 s per job).

Targets (PASS/FAIL): tessel sink ≥ 1x DDP's samples/s at every (N, B), and ≥ 80 % (batch 256) / 60 % (batch 32)
of the matrix-products bound; the one-step job ≤ 2 s. The machine is usually shared: compare the figures of one
run, and expect ±10-30 % between runs (the table prints sink/DDP's spread over the rounds).

What the hardware allows: the bounds table times, in this process with ONNX Runtime, the step's eight matrix
products alone (forward 3, input gradients 2, weight gradients 3: the fp32 FLOPs every framework must do; inputs
and outputs bound to preallocated buffers), with the threads one rank gets. N ranks on C cores take at least that
time per step when N ≤ C, and N / C times the 1-thread time when they share cores; bound/s is the samples/s a
step costing only that reaches, and each tessel series is printed as a share of it.

What this machine allows a step that runs this graph: the floor table adds, measured at the same moments as the
products, one rank's whole step alone (single_device.py's hand-fused forward, backward and SGD in ONNX Runtime,
so the element-wise work, the loss and the update count too), plus the gradients' all-reduce among N processes
alone (the CPU plugin over shared memory, benchmarks/_dp_floor.py): with as many ranks as cores no core is left to
hide the all-reduce on. bound/floor is the most of the matrix-products bound such a step reaches; where it is
below a target, the target is out of reach on this machine and the table says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the _dp_* helpers, whatever the working directory

from _dp_floor import allreduce_ms, floor_table
from _dp_launch import TESSEL_RANK, BenchmarkError, ResidentCluster, run_ddp, run_tessel
from _dp_phases import measure_phases, phases_table
from single_device import DIMS, hand_fused_model, initial_params, torch_step

SPEEDUP_TARGET = 1.0  # tessel sink / DDP, every cell
BOUND_TARGETS = {256: 0.80, 32: 0.60}  # tessel sink samples/s as a share of the matrix-products bound, by batch
SERIES = {"sink": "tessel sink", "feed": "tessel feed", "zero1": "tessel zero1", "zero3": "tessel zero3"}
LAUNCH_TARGET_S = 2.0
LAUNCH_WORLD = 4
# Steps per epoch by per-rank batch: 3200-4096 rows per rank per epoch, so each epoch is long enough to time.
STEPS = {32: 100, 256: 16}
DEADLINE_S = 240.0


def parse_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} must be a comma-separated list of positive integers")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=parse_list, default=[1, 2, 4], help="world sizes (default 1,2,4)")
    parser.add_argument("--batches", type=parse_list, default=[32, 256], help="per-rank batches (default 32,256)")
    parser.add_argument("--epochs", type=int, help="epochs per run, the first one untimed (default 8; quick 4)")
    parser.add_argument("--rounds", type=int, help="runs of each side per cell, alternating (default 3; quick 1)")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores shared out among the ranks")
    parser.add_argument("--launches", type=int, help="timed one-step jobs (default 3; quick 1)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: ranks 1,2, batch 32, 4 epochs, 1 round, 1 launch"
    )
    parser.add_argument(
        "--no-phases", action="store_true", help="skip the per-phase table (one timeline-recorded job per cell)"
    )
    parser.add_argument("--json", type=Path, help="also write every epoch time (per rank) to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.ranks = [1, 2] if args.ranks == [1, 2, 4] else args.ranks
        args.batches = [32] if args.batches == [32, 256] else args.batches
    defaults = {"epochs": (8, 4), "rounds": (3, 1), "launches": (3, 1)}  # (full, --quick)
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.epochs < 2:
        parser.error("--epochs must be ≥ 2 (the first epoch is warm-up)")
    if args.rounds < 1 or args.launches < 1:
        parser.error("--rounds and --launches must be ≥ 1")
    return args


def steps_for(batch: int) -> int:
    return STEPS.get(batch, max(2, 3200 // batch))


def check(records: list[dict], what: str) -> None:
    """Every rank ends with the same parameters; losses are finite and fall. Raises BenchmarkError otherwise."""
    first = records[0]["checksums"]
    for record in records[1:]:
        for index, (a, b) in enumerate(zip(first, record["checksums"])):
            if abs(a - b) > 1e-6 * max(1.0, abs(a)):
                raise BenchmarkError(f"{what}: rank {record['rank']} parameter {index} sums to {b}, rank 0 to {a}")
    steps = records[0]["steps"]
    for mode, run in records[0]["modes"].items():
        losses = run["losses"]
        if not all(math.isfinite(v) for v in losses):
            raise BenchmarkError(f"{what} {mode}: a loss is not finite")
        if statistics.fmean(losses[-steps:]) >= statistics.fmean(losses[:steps]):
            raise BenchmarkError(f"{what} {mode}: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")


def throughput(records: list[dict], mode: str) -> float:
    """Samples per second: one epoch's samples over the median, across epochs 2..E, of the slowest rank's time."""
    world, batch, steps = records[0]["world"], records[0]["batch"], records[0]["steps"]
    per_epoch = zip(*(r["modes"][mode]["epoch_seconds"][1:] for r in records))
    return world * batch * steps / statistics.median([max(ranks) for ranks in per_epoch])


def _run_side(args: argparse.Namespace, side: str, world: int, batch: int, round_: int) -> list[dict]:
    """One job of `side` ("tessel" or "DDP") at (world, batch) in round `round_`: its ranks' records, checked; its
    progress on stderr."""
    steps, threads = steps_for(batch), max(1, args.cores // world)
    started, where = time.monotonic(), f"[{side}, {world} ranks, batch {batch}, round {round_ + 1}]"
    print(f"{where} running ...", file=sys.stderr, flush=True)
    try:
        if side == "tessel":
            options = ["--batch", str(batch), "--steps", str(steps), "--epochs", str(args.epochs)]
            records = run_tessel(world, args.cores, options, DEADLINE_S)
        else:
            records = run_ddp(world, threads, batch, steps, args.epochs, DEADLINE_S)
        check(records, f"{side} {world} ranks batch {batch}")
    except BenchmarkError as exc:
        print(f"{where} FAILED: {exc}", file=sys.stderr, flush=True)
        raise
    print(f"{where} done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return records


def measure(args: argparse.Namespace) -> tuple[dict, dict, dict, list]:
    """({(series, N, B): median samples/s over the rounds}, {(series, N, B): each round's series / DDP},
    {(side, N, B): error}, raw records). Each round runs both sides once, tessel first in rounds 1, 3, ... and
    DDP first in rounds 2, 4, ..., so that a slow minute of the machine falls on both alike; a side that fails
    once is not run again at that cell."""
    per_round, ratios, errors, raw = {}, {}, {}, []
    for batch in args.batches:
        for world in args.ranks:
            for round_ in range(args.rounds):
                got = {}
                for side in ("tessel", "DDP") if round_ % 2 == 0 else ("DDP", "tessel"):
                    if (side, world, batch) in errors:
                        continue
                    try:
                        records = _run_side(args, side, world, batch, round_)
                    except BenchmarkError as exc:
                        errors[(side, world, batch)] = str(exc).splitlines()[0]
                        continue
                    raw.append({"side": side, "ranks": world, "batch": batch, "round": round_, "records": records})
                    for mode in records[0]["modes"]:
                        got[SERIES.get(mode, "DDP")] = throughput(records, mode)
                for series, rate in got.items():
                    per_round.setdefault((series, world, batch), []).append(rate)
                    if series != "DDP" and "DDP" in got:
                        ratios.setdefault((series, world, batch), []).append(rate / got["DDP"])
    rates = {key: statistics.median(values) for key, values in per_round.items()}
    return rates, ratios, errors, raw


def launch_times(args: argparse.Namespace) -> list[float]:
    threads = max(1, args.cores // LAUNCH_WORLD)
    with ResidentCluster(LAUNCH_WORLD, threads) as cluster:
        cluster.time_launch(TESSEL_RANK, ["--one-step"], DEADLINE_S)  # untimed: first job warms the page cache
        return [cluster.time_launch(TESSEL_RANK, ["--one-step"], DEADLINE_S) for _ in range(args.launches)]


def _matrix_products_model(batch: int) -> bytes:
    """The MLP step's eight matrix products as independent Gemm nodes (weights (out, in), like nn.Dense)."""
    from onnx import TensorProto, helper

    dims, nodes, names = DIMS, [], []
    inputs = {f"a{i}": [batch, dims[i]] for i in range(len(dims) - 1)}  # layer inputs
    inputs |= {f"g{i}": [batch, dims[i + 1]] for i in range(len(dims) - 1)}  # output gradients
    inputs |= {f"w{i}": [dims[i + 1], dims[i]] for i in range(len(dims) - 1)}
    for i in range(len(dims) - 1):
        nodes.append(helper.make_node("Gemm", [f"a{i}", f"w{i}"], [f"z{i}"], transB=1))  # forward
        nodes.append(helper.make_node("Gemm", [f"g{i}", f"a{i}"], [f"dw{i}"], transA=1))  # weight gradient
        names += [(f"z{i}", [batch, dims[i + 1]]), (f"dw{i}", [dims[i + 1], dims[i]])]
        if i > 0:  # no input gradient for the first layer
            nodes.append(helper.make_node("Gemm", [f"g{i}", f"w{i}"], [f"da{i}"]))
            names.append((f"da{i}", [batch, dims[i]]))
    graph = helper.make_graph(
        nodes,
        "matrix_products",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in names],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()


def timed_alone(args: argparse.Namespace, seconds: float = 1.2) -> tuple[dict, dict, dict]:
    """({(threads, B): ms} x 3): the step's matrix products alone (the bound), one rank's whole step alone
    (single_device.py's hand-fused forward, backward and SGD: the floor's first part, see benchmarks/_dp_floor.py),
    both in ONNX Runtime with every input and output bound to a preallocated buffer, and PyTorch's eager step of the
    same MLP alone (single_device.py's, what each DDP rank computes; empty without torch), per thread count a rank
    gets. Rounds alternate between all of them, and each keeps its fastest round: a bound must not count time that
    other processes on the host took, and they are measured at the same moments."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    models = {"products": _matrix_products_model, "step": lambda batch: hand_fused_model()}
    thread_counts = sorted({max(1, args.cores // n) for n in args.ranks})
    runs = {}  # (kind, threads, B) -> (prepare, run, what the run's buffers need alive)
    for kind, model in models.items():
        for batch in args.batches:
            for threads in thread_counts:
                options = ort.SessionOptions()
                options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
                session = ort.InferenceSession(model(batch), options, providers=["CPUExecutionProvider"])
                binding = session.io_binding()
                inputs = {p.name: _random_input(rng, p, batch) for p in session.get_inputs()}
                outputs = {p.name: np.empty(_static(p.shape, batch), np.float32) for p in session.get_outputs()}
                for name, array in inputs.items():
                    binding.bind_cpu_input(name, array)
                for name, array in outputs.items():
                    binding.bind_output(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)
                run = partial(session.run_with_iobinding, binding)
                runs[(kind, threads, batch)] = (lambda: None, run, (inputs, outputs))
    try:
        import torch
    except ImportError:
        torch = None
    for batch in args.batches if torch is not None else ():
        x = np.asarray(rng.standard_normal((batch, DIMS[0])), np.float32)
        y = rng.integers(0, DIMS[-1], batch).astype(np.int64)
        for threads in thread_counts:
            run = partial(torch_step(initial_params(), threads), x, y)
            runs[("torch", threads, batch)] = (partial(torch.set_num_threads, threads), run, None)
    times: dict[tuple, list[float]] = {key: [] for key in runs}
    for _ in range(7):
        for key, (prepare, run, _) in runs.items():
            prepare()
            run()
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / 7 / len(models):
                run()
                count += 1
            times[key].append((time.perf_counter() - start) / count * 1e3)
    fastest = {key: min(values) for key, values in times.items()}
    return tuple({(t, b): v for (k, t, b), v in fastest.items() if k == kind} for kind in (*models, "torch"))


def _static(shape: list, batch: int) -> list[int]:
    return [batch if isinstance(d, str) or d is None else d for d in shape]


def _random_input(rng: np.random.Generator, port, batch: int) -> np.ndarray:
    shape = _static(port.shape, batch)
    if "int" in port.type:
        return rng.integers(0, DIMS[-1], shape).astype(np.int64)
    return np.asarray(rng.standard_normal(shape) * 0.01, np.float32)


def phases(args: argparse.Namespace) -> dict[tuple[int, int], dict[str, float]]:
    """{(B, N): phase -> ms per step} of the sink series; a cell whose job fails is left out (and said so)."""
    cells = {}
    for batch in args.batches:
        for world in args.ranks:
            try:
                cells[(batch, world)] = measure_phases(world, args.cores, batch, steps_for(batch), DEADLINE_S)
            except (BenchmarkError, RuntimeError) as exc:
                print(f"phases, {world} ranks, batch {batch}: FAILED ({str(exc).splitlines()[0]})", file=sys.stderr)
    return cells


def _gemm_walls(args: argparse.Namespace, bounds: dict) -> dict[tuple[int, int], float]:
    """{(B, N): the matrix products' wall time per step with each rank's threads; ranks beyond the cores share
    them (N / C times the time)."""
    walls = {}
    for batch in args.batches:
        for world in args.ranks:
            walls[(batch, world)] = bounds[(max(1, args.cores // world), batch)] * max(1.0, world / args.cores)
    return walls


def bounds_table(args: argparse.Namespace, rates: dict, bounds: dict) -> list[str]:
    """Per (B, N): the matrix products' wall time per step (the bound), the samples/s a step costing only that
    would reach, and each tessel series' samples/s as a share of it (target: BOUND_TARGETS, on the sink series)."""
    shown = [s for s in SERIES.values() if s != "tessel feed"]
    head = f"{'batch':>5} {'N':>2} | {'GEMMs alone':>11} | {'bound/s':>8} | "
    head += " ".join(f"{s.split()[-1]:>7}" for s in shown) + " | target"
    lines = [head, "-" * (len(head) + 12)]
    walls = _gemm_walls(args, bounds)
    for batch in args.batches:
        for world in args.ranks:
            wall = walls[(batch, world)]
            bound = world * batch / (wall / 1e3)
            shares = {s: rates[(s, world, batch)] / bound if rates.get((s, world, batch)) else None for s in shown}
            target = BOUND_TARGETS.get(batch)
            sink = shares["tessel sink"]
            verdict = "-" if sink is None or target is None else "PASS" if sink >= target else "FAIL"
            goal = f" (>= {target:.0%})" if target is not None else ""
            lines.append(
                f"{batch:>5} {world:>2} | {wall:8.2f} ms | {bound:8.0f} | "
                + " ".join(_cell(None if v is None else 100 * v, "6.0f", "%") for v in shares.values())
                + f" | {verdict}{goal}"
            )
    return lines


def _cell(value: float | None, fmt: str, suffix: str = "") -> str:
    """value formatted with its suffix, or a dash as wide when there is no value (that side's run failed)."""
    if value is None:
        return format("-", f">{int(fmt.split('.')[0]) + len(suffix)}")
    return format(value, fmt) + suffix


def table(args: argparse.Namespace, rates: dict, ratios: dict) -> list[str]:
    """Per (B, N): samples/s of every series (the median over the rounds), each tessel series over DDP (the median
    of the rounds' ratios), sink/DDP's spread over the rounds, and scaling efficiency."""
    tessel = list(SERIES.values())
    series = [*tessel, "DDP"]
    head = f"{'batch':>5} {'N':>2} | " + " ".join(f"{s.split()[-1]:>7}" for s in series) + " | "
    head += " ".join(f"{s.split()[-1] + '/DDP':>10}" for s in tessel) + f" | {'sink/DDP rounds':>15} | "
    head += f"{'eff sink':>8} {'eff DDP':>8} | target"
    lines = [head, "-" * len(head)]
    for batch in args.batches:
        for world in args.ranks:
            got = {s: rates.get((s, world, batch)) for s in series}
            ratio = {s: statistics.median(ratios[(s, world, batch)]) if (s, world, batch) in ratios else None
                     for s in tessel}  # fmt: skip
            rounds = ratios.get(("tessel sink", world, batch), [])
            spread = f"{min(rounds):.2f}-{max(rounds):.2f}x" if rounds else "-"
            base = {s: rates.get((s, 1, batch)) for s in ("tessel sink", "DDP")}
            eff = {s: got[s] / (world * base[s]) if got[s] and base[s] else None for s in base}
            sink = ratio["tessel sink"]
            verdict = "-" if sink is None else "PASS" if sink >= SPEEDUP_TARGET else "FAIL"
            lines.append(
                f"{batch:>5} {world:>2} | " + " ".join(_cell(got[s], "7.0f") for s in series) + " | "
                + " ".join(_cell(ratio[s], "9.2f", "x") for s in tessel) + f" | {spread:>15} | "
                + " ".join(_cell(eff[s], "8.2f") for s in eff) + f" | {verdict}"
            )  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, load_before = time.monotonic(), os.getloadavg()[0]
    rates, ratios, errors, raw = measure(args)
    try:
        launches = launch_times(args)
        launch_error = ""
    except BenchmarkError as exc:
        launches, launch_error = [], str(exc).splitlines()[0]
    print(
        f"data parallel: MLP 784-512-512-10, SGD lr 0.01, CrossEntropyLoss; {args.cores} cores, "
        f"max(1, {args.cores} // N) threads per rank; rounds per cell (tessel and DDP alternating): {args.rounds}; "
        f"timed epochs a run: {args.epochs - 1} (+1 warm-up); "
        f"steps/epoch {', '.join(f'B={b}: {steps_for(b)}' for b in args.batches)}"
    )
    print("aggregate samples/s: N x B x steps / the median slowest-rank epoch time, the median over the rounds")
    print(
        "sink/DDP, feed/DDP, ...: the median over the rounds of tessel's samples/s over DDP's in the same round (the "
        "verdict's figure); eff: samples/s at N / (N x samples/s at 1)"
    )
    print("\n".join(table(args, rates, ratios)))
    bounds, steps, torch_steps = timed_alone(args)
    print(
        "bounds: wall time per step of N ranks doing nothing but the step's matrix products, with each rank's "
        "threads (GEMMs alone), the samples/s that allows (bound/s), and each tessel series' samples/s as a share of "
        "it"
    )
    print("\n".join(bounds_table(args, rates, bounds)))
    allreduces = {}
    for world in sorted(n for n in args.ranks if n > 1):
        try:
            allreduces[world] = allreduce_ms(world)
        except RuntimeError as exc:
            print(f"floor: {exc}", file=sys.stderr)
    print(
        "floor: one rank's whole step alone (the hand-fused ONNX Runtime step of single_device.py: products, "
        "element-wise work, loss and update), with each rank's threads (N / C times the 1-thread time where ranks "
        "share the cores), plus the gradients' all-reduce among N processes alone (no core is left to hide it on); "
        "bound/floor: the most of the matrix-products bound a step can reach here; sink/floor: tessel sink's "
        "samples/s as a share of the floor's; torch step: PyTorch's eager step of the MLP alone (what a DDP rank "
        "computes), same threads and rounds; torch/step: its time over the whole step's, the most of DDP's speed at "
        "one rank a step on ONNX Runtime reaches (benchmarks/_dp_floor.py)"
    )
    cells = [(b, n) for b in args.batches for n in args.ranks]
    walls = _gemm_walls(args, bounds)
    print("\n".join(floor_table(cells, args.cores, steps, allreduces, walls, rates, BOUND_TARGETS, torch_steps)))
    if not args.no_phases:
        print(
            "where the sink step's time goes (ms per step, the slowest rank, from a timeline-recorded job per cell; "
            "see benchmarks/_dp_phases.py): segments with matrix products (forward, backward), other segments "
            "(the update), collectives no segment overlapped, reading the batch, and the rest (dispatch, transfers)"
        )
        print("\n".join(phases_table(phases(args), walls)))
    for (side, world, batch), error in sorted(errors.items()):
        print(f"{side} {world} ranks batch {batch}: FAILED ({error})")
    if launches:
        median = statistics.median(launches)
        verdict = "PASS" if median <= LAUNCH_TARGET_S else "FAIL"
        runs = ", ".join(f"{s:.2f}" for s in launches)
        print(f"`tessel run -n {LAUNCH_WORLD}` one-step job on running daemons: median {median:.2f} s of [{runs}] "
              f"(target ≤ {LAUNCH_TARGET_S:.0f} s; msrun 13-15 s): {verdict}")  # fmt: skip
    else:
        print(f"`tessel run -n {LAUNCH_WORLD}` one-step job on running daemons: FAILED ({launch_error})")
    # Other processes on the host skew both sides: the load average tells how quiet the run was.
    load = f"1-min load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    print(f"total wall time {time.monotonic() - started:.0f} s; {load} ({args.cores} cores)")
    if args.json:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        rows = [{"series": s, "ranks": n, "batch": b, "samples_per_s": v} for (s, n, b), v in rates.items()]
        record = {"config": config, "rates": rows, "launch_seconds": launches, "errors": [list(k) for k in errors]}
        record["ratios_to_ddp"] = [
            {"series": s, "ranks": n, "batch": b, "rounds": v} for (s, n, b), v in ratios.items()
        ]
        record["gemm_bounds_ms"] = [{"threads": t, "batch": b, "ms": v} for (t, b), v in bounds.items()]
        record["whole_step_ms"] = [{"threads": t, "batch": b, "ms": v} for (t, b), v in steps.items()]
        record["torch_step_ms"] = [{"threads": t, "batch": b, "ms": v} for (t, b), v in torch_steps.items()]
        record["allreduce_ms"] = [{"ranks": n, "ms": v} for n, v in allreduces.items()]
        args.json.write_text(json.dumps(record | {"runs": raw}, indent=1))
        print(f"wrote {args.json}")
    return 1 if errors or not launches else 0


if __name__ == "__main__":
    sys.exit(main())
