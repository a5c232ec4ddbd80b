"""Run under `tessel run -n N multi_copy_train.py MODE IMPORT K`: nn.MicroBatchInterleaved(WithLossCell(net), K)
trained with Model.train, every rank checked against a float64 numpy reference of ONE device training the same
network with the same K on the global batch (copy i = rows i, i + K, ... of the batch; the loss is the sum of the
copies' mean cross-entropies).

MODE: semi_auto or auto (a Megatron MLP: matmul1 cut by columns, matmul2 by rows; the loss is global, every rank
checks it) or data_parallel (gradients_mean=True; each rank's loss is the sum over the copies of its own rows, which
the reference computes too). IMPORT: full_batch (every rank reads the global batch) or data_parallel (each rank's
dataset shard). MULTI_COPY_SIZE=large in the environment: a network big enough for overlap. Prints
`multi-copy <mode> <import> k=K ok on rank r of n: loss error E`.
"""

import os
import sys

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.train import Callback

MODE, IMPORT, K = sys.argv[1], sys.argv[2], int(sys.argv[3])
IN, HIDDEN, OUT, GLOBAL_BATCH, STEPS, LR = 8, 16, 4, 16, 5, 0.25
if os.environ.get("MULTI_COPY_SIZE") == "large":  # enough work per copy for the schedule to overlap it
    IN, HIDDEN, GLOBAL_BATCH, LR = 256, 1024, 64, 0.05

init()
rank, world = get_rank(), get_group_size()
mode = {"semi_auto": ms.ParallelMode.SEMI_AUTO_PARALLEL, "auto": ms.ParallelMode.AUTO_PARALLEL,
        "data_parallel": ms.ParallelMode.DATA_PARALLEL}[MODE]  # fmt: skip
ms.set_auto_parallel_context(parallel_mode=mode, gradients_mean=True, full_batch=IMPORT == "full_batch")


def initial():
    rng = np.random.default_rng(3)
    return {
        k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in (("w1", (IN, HIDDEN)), ("w2", (HIDDEN, OUT)))
    }


def data():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((STEPS * GLOBAL_BATCH, IN)).astype(np.float32)
    return x, (np.abs(x[:, :OUT]).argmax(1)).astype(np.int32)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        values = initial()
        self.w1, self.w2 = ms.Parameter(ms.Tensor(values["w1"]), "w1"), ms.Parameter(ms.Tensor(values["w2"]), "w2")
        model_parallel = mode != ms.ParallelMode.DATA_PARALLEL
        self.matmul1 = ops.MatMul().shard(((1, 1), (1, world))) if model_parallel else ops.MatMul()
        self.relu = ops.ReLU().shard(((1, world),)) if model_parallel else ops.ReLU()
        self.matmul2 = ops.MatMul().shard(((1, world), (world, 1))) if model_parallel else ops.MatMul()

    def construct(self, x):
        return self.matmul2(self.relu(self.matmul1(x, self.w1)), self.w2)


def copies_loss_and_grads(p, x, y):
    """Sum over the K copies (rows i::K) of the copy's mean cross-entropy, and its gradients."""
    loss, grads = 0.0, {"w1": 0.0, "w2": 0.0}
    for i in range(K):
        xc, yc = x[i::K], y[i::K]
        h = np.maximum(xc @ p["w1"], 0)
        logits = h @ p["w2"]
        e = np.exp(logits - logits.max(1, keepdims=True))
        prob = e / e.sum(1, keepdims=True)
        loss += -np.log(prob[np.arange(len(yc)), yc]).mean()
        dlogits = (prob - np.eye(OUT)[yc]) / len(yc)
        dh = dlogits @ p["w2"].T * (h > 0)
        grads = {"w1": grads["w1"] + xc.T @ dh, "w2": grads["w2"] + h.T @ dlogits}
    return loss, grads


def reference():
    """The loss each step reports on this rank: the global one, or (data parallel) the sum over this rank's rows."""
    p = {k: v.astype(np.float64) for k, v in initial().items()}
    x_all, y_all = data()
    losses = []
    for step in range(STEPS):
        rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        x, y = x_all[rows].astype(np.float64), y_all[rows]
        loss, grads = copies_loss_and_grads(p, x, y)
        if MODE == "data_parallel":  # this rank's rows (MindSpore's shard rule: every world-th row from rank)
            loss, _ = copies_loss_and_grads(p, x[rank::world], y[rank::world])
        losses.append(loss)
        p = {k: p[k] - LR * grads[k] for k in p}
    return losses


def dataset():
    x, y = data()
    if IMPORT == "full_batch":
        return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(GLOBAL_BATCH)
    source = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank)
    return source.batch(GLOBAL_BATCH // world)


net = Net()
losses = []


class Record(Callback):
    def on_train_step_end(self, run_context):
        losses.append(float(run_context.original_args().net_outputs.asnumpy()))


interleaved = nn.MicroBatchInterleaved(nn.WithLossCell(net, nn.CrossEntropyLoss()), K)
model = ms.Model(interleaved, optimizer=nn.SGD(net.trainable_params(), LR))
model.train(1, dataset(), callbacks=[Record()], dataset_sink_mode=False)
want = reference()
assert len(losses) == STEPS, losses
worst = max(abs(a - b) / abs(b) for a, b in zip(losses, want))
assert worst <= 1e-5, f"losses {losses} differ from 1-device training with {K} copies {want} by {worst:.2e} relative"
print(f"multi-copy {MODE} {IMPORT} k={K} ok on rank {rank} of {world}: loss error {worst:.1e}", flush=True)
