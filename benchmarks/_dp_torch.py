"""One rank of benchmarks/data_parallel.py's PyTorch side: DistributedDataParallel over gloo.

The same MLP (Flatten + Linear 784-512-512-10 with ReLU), SGD lr 0.01, CrossEntropyLoss, per-rank batch and
synthetic data as _dp_tessel.py (the same rows, sharded the same way: rank k gets rows k, k + N, ...), with
torch.set_num_threads(--threads). Trains --epochs epochs of --steps steps and writes `rank<r>.json` into --out
with each epoch's wall time (epoch 1 is warm-up), the losses and a float64 checksum of every parameter.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _dp_data import synthetic


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    for name in ("rank", "world", "port", "batch", "steps", "epochs", "threads"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--width", type=int, default=512, help="hidden width (512: the seeds' MLP)")
    parser.add_argument(
        "--slowdown",
        type=float,
        default=1.0,
        help="emulated slower device: each step's compute takes this many times as long (a sleep after it)",
    )
    return parser.parse_args()


def _compute_seconds(model, loss_fn, x, y) -> float:
    """One step's forward, backward and SGD update alone (a copy of the local model, no all-reduce), the least CPU
    time of 10: what an emulated slower device stretches, as the emulated tessel plugins stretch each program to
    the least CPU time of its runs (benchmarks/plugins/emulated.py). Not the wall time of the step, which would
    stretch the waits for the other rank too and, on a machine shared with other work, the waits for a core."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    for _ in range(12):  # the first two: warm-up
        started = time.process_time()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
        times.append(time.process_time() - started)
    return min(times[2:])


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=60),
    )
    images, labels = synthetic(args.world * args.batch * args.steps)
    shard_x = torch.from_numpy(images[args.rank :: args.world].copy())
    shard_y = torch.from_numpy(labels[args.rank :: args.world].astype("int64"))
    batches = [(shard_x[i : i + args.batch], shard_y[i : i + args.batch]) for i in range(0, len(shard_x), args.batch)]
    model = nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, 10),
    )
    loss_fn = nn.CrossEntropyLoss()
    stretch = (args.slowdown - 1.0) * _compute_seconds(model, loss_fn, *batches[0]) if args.slowdown != 1.0 else 0.0
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    seconds, losses = [], []
    for _ in range(args.epochs):
        started = time.perf_counter()
        for x, y in batches:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            optimizer.step()
            time.sleep(stretch)
            losses.append(float(loss.detach()))
        seconds.append(time.perf_counter() - started)
    checksums = [float(p.detach().double().sum()) for p in model.parameters()]
    dist.destroy_process_group()
    record = {"rank": args.rank, "world": args.world, "batch": args.batch, "steps": len(batches)}
    record["modes"] = {"ddp": {"epoch_seconds": seconds, "losses": losses}}
    record["checksums"] = checksums
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{args.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
