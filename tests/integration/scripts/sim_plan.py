"""Planned for a world that is not running (`tessel run --sim-level 0 -n 64 sim_plan.py DIR`): AUTO_PARALLEL plans
a Megatron-sized MLP for 64 ranks, this rank's programs compile, the strategy file and the save_graphs output are
written, and the process stops before the first run."""

from __future__ import annotations

import os
import sys

import numpy as np

import tessel as ms
from tessel import nn
from tessel.communication import get_group_size, get_rank, init

folder = sys.argv[1]
ms.set_context(mode=ms.GRAPH_MODE, save_graphs=True, save_graphs_path=os.path.join(folder, "graphs"))
init()
ms.set_auto_parallel_context(
    parallel_mode=ms.ParallelMode.AUTO_PARALLEL,
    search_mode="sharding_propagation",
    strategy_ckpt_config={"save_file": os.path.join(folder, "strategy.json")},
)
print(f"simulating rank {get_rank()} of {get_group_size()}")
net = nn.SequentialCell(nn.Dense(256, 1024), nn.ReLU(), nn.Dense(1024, 256))
step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
batch = 128 // get_group_size() or 1
step(ms.Tensor(np.ones((batch * 2, 256), np.float32)), ms.Tensor(np.ones((batch * 2, 256), np.float32)))
print("unreachable: the simulation stops at the first run")
