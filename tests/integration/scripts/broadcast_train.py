"""Run under `tessel run -n N broadcast_train.py`: every rank draws different initial weights; with
parameter_broadcast=True, Model.train (DATA_PARALLEL) starts all of them from rank 0's, so training equals 1-rank
training from rank 0's weights on the global batch; without it, the replica check names the parameter.
Prints `broadcast ok on rank r of n: parameter error E` and `unbroadcast caught on rank r: <message>`."""

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.communication import get_group_size, get_rank, init
from tessel.core.errors import ConfigurationError

init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
IN, OUT, ROWS, STEPS, LR = 6, 3, 4, 5, 0.3


def data():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((STEPS * ROWS * world, IN)).astype(np.float32)
    return x, (x[:, :OUT].argmax(1)).astype(np.int32)


def train(broadcast: bool, loop: bool = False) -> nn.Dense:
    """Model.train, or (loop) the custom loop value_and_grad + DistributedGradReducer + optimizer."""
    ms.set_auto_parallel_context(parameter_broadcast=broadcast)
    ms.set_seed(100 + rank)  # a different initialisation on every rank
    net = nn.Dense(IN, OUT)
    x, y = data()
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank).batch(ROWS)
    loss_fn, optimizer = nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), LR)
    if not loop:
        ms.Model(net, loss_fn, optimizer).train(1, dataset)
        return net
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, optimizer.parameters)
    reducer = nn.DistributedGradReducer(optimizer.parameters)
    for a, b in dataset.create_tuple_iterator():
        _, grads = grad_fn(a, b)
        optimizer(reducer(grads))
    return net


def reference() -> dict[str, np.ndarray]:
    ms.set_seed(100)  # rank 0's initialisation
    net = nn.Dense(IN, OUT)
    w, b = net.weight.asnumpy().astype(np.float64), net.bias.asnumpy().astype(np.float64)
    x_all, y_all = data()
    rows = ROWS * world
    for step in range(STEPS):
        x, y = x_all[step * rows : (step + 1) * rows].astype(np.float64), y_all[step * rows : (step + 1) * rows]
        logits = x @ w.T + b
        e = np.exp(logits - logits.max(1, keepdims=True))
        dlogits = (e / e.sum(1, keepdims=True) - np.eye(OUT)[y]) / rows
        w, b = w - LR * dlogits.T @ x, b - LR * dlogits.sum(0)
    return {"weight": w, "bias": b}


want = reference()
for loop in (False, True):
    net = train(True, loop)
    got = {"weight": net.weight.asnumpy(), "bias": net.bias.asnumpy()}
    error = max(float(np.abs(got[k] - want[k]).max() / np.abs(want[k]).max()) for k in want)
    assert error <= 1e-5, f"parameters differ from 1-rank training from rank 0's weights by {error:.2e}"
    print(f"broadcast {'loop' if loop else 'model'} ok on rank {rank} of {world}: parameter error {error:.1e}")
try:
    train(False)
except ConfigurationError as caught:
    print(f"unbroadcast caught on rank {rank}: {caught}", flush=True)
