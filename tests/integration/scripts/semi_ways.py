"""One sharded network trained one of five ways under SEMI_AUTO_PARALLEL; run standalone (plain python, a world
of 1) it writes its losses, run under `tessel run -n N` every rank checks its losses against them and that it
holds only its slice of each parameter.

    python semi_ways.py WAY reference.json          # standalone: writes the losses
    tessel run -n 4 semi_ways.py WAY reference.json  # every rank compares

WAY: jit (value_and_grad + optimizer in one @ms.jit step), loop (value_and_grad, then optimizer(grads)),
onestep (nn.TrainOneStepCell), cell (a custom Cell whose construct takes the gradients and updates), model
(Model.train on a sharded dataset), jit_full_batch (jit with full_batch=True: every rank is given the whole
batch; the host sends the daemon only the slices the plan reads, checked in bytes on the last step). After
training, `net(x)` on the trained slices must give each rank its share of the standalone network's output (inference
after parallel training; under full_batch the whole output).
"""

from __future__ import annotations

import json
import sys

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init

STEPS, BATCH, IN, HIDDEN, OUT = 4, 16, 12, 32, 8


class Net(nn.Cell):
    """A Megatron MLP: the first MatMul's weight split by columns, the second's by rows, dp copies of that."""

    def __init__(self, dp: int, mp: int):
        super().__init__()
        rng = np.random.default_rng(3)
        self.w1 = ms.Parameter(ms.Tensor(rng.standard_normal((IN, HIDDEN)).astype(np.float32) * 0.3), name="w1")
        self.w2 = ms.Parameter(ms.Tensor(rng.standard_normal((HIDDEN, OUT)).astype(np.float32) * 0.3), name="w2")
        self.matmul1 = ops.MatMul().shard(((dp, 1), (1, mp)))
        self.relu = ops.ReLU().shard(((dp, mp),))
        self.matmul2 = ops.MatMul().shard(((dp, mp), (mp, 1)))

    def construct(self, x):
        return self.matmul2(self.relu(self.matmul1(x, self.w1)), self.w2)


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    return [
        (rng.standard_normal((BATCH, IN)).astype(np.float32), rng.standard_normal((BATCH, OUT)).astype(np.float32))
        for _ in range(STEPS)
    ]


def train(way: str, world: int, rank: int) -> tuple[list[float], Net]:
    mp = 2 if world > 1 else 1
    net = Net(world // mp, mp)
    loss_fn = nn.MSELoss()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    share = BATCH // world
    data = [(x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]) for x, y in batches()]
    if way == "jit_full_batch":
        data = batches()

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    losses: list[float] = []
    if way in ("jit", "jit_full_batch"):

        @ms.jit
        def step(x, y):
            loss, grads = grad_fn(x, y)
            optimizer(grads)
            return loss

        losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for x, y in data[:-1]]
        losses.append(fed_bytes(lambda: float(step(ms.Tensor(data[-1][0]), ms.Tensor(data[-1][1])).asnumpy())))
    elif way == "loop":
        for x, y in data:
            loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
            optimizer(grads)
            losses.append(float(loss.asnumpy()))
    elif way == "onestep":
        step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
        losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for x, y in data]
    elif way == "cell":

        class Step(nn.Cell):
            def __init__(self):
                super().__init__(auto_prefix=False)
                self.net, self.optimizer = net, optimizer

            def construct(self, x, y):
                loss, grads = grad_fn(x, y)
                self.optimizer(grads)
                return loss

        step = Step()
        losses = [float(step(ms.Tensor(x), ms.Tensor(y)).asnumpy()) for x, y in data]
    elif way == "model":
        xs = np.concatenate([x for x, _ in batches()])
        ys = np.concatenate([y for _, y in batches()])
        # MindSpore's shard rule interleaves rows, so rank r's step-s batch is its share of global batch s.
        dataset = ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False, num_shards=world, shard_id=rank)
        model = ms.Model(net, loss_fn, optimizer)

        class Record(ms.train.Callback):
            def on_train_step_end(self, run_context):
                losses.append(float(np.asarray(run_context.original_args().net_outputs.asnumpy())))

        model.train(1, dataset.batch(share), callbacks=[Record()], dataset_sink_mode=False)
    else:
        raise SystemExit(f"unknown way {way!r}")
    return losses, net


def fed_bytes(run):
    """run(), its Execute's bytes sent to the daemon recorded by the profiler and printed; run()'s result."""
    import tempfile

    from tessel import profiler

    with tempfile.TemporaryDirectory() as folder:
        recorder = profiler.start(folder)
        out = run()
        fed = sum(e["args"]["bytes"] for e in recorder.events if e["name"].startswith("host→daemon"))
        profiler.stop()
    print(f"fed {fed} bytes in the last step", flush=True)
    return out


def main() -> None:
    way, reference = sys.argv[1], sys.argv[2]
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    world, rank = get_group_size(), get_rank()
    whole = way == "jit_full_batch"
    if world > 1:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=whole)
    losses, net = train(way, world, rank)
    probe = np.random.default_rng(5).standard_normal((BATCH, IN)).astype(np.float32)
    share = BATCH if whole else BATCH // world
    first = 0 if whole else rank * share
    predicted = net(ms.Tensor(probe[first : first + share])).asnumpy()
    if world == 1:
        with open(reference, "w") as f:
            json.dump({"losses": losses, "predicted": predicted.tolist()}, f)
        print(f"semi ways {way} standalone losses {losses}")
        return
    with open(reference) as f:
        reference = json.load(f)
    want = reference["losses"]
    error = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, want))
    assert len(losses) == len(want) == STEPS, (losses, want)
    expected = np.array(reference["predicted"], np.float32)[first : first + share]
    np.testing.assert_allclose(predicted, expected, rtol=1e-4, atol=1e-5)
    w1, w2 = net.w1.asnumpy(), net.w2.asnumpy()
    assert w1.shape == (IN, HIDDEN // 2) and w2.shape == (HIDDEN // 2, OUT), (w1.shape, w2.shape)
    assert net.w1.shape == (IN, HIDDEN) and net.w1.layout is not None
    print(f"semi ways {way} ok on rank {rank} of {world}: loss error {error:.3g}; losses {losses}")


if __name__ == "__main__":
    main()
