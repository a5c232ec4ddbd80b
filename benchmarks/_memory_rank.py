"""One rank of benchmarks/optimizer_parallel.py: trains an MLP with --mib MiB of weights (Dense layers of
--width) with Adam under DATA_PARALLEL, optimizer parallel at --level ("off", "level1", "level2", "level3"), a few
steps in sink mode, and writes `rank<r>.json` into --out: the bytes this rank's daemon holds of parameters,
gradients and optimizer state (from the layouts the step gave them, see `held_bytes`), the communication buffers,
the step times and the losses.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.communication import get_group_size, get_rank, init
from tessel.train import Callback

MIB = 2**20


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--level", default="off", choices=["off", "level1", "level2", "level3"])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--mib", type=int, default=128, help="weights, MiB (layers of width x width float32)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


class Network(nn.Cell):
    def __init__(self, width: int, layers: int):
        super().__init__()
        cells = []
        for _ in range(layers):
            cells += [nn.Dense(width, width, weight_init="normal", bias_init="zeros"), nn.ReLU()]
        self.body = nn.SequentialCell(*cells[:-1])

    def construct(self, x):
        return self.body(x)


class StepClock(Callback):
    def __init__(self):
        self.seconds, self.losses, self._started = [], [], 0.0

    def on_train_step_begin(self, run_context) -> None:
        self._started = time.perf_counter()

    def on_train_step_end(self, run_context) -> None:
        self.seconds.append(time.perf_counter() - self._started)
        self.losses.append(float(run_context.original_args().net_outputs.asnumpy()))


def held_bytes(params, optimizer, shards: dict, world: int) -> dict[str, int]:
    """What this rank's daemon must hold, by kind, from the layouts the train step gave each tensor:
    parameters (whole, or the level3 block) plus, at level3, the largest gathered weight alive at once (one layer's);
    optimizer state (moments, blocks when sharded); gradients: without optimizer parallel the whole gradient of
    every parameter (the buckets the backward writes into), with it each parameter's reduced block plus one whole
    layer gradient (a whole local gradient lives until its reduce-scatter has read it)."""

    def local(p) -> int:
        shape = p.layout.local_shape(p.shape) if p.layout is not None else p.shape
        return int(np.prod(shape)) * np.dtype(p.dtype.numpy).itemsize

    whole = {p.key: int(np.prod(p.shape)) * np.dtype(p.dtype.numpy).itemsize for p in params}
    level = next(iter(shards.values())).level if shards else "off"
    parameters = sum(local(p) for p in params)
    gathered = max((whole[k] for k, s in shards.items() if s.weights_sharded), default=0)
    state = sum(local(q) for q in optimizer.slot_parameters())
    if level == "off":
        gradients = sum(whole.values())
    else:
        blocks = sum(whole[k] // len(s.group) if k in shards else whole[k] for k, s in ((p.key, shards.get(p.key))
                     for p in params))  # fmt: skip
        gradients = blocks + max(whole.values())
    return {"parameters": parameters + gathered, "gradients": gradients, "optimizer": state}


def main() -> None:
    args = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    rank, world = get_rank(), get_group_size()
    if world > 1:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    if args.level != "off":
        config = {"optimizer_level": args.level}
        ms.set_auto_parallel_context(enable_parallel_optimizer=True, parallel_optimizer_config=config)
    ms.set_seed(1)
    layers = max(1, args.mib * MIB // (args.width * args.width * 4))
    net = Network(args.width, layers)
    rows = world * args.batch * args.steps
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, args.width)).astype(np.float32)
    y = rng.integers(0, args.width, rows).astype(np.int32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank).batch(args.batch)
    optimizer = nn.Adam(net.trainable_params(), 1e-4)
    model = ms.Model(net, nn.CrossEntropyLoss(), optimizer)
    clock = StepClock()
    model.train(2, data, callbacks=[clock], dataset_sink_mode=False)
    step = model._train_network._fused if hasattr(model._train_network, "_fused") else None
    shards = dict(getattr(step, "_shards", {}) or {})
    record = {
        "rank": rank,
        "world": world,
        "level": args.level,
        "held": held_bytes(net.trainable_params(), optimizer, shards, world),
        "weights": sum(int(np.prod(p.shape)) * 4 for p in net.trainable_params()),
        "seconds": clock.seconds,
        "losses": clock.losses,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
