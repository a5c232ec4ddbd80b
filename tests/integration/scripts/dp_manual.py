"""Run under `tessel run -n N dp_manual.py`: the manual-parallel seed (every rank slices its rows of the batch by
get_rank(), the loss is ops.AllReduce()(loss) / N) trained with Model.train, checked against float64 numpy.

MindSpore's semantics (AllReduce(sum)' = AllReduce(sum)): the reported loss is the mean of the ranks' losses,
which at step 0 is the single-device loss of the whole batch; each rank's parameters then move by the gradient
of its own rows' mean loss. The reference simulates exactly that, rank by rank.
Prints `manual ok on rank r of n: step-0 loss L (single device S), relative error E`.
"""

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.train import LossMonitor

init()
cur_rank, device_num = get_rank(), get_group_size()
IN, HIDDEN, OUT, BATCH, STEPS, LR = 10, 12, 4, 4 * device_num, 6, 0.2
shard_size = BATCH // device_num


def initial():
    rng = np.random.default_rng(5)
    shapes = {"w1": (IN, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, OUT), "b2": (OUT,)}
    return {k: (rng.standard_normal(s) * 0.4).astype(np.float32) for k, s in shapes.items()}


def data():
    rng = np.random.default_rng(17)
    x = rng.standard_normal((STEPS * BATCH, IN)).astype(np.float32)
    return x, (np.abs(x[:, :OUT]).argmax(1)).astype(np.int32)


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        v = initial()
        self.w1, self.b1 = ms.Parameter(ms.Tensor(v["w1"]), "w1"), ms.Parameter(ms.Tensor(v["b1"]), "b1")
        self.w2, self.b2 = ms.Parameter(ms.Tensor(v["w2"]), "w2"), ms.Parameter(ms.Tensor(v["b2"]), "b2")
        self.matmul, self.relu = ops.MatMul(), nn.ReLU()

    def construct(self, x):
        x = x[cur_rank * shard_size : cur_rank * shard_size + shard_size]
        return self.matmul(self.relu(self.matmul(x, self.w1) + self.b1), self.w2) + self.b2


class ReduceLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.loss = nn.CrossEntropyLoss()
        self.all_reduce = ops.AllReduce()

    def construct(self, data, label):
        label = label[cur_rank * shard_size : cur_rank * shard_size + shard_size]
        return self.all_reduce(self.loss(data, label)) / device_num


def loss_and_grads(p, x, y):
    z = x @ p["w1"] + p["b1"]
    h = np.maximum(z, 0)
    logits = h @ p["w2"] + p["b2"]
    e = np.exp(logits - logits.max(1, keepdims=True))
    prob = e / e.sum(1, keepdims=True)
    dlogits = (prob - np.eye(OUT)[y]) / len(y)
    dz = dlogits @ p["w2"].T * (z > 0)
    loss = -np.log(prob[np.arange(len(y)), y]).mean()
    return loss, {"w1": x.T @ dz, "b1": dz.sum(0), "w2": h.T @ dlogits, "b2": dlogits.sum(0)}


def reference():
    ranks = [{k: v.astype(np.float64) for k, v in initial().items()} for _ in range(device_num)]
    x_all, y_all = data()
    losses = []
    for step in range(STEPS):
        x, y = x_all[step * BATCH : (step + 1) * BATCH].astype(np.float64), y_all[step * BATCH : (step + 1) * BATCH]
        step_losses = []
        for r, p in enumerate(ranks):
            rows = slice(r * shard_size, (r + 1) * shard_size)
            loss, grads = loss_and_grads(p, x[rows], y[rows])
            step_losses.append(loss)
            for k in p:
                p[k] -= LR * grads[k]
        losses.append(np.mean(step_losses))
    single, _ = loss_and_grads({k: v.astype(np.float64) for k, v in initial().items()}, *(a[:BATCH] for a in data()))
    return ranks[cur_rank], losses, single


x, y = data()
dataset = ds.NumpySlicesDataset({"image": x, "label": y}, shuffle=False).batch(BATCH)
net = Network()
losses = []


class Record(LossMonitor):
    def on_train_step_end(self, run_context):
        losses.append(float(run_context.original_args().net_outputs.asnumpy()))


model = ms.Model(net, loss_fn=ReduceLoss(), optimizer=nn.SGD(net.trainable_params(), LR))
model.train(1, dataset, callbacks=[Record(1)])
want, want_losses, single = reference()
mine = {"w1": net.w1, "b1": net.b1, "w2": net.w2, "b2": net.b2}
worst = max(float(np.abs(mine[k].asnumpy() - want[k]).max() / np.abs(want[k]).max()) for k in want)
np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
assert abs(losses[0] - single) <= 1e-5 * abs(single), (losses[0], single)
assert worst <= 1e-5, f"parameters differ from the reference by {worst:.2e} relative"
print(f"manual ok on rank {cur_rank} of {device_num}: step-0 loss {losses[0]:.6f} (single device {single:.6f}), "
      f"relative error {worst:.1e}", flush=True)  # fmt: skip
