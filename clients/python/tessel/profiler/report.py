"""`tessel timeline DIR`: what the timelines of a run say, per rank.

- communication hidden: the share of the time the communicators moved data while a segment computed
  (|communication ∩ compute| / |communication|);
- the step-time breakdown: the recorded span, each instant counted once under the first of compute, communication
  (only what no segment hides), data loading, host transfers, other (script, dispatch, gaps), divided by the steps;
- idle: the share of the steps' time no segment computed (a pipeline stage's bubble), and the most the daemon's
  tensor store grew within a step (the activations a step holds).

    tessel timeline /tmp/tl
    summaries = summarize("/tmp/tl")          # one RankSummary per timeline_rank<r>.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tessel.core.errors import ConfigurationError

Interval = tuple[float, float]
CATEGORIES = ("compute", "communication", "data loading", "host transfers", "other")
_SOURCES = {  # event category -> breakdown category
    "compute": "compute",
    "communication": "communication",
    "data": "data loading",
    "transfer": "host transfers",
}


@dataclass(frozen=True)
class RankSummary:
    rank: int
    steps: int
    span_us: float  # first event to last
    breakdown_us: dict[str, float]  # CATEGORIES -> time over the whole span (sums to span_us)
    communication_us: float  # time any communicator moved data
    hidden_us: float  # ... while a segment computed
    compute_us: float = 0.0  # time a segment computed
    step_spans_us: tuple[float, ...] = ()  # each step's span (first instruction to last)
    step_compute_us: tuple[float, ...] = ()  # ... and the time segments computed in it
    peak_growth_bytes: int = 0  # the most the daemon's store grew above its low point within one step
    dropped_events: int = 0  # events the recorder left out past its limit (the summary then misses them)

    @property
    def idle_share(self) -> float | None:
        """The share of its steps' time this rank computed nothing (waiting for transfers or other ranks, issuing
        and waiting for collectives): for a pipeline stage, its bubble. Steps after the first only (the first
        compiles and warms up)."""
        spans = self.step_spans_us[1:] or self.step_spans_us
        computed = self.step_compute_us[1:] or self.step_compute_us
        return 1.0 - sum(computed) / sum(spans) if spans and sum(spans) > 0 else None

    @property
    def step_us(self) -> float:
        return self.span_us / max(1, self.steps)

    @property
    def hidden_share(self) -> float | None:
        return self.hidden_us / self.communication_us if self.communication_us > 0 else None


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of intervals, as sorted disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def length(intervals: Sequence[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """a minus b (both merged)."""
    out, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def summarize_trace(trace: dict) -> RankSummary:
    """One rank's summary from its Chrome trace (as Recorder.trace() writes it)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    other = trace.get("otherData", {})
    rank = int(other.get("rank", events[0]["pid"] if events else 0))
    spans: dict[str, list[Interval]] = {c: [] for c in CATEGORIES}
    for e in events:
        category = _SOURCES.get(e.get("cat", ""))
        if category is not None:
            spans[category].append((e["ts"], e["ts"] + e["dur"]))
    merged = {c: merge(v) for c, v in spans.items()}
    if not events:
        return RankSummary(rank, 0, 0.0, dict.fromkeys(CATEGORIES, 0.0), 0.0, 0.0)
    whole = [(min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events))]
    communication = merged["communication"]
    breakdown, taken = {}, []
    for category in CATEGORIES[:-1]:  # each instant counted once, under the first category that holds it
        own = subtract(merged[category], merge(taken))
        breakdown[category] = length(own)
        taken += own
    breakdown["other"] = length(subtract(whole, merge(taken)))
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "step")
    hidden = length(intersect(communication, merged["compute"]))
    spans = tuple(b - a for a, b in steps)
    computed = tuple(length(intersect(merged["compute"], [step])) for step in steps)
    growth = _store_growth(trace.get("traceEvents", []), steps)
    return RankSummary(
        rank, len(steps), length(whole), breakdown, length(communication), hidden, length(merged["compute"]), spans,
        computed, growth, int(other.get("dropped_events", 0)),
    )  # fmt: skip


