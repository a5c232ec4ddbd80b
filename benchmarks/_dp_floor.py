"""The floor of a data-parallel step on this machine, for benchmarks/data_parallel.py: what a step costs at the
least when nothing overlaps it, measured from its two parts alone.

- The whole step of one rank: the hand-fused forward, backward and SGD update of benchmarks/single_device.py in
  ONNX Runtime (one graph, no collectives, every buffer bound beforehand), with the threads one rank gets. Unlike
  the matrix products alone it counts the step's element-wise work, the loss and the update, which every framework
  runs too; ranks beyond the cores share them (N / C times the 1-thread time).
- The all-reduce of the step's gradients (669,706 float32, the MLP's parameters) among N processes alone, with the
  CPU plugin over shared memory: the bucket in shared memory (zero-copy, as tessel's gradient buckets are),
  rewritten before each call as a backward pass writes it, every call after a barrier; the slowest rank's median
  call of a round, the fastest of ROUNDS rounds.

With as many ranks as cores (or more) there is no core left to hide the all-reduce behind computation (a rank's
all-reduce needs its core: it copies and adds), so the floor is the sum of the two: a step that runs this graph in
ONNX Runtime and this all-reduce on the same cores does not go below it (only less work would: a fused graph, an
all-reduce that moves fewer bytes). The matrix-products bound over this floor is the largest share of that bound
such a step can reach.

Next to it, PyTorch's eager step of the same MLP alone (benchmarks/single_device.py's, what each DDP rank computes
before its all-reduce), timed in the same rounds with the same threads: its time over the whole step's is the most
of DDP's samples/s at one rank that a step on ONNX Runtime reaches (DDP at one rank adds only its hooks to it).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

import numpy as np

GRADIENTS = 669_706  # float32: the MLP 784-512-512-10's weights and biases
ROUNDS = 5
CALLS = 40  # per round, after WARMUP
WARMUP = 5
DEADLINE_S = 120.0


def allreduce_ms(world: int) -> float:
    """The all-reduce of the step's gradients among `world` processes alone (see the module docstring), in ms."""
    context = get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tessel-dp-floor-") as directory:
        ranks = [context.Process(target=_rank, args=(rank, world, directory)) for rank in range(world)]
        for process in ranks:
            process.start()
        deadline = time.monotonic() + DEADLINE_S
        for process in ranks:
            process.join(max(0.0, deadline - time.monotonic()))
        if any(p.is_alive() or p.exitcode != 0 for p in ranks):
            for process in ranks:
                process.kill()
            codes = [p.exitcode for p in ranks]
            raise RuntimeError(f"the {world}-rank all-reduce of the floor failed or hung (exit codes {codes})")
        rounds = [json.loads(Path(directory, f"times.{r}.json").read_text()) for r in range(world)]
    slowest = [max(per_rank[i] for per_rank in rounds) for i in range(ROUNDS)]
    return min(slowest)


def _rank(rank: int, world: int, directory: str) -> None:
    from _collectives_worker import TesselBackend  # the collectives benchmark's group: peers meet in `directory`

    backend = TesselBackend({"backend": "tessel", "directory": directory, "world_size": world, "job_id": "floor"}, rank)
    comm = backend.comm
    bucket = comm.buffer((GRADIENTS,), np.float32)
    gradients = np.random.default_rng(rank).standard_normal(GRADIENTS).astype(np.float32)
    medians = []
    for _ in range(ROUNDS):
        times = []
        for _ in range(WARMUP + CALLS):
            bucket[...] = gradients
            comm.barrier()
            started = time.perf_counter()
            comm.all_reduce(bucket, "mean")
            times.append(time.perf_counter() - started)
        medians.append(statistics.median(times[WARMUP:]) * 1e3)
    Path(directory, f"times.{rank}.json").write_text(json.dumps(medians))
    backend.close()


def floor_table(
    cells: list[tuple[int, int]],
    cores: int,
    steps: dict,
    allreduces: dict,
    walls: dict,
    rates: dict,
    targets: dict,
    torch_steps: dict | None = None,
) -> list[str]:
    """Per (B, N): the whole step alone, the all-reduce alone, their sum (the floor), the matrix-products bound's
    share of it (the most of that bound a step can reach here), tessel sink's samples/s as a share of the floor,
    and whether the bound target of the batch (`targets`: {B: share}) lies above the floor. `steps`: {(threads, B):
    ms} of the whole step; `allreduces`: {N: ms}; `walls`: {(B, N): the GEMMs-alone ms}. With `torch_steps`
    ({(threads, B): ms} of PyTorch's eager step alone, what a DDP rank computes), a last column: that step's time over
    the whole step's (above 1: ONNX Runtime runs this graph faster than PyTorch), the most of DDP's speed at one rank
    that a step on ONNX Runtime can reach."""
    torch_steps = torch_steps or {}
    head = f"{'batch':>5} {'N':>2} | {'whole step':>10} | {'all-reduce':>10} | {'floor':>8} | "
    head += f"{'bound/floor':>11} | {'sink/floor':>10} | {'the bound target':<17}"
    head = (head + f" | {'torch step':>10} {'torch/step':>10}") if torch_steps else head.rstrip()
    lines = [head, "-" * len(head)]
    for batch, world in cells:
        threads, share_cores = max(1, cores // world), max(1.0, world / cores)
        step = steps[(threads, batch)] * share_cores
        reduce = allreduces.get(world, 0.0) if world > 1 else 0.0
        if world > 1 and world not in allreduces:
            lines.append(f"{batch:>5} {world:>2} | {step:7.2f} ms | {'failed':>10} |")
            continue
        floor = step + reduce
        sink = rates.get(("tessel sink", world, batch))
        share = "-" if sink is None else f"{sink / (world * batch / (floor / 1e3)):.0%}"
        reach, target = walls[(batch, world)] / floor, targets.get(batch)
        verdict = "-" if target is None else "within the floor" if reach >= target else "out of reach here"
        line = (
            f"{batch:>5} {world:>2} | {step:7.2f} ms | {reduce:7.2f} ms | {floor:5.2f} ms | "
            f"{reach:11.0%} | {share:>10} | {verdict:<17}"
        )
        if (threads, batch) in torch_steps:
            eager = torch_steps[(threads, batch)] * share_cores
            line += f" | {eager:7.2f} ms {eager / step:9.2f}x"
        lines.append(line.rstrip())
    return lines
