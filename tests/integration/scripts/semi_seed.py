"""Run under `tessel run -n N semi_seed.py VARIANT`: the semi-auto tutorial's SemiAutoParallelNet (seed 002) trained
by Model.train with the default data import (full_batch=False, each rank's dataset sharded with num_shards/shard_id),
checked on every rank against a float64 numpy reference of 1-device training on the global batch.

VARIANT: unconfigured (fc.shard(((1, 1), (1, 2))), then an ops.MatMul() without a strategy: data parallel over all
ranks) or reschedule (fc ((1, 1), (1, 2)) then fc2 ((N, 1), (1, 1)): the framework inserts StridedSlice/AllGather).
The seed's np.random.rand weights are centred and scaled so that a few SGD steps on an MSE loss stay finite.
Prints `semi seed <variant> ok on rank r of n: loss error E`.
"""

import sys

import numpy as np

import tessel as ms
import tessel.dataset as ds
import tessel.parallel
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.train import Callback, Model

VARIANT = sys.argv[1]
HIDDEN, GLOBAL_BATCH, STEPS, LR = 128, 16, 4, 1e-4

init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, gradients_mean=True)
rng = np.random.default_rng(2)
WEIGHT = ((rng.random((HIDDEN, HIDDEN)) - 0.5) * 0.2).astype(np.float32)  # both weights start from it, as the seed
X = rng.random((STEPS * GLOBAL_BATCH, HIDDEN)).astype(np.float32)
T = (rng.standard_normal(STEPS * GLOBAL_BATCH) * 3).astype(np.float32)


class SemiAutoParallelNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(WEIGHT))
        self.weight2 = ms.Parameter(ms.Tensor(WEIGHT))
        self.fc = ops.MatMul().shard(((1, 1), (1, 2)))
        self.fc2 = ops.MatMul().shard(((world, 1), (1, 1))) if VARIANT == "reschedule" else None
        self.reduce = ops.ReduceSum()

    def construct(self, x):
        x = self.fc(x, self.weight)
        x = self.fc2(x, self.weight2) if self.fc2 is not None else ops.MatMul()(x, self.weight2)
        return self.reduce(x, -1)


def reference(lr: float) -> list[float]:
    """Losses of 1-device SGD on the global batches, in float64."""
    w1, w2 = WEIGHT.astype(np.float64), WEIGHT.astype(np.float64)
    losses = []
    for step in range(STEPS):
        rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        x, t = X[rows].astype(np.float64), T[rows].astype(np.float64)
        h = x @ w1
        y = (h @ w2).sum(-1)
        losses.append(float(((y - t) ** 2).mean()))
        dz = np.repeat((2 * (y - t) / GLOBAL_BATCH)[:, None], HIDDEN, 1)
        w1, w2 = w1 - lr * (x.T @ (dz @ w2.T)), w2 - lr * (h.T @ dz)
    return losses


class Record(Callback):
    def __init__(self):
        self.losses = []

    def on_train_step_end(self, run_context):
        self.losses.append(float(run_context.original_args().net_outputs.asnumpy()))


net = SemiAutoParallelNet()
source = ds.NumpySlicesDataset({"x": X, "t": T}, shuffle=False, num_shards=world, shard_id=rank)
record = Record()
model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), LR))
model.train(1, source.batch(GLOBAL_BATCH // world), callbacks=[record], dataset_sink_mode=False)
want, frozen = reference(LR), reference(0.0)
assert max(abs(a - b) / b for a, b in zip(want, frozen)) > 1e-2, "the reference does not depend on the updates"
assert len(record.losses) == STEPS, record.losses
worst = max(abs(a - b) / abs(b) for a, b in zip(record.losses, want))
assert worst <= 1e-5, f"losses {record.losses} differ from 1-device training {want} by {worst:.2e} relative"
plan = tessel.parallel.plan(net, ((GLOBAL_BATCH, HIDDEN), np.float32), device_num=world)
assert plan.local_value(net.weight.key, WEIGHT, rank).shape == (HIDDEN, HIDDEN // 2)  # the seed: "sliced in two"
print(f"semi seed {VARIANT} ok on rank {rank} of {world}: loss error {worst:.1e}", flush=True)
