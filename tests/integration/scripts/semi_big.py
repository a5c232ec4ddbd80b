"""A model four times larger than one rank's share, built under no_init_parameters and trained one step under
SEMI_AUTO_PARALLEL on 4 ranks: each rank draws only its slices of the weights and of the optimizer's moments. The
arrays the rank allocates (tracemalloc's peak: numpy's buffers) stay near a quarter of the model, far from the
whole of it; the process's resident-memory growth is printed too (it adds gRPC's copies of what it sends).

    tessel run -n 4 semi_big.py
"""

from __future__ import annotations

import resource
import tracemalloc

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.nn.utils import no_init_parameters

IN, HIDDEN, OUT, BATCH = 2048, 8192, 2048, 8


class Megatron(nn.Cell):
    def __init__(self, mp: int):
        super().__init__()
        self.w1 = ms.Parameter(ms.common.initializer.initializer("normal", (IN, HIDDEN)), name="w1")
        self.w2 = ms.Parameter(ms.common.initializer.initializer("normal", (HIDDEN, OUT)), name="w2")
        self.matmul1 = ops.MatMul().shard(((1, 1), (1, mp)))
        self.relu = ops.ReLU().shard(((1, mp),))
        self.matmul2 = ops.MatMul().shard(((1, mp), (mp, 1)))

    def construct(self, x):
        return self.matmul2(self.relu(self.matmul1(x, self.w1)), self.w2)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def warm_up() -> None:
    small = nn.Dense(8, 8)
    step = nn.TrainOneStepCell(nn.WithLossCell(small, nn.MSELoss()), nn.SGD(small.trainable_params(), 0.1))
    step(ms.Tensor(np.ones((4, 8), np.float32)), ms.Tensor(np.ones((4, 8), np.float32)))


def main() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    world, rank = get_group_size(), get_rank()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True)
    warm_up()  # the first compile imports the compiler's libraries: measure after that
    before = peak_mb()
    tracemalloc.start()
    with no_init_parameters():
        net = Megatron(world)
        optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model_mb = 2 * (IN * HIDDEN + HIDDEN * OUT) * 4 / 2**20  # weights and one moment each
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, IN)).astype(np.float32)
    y = rng.standard_normal((BATCH, OUT)).astype(np.float32)
    loss = float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy())
    allocated = tracemalloc.get_traced_memory()[1] / 2**20
    grown = peak_mb() - before
    assert net.w1.asnumpy().shape == (IN, HIDDEN // world), net.w1.asnumpy().shape
    assert allocated < model_mb / 2, f"rank {rank} allocated {allocated:.0f} MB for a {model_mb:.0f} MB model"
    print(
        f"semi big ok on rank {rank} of {world}: model {model_mb:.0f} MB, arrays allocated at peak {allocated:.0f} MB, "
        f"resident memory grew {grown:.0f} MB, loss {loss}"
    )


if __name__ == "__main__":
    main()
