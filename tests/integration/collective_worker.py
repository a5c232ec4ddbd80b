"""One rank of a collective test: `python collective_worker.py --spec spec.json --rank R` (see collective_harness).

Publishes its pid (and, for TCP, its data address) in a file, waits for every peer's, creates the groups of the
spec through `CpuPlugin().collective.new_group`, runs the steps, and writes each output as out.R.<step>.npy and
its errors and timestamps to result.R.json. No pickle: JSON and .npy only.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from collective_harness import make_input

from tessel.core.plugin import GroupContext, Handle, Peer
from tessel.plugins.cpu import CpuPlugin


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(value))
    temporary.rename(path)


def _exchange_peers(directory: Path, rank: int, world_size: int, plugin: CpuPlugin, transport: str) -> list[dict]:
    """Every worker publishes {pid, data_address} and reads everyone's (the address only matters for TCP)."""
    address = plugin.collective.data_address if transport == "tcp" else ""
    _write_json(directory / f"peer.{rank}.json", {"pid": os.getpid(), "data_address": address})
    deadline = time.monotonic() + 60
    peers = []
    for other in range(world_size):
        path = directory / f"peer.{other}.json"
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {other} never published {path.name}")
            time.sleep(0.005)
        peers.append(json.loads(path.read_text()))
    return peers


