"""AUTO_PARALLEL's three search modes reproduce the standalone run: an MLP, a conv net and a net whose weight is used
by two ops, 20 steps, nothing configured by the user (the planner decides every op).

    python auto_modes.py NET MODE reference.json            # standalone: writes the losses
    tessel run -n 4 auto_modes.py NET MODE reference.json   # every rank compares (relative error <= 1e-5)
    ... NET MODE reference.json SAVE.json [LOAD.json]       # and writes the strategy file (loading another first)

MODE may end in "+full_batch" ("dynamic_programming+full_batch"): full_batch=True, every rank feeds the whole batch
(the planner slices it where its ops want); otherwise each rank feeds its own rows (full_batch=False). Under
full_batch one more step is recorded with the profiler: the bytes the host sends the daemon must be the slices the
rank's plan reads (an input the plan reads only in slices is cut on the host, not sent whole), printed as "fed N
bytes of the whole batch's W, the plan's slices S"; and a plan reading some input in slices must send less than the
whole batch. MODE may be a
comma-separated list: one job then trains a fresh network under each mode in turn (the plans are keyed by search
mode, so each is searched anew), which saves a job start per mode.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init

STEPS, BATCH = 20, 16


class Mlp(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.relu = nn.Dense(32, 64), nn.Dense(64, 16), nn.ReLU()

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


class ConvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 8, 3, pad_mode="same")
        self.relu, self.flatten, self.fc = nn.ReLU(), nn.Flatten(), nn.Dense(8 * 6 * 6, 16)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


class Tied(nn.Cell):
    """One weight, two uses: encode with w, decode with its transpose."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(2)
        self.w = ms.Parameter(ms.Tensor(rng.standard_normal((16, 32)).astype(np.float32) * 0.2), name="w")
        self.encode, self.decode = ops.MatMul(), ops.MatMul(transpose_b=True)
        self.relu = ops.ReLU()

    def construct(self, x):
        return self.decode(self.relu(self.encode(x, self.w)), self.w)


class Rows(nn.Cell):
    """Small weights, a large batch: every search mode cuts the batch (the data-parallel plan)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.relu = nn.Dense(64, 64), nn.Dense(64, 16), nn.ReLU()

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


# name: (make, input shape, output width, batch)
NETS = {
    "mlp": (Mlp, (32,), 16, BATCH),
    "conv": (ConvNet, (2, 6, 6), 16, BATCH),
    "tied": (Tied, (16,), 16, BATCH),
    "rows": (Rows, (64,), 16, 2048),
}


def main() -> None:
    net_name, modes, reference = sys.argv[1:4]
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    for mode in modes.split(","):
        train(net_name, mode, reference, sys.argv[4:6])


def train(net_name: str, mode: str, reference: str, strategy_files: list[str]) -> None:
    ms.set_seed(4)
    world, rank = get_group_size(), get_rank()
    search, full_batch = mode.removesuffix("+full_batch"), mode.endswith("+full_batch")
    if world > 1:
        ms.reset_auto_parallel_context()
        ms.set_auto_parallel_context(
            parallel_mode=ms.ParallelMode.AUTO_PARALLEL, search_mode=search, full_batch=full_batch
        )
        files = dict(zip(("save_file", "load_file"), strategy_files))
        if files:
            ms.set_auto_parallel_context(strategy_ckpt_config=files)
    make, shape, out, batch = NETS[net_name]
    net = make()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.02, momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    rng = np.random.default_rng(7)
    share = batch // world
    losses = []
    for _ in range(STEPS):
        x = rng.standard_normal((batch, *shape)).astype(np.float32)
        y = rng.standard_normal((batch, out)).astype(np.float32)
        part = slice(None) if full_batch else slice(rank * share, (rank + 1) * share)
        losses.append(float(step(ms.Tensor(x[part]), ms.Tensor(y[part])).asnumpy()))
    if full_batch and world > 1:
        check_fed_bytes(step, x, y)
    if world == 1:
        with open(reference, "w") as f:
            json.dump(losses, f)
        print(f"auto {net_name} standalone losses {losses[:3]}...")
        return
    with open(reference) as f:
        want = json.load(f)
    error = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, want))
    print(f"auto {net_name} {mode} ok on rank {rank} of {world}: loss error {error:.3g}", flush=True)


def check_fed_bytes(step, x: np.ndarray, y: np.ndarray) -> None:
    """One more step with the whole batch, recorded: the host sends each data input as the slice the plan reads."""
    import tempfile

    from tessel import profiler

    plan = step._fused._partition.plan
    data = [v for v in plan.graph.inputs if v.name not in plan.parameters]
    slices = sum(math.prod(plan.input_layout(v.name).local_shape(v.shape)) * v.dtype.itemsize for v in data)
    with tempfile.TemporaryDirectory() as folder:
        recorder = profiler.start(folder)
        step(ms.Tensor(x), ms.Tensor(y))
        fed = sum(e["args"]["bytes"] for e in recorder.events if e["name"].startswith("host→daemon"))
        profiler.stop()
    whole = x.nbytes + y.nbytes
    print(f"fed {fed} bytes of the whole batch's {whole}, the plan's slices {slices}", flush=True)
    extra = fed - slices  # the learning rate and the step count: scalars
    if not 0 <= extra <= 64:
        sys.exit(f"rank {get_rank()}: the host fed {fed} bytes for data slices of {slices} bytes (whole: {whole})")


if __name__ == "__main__":
    main()
