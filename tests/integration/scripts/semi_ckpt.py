"""Checkpoints that follow the parameters, whatever the layout: train a Megatron MLP on 4 ranks (SEMI_AUTO, 2 x 2),
save it whole (integrated_save=True) and as slices (integrated_save=False, with a strategy file), then load it
into other worlds and strategies and check the evaluation loss is the trained one.

    tessel run -n 4 semi_ckpt.py train DIR         # trains, saves DIR/full.ckpt, DIR/slices/rank_k/, eval loss
    python semi_ckpt.py full DIR                    # one device, the full checkpoint
    python semi_ckpt.py slices DIR                  # one device, load_distributed_checkpoint of the 4 slices
    python semi_ckpt.py merged DIR                  # one device, transform_checkpoints' merged file
    tessel run -n 2 semi_ckpt.py dp DIR             # 2 ranks DATA_PARALLEL, the full checkpoint
    tessel run -n 4 semi_ckpt.py mp4 DIR            # 4 ranks SEMI_AUTO cut 1 x 4, the 4 slices
    tessel run -n 4 semi_ckpt.py same DIR           # 4 ranks cut 2 x 2 again, each loads its own slice file
    tessel run -n 2 semi_ckpt.py subset DIR         # only rank 0 saves: a clear error, not a deadlock
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.parallel import checkpoint

BATCH, IN, HIDDEN, OUT = 16, 12, 32, 8


class Net(nn.Cell):
    def __init__(self, dp: int = 1, mp: int = 1):
        super().__init__()
        rng = np.random.default_rng(3)
        self.w1 = ms.Parameter(ms.Tensor(rng.standard_normal((IN, HIDDEN)).astype(np.float32) * 0.3), name="w1")
        self.w2 = ms.Parameter(ms.Tensor(rng.standard_normal((HIDDEN, OUT)).astype(np.float32) * 0.3), name="w2")
        self.matmul1 = ops.MatMul().shard(((dp, 1), (1, mp)))
        self.relu = ops.ReLU().shard(((dp, mp),))
        self.matmul2 = ops.MatMul().shard(((dp, mp), (mp, 1)))

    def construct(self, x):
        return self.matmul2(self.relu(self.matmul1(x, self.w1)), self.w2)


def data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, IN)).astype(np.float32), rng.standard_normal((BATCH, OUT)).astype(np.float32)


def share(array: np.ndarray, world: int, rank: int, semi: bool) -> np.ndarray:
    size = BATCH // world
    return array[rank * size : (rank + 1) * size] if semi else array


def evaluate(net: Net, world: int, rank: int, semi: bool) -> float:
    x, y = data(99)
    loss = nn.WithLossCell(net, nn.MSELoss())(
        ms.Tensor(share(x, world, rank, semi)), ms.Tensor(share(y, world, rank, semi))
    )
    return float(loss.asnumpy())


def main() -> None:
    phase, folder = sys.argv[1], sys.argv[2]
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    world, rank = get_group_size(), get_rank()
    semi = phase in ("train", "mp4", "same", "subset")
    if semi:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)
    elif world > 1:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    net = Net(2, 2) if phase in ("train", "same") else Net(1, 4) if phase == "mp4" else Net(1, 2) if semi else Net()
    slices = [os.path.join(folder, "slices", f"rank_{r}", "net.ckpt") for r in range(4)]
    if phase == "train":
        optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
        step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
        for s in range(3):
            x, y = data(s)
            step(ms.Tensor(share(x, world, rank, True)), ms.Tensor(share(y, world, rank, True)))
        ms.save_checkpoint(net, os.path.join(folder, "full.ckpt"))
        ms.save_checkpoint(net, slices[rank], integrated_save=False)
        if rank == 0:
            checkpoint.save_strategy_file(net.trainable_params(), os.path.join(folder, "strategy.json"))
        loss = evaluate(net, world, rank, True)
        if rank == 0:
            with open(os.path.join(folder, "trained.json"), "w") as f:
                json.dump(loss, f)
        print(f"semi ckpt train on rank {rank}: eval loss {loss}")
        return
    if phase == "subset":
        evaluate(net, world, rank, semi)  # lays the parameters out
        if rank == 0:
            ms.save_checkpoint(net, os.path.join(folder, "subset.ckpt"))
        else:
            import time

            time.sleep(30)
        return
    if phase in ("full", "dp"):
        ms.load_param_into_net(net, ms.load_checkpoint(os.path.join(folder, "full.ckpt")))
    elif phase in ("slices", "mp4"):
        ms.parallel.load_distributed_checkpoint(net, slices)
    elif phase == "same":
        ms.load_checkpoint(slices[rank], net)
    elif phase == "merged":
        merged = os.path.join(folder, "merged")
        ms.parallel.transform_checkpoints(os.path.join(folder, "slices"), merged, "net")
        ms.load_checkpoint(os.path.join(merged, "rank_0", "net0.ckpt"), net)
    else:
        raise SystemExit(f"unknown phase {phase!r}")
    loss = evaluate(net, world, rank, semi)
    with open(os.path.join(folder, "trained.json")) as f:
        want = json.load(f)
    error = abs(loss - want) / abs(want)
    assert error <= 1e-6, (loss, want)
    print(f"semi ckpt {phase} ok on rank {rank} of {world}: eval loss {loss} (trained {want}, error {error:.2g})")


if __name__ == "__main__":
    main()
