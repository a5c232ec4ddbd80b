"""Where a data-parallel step's time goes, for benchmarks/data_parallel.py: one sink-mode job per cell recorded
with TESSEL_TIMELINE, each rank's steps after the first epoch cut into phases.

Phases, per step (ms, the mean over the recorded steps; the slowest rank's row is shown):
- matmul segments: segments that hold matrix products (forward and backward);
- other segments: segments without any (the optimizer update, casts);
- collectives: time collectives took that no segment overlapped (the all-reduce, its wait for the other ranks);
- data: the daemon reading the next batch of its shard;
- rest: the step's span minus the above (dispatching instructions, host transfers, the daemon's own work).
The timeline costs a few microseconds per instruction, so these steps run slightly slower than the timed ones.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from _dp_launch import run_tessel

PHASES = ("matmul segments", "other segments", "collectives", "data", "rest")


def _phases_of_rank(events: list[dict], skip_steps: int) -> dict[str, float] | None:
    """Mean ms per step of each phase over this rank's steps after the first `skip_steps`."""
    spans = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])
    steps = [e for e in spans if e.get("cat") == "step"][skip_steps:]
    if not steps:
        return None
    inner = [e for e in spans if e.get("cat") != "step"]
    totals = dict.fromkeys(PHASES, 0.0)
    index = 0
    for step in steps:
        start, end = step["ts"], step["ts"] + step["dur"]
        while index < len(inner) and inner[index]["ts"] < start:
            index += 1
        computing: list[tuple[float, float]] = []
        collectives: list[tuple[float, float]] = []
        j = index
        while j < len(inner) and inner[j]["ts"] < end:
            event, j = inner[j], j + 1
            lo, hi = event["ts"], min(end, event["ts"] + event["dur"])
            if event.get("cat") == "compute":
                ops = event.get("args", {}).get("ops", {})
                products = any("MatMul" in op or "Gemm" in op for op in ops)
                totals["matmul segments" if products else "other segments"] += hi - lo
                computing.append((lo, hi))
            elif event.get("cat") == "communication":
                collectives.append((lo, hi))
            elif event.get("cat") == "data":
                totals["data"] += hi - lo
        totals["collectives"] += sum(_uncovered(c, computing) for c in collectives)
        totals["rest"] += step["dur"]
    spent = sum(totals[p] for p in PHASES if p != "rest")
    totals["rest"] -= spent
    return {p: v / len(steps) / 1e3 for p, v in totals.items()} | {
        "step": sum(s["dur"] for s in steps) / len(steps) / 1e3
    }


def _uncovered(span: tuple[float, float], covers: list[tuple[float, float]]) -> float:
    """The length of `span` that no interval of `covers` overlaps."""
    lo, hi = span
    length = hi - lo
    for a, b in sorted(covers):
        overlap = min(hi, b) - max(lo, a)
        if overlap > 0:
            length -= overlap
    return max(0.0, length)


def measure_phases(world: int, threads: int, batch: int, steps: int, deadline_s: float) -> dict[str, float]:
    """The slowest rank's phases (ms per step) of a 3-epoch sink-mode job recorded with TESSEL_TIMELINE."""
    with tempfile.TemporaryDirectory(prefix="tessel-dp-phases-") as folder:
        rank_args = ["--batch", str(batch), "--steps", str(steps), "--epochs", "3", "--modes", "sink"]
        run_tessel(world, threads, rank_args, deadline_s, env={"TESSEL_TIMELINE": folder})
        ranks = []
        for path in sorted(Path(folder).glob("timeline_rank*.json")):
            trace = json.loads(path.read_text())
            found = _phases_of_rank(trace["traceEvents"] if isinstance(trace, dict) else trace, steps)
            if found is not None:
                ranks.append(found)
    if not ranks:
        raise RuntimeError(f"{world} ranks, batch {batch}: the timeline recorded no steps")
    return max(ranks, key=lambda r: r["step"])


def phases_table(cells: dict[tuple[int, int], dict[str, float]], bounds: dict[tuple[int, int], float]) -> list[str]:
    """Per (B, N): each phase's ms per step (the slowest rank) beside the matrix products alone."""
    head = f"{'batch':>5} {'N':>2} | {'step':>6} | " + " ".join(f"{p:>15}" for p in PHASES) + f" | {'GEMMs alone':>11}"
    lines = [head, "-" * len(head)]
    for (batch, world), found in sorted(cells.items()):
        gemms = bounds.get((batch, world))
        lines.append(
            f"{batch:>5} {world:>2} | {found['step']:6.3f} | " + " ".join(f"{found[p]:15.3f}" for p in PHASES)
            + " | " + (f"{gemms:8.3f} ms" if gemms is not None else f"{'-':>11}")
        )  # fmt: skip
    return lines
