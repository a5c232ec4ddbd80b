"""One rank of benchmarks/multi_copy.py: a Megatron MLP trained under SEMI_AUTO_PARALLEL with interleave_num copies.

    python benchmarks/_multi_copy_rank.py CONFIG_JSON      (started by the test bed inside its host)

CONFIG_JSON: {"hidden", "batch", "pairs", "copies": [k, ...], "warmup", "rounds", "recorded", "timeline"}. Each
layer pair is Megatron's: a MatMul cut by columns ((1, 1), (1, mp)), ReLU, a MatMul cut by rows ((1, mp), (mp, 1)),
so each pair costs one AllReduce forward; the loss is the mean square, replicated. Every rank reads the whole
batch (full_batch). One train step per k: nn.MicroBatchInterleaved(net, k) (k = 1: the network itself), each k
with its own copy of the network. The steps of the different k are timed interleaved, one of each per round
(each one Execute), so that load from elsewhere on a shared machine falls on all of them alike; then `recorded`
steps of each k run with the timeline on (ms.Profiler into timeline/k<k>). Rank 0 prints one JSON line:
{"k": [step ms, ...], ...}; a non-finite loss exits non-zero.
"""

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init


class MegatronMLP(nn.Cell):
    def __init__(self, hidden: int, pairs: int, mp: int):
        super().__init__()
        rng = np.random.default_rng(0)
        self.layers = []
        for i in range(2 * pairs):
            weight = rng.standard_normal((hidden, hidden), dtype=np.float32) / np.float32(math.sqrt(hidden))
            setattr(self, f"w{i}", ms.Parameter(ms.Tensor(weight), f"w{i}"))
            column = i % 2 == 0
            matmul = ops.MatMul().shard(((1, 1), (1, mp)) if column else ((1, mp), (mp, 1)))
            relu = ops.ReLU().shard(((1, mp),) if column else ((1, 1),))
            self.layers.append((getattr(self, f"w{i}"), matmul, relu))
        self.sub, self.square, self.mean = ops.Sub(), ops.Square(), ops.ReduceMean()
        self.sub.shard(((1, 1), (1, 1)))
        self.square.shard(((1, 1),))
        self.mean.shard(((1, 1),))

    def construct(self, x, y):
        for weight, matmul, relu in self.layers:
            x = relu(matmul(x, weight))
        return self.mean(self.square(self.sub(x, y)))


def main() -> None:
    config = json.loads(sys.argv[1])
    init()
    rank, world = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True)
    steps = {}
    for k in config["copies"]:  # a network of its own per k (the same initial weights)
        net = MegatronMLP(config["hidden"], config["pairs"], world)
        step_net = nn.MicroBatchInterleaved(net, k) if k > 1 else net
        steps[k] = nn.TrainOneStepCell(step_net, nn.SGD(net.trainable_params(), 1e-4))
    rng = np.random.default_rng(1)
    x = ms.Tensor(rng.standard_normal((config["batch"], config["hidden"]), dtype=np.float32))
    y = ms.Tensor(rng.standard_normal((config["batch"], config["hidden"]), dtype=np.float32) * 0.1)
    for step in steps.values():
        for _ in range(config["warmup"]):
            step(x, y)
    times: dict[int, list[float]] = {k: [] for k in steps}
    order = [k for _ in range(config["rounds"]) for k in steps]
    if not config.get("interleaved", True):
        order = sorted(order, key=list(steps).index)
    for k in order:
        start = time.perf_counter()
        loss = float(steps[k](x, y).asnumpy())
        times[k].append((time.perf_counter() - start) * 1e3)
        if not math.isfinite(loss):
            sys.exit(f"rank {rank} of {world}: interleave_num {k}: loss {loss}")
    for k, step in steps.items():
        profiler = ms.Profiler(output_path=str(Path(config["timeline"]) / f"k{k}"))
        for _ in range(config["recorded"]):
            step(x, y)
        profiler.analyse()
    if rank == 0:
        print(json.dumps({str(k): t for k, t in times.items()}), flush=True)


if __name__ == "__main__":
    main()
