"""Where a data-parallel step's time goes: one rank of `tessel run -n N _dp_profile.py --batch B` trains the
benchmark's MLP in sink mode (the data_parallel.py setting), then runs the same sunk step program for --steps
steps with the daemon's per-instruction timings on, and writes `rank<r>.json` into --out: each instruction's label
and its mean milliseconds per step, and the whole step's.

--level picks optimizer parallel ("off", "level1", "level2", "level3"); --optimizer sgd or adam.
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
from tessel.v1 import daemon_pb2

sys.path.insert(0, str(Path(__file__).parent))
from _dp_data import synthetic
from _dp_tessel import Network


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--level", default="off")
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    if args.level != "off":
        ms.set_auto_parallel_context(enable_parallel_optimizer=True, parallel_optimizer_config={
            "optimizer_level": args.level})  # fmt: skip
    init()
    ms.set_seed(1)
    rank, world = get_rank(), get_group_size()
    images, labels = synthetic(world * args.batch * args.steps)
    data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False, num_shards=world, shard_id=rank)
    data = data.batch(args.batch, drop_remainder=True)
    net = Network()
    params = net.trainable_params()
    optimizer = nn.SGD(params, 1e-2) if args.optimizer == "sgd" else nn.Adam(params, 1e-3)
    model = ms.Model(net, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer)
    model.train(1, data, dataset_sink_mode=True)  # compiles, warms up
    runner = model._sink_runner(model._train_network._fused, data)  # the runner train() made, kept
    eng, entry = runner.engine, runner.entry
    prog = eng.expand(entry.program(eng, runner.call.batch_size()))
    batch = daemon_pb2.Instruction(next_batch=daemon_pb2.NextBatch(dataset=runner.name, outputs=runner.inputs))
    program = daemon_pb2.Program(instructions=[batch, *prog.instructions])
    feed: dict = {}
    for name, feeder in entry.feeders.items():
        feed[name] = feeder()
    eng.daemon.execute(eng.session, program, repeat=10, feed=feed)  # warm
    started = time.perf_counter()
    result = eng.daemon.execute(eng.session, program, repeat=args.steps, timings=True, feed=feed)
    wall = (time.perf_counter() - started) / args.steps * 1e3
    rows = [(label, seconds / args.steps * 1e3) for label, seconds in result.timings]
    record = {"rank": rank, "world": world, "batch": args.batch, "wall_ms": wall, "instructions": rows,
              "checksum": float(sum(np.asarray(p.asnumpy(), np.float64).sum() for p in params))}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
