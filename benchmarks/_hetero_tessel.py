"""One rank of benchmarks/heterogeneous.py's tessel side; run under `tessel run -n N --plugin cpu,half_speed:...`.

An MLP (Flatten + Dense 784-W-W-10 with ReLU; W=512 is the seeds' MLP), SGD lr 0.01, CrossEntropyLoss,
DATA_PARALLEL with gradients_mean=True and batch_split=--split ('even': MindSpore's split; 'speed': the coordinator
splits each global batch by the ranks' measured speeds), Model.train with dataset_sink_mode=True on synthetic
MNIST-shaped data sharded with num_shards / shard_id. Trains --epochs epochs of --steps global batches of
N x --batch rows and writes `rank<r>.json` into --out: each epoch's wall time, this rank's rows per step, the
losses, the daemon's plugin and a checksum of every parameter.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.common import rank_step
from tessel.communication import get_group_size, get_rank, init
from tessel.train import Callback

sys.path.insert(0, str(Path(__file__).parent))
from _dp_data import synthetic


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=512, help="hidden width")
    parser.add_argument("--batch", type=int, default=64, help="per-rank batch (the even split's)")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=6, help="epochs (the first is warm-up)")
    parser.add_argument("--split", default="even", help="batch_split: even, speed or fixed weights (e.g. 89,39)")
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<r>.json")
    return parser.parse_args()


class EpochClock(Callback):
    def __init__(self):
        self.seconds: list[float] = []
        self.rows: list[int] = []
        self.losses: list[float] = []
        self._started = 0.0

    def on_train_epoch_begin(self, run_context) -> None:
        self._started = time.perf_counter()

    def on_train_step_end(self, run_context) -> None:
        self.losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    def on_train_epoch_end(self, run_context) -> None:
        self.seconds.append(time.perf_counter() - self._started)
        self.rows.append(round(rank_step.gradient_weight() * self.batch))  # weight = share / per-rank batch


def _split(text: str):
    """batch_split's value: 'even', 'speed' or fixed weights written as comma-separated numbers."""
    return text if text in ("even", "speed") else tuple(float(w) for w in text.split(","))


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.DEBUG if os.environ.get("HETERO_DEBUG") else logging.INFO, format="%(message)s")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context(
        parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True, batch_split=_split(args.split)
    )
    init()
    ms.set_seed(1)
    rank, world = get_rank(), get_group_size()
    images, labels = synthetic(world * args.batch * args.steps)
    data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False, num_shards=world, shard_id=rank)
    data = data.batch(args.batch, drop_remainder=True)
    net = nn.SequentialCell(
        nn.Flatten(),
        nn.Dense(28 * 28, args.width, weight_init="normal", bias_init="zeros"),
        nn.ReLU(),
        nn.Dense(args.width, args.width, weight_init="normal", bias_init="zeros"),
        nn.ReLU(),
        nn.Dense(args.width, 10, weight_init="normal", bias_init="zeros"),
    )
    model = ms.Model(net, loss_fn=nn.CrossEntropyLoss(), optimizer=nn.SGD(net.trainable_params(), 1e-2))
    clock = EpochClock()
    clock.batch = args.batch
    model.train(args.epochs, data, callbacks=[clock], dataset_sink_mode=True)
    record = {"rank": rank, "world": world, "batch": args.batch, "steps": args.steps, "split": args.split}
    record.update(epoch_seconds=clock.seconds, rows=clock.rows, losses=clock.losses)
    record["checksums"] = [float(np.asarray(p.asnumpy(), np.float64).sum()) for p in net.trainable_params()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
