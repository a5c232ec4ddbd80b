"""Model parallel vs data parallel for a 4-layer MLP (hidden 4096 by default): per-rank parameter bytes and step
time at 1, 2 and 4 ranks, through the SDK's SEMI_AUTO_PARALLEL path (shard() -> tessel.parallel.semi_auto ->
build_train_step -> rank programs).

Model parallel is Megatron's: layers 1 and 3 cut their weight by columns ((1, 1), (1, mp)), layers 2 and 4 by
rows ((1, mp), (mp, 1)), so each pair costs one AllReduce forward and one backward and each rank holds 1/mp of
every weight. Data parallel leaves every op unconfigured (batch cut over the ranks, weights replicated, one
bucketed gradient AllReduce).

The ranks run in one process on the rank-program simulator (compiler.rank_simulator), one after another, so the
step time printed per rank is the world's wall time divided by the number of ranks: it shows how the compute
splits, not what a cluster's overlap and network would add. For measured multi-process figures run the same
network under `tessel run -n N` once the engine's SEMI_AUTO path is in.

    python benchmarks/model_parallel.py                    # hidden 4096, batch 32, 3 steps
    python benchmarks/model_parallel.py --hidden 512       # quicker
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TESSEL_THREADS", "1")

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.compiler import SGD, bucket_allreduce, build_train_step, lower_rank_program, simulate
from tessel.parallel import trace_network
from tessel.parallel.semi_auto import partition_for_rank
from tessel.plugins.cpu.compute import CpuCompute

LAYERS = 4


class MLP(nn.Cell):
    """LAYERS MatMul + ReLU layers and a mean-square loss; `mp` > 0 shards them Megatron style."""

    def __init__(self, hidden: int, mp: int):
        super().__init__()
        rng = np.random.default_rng(0)
        self.weights = []
        self.matmuls = []
        self.relus = []
        for i in range(LAYERS):
            w = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
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


def measure(mode: str, ranks: int, hidden: int, batch: int, steps: int) -> dict:
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
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    print(f"{LAYERS}-layer MLP, hidden {args.hidden}, global batch {args.batch}, SGD, {args.steps} timed steps")
    print(f"{'mode':<15} {'ranks':>5} {'params/rank MiB':>16} {'step/rank ms':>13}  collectives per step")
    for ranks in args.ranks:
        for mode in ("data parallel", "model parallel"):
            row = measure(mode, ranks, args.hidden, args.batch, args.steps)
            print(
                f"{row['mode']:<15} {row['ranks']:>5} {row['param_mib']:>16.1f} {row['step_ms']:>13.1f}  "
                f"{row['collectives']}"
            )


if __name__ == "__main__":
    main()
