"""Pipeline parallel: every schedule side by side, against data parallel, on one host and across two.

Usage: python benchmarks/pipeline.py [--width 768] [--layers 8] [--batch 1024] [--micro 8] [--rounds 6]
                                     [--recorded 3] [--rate 1gbit] [--budget 0.5] [--quick] [--json out.json]

The network (benchmarks/_pipeline_rank.py): `layers` Dense layers of `width`, softmax cross-entropy, Adam (so the
parameters come with twice their size of optimizer state), nn.PipelineCell(.., micro) over 4 stages (2 layers
each; "interleaved": 1F1B with pipeline_interleave and 2 chunks per stage); data parallel is
the same network, DATA_PARALLEL over every rank, no stages, the same global batch. One job per layout trains them
all on the same daemons, their steps interleaved round by round (load from other processes falls on all alike);
then `recorded` rounds of one step of each with the timeline on (interleaved too). Layouts (the network-namespace
test bed; root and iproute2 needed), daemons with 1 compute thread:
- one host, 4 ranks (shared memory between the stages);
- two hosts of 2 ranks, links limited by tc tbf to --rate (stages 1 -> 2 and 3 -> 0's results cross over TCP);
- one host, 2 ranks and 2 stages (4 layers each): each stage has a core of this 2-core machine to itself.

Printed per schedule: the step time (median of the rounds) and throughput against data parallel; the bubble
measured from the timelines (tessel.profiler.report.pipeline_bubble, the median over the recorded steps): per
step, the window from the first schedule action (F/B/W segment) any stage starts to the last one any stage ends,
bubble = 1 - (time the stages ran actions in it) / (stages x window), the idle share the theory counts, next to
theory ((S-1)/(M+S-1) for GPipe and 1F1B, (S-1)/(V*M+S-1) for interleaved 1F1B, the schedule's own unit-cost
simulation for zero bubble) and to the bound a perfect runtime gets when the layout's ranks share this machine's
cores (compiler/pipeline/check.shared_cores_bubble; = theory with a core per stage); the part of the bubble spent
waiting for transfers; the fixed per-step time outside the window (optimizer update, prologue, the loss sent back:
no bubble, reported apart); the old per-rank idle share of the whole step (overheads included); the peak activation
memory (the most a rank's tensor store grew within a step, from the timeline's memory counter, the largest over
ranks); and the bytes of parameters and optimizer state the rank holding most holds, against the whole model and
the memory budget (--budget: that share of the whole model's parameters and optimizer state per rank).

Targets (PASS/FAIL): the 1F1B bubble within 5 points of theory; the zero-bubble schedule's bubble below 1F1B's;
1F1B's peak activation memory below GPipe's; every rank holding about 1/S of the parameters and optimizer state
(at most 1.05/S) and within the budget, which data parallel (every rank holds all of it) exceeds. Throughput
against data parallel is reported, not targeted. The machine is shared (2 cores): compare ratios of one run (the load
average is printed); with 4 ranks on 2 cores the stages also share cores (see the bound).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(Path(__file__).parent))
from _verdicts import finish  # noqa: E402
from testbed import Testbed, TestbedUnavailable  # noqa: E402
from testbed_cluster import TestbedCluster, describe  # noqa: E402

from tessel.compiler.pipeline import generate  # noqa: E402
from tessel.compiler.pipeline.check import shared_cores_bubble, simulate_schedule  # noqa: E402
from tessel.profiler.report import pipeline_bubble, summarize  # noqa: E402

RANK = str(Path(__file__).with_name("_pipeline_rank.py"))
SCHEDULES = ("gpipe", "1f1b", "zero_bubble_h1", "interleaved")
BUBBLE_POINTS = 0.05  # 1F1B's measured bubble within this of theory
MiB = 2**20


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_layout(args, hosts: int, per_host: int, stages: int, rate: str | None, workdir: Path) -> dict:
    """One job: every schedule and data parallel, interleaved; returns the figures of each."""
    timeline = workdir / "timeline"
    config = {"width": args.width, "layers": args.layers, "batch": args.batch, "micro": args.micro,
              "stages": stages, "schedules": list(SCHEDULES), "dp": True, "warmup": 2, "rounds": args.rounds,
              "recorded": args.recorded, "timeline": str(timeline)}  # fmt: skip
    with Testbed(hosts, rate) as bed, TestbedCluster(bed, workdir, daemons_per_host=per_host,
                                                       heartbeat_timeout_ms=10_000) as cluster:  # fmt: skip
        results = cluster.run_ranks([RANK, json.dumps(config)], timeout_s=1500)
    if any(r.returncode != 0 for r in results):
        raise RuntimeError(describe(results))
    ranks = [json.loads(next(x for x in r.output.splitlines() if x.startswith("{"))) for r in results]
    cells = {}
    cores = min(_usable_cores(), hosts * per_host)  # every rank of every layout runs on this one machine
    for name in (*SCHEDULES, "data_parallel"):
        recorded = sorted((timeline / name).glob("step*"))  # one recorded step each
        summaries = [s for d in recorded for s in summarize(d)]
        idle = [s.idle_share for s in summaries if s.idle_share is not None]
        step_ms = statistics.median(ranks[0]["times"][name])
        cell = {
            "step_ms": step_ms,
            "samples_per_s": args.batch / (step_ms / 1e3),
            "bubble": None,
            "step_idle": statistics.mean(idle) if idle else None,
            "peak_activation": max(s.peak_growth_bytes for s in summaries),
            "held": max(r["held_bytes"][name] for r in ranks),
            "total": ranks[0]["total_bytes"],
        }
        figures = [b for b in map(pipeline_bubble, recorded) if b is not None]
        if figures:  # each figure the median over the recorded steps
            cell.update(bubble=statistics.median(b.bubble for b in figures),
                        waiting=statistics.median(b.waiting_share for b in figures),
                        window_ms=statistics.median(b.window_us for b in figures) / 1e3,
                        outside_ms=statistics.median(b.outside_us for b in figures) / 1e3)  # fmt: skip
        if name != "data_parallel":
            virtual = 2 if name == "interleaved" else 1
            schedule = generate("1f1b" if name == "interleaved" else name, stages, args.micro, virtual)
            cell["theory"] = schedule.theory_bubble()
            cell["bound"] = shared_cores_bubble(schedule, min(cores, stages))
            cell["cores"] = cores
            if figures:  # the schedule replayed with this run's measured action times, transfers and dispatch free
                cell["replayed"] = statistics.median(simulate_schedule(schedule, timed=b.action_us).bubble
                                                     for b in figures)  # fmt: skip
        cells[name] = cell
    dp = cells["data_parallel"]["samples_per_s"]
    for cell in cells.values():
        cell["x_dp"] = cell["samples_per_s"] / dp
    return cells


def report(name: str, cells: dict, stages: int, budget: int) -> list[tuple[str, bool]]:
    print(f"\n{name}")
    head = (f"{'schedule':>15} {'step ms':>8} {'samples/s':>10} {'x DP':>6} | {'bubble':>7} {'theory':>7} "
            f"{'bound':>7} {'replay':>7} | {'waits':>6} {'outside ms':>10} {'step idle':>9} | {'peak act MiB':>12} | "
            f"{'held MiB/rank':>13}")  # fmt: skip
    print(head)
    print("-" * len(head))

    def share(value) -> str:
        return "-" if value is None else f"{value:6.1%}"

    for schedule, c in cells.items():
        outside = "-" if c.get("outside_ms") is None else f"{c['outside_ms']:10.1f}"
        print(f"{schedule:>15} {c['step_ms']:8.1f} {c['samples_per_s']:10.0f} {c['x_dp']:5.2f}x | "
              f"{share(c.get('bubble')):>7} {share(c.get('theory')):>7} {share(c.get('bound')):>7} "
              f"{share(c.get('replayed')):>7} | "
              f"{share(c.get('waiting')):>6} {outside:>10} {share(c.get('step_idle')):>9} | "
              f"{c['peak_activation'] / MiB:12.2f} | {c['held'] / MiB:13.2f}")  # fmt: skip
    cores = cells["1f1b"]["cores"]
    print(
        "bubble: per step, the window from the first schedule action (F/B/W segment) any stage starts to the last "
        "one any stage ends; bubble = 1 - (time the stages ran actions in it) / (stages x window), the idle share "
        "the theory's (S-1)/(M+S-1) counts. waits: the part of it spent waiting for transfers (the rest: a stage's "
        "update or prologue falling in the window, dispatch between segments, starting sends). outside ms: the "
        "part of a rank's step span outside the window (optimizer update, prologue, the loss sent back, dispatch), "
        "no bubble. step idle: the old figure, 1 - compute / step span per rank (overheads included). bound: the "
        f"bubble a perfect runtime gets on {min(cores, stages)} core(s) shared equally by the {stages} stages (free "
        "transfers and dispatch, unit costs; = theory with a core per stage). replay: the schedule replayed with "
        "this run's measured action times (transfers and dispatch free): what the schedule itself leaves idle with "
        "these costs; bubble - replay is the runtime's share."
    )
    total = cells["1f1b"]["total"]
    print(f"whole model: {total / MiB:.2f} MiB of parameters and Adam state; budget {budget / MiB:.2f} MiB per rank")
    one, gpipe, zero = cells["1f1b"], cells["gpipe"], cells["zero_bubble_h1"]
    verdicts = []
    if one["bubble"] is not None:
        gap = abs(one["bubble"] - one["theory"])
        # Where it fails, say which part is the runtime's: the schedule replayed with this run's own action times
        # (free transfers and dispatch) is what a perfect runtime gets on this machine with these stage speeds.
        where = ""
        if gap > BUBBLE_POINTS and one.get("replayed") is not None:
            where = (f"; replayed with this run's action times {one['replayed']:.1%}, so the runtime's share is "
                     f"{(one['bubble'] - one['replayed']) * 100:.1f} points and the stages' uneven action times "
                     f"account for {(one['replayed'] - one['theory']) * 100:.1f}")  # fmt: skip
        verdicts.append((f"{name}: 1F1B bubble {one['bubble']:.1%} vs theory {one['theory']:.1%} "
                         f"(target: within {BUBBLE_POINTS:.0%} points{where})", gap <= BUBBLE_POINTS))  # fmt: skip
    if zero["bubble"] is not None and one["bubble"] is not None:
        verdicts.append((f"{name}: zero-bubble bubble {zero['bubble']:.1%} < 1F1B's {one['bubble']:.1%}",
                         zero["bubble"] < one["bubble"]))  # fmt: skip
    lower = one["peak_activation"] < gpipe["peak_activation"]
    verdicts.append((f"{name}: 1F1B peak activations {one['peak_activation'] / MiB:.2f} MiB < GPipe's "
                     f"{gpipe['peak_activation'] / MiB:.2f} MiB", lower))  # fmt: skip
    held = max(c["held"] for s, c in cells.items() if s != "data_parallel")
    dp_held = cells["data_parallel"]["held"]
    verdicts.append((f"{name}: a stage holds {held / total:.3f} of the model's parameters and state (1/S = "
                     f"{1 / stages:.3f}), {held / MiB:.2f} MiB within the {budget / MiB:.2f} MiB budget; data "
                     f"parallel holds {dp_held / MiB:.2f} MiB per rank",
                     held <= 1.05 * total / stages and held <= budget < dp_held))  # fmt: skip
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1024, help="global batch (data parallel: split over ranks)")
    parser.add_argument("--micro", type=int, default=8, help="micro-batches per step (PipelineCell's micro_size)")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (one step of each per round)")
    parser.add_argument("--recorded", type=int, default=3, help="steps recorded on the timeline per schedule")
    parser.add_argument("--rate", default="1gbit", help="tbf rate of every host's link across hosts (1gbit)")
    parser.add_argument("--budget", type=float, default=0.5, help="memory budget per rank, a share of the model")
    parser.add_argument("--quick", action="store_true", help="only the 2-rank layout on one host")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    layouts = []
    if not args.quick:
        layouts.append(("one host, 4 ranks, 4 stages", 1, 4, 4, None))
        layouts.append((f"two hosts of 2 ranks, 4 stages, {args.rate} links", 2, 2, 4, args.rate))
    layouts.append(("one host, 2 ranks, 2 stages (a core each)", 1, 2, 2, None))
    print(f"pipeline: MLP {args.layers} x {args.width}, Adam, global batch {args.batch}, micro_size {args.micro}; "
          f"1 compute thread per daemon; median of {args.rounds} steps, the schedules interleaved")  # fmt: skip
    verdicts, figures = [], {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, hosts, per_host, stages, rate in layouts:
                print(f"[{name}] running ...", file=sys.stderr, flush=True)
                before = os.getloadavg()[0]
                cells = run_layout(args, hosts, per_host, stages, rate, Path(tmp) / f"{hosts}x{per_host}")
                load = (before, os.getloadavg()[0])
                cells["1f1b"]["load"] = load
                total = cells["1f1b"]["total"]
                verdicts += report(f"{name} (load average {load[0]:.1f} -> {load[1]:.1f})", cells, stages,
                                   int(args.budget * total))  # fmt: skip
                figures[name] = cells
    except TestbedUnavailable as exc:
        print(f"cannot build the test bed: {exc}", file=sys.stderr)
        return 2
    return finish(verdicts, figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
