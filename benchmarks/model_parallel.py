"""Model parallel vs data parallel for a 4-layer MLP (hidden 4096 by default, batch 32, SGD): per-rank parameter
bytes and steady-state step time at 1, 2 and 4 ranks.

Model parallel is Megatron's, through SEMI_AUTO_PARALLEL: layers 1 and 3 cut their weight by columns
((1, 1), (1, mp)), layers 2 and 4 by rows ((1, mp), (mp, 1)), so each pair costs one AllReduce forward and one
backward and each rank holds 1/mp of every weight. Data parallel is ParallelMode.DATA_PARALLEL (weights replicated,
the batch cut over the ranks, one bucketed gradient AllReduce).

Real mode (the default) runs every cell as its own job under `tessel run -n N` (one daemon per rank, this script as
the rank program) and reports, per rank, the bytes of its parameters, the bytes its daemon's store holds after
training (DaemonStatusReply.tensor_bytes: parameters, their optimizer state and what the step keeps) and the
median step time after the compile and warm-up steps (the slowest rank's). Daemons run 1 compute thread each
(TESSEL_THREADS), so N ranks want N cores: on a machine with fewer, the larger worlds share cores and their step
times show contention, not scaling. A cell whose estimated memory does not fit comfortably in the available RAM is
skipped and said so.

--simulate runs the ranks in this process on the rank-program simulator (compiler.rank_simulator), one after
another: the step time printed per rank is the world's wall time divided by the ranks (how the compute splits, not
what processes, overlap and a network add).

    python benchmarks/model_parallel.py                    # real: tessel run -n 1, 2, 4
    python benchmarks/model_parallel.py --hidden 512       # quicker
    python benchmarks/model_parallel.py --simulate         # the in-process simulator
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TESSEL_THREADS", "1")

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.compiler import SGD, bucket_allreduce, build_train_step, lower_rank_program, simulate
from tessel.core.errors import JobFailedError
from tessel.parallel import trace_network
from tessel.parallel.semi_auto import partition_for_rank
from tessel.plugins.cpu.compute import CpuCompute

LAYERS = 4
MODES = ("data parallel", "model parallel")
WARMUP = 2  # the first step compiles; the second still allocates


class MLP(nn.Cell):
    """LAYERS MatMul + ReLU layers and a mean-square loss; `mp` > 0 shards them Megatron style."""

    def __init__(self, hidden: int, mp: int):
        super().__init__()
        rng = np.random.default_rng(0)
        self.weights = []
        self.matmuls = []
        self.relus = []
        for i in range(LAYERS):
            w = rng.standard_normal((hidden, hidden), dtype=np.float32) / np.float32(np.sqrt(hidden))
            weight = ms.Parameter(ms.Tensor(w), f"w{i}")
            setattr(self, f"w{i}", weight)
            self.weights.append(weight)
            column = i % 2 == 0
            matmul, relu = ops.MatMul(), ops.ReLU()
            if mp:  # the activation stays cut by columns inside a pair and whole (on every rank) between pairs
                matmul.shard(((1, 1), (1, mp)) if column else ((1, mp), (mp, 1)))
                relu.shard(((1, mp),) if column else ((1, 1),))
            self.matmuls.append(matmul)
            self.relus.append(relu)
        self.square, self.mean = ops.Mul(), ops.ReduceMean()
        if mp:
            self.square.shard(((1, 1), (1, 1)))
            self.mean.shard(((1, 1),))

    def construct(self, x):
        for weight, matmul, relu in zip(self.weights, self.matmuls, self.relus):
            x = relu(matmul(x, weight))
        return self.mean(self.square(x, x))


# --- real mode: one `tessel run -n N` job per cell ------------------------------------------------------------------


def worker(mode: str, hidden: int, batch: int, steps: int, out: Path) -> None:
    """The rank program: train `steps` timed steps after WARMUP and write this rank's figures to out/rank<r>.json."""
    import tessel.parallel
    from tessel.communication import get_group_size, get_rank, init, runtime
    from tessel.v1 import common_pb2

    init()
    rank, world = get_rank(), get_group_size()
    model_parallel = mode == "model parallel" and world > 1
    if model_parallel:  # every rank reads the whole batch: the activations between pairs are whole anyway
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True)
    else:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    net = MLP(hidden, world if model_parallel else 0)
    x = np.random.default_rng(1).standard_normal((batch, hidden), dtype=np.float32)
    rows = batch if model_parallel else batch // world
    first = 0 if model_parallel else rank * rows
    if model_parallel:
        plan = tessel.parallel.plan(net, x, device_num=world)
        shapes = [plan.input_layout(p.key).local_shape(p.shape) for p in net.weights]
    else:
        shapes = [p.shape for p in net.weights]
    param_bytes = sum(4 * int(np.prod(shape)) for shape in shapes)
    step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.01))
    if not model_parallel:
        _stage_one_by_one(net.trainable_params())
    data = ms.Tensor(np.ascontiguousarray(x[first : first + rows]))
    times, losses = [], []
    for _ in range(WARMUP + steps):
        start = time.perf_counter()
        losses.append(float(step(data).asnumpy()))
        times.append(time.perf_counter() - start)
    status = runtime.current().daemon.client.Status(common_pb2.Empty())
    figures = {
        "rank": rank,
        "param_bytes": param_bytes,
        "store_bytes": status.tensor_bytes,
        "compile_s": times[0],
        "step_s": float(np.median(times[WARMUP:])),
        "losses": losses,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(figures))


