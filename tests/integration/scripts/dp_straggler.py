"""One rank of an even-split DATA_PARALLEL job (Model.train) that runs until the test stops it (at most STEPS
steps), for the straggler test: its daemon may be slowed with TESSEL_TEST_SLOWDOWN_S. Prints "rank R training" at
its second step.

    python dp_straggler.py     (as a rank: TESSEL_* set by the test, or under tessel run)
"""

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.communication import get_group_size, get_rank, init
from tessel.train import Callback

IN, HIDDEN, OUT, PER_RANK, STEPS = 8, 16, 4, 4, 3000

init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
rng = np.random.default_rng(5)
x = rng.standard_normal((PER_RANK * world * 100, IN)).astype(np.float32)
y = (np.abs(x[:, :OUT]).argmax(1)).astype(np.int32)
dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank).batch(PER_RANK)
net = nn.SequentialCell([nn.Dense(IN, HIDDEN), nn.ReLU(), nn.Dense(HIDDEN, OUT)])
model = ms.Model(net, loss_fn=nn.CrossEntropyLoss(), optimizer=nn.SGD(net.trainable_params(), 0.01))


class Announce(Callback):
    def __init__(self):
        self.steps = 0

    def on_train_step_end(self, run_context):
        self.steps += 1
        if self.steps == 2:
            print(f"rank {rank} training", flush=True)


model.train(STEPS // 100, dataset, callbacks=[Announce()])
print(f"rank {rank} done", flush=True)
