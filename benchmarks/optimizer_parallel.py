"""Optimizer parallel memory: what each rank holds, and what its daemon's peak resident memory is, per level.

Usage: python benchmarks/optimizer_parallel.py [--ranks 1,2,4] [--levels off,level1,level2,level3] [--mib 128]

An MLP of Dense(2048, 2048) layers with --mib MiB of weights (128: eight 16 MiB layers), Adam, DATA_PARALLEL with
gradients_mean, trained for a few steps by Model.train; for each (ranks, level) a fresh cluster (a coordinator
and N daemons, each with max(1, cores // N) threads) runs one job, so each daemon's peak resident memory
(VmHWM) is that job's. Printed per cell:
- held: the bytes each rank's daemon must hold, by kind (benchmarks/_memory_rank.py `held_bytes`): parameters
  (level3: the block plus one gathered layer), gradients (level0/1: every whole local gradient, the bucket the
  backward writes into; level2/3: the blocks plus one whole layer gradient), optimizer state (blocks once sharded),
  plus the communication buffers (the shared-memory arena the daemon touched, RssShmem at exit);
- peak RSS of the daemons (max over ranks) and the target: 1.5 x held + 200 MB;
- where the peak goes (measured, not estimated: the daemons run with TESSEL_MEMORY_TRACE, daemon/memtrace.py, which
  resets the kernel's high-water mark before each instruction and reads it after): the instruction during which
  the daemon peaked, and its peak split into the idle daemon's resident memory (Python, gRPC, ONNX Runtime
  loaded), the private tensors of its store, shared memory (the communication arena: gradient buckets, collective
  outputs), spare state buffers, "pending" (private results of collectives that ran but were not waited for yet:
  a weight gathered ahead of its layer), "other" (resident after the instruction but held by none of those:
  runtime allocations, ONNX Runtime's sessions, freed heap) and "in-op" (the instruction's own temporaries: its
  peak above the resident memory after it). --no-trace runs without it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _dp_launch import BenchmarkError, ResidentCluster, _die_with_parent

HERE = Path(__file__).parent
RANK = HERE / "_memory_rank.py"
MB = 1e6
MIB = 2**20


def parse_list(text: str, kind=int) -> list:
    return [kind(part) for part in text.split(",") if part.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=parse_list, default=[1, 2, 4])
    parser.add_argument("--levels", type=lambda t: parse_list(t, str), default=["off", "level1", "level2", "level3"])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-trace", dest="trace", action="store_false", help="skip the per-instruction breakdown")
    return parser.parse_args(argv)


def _status(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS, RssShmem of a process in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssShmem", "RssAnon"):
            out[key] = int(value.split()[0]) * 1024
    return out


class Sampler:
    """Polls each daemon's /proc status every 50 ms: the peak of its shared memory (RssShmem, the communication
    buffers it touched), which the kernel does not keep a high-water mark of."""

    def __init__(self, pids: list[int]):
        self.pids, self.peaks = pids, [{"RssShmemPeak": 0} for _ in pids]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.05):
            for pid, peak in zip(self.pids, self.peaks):
                with contextlib.suppress(OSError):
                    peak["RssShmemPeak"] = max(peak["RssShmemPeak"], _status(pid).get("RssShmem", 0))

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def run_cell(args: argparse.Namespace, world: int, level: str) -> dict:
    threads = max(1, args.cores // world)
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tessel-mem-"))
        trace = Path(tmp) / "trace"
        trace.mkdir()
        if args.trace:
            os.environ["TESSEL_MEMORY_TRACE"] = str(trace)  # the daemons measure per instruction (daemon/memtrace.py)
        try:
            cluster = stack.enter_context(ResidentCluster(world, threads))
        finally:
            os.environ.pop("TESSEL_MEMORY_TRACE", None)
        daemons = cluster.procs[1:]
        idle = [_status(p.pid) for p in daemons]
        cmd = [sys.executable, "-m", "tessel.cli", "run", "-n", str(world), "--coordinator", cluster.address]
        cmd += ["--quiet", "--log-dir", f"{tmp}/logs", str(RANK), "--level", level, "--mib", str(args.mib)]
        cmd += ["--width", str(args.width), "--batch", str(args.batch), "--out", f"{tmp}/out"]
        started = time.monotonic()
        sampler = Sampler([p.pid for p in daemons])
        try:
            done = subprocess.run(cmd, env=cluster.env(), capture_output=True, text=True, timeout=900,
                                  preexec_fn=_die_with_parent)  # fmt: skip
        finally:
            sampler.stop()
        if done.returncode != 0:
            raise BenchmarkError(f"{world} ranks {level}: exit {done.returncode}\n{done.stderr[-3000:]}")
        after = [_status(p.pid) | peaks for p, peaks in zip(daemons, sampler.peaks)]
        for p, status in zip(daemons, after):
            traced = trace / f"memory_{p.pid}.json"
            if traced.exists():
                status["trace"] = json.loads(traced.read_text())
                status["VmHWM"] = status["trace"]["peak"]  # the trace resets the kernel's mark per instruction
        records = [json.loads((Path(tmp) / "out" / f"rank{r}.json").read_text()) for r in range(world)]
    return {
        "world": world,
        "level": level,
        "records": records,
        "daemons": after,
        "idle": idle,
        "seconds": time.monotonic() - started,
    }


def table(cells: list[dict]) -> list[str]:
    head = f"{'N':>2} {'level':>6} | {'params':>8} {'grads':>8} {'optim':>8} {'comm':>8} {'held':>8} | "
    head += f"{'peak RSS':>9} {'target':>8} {'ratio':>6} | {'step s':>7}"
    lines = [head, "-" * len(head)]
    for cell in cells:
        held = max(cell["records"], key=lambda r: sum(r["held"].values()))["held"]
        comm = max(d.get("RssShmemPeak", 0) for d in cell["daemons"])
        total = sum(held.values()) + comm
        peak = max(d["VmHWM"] for d in cell["daemons"])
        target = 1.5 * total + 200 * MB
        steps = sorted(s for r in cell["records"] for s in r["seconds"][len(r["seconds"]) // 2 :])
        kinds = (held["parameters"], held["gradients"], held["optimizer"], comm, total)
        figures = " ".join(f"{v / MIB:7.0f}M" for v in kinds)
        verdict = "PASS" if peak <= target else "FAIL"
        lines.append(
            f"{cell['world']:>2} {cell['level']:>6} | {figures} | {peak / MIB:8.0f}M {target / MIB:7.0f}M "
            f"{peak / total:5.2f}x | {steps[len(steps) // 2]:7.3f} {verdict}"
        )
    return lines


def where(cells: list[dict]) -> list[str]:
    """Per cell, the daemon at its peak (TESSEL_MEMORY_TRACE, daemon/memtrace.py): idle process, the store's private
    tensors, its tensors in shared memory, spare state buffers, the rest resident after the instruction (freed
    heap, runtime caches) and the instruction's own temporaries (its peak above the resident memory after it)."""
    head = f"{'N':>2} {'level':>6} | {'peak':>6} = {'idle':>5} {'store':>6} {'shm':>5} {'spare':>6} {'pending':>7} "
    head += f"{'other':>6} {'in-op':>6} | during"
    lines = ["where the peak goes (MiB, the daemon with the highest peak):", head, "-" * len(head)]
    for cell in cells:
        daemon = max(cell["daemons"], key=lambda d: d["VmHWM"])
        t = daemon.get("trace")
        if not t or "store_private" not in t["at"]:
            continue
        at, idle = t["at"], t["idle"]["VmRSS"]
        pending = at.get("pending_private", 0)
        known = idle + at["store_private"] + at["state_spare"] + at["RssShmem"] + pending
        parts = (idle, at["store_private"], at["RssShmem"], at["state_spare"], pending, at["VmRSS"] - known,
                 t["peak"] - at["VmRSS"])  # fmt: skip
        figures = " ".join(f"{v / MIB:{w}.0f}" for v, w in zip(parts, (5, 6, 5, 6, 7, 6, 6)))
        lines.append(f"{cell['world']:>2} {cell['level']:>6} | {t['peak'] / MIB:6.0f} = {figures} | {at['label']}")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    cells, failures = [], []
    for world in args.ranks:
        for level in args.levels:
            if world == 1 and level != "off":
                continue  # one rank: nothing is replicated, optimizer parallel shards nothing
            print(f"[{world} ranks, {level}] running ...", file=sys.stderr, flush=True)
            try:
                cells.append(run_cell(args, world, level))
            except (BenchmarkError, subprocess.TimeoutExpired) as exc:
                lines = str(exc).splitlines()
                cause = next((line for line in reversed(lines) if "Error" in line), lines[0])
                failures.append(f"{world} ranks {level}: {cause.strip()}")
    print(f"Adam, {args.mib} MiB of weights (Dense {args.width}x{args.width}), batch {args.batch} per rank; "
          "MiB per rank (held = what the daemon must hold; peak = the daemon's VmHWM)")  # fmt: skip
    print("\n".join(table(cells)))
    print("\n".join(where(cells)))
    for failure in failures:
        print(f"FAILED {failure}")
    print(f"1-min load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end ({args.cores} cores)")
    if args.json:
        args.json.write_text(json.dumps({"cells": cells, "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
