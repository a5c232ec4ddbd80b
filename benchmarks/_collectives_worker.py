"""One rank of benchmarks/collectives.py: times a plan of collectives on one backend, writes result.<rank>.json.

    python benchmarks/_collectives_worker.py --spec spec.json --rank R     (backends tessel, tessel-tcp, gloo)
    mpirun -n N python benchmarks/_collectives_worker.py --spec spec.json  (backend mpi: the rank comes from MPI)

The spec (JSON, written by collectives.py) names the backend, the world size, a scratch directory, the job id
(tessel), the port (gloo), the number of repetitions and the plan: one entry per (op, variant, count) with its
iterations per repetition and warm-up calls. `count` is the float32 element count of the NCCL-tests "size": the
buffer of AllReduce and Broadcast, the output of AllGather, the input of ReduceScatter.

Each entry: one call whose result is checked against the exact expected values (so a broken path is never
timed), warm-up calls, then per repetition a barrier followed by `iterations` back-to-back calls; the mean time
per call of each repetition is recorded. The inputs are zeroed after the check so that gloo's in-place
AllReduce stays finite over many iterations. No pickle: JSON files only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Run = Callable[[], np.ndarray]  # one collective call; returns this rank's output as a numpy array


class Unsupported(Exception):
    """The backend lacks what an entry needs; raised before any data moves, alike on every rank."""


def write_json(path: Path, value: Any) -> None:
    """Write atomically (temp file + rename): the parent may read as soon as the name appears."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value))
    temporary.rename(path)


# ------------------------------------------------------------------------------------------------- inputs, checks


