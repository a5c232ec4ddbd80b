"""DataParallelNet and HybridParallelNet from the parallel-modes seed, trained a few steps with Model.train.

    tessel run -n 2 examples/parallel_nets.py data      # DATA_PARALLEL: x (32, 512) @ weight (512, 128), summed
    tessel run -n 2 examples/parallel_nets.py hybrid    # HYBRID_PARALLEL: weight (256, 128) per rank + AllReduce

The seed leaves `model.train(*args)` open; here the loss is the mean square of the network's output against a
fixed target, on random data every rank generates identically (hybrid) or takes its shard of (data).
"""

import sys

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.train import LossMonitor

init()
ms.set_seed(1)
np.random.seed(1)  # the seed's weights come from np.random: the same on every rank


class DataParallelNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.random.rand(512, 128).astype(np.float32) * 0.01))
        self.fc = ops.MatMul()
        self.reduce = ops.ReduceSum()

    def construct(self, x):
        return self.reduce(self.fc(x, self.weight), -1)


class HybridParallelNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.random.rand(256, 128).astype(np.float32) * 0.01))
        self.fc = ops.MatMul()
        self.reduce = ops.AllReduce()

    def construct(self, x):
        return self.reduce(self.fc(x, self.weight))


hybrid = sys.argv[1:] == ["hybrid"]
mode = ms.ParallelMode.HYBRID_PARALLEL if hybrid else ms.ParallelMode.DATA_PARALLEL
ms.set_auto_parallel_context(parallel_mode=mode, gradients_mean=not hybrid)
rng = np.random.default_rng(0)
if hybrid:  # every rank holds its 256 of the 512 input features
    x = rng.random((256, 512), np.float32)[:, get_rank() * 256 : (get_rank() + 1) * 256]
    target = np.zeros((256, 128), np.float32)
    dataset = ds.NumpySlicesDataset({"x": x, "y": target}, shuffle=False).batch(32)
    net = HybridParallelNet()
else:
    x, target = rng.random((256, 512), np.float32), np.zeros(256, np.float32)
    shards = {"num_shards": get_group_size(), "shard_id": get_rank()}
    dataset = ds.NumpySlicesDataset({"x": x, "y": target}, shuffle=False, **shards).batch(32)
    net = DataParallelNet()
model = ms.Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), 1e-3 if hybrid else 1e-7))
model.train(2, dataset, callbacks=[LossMonitor(1)])