def _stage_one_by_one(params) -> None:
    """Put the parameters on this rank's daemon one Put each before the first step. The engine would send them all
    in the first step's Execute: one 256 MiB request whose serialization holds the GIL long enough, on a loaded
    2-core machine, for the heartbeat thread to miss the coordinator's 3 s deadline and the job to fail."""
    from tessel.common import parameter
    from tessel.common.engine import engine

    eng = engine()
    for p in params:
        eng.daemon.put(eng.session, {p.key: p.asnumpy()})
        parameter.stage(eng, [p], {})  # marks it held by this daemon, so the step feeds it no more


def _available_bytes() -> int:
    """MemAvailable from /proc/meminfo (0 where there is none: nothing is skipped then)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def estimated_bytes(mode: str, ranks: int, hidden: int) -> int:
    """Peak memory of a cell, all ranks: each rank's client builds the whole network once (float32), its daemon
    holds its parameters, their gradients and the step's buffers (about 3 copies of what the rank holds)."""
    full = 4 * LAYERS * hidden * hidden
    held = full // ranks if mode == "model parallel" else full
    return ranks * (full + 3 * held)


def _run_job(command: list[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """Run `command` in its own process group; on timeout the whole group (launcher, daemons, ranks) is ended."""
    env = dict(os.environ, TESSEL_HOME=str(cwd / "home"), PYTHONUNBUFFERED="1")
    job = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = job.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGTERM)
        try:
            out, _ = job.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            out, _ = job.communicate(timeout=10)
        raise JobFailedError(
            f"benchmark cell `{' '.join(command)}` ran past its {timeout_s:.0f} s deadline and was ended; give it "
            f"more with --timeout or fewer --steps. Its output ended:\n{out[-2000:]}"
        ) from None
    return subprocess.CompletedProcess(command, job.returncode, out, "")


def _cause(message: str) -> str:
    """The most telling line of a failed cell's message: tessel run's own verdict when there is one."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    verdict = [line for line in lines if line.startswith(("tessel run:", "job "))]
    return (verdict or lines or ["no output"])[-1][:300]


def measure_real(mode: str, ranks: int, hidden: int, batch: int, steps: int, timeout_s: float) -> dict:
    """One cell under `tessel run -n ranks`: the figures of its ranks, combined (max over ranks)."""
    with tempfile.TemporaryDirectory(prefix="tessel_mp_") as folder:
        cwd = Path(folder)
        command = [sys.executable, "-m", "tessel.cli", "run", "-n", str(ranks), os.path.abspath(__file__)]
        command += ["--worker", mode, "--hidden", str(hidden), "--batch", str(batch), "--steps", str(steps)]
        command += ["--out", str(cwd)]
        result = _run_job(command, cwd, timeout_s)
        found = sorted(cwd.glob("rank*.json"))
        if result.returncode != 0 or len(found) != ranks:
            raise JobFailedError(
                f"benchmark cell {mode} on {ranks} ranks failed (exit {result.returncode}, {len(found)} of {ranks} "
                f"ranks reported); its output ended:\n{result.stdout[-3000:]}"
            )
        rows = [json.loads(path.read_text()) for path in found]
    return {
        "mode": mode,
        "ranks": ranks,
        "param_mib": max(r["param_bytes"] for r in rows) / 2**20,
        "store_mib": max(r["store_bytes"] for r in rows) / 2**20,
        "compile_s": max(r["compile_s"] for r in rows),
        "step_ms": 1e3 * max(r["step_s"] for r in rows),
        "loss": rows[0]["losses"][-1],
    }


# --- simulator mode -------------------------------------------------------------------------------------------------


def measure_simulated(mode: str, ranks: int, hidden: int, batch: int, steps: int) -> dict:
    """One cell on the in-process rank simulator: step time is the world's wall time divided by the ranks."""
    ms.reset_auto_parallel_context()
    full_batch = mode == "model parallel"
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=full_batch)
    net = MLP(hidden, ranks if mode == "model parallel" else 0)
    x = np.random.default_rng(1).standard_normal((batch, hidden)).astype(np.float32)
    graph, trace = trace_network(net, x)
    full = {p.key: p.asnumpy() for p in trace.parameters()}
    rows = batch // ranks
    programs, feeds, param_bytes = [], [], []
    for rank in range(ranks):
        part = partition_for_rank(graph, trace, list(full), full, rank, ranks)
        train = build_train_step(part.graph, list(full), SGD(0.01))
        programs.append(lower_rank_program(bucket_allreduce(train.graph), state=[s.name for s in train.state]))
        data = x if full_batch else x[rank * rows : (rank + 1) * rows]
        feeds.append(part.params | part.slice_feeds({"x": data}) | {"learning_rate": np.float32(0.01)})
        param_bytes.append(sum(v.nbytes for v in part.params.values()))
    compute = CpuCompute(threads=1)
    simulate(programs, feeds, compute, runs=1)  # compile and warm up
    start = time.perf_counter()
    simulate(programs, feeds, compute, runs=steps)
    world = (time.perf_counter() - start) / steps
    collectives = programs[0].collective_counts()
    return {
        "mode": mode,
        "ranks": ranks,
        "param_mib": max(param_bytes) / 2**20,
        "step_ms": 1e3 * world / ranks,
        "collectives": ", ".join(f"{k} x{v}" for k, v in sorted(collectives.items())) or "none",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (real mode: after 2 warm-up steps)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--simulate", action="store_true", help="the in-process rank simulator, not tessel run")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per real cell")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.hidden, args.batch, args.steps, args.out)
    elif args.simulate:
        simulated(args)
    else:
        real(args)