class Worker:
    def __init__(self, spec: dict, rank: int):
        self.spec, self.rank = spec, rank
        self.directory = Path(spec["directory"])
        self.errors: dict[str, dict] = {}
        self.times: dict[str, float] = {}
        self.aborts: dict[str, tuple[float, str]] = {}  # group -> (monotonic time, cause)
        self.pending: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        spec = self.spec
        self.plugin = CpuPlugin()
        peers = self.peers = _exchange_peers(
            self.directory, self.rank, spec["world_size"], self.plugin, spec["transport"]
        )
        self.groups = {}
        for name, described in spec["groups"].items():
            ranks = tuple(described["ranks"])
            if self.rank not in ranks:
                continue
            members = tuple(Peer(r, "localhost", peers[r]["data_address"], peers[r]["pid"]) for r in ranks)
            context = GroupContext(
                spec["job_id"], name, ranks, self.rank, members, described["timeout_s"], self._abort_of(name)
            )
            self.groups[name] = self.plugin.collective.new_group(context)

    def _abort_of(self, group: str):
        def abort() -> str | None:
            when = self.aborts.get(group)
            return when[1] if when and time.monotonic() >= when[0] else None

        return abort

    def field(self, step: dict, key: str, default: Any = None) -> Any:
        override = step.get("per_rank", {}).get(str(self.rank), {})
        return override.get(key, step.get(key, default))

    def run_step(self, step: dict) -> None:
        name, op = step["name"], self.field(step, "op")
        group = step.get("group", "world")
        ranks = step.get("ranks", self.spec["groups"][group]["ranks"] if group in self.spec["groups"] else [])
        if op == "wait":
            return self.wait_pending()
        if self.rank not in ranks:
            return None
        if op == "concurrent":
            threads = [threading.Thread(target=self.run_step, args=(sub,)) for sub in step["steps"]]
            [t.start() for t in threads]
            [t.join() for t in threads]
            return None
        if op == "sleep":
            return time.sleep(step["seconds"])
        if op == "kill":
            return self.kill_later(step["seconds"])
        if op == "close":
            self.times[f"{name}:start"] = time.time()
            return self.groups[group].close()
        if str(self.rank) in step.get("abort", {}):
            delay, cause = step["abort"][str(self.rank)]
            self.aborts[group] = (time.monotonic() + delay, cause)
        self.times[f"{name}:start"] = time.time()
        try:
            result, x = None, None
            for _ in range(step.get("repeat", 1)):
                x = self.make(step, name)
                result = self.call(self.groups[group], step, name, op, x)
            if not isinstance(result, Handle) and not np.array_equal(x, self.make(step, name)):
                raise AssertionError(f"step {name!r} modified its input on rank {self.rank}")
            if isinstance(result, Handle):
                self.pending.append((name, result))
            else:
                self.save(name, result)
        except Exception as error:  # recorded for the test to check; the worker goes on with the next step
            self.record(name, error)
        return None

    def make(self, step: dict, name: str) -> np.ndarray:
        shape, dtype = self.field(step, "shape", [4]), self.field(step, "dtype", "float32")
        return make_input(self.spec["seed"], name, self.rank, shape, dtype)

    def call(self, comm: Any, step: dict, name: str, op: str, x: np.ndarray) -> Any:
        shape, dtype = self.field(step, "shape", [4]), self.field(step, "dtype", "float32")
        reduce_op, async_op = self.field(step, "reduce", "sum"), bool(step.get("async_op", False))
        if self.field(step, "zero_copy", False) and hasattr(comm, "buffer"):  # a transport without it copies
            buffer = comm.buffer(x.shape, x.dtype)
            buffer[...] = x
            result = comm.all_reduce(buffer, reduce_op)
            if not np.array_equal(buffer, x):
                raise AssertionError(f"step {name!r} modified its shared-memory input on rank {self.rank}")
            return result
        if op == "all_reduce":
            return comm.all_reduce(x, reduce_op, async_op=async_op)
        if op == "all_gather":
            return comm.all_gather(x, async_op=async_op)
        if op == "reduce_scatter":
            return comm.reduce_scatter(x, reduce_op, async_op=async_op)
        if op == "broadcast":
            return comm.broadcast(x, self.field(step, "root", 0), async_op=async_op)
        if op == "all_to_all":
            split, concat = self.field(step, "split_dim", 0), self.field(step, "concat_dim", 0)
            return comm.all_to_all(x, split, concat, async_op=async_op)
        if op == "neighbor_exchange":
            me, seed = str(self.rank), self.spec["seed"]
            send_ranks, recv_ranks = self.field(step, "send_ranks")[me], self.field(step, "recv_ranks")[me]
            sends = [make_input(seed, f"{name}.{i}", self.rank, shape, dtype) for i in range(len(send_ranks))]
            recv_shapes = self.field(step, "recv_shapes", {}).get(me, [shape] * len(recv_ranks))
            recv_dtype = np.dtype(dtype)
            return comm.neighbor_exchange(sends, send_ranks, recv_ranks, recv_shapes, recv_dtype, async_op=async_op)
        if op == "send":
            return comm.send(x, self.field(step, "peer"), async_op=async_op)
        if op == "recv":
            return comm.recv(shape, np.dtype(dtype), self.field(step, "peer"), async_op=async_op)
        if op == "barrier":
            return comm.barrier(async_op=async_op)
        raise ValueError(f"unknown op {op!r} in step {name!r}")

    def wait_pending(self) -> None:
        pending, self.pending = self.pending, []
        for name, handle in pending:
            try:
                self.save(name, handle.wait(timeout=60))
            except Exception as error:
                self.record(name, error)

    def save(self, name: str, result: Any) -> None:
        if isinstance(result, np.ndarray):
            np.save(self.directory / f"out.{self.rank}.{name}.npy", result, allow_pickle=False)
        elif isinstance(result, list):
            for i, value in enumerate(result):
                np.save(self.directory / f"out.{self.rank}.{name}.{i}.npy", value, allow_pickle=False)
        self.times[name] = time.time()

    def record(self, name: str, error: BaseException) -> None:
        with self.lock:
            self.errors[name] = {
                "type": type(error).__name__,
                "message": str(error),
                "culprit_rank": getattr(error, "culprit_rank", None),
                "field": getattr(error, "field", None),
                "time": time.time(),
                "traceback": traceback.format_exc(),
            }

    def kill_later(self, seconds: float) -> None:
        """SIGKILL this process after `seconds`, while it runs the next steps (a crash mid-collective)."""

        def kill() -> None:
            _write_json(self.directory / f"killed.{self.rank}.json", {"time": time.time()})
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(seconds, kill).start()

    def finish(self) -> None:
        self.wait_pending()
        for comm in self.groups.values():
            comm.close()
        self.plugin.close()
        results = {"errors": self.errors, "times": self.times, "pids": [p["pid"] for p in self.peers]}
        _write_json(self.directory / f"result.{self.rank}.json", results)


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the harness asks a hung worker where it is
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    worker = Worker(spec, args.rank)
    worker.start()
    for step in spec["steps"]:
        worker.run_step(step)
    worker.finish()


if __name__ == "__main__":
    main()
