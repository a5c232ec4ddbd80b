"""One rank's timeline: what the script and its daemon did, as a Chrome trace (JSON) that Perfetto opens.

Every Execute while recording asks the daemon for its timeline (ExecuteRequest.timeline): each instruction's
wall-clock span, and for each collective when its communicator moved the data. Added here: the script's side
(the batch it loaded, the Execute call around the daemon's work: host-to-daemon and daemon-to-host transfers).
Tracks ("threads" in the trace) per rank ("process"): steps, script, daemon (segments, issues, waits, batches),
and one per communication group (its communicator's thread); a counter, "store", follows the bytes the daemon's
tensor store holds after each instruction (what a step keeps alive: activations waiting for their backward).

    recorder = Recorder("timeline_dir", rank=0)
    result = recorder.execute(daemon, session, program, feed=feed, fetch=names)   # instead of daemon.execute
    recorder.write()                                                               # timeline_dir/timeline_rank0.json
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

STEPS, SCRIPT, DAEMON, COMMUNICATION = 0, 1, 2, 10  # track ids; groups get COMMUNICATION + i
_COLLECTIVES = {
    "all_reduce": "AllReduce",
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "broadcast": "Broadcast",
    "all_to_all": "AlltoAll",
    "neighbor_exchange": "NeighborExchange",
    "send": "Send",
    "recv": "Receive",
    "barrier": "Barrier",
}
DEFAULT_LIMIT = 1_000_000  # events kept per rank; past it recording stops (and the file says so)
SEGMENT_NAMES: dict[str, tuple[str, dict]] = {}  # segment name -> (short name, details), from every compile


def file_name(rank: int) -> str:
    return f"timeline_rank{rank}.json"


def human_bytes(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def describe_graph(graph: Any) -> tuple[str, dict]:
    """(a short name, details) for a segment's graph: its main ops and the user's source lines that made them."""
    quiet = {"Constant", "Identity", "Reshape", "Cast", "DimSize", "ExpandDims", "Squeeze", "OnesLike", "ZerosLike"}
    counts = Counter(n.op for n in graph.nodes if n.op not in quiet) or Counter(n.op for n in graph.nodes)
    shown = [f"{op}×{c}" if c > 1 else op for op, c in counts.most_common(3)]
    more = len(counts) - len(shown)
    sources = sorted({os.path.basename(n.source) for n in graph.nodes if n.source})
    name = ", ".join(shown) + (f" +{more} more" if more > 0 else "")
    return name or "empty segment", {"ops": dict(counts), "source": sources[:8], "nodes": len(graph.nodes)}


class Recorder:
    """Collects one rank's events (Chrome trace "complete" events, microseconds since the epoch)."""

    def __init__(self, directory: str | os.PathLike, rank: int = 0, limit: int = DEFAULT_LIMIT):
        self.directory, self.rank, self.limit = Path(directory), rank, limit
        self.events: list[dict] = []
        self.labels = SEGMENT_NAMES  # segment name -> (name, details)
        self.groups: dict[str, int] = {}  # communication group -> track id
        self.steps = 0
        self.dropped = 0
        self.enabled = True

    # --- what the SDK reports -----------------------------------------------------------------------------------
    def span(self, name: str, category: str, start_ns: int, end_ns: int, track: int = SCRIPT, **args: Any) -> None:
        if not self.enabled:
            return
        if len(self.events) >= self.limit:
            self.dropped += 1
            return
        event = {"name": name, "cat": category, "ph": "X", "ts": start_ns / 1e3, "dur": max(0, end_ns - start_ns) / 1e3}
        event.update(pid=self.rank, tid=track)
        if args:
            event["args"] = args
        self.events.append(event)

    def execute(self, daemon: Any, session: str, program: Any, **kwargs: Any) -> Any:
        """daemon.execute(session, program, **kwargs) with the daemon's timeline recorded around it."""
        if not self.enabled:
            return daemon.execute(session, program, **kwargs)
        begin = time.time_ns()
        result = daemon.execute(session, program, timeline=True, **kwargs)
        end = time.time_ns()
        feed = sum(int(np.asarray(v).nbytes) for v in (kwargs.get("feed") or {}).values())
        back = sum(int(np.asarray(v).nbytes) for v in result.fetched.values())
        back += sum(int(np.asarray(v).nbytes) for v in result.collected.values())
        events = list(result.timeline)
        first = min((e.start_ns for e in events), default=end)
        last = max((e.end_ns for e in events), default=end)
        first, last = min(max(first, begin), end), max(min(last, end), begin)
        self.span(f"host→daemon ({human_bytes(feed)} fed)", "transfer", begin, first, bytes=feed)
        self.span(f"daemon→host ({human_bytes(back)} back)", "transfer", last, end, bytes=back)
        self._daemon_events(events)
        return result

    def data_loading(self, start_ns: int, end_ns: int, batch: Sequence[Any] = ()) -> None:
        nbytes = sum(int(np.asarray(getattr(x, "asnumpy", lambda x=x: x)()).nbytes) for x in batch)
        self.span(f"data loading ({human_bytes(nbytes)})", "data", start_ns, end_ns, bytes=nbytes)

    # --- the daemon's events ----------------------------------------------------------------------------------
    def _daemon_events(self, events: Sequence[Any]) -> None:
        issued: dict[str, tuple[str, str]] = {}  # handle -> (collective name, group)
        by_step: dict[int, list[Any]] = {}
        for e in events:
            by_step.setdefault(e.repetition, []).append(e)
        for repetition in sorted(by_step):
            step = by_step[repetition]
            segments = [e.name for e in step if e.kind == "run_segment"]
            if not (segments and all(name.startswith("eager/") for name in segments)):  # one op run eagerly: no step
                self.span(
                    f"step {self.steps}", "step", min(e.start_ns for e in step), max(e.end_ns for e in step), STEPS
                )
                self.steps += 1
            for e in step:
                self._daemon_event(e, issued)

    def _daemon_event(self, e: Any, issued: dict[str, tuple[str, str]]) -> None:
        where = {"instruction": e.index}
        if e.store_bytes and self.enabled and len(self.events) < self.limit:  # a counter track: the store's bytes
            self.events.append({"name": "store", "cat": "memory", "ph": "C", "ts": e.end_ns / 1e3, "pid": self.rank,
                                "args": {"bytes": e.store_bytes}})  # fmt: skip
        if e.kind == "run_segment":
            name, details = self.labels.get(e.name, ("", {}))
            short = re.sub(r"@[0-9a-f]{6,}|:[0-9a-f]{8,}", "", e.name).replace("/", " ")
            name = f"{short}: {name}" if name else short
            self.span(name, "compute", e.start_ns, e.end_ns, DAEMON, segment=e.name, **details, **where)
        elif e.kind in _COLLECTIVES:
            op, group = _COLLECTIVES[e.kind], e.name or "world"
            label = f"{op} ({group}, {human_bytes(e.bytes)})"
            if e.handle:
                issued[e.handle] = (op, group)
                self.span(f"start {label}", "issue", e.start_ns, e.end_ns, DAEMON, handle=e.handle, **where)
            if e.comm_end_ns:
                track = self.groups.setdefault(group, COMMUNICATION + len(self.groups))
                mode = "asynchronous" if e.handle else "synchronous"
                self.span(label, "communication", e.comm_start_ns, e.comm_end_ns, track, bytes=e.bytes, group=group,
                          mode=mode, **where)  # fmt: skip
        elif e.kind == "wait":
            op, group = issued.get(e.handle, ("collective", ""))
            self.span(f"wait for {op} ({group})", "wait", e.start_ns, e.end_ns, DAEMON, handle=e.handle, **where)
        elif e.kind == "next_batch":
            label = f"next batch ({e.name}, {human_bytes(e.bytes)})"
            self.span(label, "data", e.start_ns, e.end_ns, DAEMON, bytes=e.bytes, **where)
        elif e.kind == "copy":
            self.span("copy", "other", e.start_ns, e.end_ns, DAEMON, **where)

    # --- the file ---------------------------------------------------------------------------------------------
    def trace(self) -> dict:
        """The Chrome trace: metadata naming the rank and its tracks, then the events."""
        names = {STEPS: "steps", SCRIPT: "script", DAEMON: "daemon"}
        names.update({track: f"communication: {group}" for group, track in self.groups.items()})
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}}]
        for track, name in names.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": track, "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": track,
                         "args": {"sort_index": track}})  # fmt: skip
        other = {"rank": self.rank, "steps": self.steps, "dropped_events": self.dropped}
        for event in self.events:  # the rank may be known only now (a recorder started before init())
            event["pid"] = self.rank
        return {"traceEvents": meta + self.events, "displayTimeUnit": "ms", "otherData": other}

    def write(self, pretty: bool = False) -> Path:
        """Write (atomically) `directory/timeline_rank<r>.json`, indented if `pretty`; returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / file_name(self.rank)
        temporary = path.with_suffix(f".tmp{os.getpid()}")
        temporary.write_text(json.dumps(self.trace(), indent=1 if pretty else None))
        os.replace(temporary, path)
        return path


def load(path: str | os.PathLike) -> Mapping[str, Any]:
    return json.loads(Path(path).read_text())