def _store_growth(events: list[dict], steps: list[Interval]) -> int:
    """The most the store's bytes (the "store" counter) rose above their lowest point within one step."""
    counter = sorted((e["ts"], e["args"]["bytes"]) for e in events if e.get("ph") == "C" and e.get("name") == "store")
    growth = 0
    for start, end in steps:
        inside = [b for ts, b in counter if start <= ts <= end]
        if inside:
            growth = max(growth, max(inside) - min(inside))
    return int(growth)


@dataclass(frozen=True)
class PipelineBubble:
    """A pipeline's bubble measured across its ranks' timelines, defined as the theory's (S-1)/(M+S-1) is.

    Per step, the pipeline's window runs from the first schedule action (F, B or W segment) any rank starts to the
    last one any rank ends (the same clock on one machine); a rank's work is the time its action segments ran in
    it. bubble = 1 - (work summed over ranks) / (ranks x window): the idle share of the window, as the theory's
    unit-cost stage idles (S-1)(F+B) out of (M+S-1)(F+B). What a step does outside its actions (the optimizer
    update, the prologue, sending the loss, dispatch at the ends) is no bubble: `outside_us` is the part of a
    rank's step span outside the window (mean over ranks). `waiting_us` is the part of the idle time ranks spent in
    waits for transfers; the rest is a rank's own work that is no action but falls in the window (its optimizer
    update while another stage still runs its last backward, its prologue), dispatch between segments and starting
    sends (where ranks outnumber cores, also waiting for a core there). Means over the steps after the first (the
    first warms up), as RankSummary.idle_share."""

    ranks: int
    steps: int
    window_us: float
    work_us: float  # summed over ranks
    waiting_us: float  # summed over ranks
    step_us: float  # mean over ranks of a step's span
    outside_us: float = 0.0  # mean over ranks of the part of a step's span outside the window
    action_us: dict[str, float] = field(default_factory=dict)  # each action's segments' time ("F(v=0,m=1)")

    @property
    def bubble(self) -> float:
        return 1.0 - self.work_us / (self.ranks * self.window_us) if self.window_us > 0 else 0.0

    @property
    def waiting_share(self) -> float:
        return self.waiting_us / (self.ranks * self.window_us) if self.window_us > 0 else 0.0


