"""Recomputation under SEMI_AUTO_PARALLEL on N ranks (`tessel run -n N semi_recompute.py`): the same Megatron MLP
(with Dropout) trained three times in one job, plain, recomputed (`Cell.recompute()`: the collectives the parallel
pass inserts are recomputed too) and recomputed with mp_comm_recompute=False; every rank checks that the three
give identical losses and identical parameter slices, and prints one line."""

from __future__ import annotations

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init

STEPS, BATCH, IN, HIDDEN, OUT = 3, 16, 12, 32, 8


class Block(nn.Cell):
    def __init__(self, dp: int, mp: int):
        super().__init__()
        rng = np.random.default_rng(3)
        self.w1 = ms.Parameter(ms.Tensor(rng.standard_normal((IN, HIDDEN)).astype(np.float32) * 0.3), name="w1")
        self.w2 = ms.Parameter(ms.Tensor(rng.standard_normal((HIDDEN, OUT)).astype(np.float32) * 0.3), name="w2")
        self.matmul1 = ops.MatMul().shard(((dp, 1), (1, mp)))
        self.gelu = ops.GeLU().shard(((dp, mp),))
        self.dropout = nn.Dropout(p=0.25)
        self.matmul2 = ops.MatMul().shard(((dp, mp), (mp, 1)))
        self.tanh = ops.Tanh()

    def construct(self, x):
        h = self.dropout(self.gelu(self.matmul1(x, self.w1)))
        return self.tanh(self.matmul2(h, self.w2)) * 2.0


def train(world: int, rank: int, **recompute) -> tuple[list[float], list[np.ndarray]]:
    ms.set_seed(1)
    net = Block(world // 2, 2)
    if recompute:
        net.recompute(**recompute)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    step.set_train()
    rng = np.random.default_rng(11)
    share = BATCH // world
    losses = []
    for _ in range(STEPS):
        x = rng.standard_normal((BATCH, IN)).astype(np.float32)[rank * share : (rank + 1) * share]
        y = rng.standard_normal((BATCH, OUT)).astype(np.float32)[rank * share : (rank + 1) * share]
        losses.append(float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()))
    return losses, [p.asnumpy() for p in net.trainable_params()]


def copies_made() -> list[int]:
    """Counts of the copies each differentiation made (tessel.compiler.recompute.rematerialize's result)."""
    from tessel.compiler import autodiff

    made: list[int] = []
    rematerialize = autodiff.rematerialize

    def counted(*args):
        made.append(rematerialize(*args))
        return made[-1]

    autodiff.rematerialize = counted
    return made


def main() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    world, rank = get_group_size(), get_rank()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)
    made = copies_made()
    plain_losses, plain_params = train(world, rank)
    copies = {"plain": sum(made)}
    for comm in (True, False):
        made.clear()
        losses, params = train(world, rank, mp_comm_recompute=comm)
        copies[f"mp_comm_recompute={comm}"] = sum(made)
        assert losses == plain_losses, (comm, losses, plain_losses)
        for got, want in zip(params, plain_params):
            assert got.shape == want.shape and got.shape != (IN, HIDDEN), got.shape
            np.testing.assert_array_equal(got, want)
    # recomputing the communication copies the collectives the copies need as well
    assert copies["plain"] == 0 < copies["mp_comm_recompute=False"] < copies["mp_comm_recompute=True"], copies
    print(f"semi recompute ok on rank {rank} of {world}: copies {copies}, losses {plain_losses}")


if __name__ == "__main__":
    main()
