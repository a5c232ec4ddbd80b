"""Run under `tessel run -n N dp_train.py MODE`: data-parallel training through the SDK, checked on every rank
against a float64 numpy reference of 1-rank training on the N-times global batch.

MODE: model (Model.train, feed mode), sink (Model.train, dataset_sink_mode=True, a per-step learning-rate list), loop
(custom loop: value_and_grad + DistributedGradReducer + optimizer), pynative (the custom loop in PYNATIVE_MODE), sum
(gradients_mean=False: the reference gets the sum of the N ranks' gradients), amp (Model.train at amp_level O2 with a
fixed loss scale of 128: float16 compute, so the reference is met to float16's rounding, 2e-3 relative), lossscale
(Model.train with DynamicLossScaleManager(2**10): TrainOneStepWithLossScaleCell traced as one program, its overflow
check on the all-reduced gradients), augment (sink mode over a shuffled source whose rows are flipped at random: the
reference trains on what one device's pipeline yields, so each rank must flip each of its rows as one device does),
groups (Model.train with a parameter group of its own learning rate and weight decay).
Prints `dp <mode> ok on rank r of n: relative error E, losses L0 ... L19`; any mismatch raises.
"""

import sys

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.train import LossMonitor

MODE = sys.argv[1]
IN, HIDDEN, OUT, PER_RANK, STEPS, LR, MOMENTUM = 12, 16, 5, 4, 20, 0.1, 0.9
# sink mode: a per-step list, which the daemons must apply step by step within the sink
RATES = [LR * (1 - 0.03 * s) for s in range(STEPS)] if MODE == "sink" else [LR] * STEPS
GROUP_LR, GROUP_DECAY = 0.05, 0.01  # groups mode: w1 and b1 in a parameter group of their own rate and decay

if MODE == "pynative":
    ms.set_context(mode=ms.PYNATIVE_MODE)
init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=MODE != "sum")
ms.set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": 0.0005}})  # >= 2 buckets


def initial():
    rng = np.random.default_rng(3)
    shapes = {"w1": (IN, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, OUT), "b2": (OUT,)}
    return {k: (rng.standard_normal(s) * 0.4).astype(np.float32) for k, s in shapes.items()}


def data():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((STEPS * PER_RANK * world, IN)).astype(np.float32)
    return x, (np.abs(x[:, :OUT]).argmax(1)).astype(np.int32)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        values = initial()
        self.w1, self.b1 = ms.Parameter(ms.Tensor(values["w1"]), "w1"), ms.Parameter(ms.Tensor(values["b1"]), "b1")
        self.w2, self.b2 = ms.Parameter(ms.Tensor(values["w2"]), "w2"), ms.Parameter(ms.Tensor(values["b2"]), "b2")
        self.matmul, self.relu = ops.MatMul(), nn.ReLU()

    def construct(self, x):
        if MODE == "augment":
            x = x.reshape(-1, IN)
        return self.matmul(self.relu(self.matmul(x, self.w1) + self.b1), self.w2) + self.b2


def source(**sharding):
    x, y = data()
    if MODE != "augment":
        return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, **sharding)
    images = ds.NumpySlicesDataset({"x": x.reshape(-1, 1, IN, 1), "y": y}, **sharding)  # 1 x IN images
    return images.map(ds.vision.RandomHorizontalFlip(), "x")


def global_batches():
    """What one device's pipeline yields, batch by batch of PER_RANK * world rows."""
    if MODE != "augment":
        return data()
    x, y = zip(*source().batch(PER_RANK * world).create_tuple_iterator(output_numpy=True))
    return np.concatenate(x).reshape(-1, IN), np.concatenate(y)