def pipeline_bubble(directory: str | Path) -> PipelineBubble | None:
    """The bubble of the pipeline whose ranks' timelines are in `directory` (see PipelineBubble); None if its
    segments carry no schedule action (not a pipeline)."""
    traces = [_read(f) for f in sorted(Path(directory).glob("timeline_rank*.json"))]
    per_rank, all_named = [], []
    for trace in traces:
        events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
        steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "step")
        named = [e for e in events if e.get("cat") == "compute" and e.get("args", {}).get("action")]
        actions = merge((e["ts"], e["ts"] + e["dur"]) for e in named)
        waits = merge((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "wait")
        per_rank.append((steps, actions, waits))
        all_named.append(named)
    count = min((len(steps) for steps, _, _ in per_rank), default=0)
    if not per_rank or count == 0 or not any(actions for _, actions, _ in per_rank):
        return None
    chosen = range(1, count) if count > 1 else range(count)
    window = work = waiting = span = outside = 0.0
    used = []
    for k in chosen:
        mine = [(steps[k], intersect(actions, [steps[k]]), waits) for steps, actions, waits in per_rank]
        started = [a[0][0] for _, a, _ in mine if a]
        ended = [a[-1][1] for _, a, _ in mine if a]
        if not started:  # a step that ran no schedule action (an eval run): no pipeline window
            continue
        used.append(k)
        whole = [(min(started), max(ended))]
        window += whole[0][1] - whole[0][0]
        work += sum(length(intersect(a, whole)) for _, a, _ in mine)
        waiting += sum(length(intersect(w, whole)) for _, _, w in mine)
        span += sum(step[1] - step[0] for step, _, _ in mine) / len(mine)
        outside += sum(step[1] - step[0] - length(intersect([step], whole)) for step, _, _ in mine) / len(mine)
    if not used:
        return None
    n = len(used)
    timed: dict[str, float] = {}
    for named, (steps, _, _) in zip(all_named, per_rank):
        for e in named:
            if any(steps[k][0] <= e["ts"] <= steps[k][1] for k in used):
                timed[e["args"]["action"]] = timed.get(e["args"]["action"], 0.0) + e["dur"] / n
    return PipelineBubble(len(per_rank), n, window / n, work / n, waiting / n, span / n, outside / n, timed)


def _read(path: Path) -> dict:
    """A timeline file's trace; a file that is not one is a clear error naming it."""
    try:
        trace = json.loads(path.read_text())
        if not isinstance(trace, dict):
            raise ValueError("not a JSON object")
        for event in trace.get("traceEvents", []):
            if event.get("ph") == "X" and not {"ts", "dur"} <= set(event):
                raise ValueError(f"a complete event without ts/dur: {event}")
        return trace
    except (OSError, ValueError, AttributeError) as err:
        raise ConfigurationError(
            f"{path} is not a timeline tessel wrote ({err}); remove it or write it again"
        ) from None


def summarize(directory: str | Path) -> list[RankSummary]:
    """A RankSummary per timeline_rank<r>.json in `directory`, by rank."""
    if not Path(directory).is_dir():
        raise ConfigurationError(f"{directory} is not a directory of timeline_rank*.json files")
    files = sorted(Path(directory).glob("timeline_rank*.json"))
    return sorted((summarize_trace(_read(f)) for f in files), key=lambda s: s.rank)


def table(summaries: Sequence[RankSummary]) -> str:
    """The text `tessel timeline` prints: per rank, ms per step in each category and the hidden share."""
    head = f"{'rank':>4} {'steps':>6} {'step ms':>9} | " + " ".join(f"{c:>14}" for c in CATEGORIES)
    head += f" | {'comm ms':>9} {'hidden':>7} | {'idle':>5} {'store+ MiB':>10}"
    lines = [head, "-" * len(head)]
    for s in summaries:
        per = max(1, s.steps) * 1e3  # microseconds over the span -> milliseconds per step
        cells = " ".join(f"{s.breakdown_us[c] / per:14.3f}" for c in CATEGORIES)
        hidden = "-" if s.hidden_share is None else f"{s.hidden_share:.0%}"
        idle = "-" if s.idle_share is None else f"{s.idle_share:.0%}"
        lines.append(f"{s.rank:>4} {s.steps:>6} {s.span_us / per:9.3f} | {cells} | {s.communication_us / per:9.3f} "
                     f"{hidden:>7} | {idle:>5} {s.peak_growth_bytes / 2**20:10.2f}")  # fmt: skip
    cut = [s.rank for s in summaries if s.dropped_events]
    if cut:
        lines.append(
            f"NOTE: rank(s) {cut} reached the recorder's event limit and left events out (see dropped_events in "
            "their files): their figures cover only the start of the run. Raise Profiler(timeline_limit=...)."
        )
    lines.append(
        "ms per step; each instant is counted once, under the first of: compute, communication no segment hides, "
        "data loading, host transfers, other. comm ms: time the communicators moved data; hidden: the share of it "
        "during which a segment computed. idle: the share of the steps (after the first) in which no segment "
        "computed (a pipeline stage's bubble); store+: the most the daemon's tensor store grew within a step (the "
        "activations a step keeps alive)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessel timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="where TESSEL_TIMELINE (or Profiler(output_path=...)) wrote the files")
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        summaries = summarize(args.directory)
    except ConfigurationError as err:
        print(f"tessel timeline: {err}", file=sys.stderr, flush=True)
        return 1
    if not summaries:
        print(f"tessel timeline: no timeline_rank*.json in {args.directory}", flush=True)
        return 1
    if args.json:
        rows = [
            {
                "rank": s.rank,
                "steps": s.steps,
                "step_ms": s.step_us / 1e3,
                "breakdown_ms_per_step": {c: s.breakdown_us[c] / max(1, s.steps) / 1e3 for c in CATEGORIES},
                "communication_ms_per_step": s.communication_us / max(1, s.steps) / 1e3,
                "hidden_share": s.hidden_share,
                "idle_share": s.idle_share,
                "peak_growth_bytes": s.peak_growth_bytes,
            }
            for s in summaries
        ]
        print(json.dumps(rows, indent=1))
    else:
        print(f"timeline of {len(summaries)} rank(s) in {args.directory}")
        print(table(summaries))
    return 0