def real(args: argparse.Namespace) -> None:
    print(
        f"{LAYERS}-layer MLP, hidden {args.hidden}, global batch {args.batch}, SGD, tessel run -n N, "
        f"{args.steps} timed steps after {WARMUP} warm-up, {os.cpu_count()} cores, "
        f"TESSEL_THREADS={os.environ['TESSEL_THREADS']}"
    )
    print(
        f"{'mode':<15} {'ranks':>5} {'params/rank MiB':>16} {'store/rank MiB':>15} {'compile s':>10} "
        f"{'step ms':>9}  loss (rank 0)"
    )
    for ranks in args.ranks:
        for mode in MODES:
            need, have = estimated_bytes(mode, ranks, args.hidden), _available_bytes()
            if have and need > have // 2:
                print(
                    f"{mode:<15} {ranks:>5}  skipped: needs about {need / 2**30:.1f} GiB, "
                    f"{have / 2**30:.1f} GiB available (kept under half)"
                )
                continue
            try:
                row = measure_real(mode, ranks, args.hidden, args.batch, args.steps, args.timeout)
            except JobFailedError as failed:  # one cell failing (a loaded machine) leaves the others worth having
                print(f"{mode:<15} {ranks:>5}  failed: {_cause(str(failed))}", flush=True)
                continue
            print(
                f"{row['mode']:<15} {row['ranks']:>5} {row['param_mib']:>16.1f} {row['store_mib']:>15.1f} "
                f"{row['compile_s']:>10.1f} {row['step_ms']:>9.1f}  {row['loss']:.6g}",
                flush=True,
            )


def simulated(args: argparse.Namespace) -> None:
    print(
        f"{LAYERS}-layer MLP, hidden {args.hidden}, global batch {args.batch}, SGD, {args.steps} timed steps "
        "(rank simulator: step/rank = world time / ranks)"
    )
    print(f"{'mode':<15} {'ranks':>5} {'params/rank MiB':>16} {'step/rank ms':>13}  collectives per step")
    for ranks in args.ranks:
        for mode in MODES:
            row = measure_simulated(mode, ranks, args.hidden, args.batch, args.steps)
            print(
                f"{row['mode']:<15} {row['ranks']:>5} {row['param_mib']:>16.1f} {row['step_ms']:>13.1f}  "
                f"{row['collectives']}"
            )


if __name__ == "__main__":
    main()
