"""A float16 network whose row-parallel MatMul ends in a reduction, compiled under SEMI_AUTO_PARALLEL with
force_fp32_communication (or AutoParallel.enable_fp32_communication: argv[2] == "auto_parallel"), its graphs saved to
argv[1]. Run it as a simulated rank (MS_SIMULATION_LEVEL=0 RANK_SIZE=2): it stops before the first run. With
argv[2] == "toggle" (under `tessel run -n 2`) it runs once without the option, then sets it and runs again."""

from __future__ import annotations

import sys

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.communication import init

ms.set_context(mode=ms.GRAPH_MODE, save_graphs=True, save_graphs_path=sys.argv[1])
init()


class RowParallel(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.ones((8, 4), np.float16)), "w")
        self.matmul = ops.MatMul().shard(((1, 2), (2, 1)))

    def construct(self, x):
        return self.matmul(x, self.w)


net = RowParallel()
if sys.argv[2] == "toggle":
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel")
    print("first run", net(ms.Tensor(np.ones((4, 8), np.float16))).shape)
    ms.set_auto_parallel_context(force_fp32_communication=True)
elif sys.argv[2] == "auto_parallel":
    from tessel.parallel.auto_parallel import AutoParallel

    net = AutoParallel(net, "semi_auto")
    net.enable_fp32_communication()
else:
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", force_fp32_communication=True)
net(ms.Tensor(np.ones((4, 8), np.float16)))
