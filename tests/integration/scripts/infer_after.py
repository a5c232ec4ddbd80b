"""Inference after parallel training, under one parallel mode: `Model.train` on a sharded dataset, then
`model.eval`, `model.predict` and `net(x)` on the trained (possibly sliced) parameters, each checked on every rank
against float64 numpy run on the full trained parameters (gathered by `save_checkpoint`, which writes the whole
parameters under every mode) — the one-device answer.

    tessel run -n N infer_after.py MODE DIR     # MODE: data_parallel | semi_auto | auto_parallel | hybrid

What each call returns is MindSpore's: under DATA_PARALLEL and HYBRID_PARALLEL every rank runs the whole network
on its own batch; under SEMI_AUTO / AUTO the batch is split across the ranks (dataset_strategy data_parallel), a
rank's `predict` / `net(x)` output is its rows of the global output and the loss is the global batch's.
Prints `infer after MODE ok on rank r of n`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init

BATCH, IN, HIDDEN, OUT, STEPS = 16, 12, 32, 8, 4
MODES = {
    "data_parallel": ms.ParallelMode.DATA_PARALLEL,
    "semi_auto": ms.ParallelMode.SEMI_AUTO_PARALLEL,
    "auto_parallel": ms.ParallelMode.AUTO_PARALLEL,
    "hybrid": ms.ParallelMode.HYBRID_PARALLEL,
}


class Net(nn.Cell):
    """A Megatron MLP: under SEMI_AUTO the first weight is split by columns and the second by rows."""

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


def numpy_net(w1: np.ndarray, w2: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.maximum(x.astype(np.float64) @ w1, 0.0) @ w2


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    world, rank = get_group_size(), get_rank()
    ms.set_auto_parallel_context(parallel_mode=MODES[mode], gradients_mean=mode != "hybrid")
    split = mode in ("semi_auto", "auto_parallel")  # the batch is split across the ranks inside the network
    share = BATCH // world
    rng = np.random.default_rng(11)
    xs = rng.standard_normal((BATCH * STEPS, IN)).astype(np.float32)
    ys = rng.standard_normal((BATCH * STEPS, OUT)).astype(np.float32)

    net = Net(world // 2, 2)
    model = ms.Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9), metrics={"loss", "mae"})
    train = ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False, num_shards=world, shard_id=rank)
    model.train(1, train.batch(share), dataset_sink_mode=False)

    ms.save_checkpoint(net, str(out / f"trained_{mode}_{rank}.ckpt"))
    full = ms.load_checkpoint(str(out / f"trained_{mode}_{rank}.ckpt"))
    w1, w2 = full["w1"].asnumpy().astype(np.float64), full["w2"].asnumpy().astype(np.float64)
    assert w1.shape == (IN, HIDDEN) and w2.shape == (HIDDEN, OUT), (w1.shape, w2.shape)
    if split:
        assert net.w1.asnumpy().shape == (IN, HIDDEN // 2), net.w1.asnumpy().shape  # the slices stayed sliced

    # eval: each rank's shard of an eval set; the loss is over the rows the network sees as one batch
    ex = np.random.default_rng(7).standard_normal((BATCH * 2, IN)).astype(np.float32)
    ey = np.random.default_rng(8).standard_normal((BATCH * 2, OUT)).astype(np.float32)
    evaluation = ds.NumpySlicesDataset({"x": ex, "y": ey}, shuffle=False, num_shards=world, shard_id=rank)
    metrics = model.eval(evaluation.batch(share), dataset_sink_mode=False)
    rows = [np.arange(s * BATCH, (s + 1) * BATCH) for s in range(2)]  # the global batches
    mine = [r[rank::world] for r in rows]  # MindSpore's shard rule interleaves rows: this rank's share of each
    # the loss is the network's: over the global batch when it is split inside the network; MAE is computed on the
    # rows this rank's network returns (MindSpore's MAE: the errors' sum over the number of samples)
    losses = [np.mean((numpy_net(w1, w2, ex[r]) - ey[r]) ** 2) for r in (rows if split else mine)]
    want_loss = float(np.mean(losses))
    errors = np.concatenate([numpy_net(w1, w2, ex[r]) - ey[r] for r in mine])
    want_mae = float(np.abs(errors).sum() / len(errors))
    assert abs(metrics["loss"] - want_loss) <= 1e-5 * max(1.0, want_loss), (metrics, want_loss)
    assert abs(metrics["mae"] - want_mae) <= 1e-5 * max(1.0, want_mae), (metrics, want_mae)

    # predict and net(x): this rank's rows of a global batch
    probe = np.random.default_rng(5).standard_normal((BATCH, IN)).astype(np.float32)
    local = probe[rank * share : (rank + 1) * share]
    want = numpy_net(w1, w2, local)
    for how, got in (("predict", model.predict(ms.Tensor(local))), ("net(x)", net(ms.Tensor(local)))):
        got = got.asnumpy()
        assert got.shape == want.shape, (how, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=how)
    print(f"infer after {mode} ok on rank {rank} of {world}: eval {metrics}")


if __name__ == "__main__":
    main()
