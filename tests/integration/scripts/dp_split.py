"""Run under `tessel run -n N dp_split.py SPLIT MODE`: speed-aware data parallelism (batch_split) through Model.train,
checked on every rank against a float64 numpy reference of one device on the global batch.

SPLIT: weights such as `1,2` or `1,1,3` (batch_split=(1, 2)), or `speed` (the coordinator's split by the daemons'
measurements, then by the job's step times). MODE: model (feed mode) or sink (dataset_sink_mode=True), with
optional flags after commas: `shuffle` (a shuffled dataset: each epoch must read that epoch's order, as one device
does), `loop` (Model.train(1, ...) once per epoch instead of one call), `custom` (a TrainOneStepCell subclass:
refused on every rank), `own` (a training loop of the script's own: refused on every rank), `layerwise` (a
layerwise_parallel parameter: refused on every rank).
Prints `split ok on rank r of n: relative error E, shares S` (S: this rank's rows per step, epoch by epoch).
"""

import logging
import sys

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.common import rank_step
from tessel.communication import get_group_size, get_rank, init
from tessel.core.errors import NotSupportedYetError

SPLIT, (MODE, *FLAGS) = sys.argv[1], sys.argv[2].split(",")
IN, HIDDEN, OUT, STEPS, EPOCHS, LR, MOMENTUM = 12, 16, 5, 6, 3, 0.1, 0.9

logging.basicConfig(level=logging.INFO, format="%(message)s")
init()
rank, world = get_rank(), get_group_size()
weights = "speed" if SPLIT == "speed" else tuple(float(w) for w in SPLIT.split(","))
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True, batch_split=weights)
ms.set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": 0.0005}})  # >= 2 buckets
PER_RANK = 6 if world == 2 else 5  # a global batch of 12 or 15 rows: shares 4:8 (1:2), 3:3:9 (1:1:3)
B = PER_RANK * world


def initial():
    rng = np.random.default_rng(3)
    shapes = {"w1": (IN, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, OUT), "b2": (OUT,)}
    return {k: (rng.standard_normal(s) * 0.4).astype(np.float32) for k, s in shapes.items()}


def data():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((STEPS * B, IN)).astype(np.float32)
    return x, (np.abs(x[:, :OUT]).argmax(1)).astype(np.int32)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        values = initial()
        self.w1, self.b1 = ms.Parameter(ms.Tensor(values["w1"]), "w1"), ms.Parameter(ms.Tensor(values["b1"]), "b1")
        self.w2, self.b2 = ms.Parameter(ms.Tensor(values["w2"]), "w2"), ms.Parameter(ms.Tensor(values["b2"]), "b2")
        self.matmul, self.relu = ops.MatMul(), nn.ReLU()

    def construct(self, x):
        return self.matmul(self.relu(self.matmul(x, self.w1) + self.b1), self.w2) + self.b2


def one_device_batches():
    """Each epoch's global batches as one device reads them: consecutive B rows, or the one-device dataset's
    batches of B rows when shuffled (epoch e in its order of epoch e)."""
    x_all, y_all = data()
    if "shuffle" not in FLAGS:
        return [[(x_all[j * B : (j + 1) * B], y_all[j * B : (j + 1) * B]) for j in range(STEPS)]] * EPOCHS
    whole = ds.NumpySlicesDataset({"x": x_all, "y": y_all}, shuffle=True).batch(B)
    return [list(whole.create_tuple_iterator(num_epochs=1, output_numpy=True)) for _ in range(EPOCHS)]


def reference():
    """float64 numpy: Momentum on the one device's global batches, EPOCHS times over the data."""
    p = {k: v.astype(np.float64) for k, v in initial().items()}
    v = {k: np.zeros_like(a) for k, a in p.items()}
    for epoch in one_device_batches():
        for x, y in epoch:
            x = x.astype(np.float64)
            z = x @ p["w1"] + p["b1"]
            h = np.maximum(z, 0)
            logits = h @ p["w2"] + p["b2"]
            e = np.exp(logits - logits.max(1, keepdims=True))
            prob = e / e.sum(1, keepdims=True)
            dlogits = (prob - np.eye(OUT)[y]) / B
            dz = dlogits @ p["w2"].T * (z > 0)
            grads = {"w1": x.T @ dz, "b1": dz.sum(0), "w2": h.T @ dlogits, "b2": dlogits.sum(0)}
            for k in p:
                v[k] = MOMENTUM * v[k] + grads[k]
                p[k] = p[k] - LR * v[k]
    return p


x, y = data()
source = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle="shuffle" in FLAGS, num_shards=world, shard_id=rank)
net = Net()
optimizer = nn.Momentum(net.trainable_params(), LR, MOMENTUM)
if "custom" in FLAGS or "own" in FLAGS:

    class OwnStep(nn.TrainOneStepCell):  # a construct of its own: its reducer's mean knows no shares
        def construct(self, *inputs):
            return super().construct(*inputs)

    kind = OwnStep if "custom" in FLAGS else nn.TrainOneStepCell
    cell = kind(nn.WithLossCell(net, nn.CrossEntropyLoss()), optimizer)
    try:
        if "custom" in FLAGS:
            ms.Model(cell).train(1, source.batch(PER_RANK), dataset_sink_mode=False)
        else:
            for xs, ys in source.batch(PER_RANK).create_tuple_iterator():
                cell(xs, ys)
    except NotSupportedYetError as error:
        print(f"split refused on rank {rank}: {error}", flush=True)
        sys.exit(0)
    raise SystemExit("batch_split with a step of its own ran")
model = ms.Model(net, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer)
if "layerwise" in FLAGS:  # a parameter no rank's gradient reduction averages: its update would keep the share weight
    net.w1.layerwise_parallel = True
    try:
        model.train(1, source.batch(PER_RANK), dataset_sink_mode=False)
    except NotSupportedYetError as error:
        print(f"split refused on rank {rank}: {error}", flush=True)
        sys.exit(0)
    raise SystemExit("batch_split with a layerwise_parallel parameter ran")
shares = []


class Shares(ms.train.Callback):
    def on_train_step_end(self, run_context):
        if not shares or shares[-1][0] != run_context.original_args().cur_epoch_num:
            shares.append((run_context.original_args().cur_epoch_num, rank_step.gradient_weight() * B / world))


batches = source.batch(PER_RANK)
if "loop" in FLAGS:  # one call per epoch: the dataset and the coordinator's rounds go on from call to call
    for _ in range(EPOCHS):
        model.train(1, batches, callbacks=[Shares()], dataset_sink_mode=MODE == "sink")
        shares[-1] = (None, shares[-1][1])  # each call's epoch is its epoch 1: the next call's is a new one
else:
    model.train(EPOCHS, batches, callbacks=[Shares()], dataset_sink_mode=MODE == "sink")
want = reference()
mine = {"w1": net.w1, "b1": net.b1, "w2": net.w2, "b2": net.b2}
worst = max(float(np.abs(mine[k].asnumpy() - want[k]).max() / np.abs(want[k]).max()) for k in want)
assert worst <= 1e-5, f"parameters differ from one device on the global batch by {worst:.2e} relative"
assert rank_step.gradient_weight() == 1.0  # reset after train
print(
    f"split ok on rank {rank} of {world}: relative error {worst:.1e}, shares "
    + " ".join(str(round(s)) for _, s in shares),
    flush=True,
)
