"""AllReduce / AllGather / ReduceScatter / Broadcast: tessel's CPU plugin vs gloo vs MPI, side by side in one run.

Usage: python benchmarks/collectives.py [--ranks 2,4] [--sizes 4K,64K,1M,4M,16M,64M] [--iters 200]
                                        [--repetitions 5] [--quick] [--json out.json]

For each world size, each backend runs in its own set of processes, one per rank, one thread each:
- tessel: `CpuPlugin(threads=1).collective.new_group(GroupContext(...))` per rank, as tests/integration builds
  groups; shared memory (numpy inputs, and for AllReduce also inputs living in `comm.buffer()`: zero-copy), then
  AllReduce again over TCP (TESSEL_TRANSPORT=tcp) so the inter-host transport is visible, and over TCP encrypted
  (TESSEL_DATA_TLS=on) with a table of what TLS costs;
- gloo: torch.distributed (init_method tcp://127.0.0.1:port), all_reduce / all_gather / reduce_scatter /
  broadcast into preallocated tensors, torch.set_num_threads(1);
- MPI: mpi4py Allreduce / Allgather / Reduce_scatter_block / Bcast on numpy buffers under mpirun
  (skipped, with the reason, when mpi4py or mpirun is missing).
Each backend is placed as its users get it by default: mpirun binds a rank per core when the ranks fit the cores
(without binding its busy-polling ranks measured 15 ms per 4 KiB call here), tessel and gloo ranks are unpinned.
Messages are float32. Every (op, size) is first checked against its exact result, warmed up, then timed in
repetitions of back-to-back calls after a barrier; a figure is the median over repetitions of the slowest rank's
mean time per call. Calls per repetition: --iters for small messages, fewer for large ones (about 128 MiB moved
per repetition, at least 2). Bus bandwidth follows NCCL-tests: busbw = size/time x 2(n-1)/n for AllReduce,
x (n-1)/n for AllGather / ReduceScatter (size = the gathered output / the scattered input), x 1 for Broadcast.

Prints one table per collective (AllReduce: one per tessel path) and PASS/FAIL for the targets: AllReduce busbw
≥ MPI's and ≥ 3x gloo's at ≥ 4 MiB, 4 KiB AllReduce ≤ 50 µs at 2 ranks. The machine is usually shared: compare
figures within one run, and expect ±10-30 % between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the _collectives_* helpers, whatever the working directory

from _collectives_launch import Launch, launch, unavailable
from _collectives_report import OPS, Results, record, summary, tables, targets

DEFAULT_SIZES = "4K,64K,1M,4M,16M,64M"
QUICK_SIZES = "4K,4M"
VOLUME_BYTES = 128 << 20  # bytes moved per repetition at large sizes (bounds the time per entry)
MIN_ITERATIONS = 2
DEADLINE_S = 300.0  # per backend launch; a hang is killed and reported, the run goes on
SERIES_OF = {"tessel": ("tessel", "tessel zero-copy"), "tessel-tcp": ("tessel tcp",), "gloo": ("gloo",)}
SERIES_OF["tessel-tls"] = ("tessel tcp+tls",)
SERIES_OF["mpi"] = ("MPI",)


def parse_size(text: str) -> int:
    """'4K' -> 4096, '1M' -> 1048576, '512' -> 512 (binary units)."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a positive byte count like 4096, 4K, 64K or 1M")
    return int(number) * scale


def parse_list(text: str, parse) -> list:
    return [parse(part) for part in text.split(",") if part.strip()]


def parse_ranks(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"rank count {text!r} must be an integer ≥ 2 (busbw is 0 for one rank)")
    return int(text)


def iterations(nbytes: int, most: int) -> int:
    return max(MIN_ITERATIONS, min(most, VOLUME_BYTES // nbytes))


def plan_for(backend: str, world_size: int, sizes: list[int], most: int) -> list[dict]:
    """The worker's plan: (op, variant, float32 count) entries with their iterations and warm-up calls.

    Counts are rounded down to a multiple of the world size so AllGather/ReduceScatter blocks are equal."""
    ops = ("all_reduce",) if backend in ("tessel-tcp", "tessel-tls") else OPS
    variants = {"all_reduce": ("numpy", "zero-copy")} if backend == "tessel" else {}
    plan = []
    for op in ops:
        for variant in variants.get(op, ("numpy",)):
            for nbytes in sizes:
                count = max(world_size, nbytes // 4 // world_size * world_size)
                calls = iterations(count * 4, most)
                plan.append({"op": op, "variant": variant, "count": count, "iterations": calls, "warmup": calls // 10})
    return plan


def environment() -> dict:
    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "numpy": np.__version__,
        "torch": version("torch"),
        "mpi4py": version("mpi4py"),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=lambda t: parse_list(t, parse_ranks), default=[2, 4], help="e.g. 2,4")
    parser.add_argument("--sizes", type=lambda t: parse_list(t, parse_size), help=f"default {DEFAULT_SIZES}")
    parser.add_argument("--iters", type=int, help="calls per repetition for small messages (default 200)")
    parser.add_argument("--repetitions", type=int, help="timed repetitions per entry (default 5)")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: sizes {QUICK_SIZES}, 20 calls, 3 reps")
    parser.add_argument("--json", type=Path, help="also write every measurement (per rank) to this file")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or parse_list(QUICK_SIZES if args.quick else DEFAULT_SIZES, parse_size)
    if args.iters is None:
        args.iters = 20 if args.quick else 200
    if args.repetitions is None:
        args.repetitions = 3 if args.quick else 5
    if args.iters < 1 or args.repetitions < 1:
        parser.error("--iters and --repetitions must be ≥ 1")
    return args


def run_all(args: argparse.Namespace) -> tuple[list[Launch], dict[str, str]]:
    """Every backend at every world size, one after the other; returns the launches and skip reasons by series."""
    launches, skipped = [], {}
    for world_size in args.ranks:
        for backend in ("tessel", "gloo", "mpi", "tessel-tcp", "tessel-tls"):
            plan = plan_for(backend, world_size, args.sizes, args.iters)
            print(f"[{backend}, {world_size} ranks] running {len(plan)} entries ...", file=sys.stderr, flush=True)
            outcome = launch(backend, world_size, plan, args.repetitions, DEADLINE_S)
            status = f"skipped ({outcome.skipped})" if outcome.skipped else f"done in {outcome.wall_s:.1f} s"
            print(f"[{backend}, {world_size} ranks] {status}", file=sys.stderr, flush=True)
            launches.append(outcome)
            for series, reason in outcome.unsupported.items():
                skipped.setdefault(series, f"{world_size} ranks: {reason}")
            if outcome.skipped:
                where = "" if unavailable(backend) else f"{world_size} ranks: "  # missing software: every size
                for series in SERIES_OF[backend]:
                    skipped.setdefault(series, where + outcome.skipped)
    return launches, skipped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    launches, skipped = run_all(args)
    results = Results(m for outcome in launches for m in outcome.measurements)
    judged = targets(results, skipped)
    print(f"collectives: ranks {args.ranks}, float32, {args.repetitions} repetitions, ≤ {args.iters} calls each")
    for series, reason in sorted(skipped.items()):
        print(f"{series}: skipped ({reason})")
    print("\n".join(tables(results)))
    print()
    print("\n".join(summary(judged)))
    print(f"total wall time {time.monotonic() - started:.0f} s")
    if args.json:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps(record(config, environment(), launches, judged), indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
