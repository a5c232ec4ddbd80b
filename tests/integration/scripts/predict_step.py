"""Run under `tessel run -n 2 predict_step.py NET`: train NET under SEMI_AUTO_PARALLEL with fixed strategies, time its
steps, and compute what the planner's cost model predicts for the same plan, priced with the model the coordinator
built from this job's daemons' measurements.

NET: megatron (an MLP, Megatron's column-then-row strategies), data_parallel (the same MLP, batch cut), conv (a
small conv net, batch cut). ROUNDS times: rank 0 has the daemons measure again (GetCostModel refresh=True), then
every rank runs STEPS steps; the round's measured step is their mean (the daemons' rates are work over time, waits
for a busy core included). Rank 0 prints one JSON line: {"net", "ratio" (the median over the rounds of predicted /
measured), "rounds"}.
"""

import json
import os
import statistics
import sys
import time

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.compiler.parallel.search import predict_step_time
from tessel.coordinator.plan_client import cluster_cost_model
from tessel.core.coordinator_client import CoordinatorClient

NET = sys.argv[1]
WARMUP, ROUNDS, STEPS = 5, 5, int(os.environ.get("STEPS", "10"))
BATCH, IN, HIDDEN, OUT = 256, 512, 1024, 256

ms.set_context(mode=ms.GRAPH_MODE)
init()
world, rank = get_group_size(), get_rank()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True)
ms.set_seed(1)


class Mlp(nn.Cell):
    def __init__(self, megatron: bool):
        super().__init__()
        rng = np.random.default_rng(0)
        self.w1 = ms.Parameter(ms.Tensor((rng.standard_normal((IN, HIDDEN)) * 0.03).astype(np.float32)), "w1")
        self.w2 = ms.Parameter(ms.Tensor((rng.standard_normal((HIDDEN, OUT)) * 0.03).astype(np.float32)), "w2")
        mp, dp = (world, 1) if megatron else (1, world)
        self.matmul1 = ops.MatMul().shard(((dp, 1), (1, mp)))
        self.relu = ops.ReLU().shard(((dp, mp),))
        self.matmul2 = ops.MatMul().shard(((dp, mp), (mp, 1)))

    def construct(self, x):
        return self.matmul2(self.relu(self.matmul1(x, self.w1)), self.w2)


class ConvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, pad_mode="same", weight_init="normal")
        self.conv2 = nn.Conv2d(16, 32, 3, pad_mode="same", weight_init="normal")
        self.relu1, self.relu2 = ops.ReLU(), ops.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(32 * 16 * 16, 10, weight_init="normal")
        for conv in (self.conv1, self.conv2):
            conv.conv2d.shard(((world, 1, 1, 1), (1, 1, 1, 1)))
        self.relu1.shard(((world, 1, 1, 1),))
        self.relu2.shard(((world, 1, 1, 1),))
        self.fc.matmul.shard(((world, 1), (1, 1)))

    def construct(self, x):
        return self.fc(self.flatten(self.relu2(self.conv2(self.relu1(self.conv1(x))))))


rng = np.random.default_rng(1)
if NET == "conv":
    net = ConvNet()
    x = rng.standard_normal((64, 3, 16, 16)).astype(np.float32)
    y = rng.standard_normal((64, 10)).astype(np.float32)
else:
    net = Mlp(megatron=NET == "megatron")
    x = rng.standard_normal((BATCH, IN)).astype(np.float32)
    y = rng.standard_normal((BATCH, OUT)).astype(np.float32)

with_loss = nn.WithLossCell(net, nn.MSELoss())
step = nn.TrainOneStepCell(with_loss, nn.SGD(net.trainable_params(), 0.01))
plan = ms.parallel.plan(with_loss, x, y, device_num=world)
xs, ys = ms.Tensor(x), ms.Tensor(y)
for _ in range(WARMUP):
    step(xs, ys).asnumpy()
client = CoordinatorClient(os.environ["TESSEL_COORDINATOR"]) if rank == 0 else None
rounds = []
for _ in range(ROUNDS):
    # Rank 0 has the daemons measure again right before timing (the other rank waits in its next step): on a
    # machine shared with other work, the load at registration may be long gone.
    model = cluster_cost_model(client, os.environ["TESSEL_JOB_ID"], refresh=True) if client else None
    seconds = []
    for _ in range(STEPS):
        began = time.perf_counter()
        loss = float(step(xs, ys).asnumpy())
        seconds.append(time.perf_counter() - began)
    assert np.isfinite(loss), loss
    if model is not None:
        predicted = predict_step_time(plan, model)
        measured = statistics.fmean(seconds)  # as the daemons' rates: time over the whole window, waits included
        rounds.append({"measured_s": measured, "predicted_s": predicted.total, "parts": repr(predicted),
                       "gflops": model.flops_per_second / 1e9, "op_factors": dict(model.op_factors)})  # fmt: skip
if client is not None:
    ratios = sorted(r["predicted_s"] / r["measured_s"] for r in rounds)
    print(json.dumps({"net": NET, "ratio": statistics.median(ratios), "rounds": rounds}), flush=True)
    client.close()