def make_input(op: str, count: int, rank: int, size: int) -> np.ndarray:
    """This rank's input: rank + 1 everywhere; ReduceScatter adds the block index so each block differs."""
    if op == "all_gather":
        return np.full(count // size, rank + 1, np.float32)
    x = np.full(count, rank + 1, np.float32)
    if op == "reduce_scatter":
        x += np.repeat(np.arange(size, dtype=np.float32), count // size)
    return x


def expected_output(op: str, count: int, rank: int, size: int) -> np.ndarray:
    """The exact result of one call on make_input's data (small integers: exact in float32)."""
    total = size * (size + 1) / 2
    if op == "all_reduce":
        return np.full(count, total, np.float32)
    if op == "all_gather":
        return np.repeat(np.arange(1, size + 1, dtype=np.float32), count // size)
    if op == "reduce_scatter":
        return np.full(count // size, total + size * rank, np.float32)
    if op == "broadcast":
        return np.full(count, 1.0, np.float32)  # root 0's value
    raise ValueError(f"unknown collective {op!r}; use all_reduce, all_gather, reduce_scatter or broadcast")


def check(backend: str, entry: dict, rank: int, size: int, got: np.ndarray) -> None:
    want = expected_output(entry["op"], entry["count"], rank, size)
    got = np.asarray(got).reshape(-1)
    if got.shape != want.shape or not np.array_equal(got, want):
        where = np.flatnonzero(got != want)[:3] if got.shape == want.shape else "shape"
        raise AssertionError(
            f"{backend} {entry['op']} ({entry['variant']}, {entry['count']} float32) on rank {rank} returned wrong "
            f"values (first differences at {where}: got shape {got.shape}, want {want.shape}); the benchmark "
            "refuses to time a collective that gives wrong results"
        )


# ------------------------------------------------------------------------------------------------- backends


class TesselBackend:
    """tessel's CPU plugin, one process per rank, groups built exactly as tests/integration does."""

    def __init__(self, spec: dict, rank: int):
        from tessel.core.plugin import GroupContext, Peer
        from tessel.plugins.cpu import CpuPlugin

        self.plugin = CpuPlugin(threads=1)
        tcp = spec["backend"] in ("tessel-tcp", "tessel-tls")
        peers = self._exchange_peers(Path(spec["directory"]), rank, spec["world_size"], tcp)
        ranks = tuple(range(spec["world_size"]))
        members = tuple(Peer(r, "localhost", peers[r]["data_address"], peers[r]["pid"]) for r in ranks)
        context = GroupContext(spec["job_id"], "world", ranks, rank, members, timeout_s=120.0)
        self.comm = self.plugin.collective.new_group(context)

    def _exchange_peers(self, directory: Path, rank: int, size: int, tcp: bool) -> list[dict]:
        address = self.plugin.collective.data_address if tcp else ""
        write_json(directory / f"peer.{rank}.json", {"pid": os.getpid(), "data_address": address})
        deadline = time.monotonic() + 120
        peers = []
        for other in range(size):
            path = directory / f"peer.{other}.json"
            while not path.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {other} did not publish {path} within 120 s (did it fail to start?)")
                time.sleep(0.005)
            peers.append(json.loads(path.read_text()))
        return peers

    def barrier(self) -> None:
        self.comm.barrier()

    def prepare(self, entry: dict, x: np.ndarray) -> Run:
        comm, op = self.comm, entry["op"]
        if entry["variant"] == "zero-copy":
            if not hasattr(comm, "buffer"):
                raise Unsupported(f"{type(comm).__name__} offers no buffer() (no zero-copy path)")
            buffer = comm.buffer(x.shape, x.dtype)  # lives in shared memory: all_reduce reads it in place
            buffer[...] = x
            return lambda: comm.all_reduce(buffer, "sum")
        if op == "all_reduce":
            return lambda: comm.all_reduce(x, "sum")
        if op == "all_gather":
            return lambda: comm.all_gather(x)
        if op == "reduce_scatter":
            return lambda: comm.reduce_scatter(x, "sum")
        return lambda: comm.broadcast(x, 0)

    def close(self) -> None:
        self.comm.close()
        self.plugin.close()


class GlooBackend:
    """torch.distributed with gloo; tensors share memory with the numpy inputs (torch.from_numpy)."""

    def __init__(self, spec: dict, rank: int):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        self.torch, self.dist = torch, dist
        address = f"tcp://127.0.0.1:{spec['port']}"
        # A bounded timeout: if a peer fails, the others raise instead of waiting gloo's default 30 minutes.
        timeout = datetime.timedelta(seconds=120)
        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=spec["world_size"], timeout=timeout)
        # torch 2.13 renamed the *_into_tensor / *_tensor forms; same semantics.
        self.gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        self.scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        self.size = spec["world_size"]

    def barrier(self) -> None:
        self.dist.barrier()

    def prepare(self, entry: dict, x: np.ndarray) -> Run:
        dist, op, count = self.dist, entry["op"], entry["count"]
        inp = self.torch.from_numpy(x)
        if op == "all_gather":
            out = self.torch.empty(count)
            return lambda: (self.gather(out, inp), out.numpy())[1]
        if op == "reduce_scatter":
            out = self.torch.empty(count // self.size)
            return lambda: (self.scatter(out, inp), out.numpy())[1]
        if op == "all_reduce":
            return lambda: (dist.all_reduce(inp), x)[1]  # in place
        return lambda: (dist.broadcast(inp, src=0), x)[1]

    def close(self) -> None:
        self.dist.destroy_process_group()


class MpiBackend:
    """mpi4py's buffer interface (upper-case methods) on numpy arrays, under mpirun."""

    def __init__(self, spec: dict, rank: int):
        from mpi4py import MPI

        self.comm, self.size = MPI.COMM_WORLD, spec["world_size"]

    def barrier(self) -> None:
        self.comm.Barrier()

    def prepare(self, entry: dict, x: np.ndarray) -> Run:
        comm, op, count = self.comm, entry["op"], entry["count"]
        if op == "all_reduce":
            out = np.empty(count, np.float32)
            return lambda: (comm.Allreduce(x, out), out)[1]
        if op == "all_gather":
            out = np.empty(count, np.float32)
            return lambda: (comm.Allgather(x, out), out)[1]
        if op == "reduce_scatter":
            out = np.empty(count // self.size, np.float32)
            return lambda: (comm.Reduce_scatter_block(x, out), out)[1]
        return lambda: (comm.Bcast(x, root=0), x)[1]

    def close(self) -> None:
        pass


BACKENDS = {"tessel": TesselBackend, "tessel-tcp": TesselBackend, "gloo": GlooBackend, "mpi": MpiBackend}
BACKENDS["tessel-tls"] = TesselBackend


# ------------------------------------------------------------------------------------------------- timing


def time_entry(backend: Any, spec: dict, entry: dict, rank: int) -> list[float]:
    """Check one call, warm up, then return the mean seconds per call of each repetition."""
    size = spec["world_size"]
    x = make_input(entry["op"], entry["count"], rank, size)
    run = backend.prepare(entry, x)
    check(spec["backend"], entry, rank, size, run())
    x.fill(0)  # see the module docstring: keeps in-place results finite
    for _ in range(entry["warmup"]):
        run()
    seconds = []
    for _ in range(spec["repetitions"]):
        backend.barrier()
        start = time.perf_counter()
        for _ in range(entry["iterations"]):
            run()
        seconds.append((time.perf_counter() - start) / entry["iterations"])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--rank", type=int, help="this process's rank (not for mpi: MPI tells)")
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    rank = args.rank
    if spec["backend"] == "mpi":
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
    directory = Path(spec["directory"])
    timings, error = [], None
    try:
        backend = BACKENDS[spec["backend"]](spec, rank)
        try:
            for entry in spec["plan"]:
                try:
                    timings.append({**entry, "seconds": time_entry(backend, spec, entry, rank)})
                except Unsupported as missing:
                    timings.append({**entry, "seconds": [], "unsupported": str(missing)})
        finally:
            backend.close()
    except Exception as failure:  # reported by the parent as "<backend>: failed (reason)"
        error = f"{type(failure).__name__}: {failure}"
        traceback.print_exc()
    write_json(directory / f"result.{rank}.json", {"rank": rank, "timings": timings, "error": error})
    sys.exit(1 if error else 0)


if __name__ == "__main__":
    main()