def reference():
    """float64 numpy: Momentum on batches of PER_RANK * world rows (the mean over them; sum mode: world x)."""
    p = {k: v.astype(np.float64) for k, v in initial().items()}
    v = {k: np.zeros_like(a) for k, a in p.items()}
    x_all, y_all = global_batches()
    losses, rows = [], PER_RANK * world
    for step in range(STEPS):
        x, y = x_all[step * rows : (step + 1) * rows].astype(np.float64), y_all[step * rows : (step + 1) * rows]
        z = x @ p["w1"] + p["b1"]
        h = np.maximum(z, 0)
        logits = h @ p["w2"] + p["b2"]
        e = np.exp(logits - logits.max(1, keepdims=True))
        prob = e / e.sum(1, keepdims=True)
        losses.append(-np.log(prob[np.arange(rows), y]).mean())
        # gradients_mean=False: each rank's gradient is the mean over its own rows, and the ranks' are summed.
        dlogits = (prob - np.eye(OUT)[y]) / (rows if MODE != "sum" else PER_RANK)
        dz = dlogits @ p["w2"].T * (z > 0)
        grads = {"w1": x.T @ dz, "b1": dz.sum(0), "w2": h.T @ dlogits, "b2": dlogits.sum(0)}
        for k in p:
            grouped = MODE == "groups" and k in ("w1", "b1")
            rate, decay = (GROUP_LR, GROUP_DECAY) if grouped else (RATES[step], 0.0)
            v[k] = MOMENTUM * v[k] + grads[k] + decay * p[k]
            p[k] = p[k] - rate * v[k]
    return p, losses


def dataset():
    return source(num_shards=world, shard_id=rank).batch(PER_RANK)


net = Net()
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.Momentum(net.trainable_params(), RATES if MODE == "sink" else LR, MOMENTUM)
if MODE == "groups":
    own = {"params": [net.w1, net.b1], "lr": GROUP_LR, "weight_decay": GROUP_DECAY}
    optimizer = nn.Momentum([own, {"params": [net.w2, net.b2]}], LR, MOMENTUM)
losses = []
if MODE in ("model", "sink", "sum", "amp", "lossscale", "augment", "groups"):

    class Record(LossMonitor):
        def on_train_step_end(self, run_context):
            outputs = run_context.original_args().net_outputs  # (loss, overflow, scale) from a loss-scaled step
            losses.append(float((outputs[0] if isinstance(outputs, tuple) else outputs).asnumpy()))

    if MODE == "amp":
        optimizer = nn.Momentum(net.trainable_params(), LR, MOMENTUM, loss_scale=128.0)
        scale = ms.FixedLossScaleManager(128.0, drop_overflow_update=False)
        model = ms.Model(net, loss_fn=loss_fn, optimizer=optimizer, amp_level="O2", loss_scale_manager=scale)
    elif MODE == "lossscale":
        scale = ms.DynamicLossScaleManager(2**10, 2, 50)
        model = ms.Model(net, loss_fn=loss_fn, optimizer=optimizer, loss_scale_manager=scale)
        assert isinstance(model.train_network, nn.TrainOneStepWithLossScaleCell)
    else:
        model = ms.Model(net, loss_fn=loss_fn, optimizer=optimizer)
    model.train(1, dataset(), callbacks=[Record(1)], dataset_sink_mode=MODE in ("sink", "augment"))
else:

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    reducer = nn.DistributedGradReducer(optimizer.parameters)
    for x, y in dataset().create_tuple_iterator():
        loss, grads = grad_fn(x, y)
        optimizer(reducer(grads))
        losses.append(float(loss.asnumpy()))

want, want_losses = reference()
mine = {"w1": net.w1, "b1": net.b1, "w2": net.w2, "b2": net.b2}
worst = max(float(np.abs(mine[k].asnumpy() - want[k]).max() / np.abs(want[k]).max()) for k in want)
assert len(losses) == STEPS, losses
TOLERANCE = 2e-3 if MODE == "amp" else 1e-5
assert worst <= TOLERANCE, f"parameters differ from 1-rank training on the global batch by {worst:.2e} relative"
print(f"dp {MODE} ok on rank {rank} of {world}: relative error {worst:.1e}", flush=True)
print("losses " + " ".join(f"{v:.7f}" for v in losses), flush=True)
print("reference " + " ".join(f"{v:.7f}" for v in want_losses), flush=True)
