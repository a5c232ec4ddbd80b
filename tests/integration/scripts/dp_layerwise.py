"""Run under `tessel run -n N dp_layerwise.py MODE`: DATA_PARALLEL with a Parameter(layerwise_parallel=True), as
MindSpore: that parameter's gradient is not all-reduced, so each rank updates its own copy from its own rows,
while the other parameters get the mean gradient over the ranks. Checked on every rank against a float64 numpy
simulation of the N ranks.

MODE: model (Model.train), sink (Model.train, dataset_sink_mode=True), loop (value_and_grad +
DistributedGradReducer + optimizer). Prints `layerwise <mode> ok on rank r of n: relative error E, own weight
differs from rank 0's by D`; any mismatch raises.
"""

import sys

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init

MODE = sys.argv[1]
IN, HIDDEN, OUT, PER_RANK, STEPS, LR = 6, 5, 3, 4, 8, 0.05

init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)


def initial():
    rng = np.random.default_rng(5)
    shapes = {"w1": (IN, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, OUT)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def data():
    rng = np.random.default_rng(17)
    x = rng.standard_normal((STEPS * PER_RANK * world, IN)).astype(np.float32)
    y = rng.standard_normal((STEPS * PER_RANK * world, OUT)).astype(np.float32)
    return x, y


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        values = initial()
        self.w1, self.b1 = ms.Parameter(ms.Tensor(values["w1"]), "w1"), ms.Parameter(ms.Tensor(values["b1"]), "b1")
        self.w2 = ms.Parameter(ms.Tensor(values["w2"]), "w2", layerwise_parallel=True)
        self.matmul = ops.MatMul()

    def construct(self, x):
        return self.matmul(self.matmul(x, self.w1) + self.b1, self.w2)


def reference():
    """float64 numpy of the N ranks: mean gradients for w1 and b1, each rank's own for its w2."""
    shared = {k: v.astype(np.float64) for k, v in initial().items() if k != "w2"}
    own = [initial()["w2"].astype(np.float64) for _ in range(world)]
    x_all, y_all = data()
    for step in range(STEPS):
        grads = []
        for r in range(world):  # rank r's rows of this step: its shard (rows r, r + N, ...), batch `step`
            x = x_all[r::world][step * PER_RANK : (step + 1) * PER_RANK].astype(np.float64)
            y = y_all[r::world][step * PER_RANK : (step + 1) * PER_RANK].astype(np.float64)
            h = x @ shared["w1"] + shared["b1"]
            dpred = 2 * (h @ own[r] - y) / y.size  # MSELoss: the mean over every element
            dh = dpred @ own[r].T
            grads.append({"w1": x.T @ dh, "b1": dh.sum(0), "w2": h.T @ dpred})
        for k in shared:
            shared[k] = shared[k] - LR * np.mean([g[k] for g in grads], axis=0)
        own = [w - LR * g["w2"] for w, g in zip(own, grads)]
    return {**shared, "w2": own[rank]}, own[0]


def dataset():
    x, y = data()
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank).batch(PER_RANK)


net = Net()
loss_fn = nn.MSELoss()
optimizer = nn.SGD(net.trainable_params(), LR)
if MODE in ("model", "sink"):
    ms.Model(net, loss_fn=loss_fn, optimizer=optimizer).train(1, dataset(), dataset_sink_mode=MODE == "sink")
else:

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    reducer = nn.DistributedGradReducer(optimizer.parameters)
    for x, y in dataset().create_tuple_iterator():
        _, grads = grad_fn(x, y)
        optimizer(reducer(grads))

want, rank0_w2 = reference()
mine = {"w1": net.w1, "b1": net.b1, "w2": net.w2}
worst = max(float(np.abs(mine[k].asnumpy() - want[k]).max() / np.abs(want[k]).max()) for k in want)
assert worst <= 1e-5, f"parameters differ from the {world}-rank simulation by {worst:.2e} relative"
apart = float(np.abs(want["w2"] - rank0_w2).max())
assert rank == 0 or apart > 1e-3, f"rank {rank}'s own w2 is rank 0's ({apart:.1e}): the test data cannot tell"
print(f"layerwise {MODE} ok on rank {rank} of {world}: relative error {worst:.1e}, own weight differs from rank 0's "
      f"by {apart:.2e}", flush=True)  # fmt: skip
