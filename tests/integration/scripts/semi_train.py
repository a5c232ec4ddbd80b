"""Run under `tessel run -n N semi_train.py IMPORT`: SEMI_AUTO_PARALLEL training of a Megatron MLP
(matmul1.shard(((1, 1), (1, N))), matmul2.shard(((1, N), (N, 1)))) through Model.train, checked on every rank
against a float64 numpy reference of 1-rank training on the global batch.

IMPORT: data_parallel (full_batch=False: each rank's dataset shard is its slice of the batch), full_batch
(every rank reads the whole global batch) or full_batch_sink (the same in dataset sink mode: the daemon reads the
batches and keeps of the labels, which the loss reads data parallel, only its rows; w1 in a parameter group of its
own weight decay and per-step rates). Prints `semi <import> ok on
rank r of n: loss error E`.
"""

import sys

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.train import LossMonitor

IMPORT = sys.argv[1]
SINK = IMPORT == "full_batch_sink"
WHOLE = IMPORT in ("full_batch", "full_batch_sink")
IN, HIDDEN, OUT, GLOBAL_BATCH, STEPS, LR = 8, 16, 4, 8, 6, 0.5
# sink mode: w1 in a parameter group of its own weight decay and per-step rates (each step of a sink its own)
W1_RATES, W1_DECAY = [0.25 * (1 - 0.05 * s) for s in range(STEPS)], 0.02

init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, gradients_mean=True, full_batch=WHOLE)


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
        self.matmul1 = ops.MatMul().shard(((1, 1), (1, world)))
        self.relu = ops.ReLU().shard(((1, world),))
        self.matmul2 = ops.MatMul().shard(((1, world), (world, 1)))

    def construct(self, x):
        return self.matmul2(self.relu(self.matmul1(x, self.w1)), self.w2)


def reference():
    p = {k: v.astype(np.float64) for k, v in initial().items()}
    x_all, y_all = data()
    losses = []
    for step in range(STEPS):
        rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        x, y = x_all[rows].astype(np.float64), y_all[rows]
        h = np.maximum(x @ p["w1"], 0)
        logits = h @ p["w2"]
        e = np.exp(logits - logits.max(1, keepdims=True))
        prob = e / e.sum(1, keepdims=True)
        losses.append(-np.log(prob[np.arange(GLOBAL_BATCH), y]).mean())
        dlogits = (prob - np.eye(OUT)[y]) / GLOBAL_BATCH
        dh = dlogits @ p["w2"].T * (h > 0)
        g1 = x.T @ dh + (W1_DECAY * p["w1"] if SINK else 0.0)
        p = {"w1": p["w1"] - (W1_RATES[step] if SINK else LR) * g1, "w2": p["w2"] - LR * (h.T @ dlogits)}
    return losses


def dataset():
    x, y = data()
    if WHOLE:
        return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(GLOBAL_BATCH)
    source = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank)
    return source.batch(GLOBAL_BATCH // world)


net = Net()
losses = []


class Record(LossMonitor):
    def on_train_step_end(self, run_context):
        losses.append(float(run_context.original_args().net_outputs.asnumpy()))


groups = [{"params": [net.w1], "lr": W1_RATES, "weight_decay": W1_DECAY}, {"params": [net.w2], "lr": LR}]
optimizer = nn.SGD(groups if SINK else net.trainable_params(), [LR] * STEPS if SINK else LR)
model = ms.Model(net, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer)
model.train(1, dataset(), callbacks=[Record(1)], dataset_sink_mode=SINK)
if SINK:  # the labels arrive sliced: the daemon stores only this rank's rows of each batch it reads
    (*_, runner), *_ = model._sink_runners.values()
    cut = {name: (list(c.start), list(c.stop)) for name, c in zip(runner.inputs, runner.slices) if c.start}
    rows = GLOBAL_BATCH // world
    assert list(cut.values()) == [([rank * rows], [(rank + 1) * rows])], cut
want = reference()
assert len(losses) == STEPS, losses
worst = max(abs(a - b) / abs(b) for a, b in zip(losses, want))
assert worst <= 1e-5, f"losses {losses} differ from 1-rank training {want} by {worst:.2e} relative"
print(f"semi {IMPORT} ok on rank {rank} of {world}: loss error {worst:.1e}", flush=True)
