"""One rank of benchmarks/data_parallel.py's PyTorch side: DistributedDataParallel over gloo.

The same MLP (Flatten + Linear 784-512-512-10 with ReLU), SGD lr 0.01, CrossEntropyLoss, per-rank batch and
synthetic data as _dp_tessel.py (the same rows, sharded the same way: rank k gets rows k, k + N, ...), with
torch.set_num_threads(--threads). Trains --epochs epochs of --steps steps and writes `rank<r>.json` into --out
with each epoch's wall time (epoch 1 is warm-up), the losses and a float64 checksum of every parameter.
"""

from __future__ import annotations

import argparse
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
    return parser.parse_args()


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
        nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    seconds, losses = [], []
    for _ in range(args.epochs):
        started = time.perf_counter()
        for x, y in batches:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            optimizer.step()
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
