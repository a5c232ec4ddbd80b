"""Starts one backend's ranks for benchmarks/collectives.py and turns what they wrote into measurements.

`launch(backend, world_size, plan, repetitions, deadline_s)` runs `_collectives_worker.py` once per rank
(subprocess; `mpirun` for MPI), waits with a deadline, kills every process it started on the way out, and
returns a `Launch`: either the measurements or the reason the backend could not be measured. A measurement's
time is the median over repetitions of the slowest rank's mean time per call in that repetition.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("_collectives_worker.py")
REPO = Path(__file__).resolve().parents[1]
ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")}

# Series names as printed: a backend launch yields one series per (backend, variant).
SERIES = {("tessel", "numpy"): "tessel", ("tessel", "zero-copy"): "tessel zero-copy"}
SERIES |= {("tessel-tcp", "numpy"): "tessel tcp", ("gloo", "numpy"): "gloo", ("mpi", "numpy"): "MPI"}
SERIES |= {("tessel-tls", "numpy"): "tessel tcp+tls"}


@dataclass(frozen=True)
class Measurement:
    """The time of one collective call for one series, world size and message size."""

    series: str
    ranks: int
    op: str
    nbytes: int
    seconds: float  # median over repetitions of the slowest rank's mean per call
    iterations: int
    per_rank_seconds: tuple[tuple[float, ...], ...]  # [rank][repetition], as measured


@dataclass
class Launch:
    backend: str
    ranks: int
    measurements: list[Measurement] = field(default_factory=list)
    skipped: str = ""  # why nothing was measured ('' when measured)
    unsupported: dict[str, str] = field(default_factory=dict)  # series -> why this backend could not run it
    wall_s: float = 0.0


def unavailable(backend: str) -> str:
    """Why a backend cannot run on this machine ('' when it can): checked before starting any process."""
    if backend == "gloo" and importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install torch)"
    if backend == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install mpi4py)"
        if shutil.which("mpirun") is None:
            return "mpirun is not on PATH (install Open MPI, e.g. apt-get install openmpi-bin)"
    return ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _commands(backend: str, world_size: int, spec_path: Path) -> list[list[str]]:
    worker = [sys.executable, str(WORKER), "--spec", str(spec_path)]
    if backend != "mpi":
        return [[*worker, "--rank", str(rank)] for rank in range(world_size)]
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [["mpirun", *root, "--oversubscribe", "-n", str(world_size), *worker]]


def _stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM first (mpirun then stops its ranks and removes its shared memory), SIGKILL what is left after 5 s.

    Each process leads its own session, so its process group holds only what it started."""
    for process in processes:
        os.killpg(process.pid, signal.SIGTERM)
    end = time.monotonic() + 5
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, end - time.monotonic()))
    for process in processes:
        if process.poll() is None:  # not yet reaped: its pid (= group id) cannot belong to anyone else
            os.killpg(process.pid, signal.SIGKILL)


def _run(commands: list[list[str]], directory: Path, env: dict[str, str], deadline_s: float) -> tuple[list, str]:
    """Start every command in its own session, wait until deadline_s; returns (exit codes, '' or 'timed out')."""
    processes, logs = [], []
    try:
        for index, command in enumerate(commands):
            log = open(directory / f"log.{index}", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            processes.append(
                subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
                )
            )
        end = time.monotonic() + deadline_s
        for process in processes:
            try:
                process.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        hung = [p for p in processes if p.poll() is None]
        _stop(hung)
        for process in processes:
            process.wait(timeout=10)
        for log in logs:
            log.close()
    return [p.returncode for p in processes], f"timed out after {deadline_s:.0f} s" if hung else ""


def _log_tail(directory: Path) -> str:
    lines = []
    for log in sorted(directory.glob("log.*")):
        lines += [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-400:]


def _aggregate(outcome: Launch, plan: list[dict], results: list[dict]) -> None:
    backend, world_size, measurements = outcome.backend, outcome.ranks, outcome.measurements
    for index, entry in enumerate(plan):
        series = SERIES[(backend, entry["variant"])]
        missing = [r["timings"][index]["unsupported"] for r in results if "unsupported" in r["timings"][index]]
        if missing:
            outcome.unsupported[series] = missing[0]
            continue
        per_rank = tuple(tuple(result["timings"][index]["seconds"]) for result in results)
        slowest = [max(column) for column in zip(*per_rank)]  # per repetition, the slowest rank
        nbytes = entry["count"] * 4
        median = statistics.median(slowest)
        measurements.append(Measurement(series, world_size, entry["op"], nbytes, median, entry["iterations"], per_rank))


def launch(backend: str, world_size: int, plan: list[dict], repetitions: int, deadline_s: float) -> Launch:
    """Run `plan` on `world_size` ranks of `backend`; never takes longer than deadline_s (plus cleanup)."""
    outcome = Launch(backend, world_size)
    reason = unavailable(backend)
    if reason:
        outcome.skipped = reason
        return outcome
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"tessel-bench-{backend}-") as scratch:
        directory = Path(scratch)
        spec: dict[str, Any] = {
            "backend": backend,
            "world_size": world_size,
            "directory": str(directory),
            "job_id": f"bench-{uuid.uuid4().hex[:12]}",
            "port": _free_port() if backend == "gloo" else 0,
            "repetitions": repetitions,
            "plan": plan,
        }
        spec_path = directory / "spec.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, **ONE_THREAD, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore::FutureWarning")
        env["TESSEL_TRANSPORT"] = "tcp" if backend in ("tessel-tcp", "tessel-tls") else "shm"
        env["TESSEL_DATA_TLS"] = "on" if backend == "tessel-tls" else "off"
        if backend == "tessel-tls":  # the cluster CA the ranks' data planes share, made by the first of them
            env["TESSEL_HOME"] = str(directory / "home")
        env.setdefault("TESSEL_TOKEN", uuid.uuid4().hex)  # the TCP data plane admits only peers with the token
        codes, timeout = _run(_commands(backend, world_size, spec_path), directory, env, deadline_s)
        paths = [directory / f"result.{rank}.json" for rank in range(world_size)]
        results = [json.loads(path.read_text()) for path in paths if path.exists()]
        errors = sorted({result["error"] for result in results if result["error"]})
        if timeout or errors or len(results) < world_size:
            detail = timeout or "; ".join(errors) or f"exit codes {codes}, {len(results)} of {world_size} results"
            outcome.skipped = f"failed ({detail}; log: {_log_tail(directory)})"
        else:
            _aggregate(outcome, plan, results)
    outcome.wall_s = time.monotonic() - started
    return outcome
