"""Where a daemon's resident memory goes, per instruction (a diagnostic: `TESSEL_MEMORY_TRACE=DIR`).

With the variable set, the daemon measures every instruction it runs: the peak resident memory during it (the
kernel's high-water mark, reset before the instruction through /proc/self/clear_refs), the resident memory after
it (anonymous, shared, file-backed), and what the session holds after it: the distinct buffers of its tensor
store (private, or in shared memory: the communication arena), the state buffers a segment keeps beside the
store (the other half of a double-buffered parameter or optimizer slot), and the private results of asynchronous
collectives that ran but were not waited for yet (a weight gathered ahead of its layer). After each Execute it writes
DIR/memory_<pid>.json: the process's overall peak (VmHWM as if never reset), the instruction during which it
was reached, and that instruction's breakdown. Linux only; resetting the high-water mark makes the process's
VmHWM meaningless, so read the overall peak from the file (`peak`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

ENV = "TESSEL_MEMORY_TRACE"


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssShmem", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _root(array: Any) -> Any:
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array


def _union(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, 0
    for lo, hi in sorted(spans):
        if hi > reach:
            total += hi - max(lo, reach)
            reach = hi
    return total


def held(session: Any) -> dict[str, int]:
    """Bytes of the memory the session's tensors span (overlapping views counted once): in the store, private
    or in shared memory (the communicator's arena), the segments' spare state buffers (not in the store), and the
    private results of collectives not waited for yet."""
    private, shared = [], []
    for value in list(session.tensors.values()):
        if not isinstance(value, np.ndarray) or value.nbytes == 0:
            continue
        address = value.__array_interface__["data"][0]
        (private if isinstance(_root(value), np.ndarray) else shared).append((address, address + value.nbytes))
    spans = private + shared
    spare = []
    for segment in list(session.segments.values()):
        for buffers in list(getattr(segment, "_buffers", {}).values()):
            for b in buffers:
                address = b.__array_interface__["data"][0]
                if not any(lo <= address < hi for lo, hi in spans):
                    spare.append((address, address + b.nbytes))
    pending = []  # results of collectives that ran but were not waited for yet (a prefetched level3 weight)
    for handle, _ in list(session.handles.values()):
        done = getattr(handle, "done", None)
        if done is None or not done():
            continue
        try:
            values = handle.wait(0)
        except Exception:
            continue
        for v in values if isinstance(values, (list, tuple)) else [values]:
            if isinstance(v, np.ndarray) and v.nbytes:
                address = v.__array_interface__["data"][0]
                if isinstance(_root(v), np.ndarray) and not any(lo <= address < hi for lo, hi in spans + spare):
                    pending.append((address, address + v.nbytes))
    known = spans + spare + pending
    largest = sorted(((v.nbytes, n) for n, v in list(session.tensors.items()) if isinstance(v, np.ndarray)),
                     reverse=True)[:40]  # fmt: skip
    return {
        "store_private": _union(private),
        "store_shared": _union(shared),
        "state_spare": _union(spare),
        "pending_private": _union(pending),
        "largest": [(n, b) for b, n in largest],
        "unclaimed": _unclaimed(known),
        **({"who": _who(known)} if os.environ.get("TESSEL_MEMORY_TRACE_WHO") else {}),
    }


def _who(known: list[tuple[int, int]]) -> list[str]:
    """Debug: the objects holding arrays of 4 MiB or more outside the session's tensors."""
    import gc

    out = []
    for obj in gc.get_objects():
        try:
            for value in gc.get_referents(obj):
                if isinstance(value, np.ndarray) and value.nbytes >= (4 << 20):
                    a = value.__array_interface__["data"][0]
                    if not any(lo <= a < hi for lo, hi in known):
                        name = type(obj).__name__
                        if name in ("dict", "list", "tuple", "cell"):
                            name += " <- " + ",".join(type(r).__name__ for r in gc.get_referrers(obj)[:3])
                        out.append(f"{name} {value.nbytes >> 20} MiB base={type(value.base).__name__}")
        except Exception:
            continue
    return out[:80]


def _unclaimed(known: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """Resident mappings of 1 MiB or more, less what the session's tensors span in them: (name, rss, untracked)."""
    rows, current = [], None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    lo, hi = (int(x, 16) for x in head[0].split("-"))
                    current = [head[5] if len(head) > 5 else "[anon]", lo, hi, 0]
                    rows.append(current)
                elif head[0] == "Rss:" and current is not None:
                    current[3] = int(head[1]) * 1024
    except OSError:
        return []
    out = []
    for name, lo, hi, rss in rows:
        if rss < (1 << 20):
            continue
        inside = sum(max(0, min(hi, b) - max(lo, a)) for a, b in known)
        out.append((name, rss, max(0, rss - inside)))
    return sorted(out, key=lambda r: -r[2])[:25]


class MemoryTrace:
    def __init__(self, directory: str):
        self.path = Path(directory) / f"memory_{os.getpid()}.json"
        self.idle = _status()
        self.peak = self.idle["VmHWM"]
        self.where: dict[str, Any] = {"label": "before the first Execute", **self.idle}
        self.growth: list[tuple[str, int]] = []  # (instruction, resident growth) for the first large growths

    def run(self, session: Any, step: Any) -> None:
        before = _status()
        if before["VmHWM"] > self.peak:  # reached outside an instruction (a compile, a put)
            self.peak = before["VmHWM"]
            self.where = {"label": "between instructions", **before, **held(session)}
        _reset_peak()
        step.run()
        after = _status()
        grew = after["VmRSS"] - before["VmRSS"]
        if grew >= (4 << 20) and len(self.growth) < 200:
            self.growth.append((step.label, grew))
        if after["VmHWM"] > self.peak:
            self.peak = after["VmHWM"]
            self.where = {"label": step.label, **after, "rss_before": before["VmRSS"], **held(session)}

    def write(self) -> None:
        record = {"idle": self.idle, "peak": self.peak, "at": self.where, "growth": self.growth}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self.path)


_trace: MemoryTrace | None = None


def trace() -> MemoryTrace | None:
    """The process's trace when TESSEL_MEMORY_TRACE is set (made on first use), else None."""
    global _trace
    directory = os.environ.get(ENV)
    if directory and _trace is None:
        _trace = MemoryTrace(directory)
    return _trace
