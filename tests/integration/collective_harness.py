"""Runs collectives in real worker processes and collects what each rank got, for any CPU transport.

`run_collectives(tmp_path, world_size, steps)` starts one `collective_worker.py` process per rank with the
transport in TESSEL_TRANSPORT ("shm", "tcp"; workers exchange pids, and TCP data addresses, through files),
waits for all of them (with a deadline; every worker is killed on the way out) and returns a `Run` with each
rank's outputs (.npy) and errors. Inputs are generated from (seed, step, global rank) by `make_input`, which the
tests call too, to compute the numpy reference.

A step is a dict (JSON):
    name, op: all_reduce | all_gather | reduce_scatter | broadcast | all_to_all | neighbor_exchange | send | recv
              | barrier | sleep | kill (SIGKILL itself after `seconds`) | close (the group) | concurrent | wait
    group ("world"), shape, dtype ("float32"), reduce ("sum"), root, split_dim, concat_dim, peer,
    send_ranks/recv_ranks/recv_shapes (per rank: {"<rank>": [...]}), async_op (handles are waited at "wait"),
    zero_copy (all_reduce of an input from comm.buffer(), where the transport has one), repeat,
    ranks (global ranks that run it; default: every member of the group), seconds (sleep / kill delay),
    abort ({"<rank>": [delay_s, cause]}: that rank's group abort() returns cause from delay_s after the step starts),
    per_rank ({"<rank>": {field: value}}: overrides for one rank, to provoke mismatches),
    steps (for op "concurrent": steps run in one thread each).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

WORKER = Path(__file__).with_name("collective_worker.py")
REPO = Path(__file__).resolve().parents[2]


def make_input(seed: int, step: str, rank: int, shape: list[int] | tuple[int, ...], dtype: str) -> np.ndarray:
    """The deterministic input of `rank` for `step`: small integers (exact in every dtype) or random bools."""
    key = [seed, rank, *step.encode()]
    rng = np.random.default_rng(key)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind == "f":
        return (rng.integers(-8, 9, size=shape) / 4).astype(dtype)  # quarter steps: exact sums in float16 too
    return rng.integers(-5, 6, size=shape).astype(dtype)


@dataclass
class Run:
    """What a run of workers left behind."""

    directory: Path
    world_size: int
    returncodes: list[int]
    results: list[dict[str, Any]]
    logs: list[str]
    spec: dict[str, Any] = field(default_factory=dict)

    def output(self, rank: int, step: str, index: int | None = None) -> np.ndarray:
        suffix = "" if index is None else f".{index}"
        return np.load(self.directory / f"out.{rank}.{step}{suffix}.npy", allow_pickle=False)

    def error(self, rank: int, step: str) -> dict[str, Any] | None:
        return self.results[rank].get("errors", {}).get(step)

    def time_of(self, rank: int, what: str) -> float | None:
        return self.results[rank].get("times", {}).get(what)

    def describe(self) -> str:
        parts = zip(self.returncodes, self.logs)
        return "\n".join(f"--- rank {r} (exit {code}) ---\n{log[-3000:]}" for r, (code, log) in enumerate(parts))


def run_collectives(
    tmp_path: Path,
    world_size: int,
    steps: list[dict[str, Any]],
    *,
    groups: dict[str, dict[str, Any]] | None = None,
    transport: str = "shm",
    seed: int = 0,
    group_timeout_s: float = 30.0,
    deadline_s: float = 120.0,
) -> Run:
    """Run `steps` on `world_size` worker processes and return what they produced (never hangs past deadline_s).

    `groups` maps name -> {"ranks": [...], "timeout_s": ...}; "world" (all ranks) is always created first.
    """
    directory = tmp_path / f"run-{uuid.uuid4().hex[:8]}"
    directory.mkdir(parents=True)
    all_groups = {"world": {"ranks": list(range(world_size))}, **(groups or {})}
    for described in all_groups.values():
        described.setdefault("timeout_s", group_timeout_s)
    spec = {
        "job_id": f"test-{uuid.uuid4().hex[:12]}",
        "world_size": world_size,
        "seed": seed,
        "transport": transport,
        "directory": str(directory),
        "groups": all_groups,
        "steps": steps,
    }
    spec_path = directory / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, TESSEL_TRANSPORT=transport, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["TESSEL_TOKEN"] = uuid.uuid4().hex  # the TCP data plane admits only peers that prove the same token
    processes, logs = [], []
    try:
        for rank in range(world_size):
            log = open(directory / f"log.{rank}", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            command = [sys.executable, str(WORKER), "--spec", str(spec_path), "--rank", str(rank)]
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO))
        end = time.monotonic() + deadline_s
        for process in processes:
            try:
                process.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        hung = [p for p in processes if p.poll() is None]
        for process in hung:  # its threads' stacks into its log (collective_worker registers SIGUSR1), then kill
            process.send_signal(signal.SIGUSR1)
        if hung:
            time.sleep(1.0)
        for process in hung:
            process.send_signal(signal.SIGKILL)
        for process in processes:
            process.wait(timeout=10)
        for log in logs:
            log.close()
    texts = [(directory / f"log.{r}").read_text() for r in range(world_size)]
    run = Run(directory, world_size, [p.returncode for p in processes], [], texts, spec)
    if hung:
        raise AssertionError(f"workers {[processes.index(p) for p in hung]} hung past {deadline_s} s\n{run.describe()}")
    for rank in range(world_size):
        path = directory / f"result.{rank}.json"
        run.results.append(json.loads(path.read_text()) if path.exists() else {})
    return run


def leaked_segments(run: Run) -> list[str]:
    """Shared-memory files of this run's groups still present in /dev/shm (there must be none)."""
    from tessel.core.plugin import GroupContext, Peer
    from tessel.plugins.cpu.shm_segment import segment_path

    leaked = []
    for name, described in run.spec["groups"].items():
        ranks = tuple(described["ranks"])
        peers = tuple(Peer(r, "", "", 0) for r in ranks)
        path = segment_path(GroupContext(run.spec["job_id"], name, ranks, ranks[0], peers))
        if os.path.exists(path):
            leaked.append(path)
    return leaked
