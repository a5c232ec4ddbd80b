"""One rank of benchmarks/data_parallel.py's tessel side; run under `tessel run -n N _dp_tessel.py ...`.

The seeds' MLP (Flatten + Dense 784-512-512-10 with ReLU), SGD lr 0.01, CrossEntropyLoss, DATA_PARALLEL with
gradients_mean=True, trained with Model.train on synthetic MNIST-shaped data (NumpySlicesDataset sharded with
num_shards / shard_id; learnable labels, so the loss must fall). For each mode in --modes (sink:
dataset_sink_mode=True, the daemon reads its own shard and runs an epoch per Execute; feed:
dataset_sink_mode=False, one Execute per step) it trains --epochs epochs of --steps steps and records each
epoch's wall time (epoch 1 includes compilation). Writes `rank<r>.json` into --out: epoch times, the losses, and
a float64 checksum of every parameter, so the caller can check that the ranks agree.
With --one-step it trains a single step and writes nothing (the launch-time job).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.communication import get_group_size, get_rank, init
from tessel.parallel.checkpoint import gather
from tessel.train import Callback

sys.path.insert(0, str(Path(__file__).parent))
from _dp_data import synthetic


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=32, help="per-rank batch")
    parser.add_argument("--steps", type=int, default=50, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=6, help="epochs per mode (the first is warm-up)")
    parser.add_argument(
        "--modes",
        default="sink,feed,zero1,zero3",
        help="comma-separated: sink, feed, zero1, zero3 (optimizer parallel)",
    )
    parser.add_argument("--out", type=Path, help="folder for rank<r>.json")
    parser.add_argument("--one-step", action="store_true", help="train one step of one batch and exit")
    return parser.parse_args()


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(
            nn.Dense(28 * 28, 512, weight_init="normal", bias_init="zeros"),
            nn.ReLU(),
            nn.Dense(512, 512, weight_init="normal", bias_init="zeros"),
            nn.ReLU(),
            nn.Dense(512, 10, weight_init="normal", bias_init="zeros"),
        )

    def construct(self, x):
        return self.dense_relu_sequential(self.flatten(x))


class EpochClock(Callback):
    """Wall time of each epoch and every step's loss."""

    def __init__(self):
        self.seconds: list[float] = []
        self.losses: list[float] = []
        self._started = 0.0

    def on_train_epoch_begin(self, run_context) -> None:
        self._started = time.perf_counter()

    def on_train_step_end(self, run_context) -> None:
        self.losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    def on_train_epoch_end(self, run_context) -> None:
        self.seconds.append(time.perf_counter() - self._started)


def main() -> None:
    args = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    init()
    ms.set_seed(1)
    rank, world = get_rank(), get_group_size()
    steps = 1 if args.one_step else args.steps
    images, labels = synthetic(world * args.batch * steps)
    data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False, num_shards=world, shard_id=rank)
    data = data.batch(args.batch, drop_remainder=True)
    net = Network()
    model = ms.Model(net, loss_fn=nn.CrossEntropyLoss(), optimizer=nn.SGD(net.trainable_params(), 1e-2))
    if args.one_step:
        model.train(1, data, dataset_sink_mode=True)
        return
    record: dict = {"rank": rank, "world": world, "batch": args.batch, "steps": steps, "modes": {}}
    for mode in args.modes.split(","):
        if mode.startswith("zero"):  # sink mode, optimizer parallel at level 1 or 3 (a new train step is compiled)
            config = {"optimizer_level": f"level{mode[4:]}"}
            ms.set_auto_parallel_context(enable_parallel_optimizer=True, parallel_optimizer_config=config)
        clock = EpochClock()
        model.train(args.epochs, data, callbacks=[clock], dataset_sink_mode=mode != "feed")
        record["modes"][mode] = {"epoch_seconds": clock.seconds, "losses": clock.losses}
    whole = gather([(p.name, p) for p in net.trainable_params()])  # level3 keeps blocks: gathered whole
    record["checksums"] = [float(np.asarray(v, np.float64).sum()) for v in whole.values()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
