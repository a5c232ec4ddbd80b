"""Resume equals never stopping: train 4 epochs in one go, or 2 epochs (ModelCheckpoint each epoch) and then, in a
new process, load the epoch-2 checkpoint and train on with Model.train(4, initial_epoch=2). The losses of epochs 3
and 4 must be the same: parameters, Adam's moments and beta powers, the learning-rate schedule's step
(global_step) and the dataset's shuffle order all resume.

    python resume.py MODE PHASE DIR [SINK]      # MODE: standalone | dp | semi; PHASE: whole | first | rest
    tessel run -n 2 resume.py dp whole DIR
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.communication import get_group_size, get_rank, init
from tessel.train import CheckpointConfig, ModelCheckpoint

ROWS, BATCH, EPOCHS, STOP = 64, 8, 4, 2


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Dense(6, 16), nn.Dense(16, 3)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


class Record(ms.train.Callback):
    def __init__(self):
        self.losses: list[float] = []

    def on_train_step_end(self, run_context):
        self.losses.append(float(np.asarray(run_context.original_args().net_outputs.asnumpy()).reshape(-1)[0]))


def main() -> None:
    mode, phase, folder = sys.argv[1], sys.argv[2], sys.argv[3]
    sink = len(sys.argv) > 4 and sys.argv[4] == "sink"
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(5)
    init()
    world, rank = get_group_size(), get_rank()
    if mode == "dp":
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    elif mode == "semi":
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((ROWS, 6)).astype(np.float32), rng.integers(0, 3, ROWS).astype(np.int32)
    shards = {"num_shards": world, "shard_id": rank} if world > 1 else {}
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True, **shards).batch(BATCH // world)
    net = Net()
    steps = dataset.get_dataset_size()
    schedule = [0.05 * 0.9**s for s in range(EPOCHS * steps)]  # a per-step learning rate: the step must resume
    optimizer = nn.Adam(net.trainable_params(), learning_rate=schedule)
    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), optimizer)
    record = Record()
    callbacks = [record]
    if phase == "first":
        config = CheckpointConfig(save_checkpoint_steps=steps, keep_checkpoint_max=10)
        callbacks.append(ModelCheckpoint(prefix="net", directory=os.path.join(folder, f"ckpt_{rank}"), config=config))
        model.train(STOP, dataset, callbacks=callbacks, dataset_sink_mode=sink)
    elif phase == "rest":
        ms.load_checkpoint(os.path.join(folder, f"ckpt_{rank}", f"net-{STOP}_{steps}.ckpt"), model.train_network)
        model.train(EPOCHS, dataset, callbacks=callbacks, dataset_sink_mode=sink, initial_epoch=STOP)
    else:
        model.train(EPOCHS, dataset, callbacks=callbacks, dataset_sink_mode=sink)
    with open(os.path.join(folder, f"{phase}_{rank}.json"), "w") as f:
        json.dump(record.losses, f)
    print(f"resume {mode} {phase} done on rank {rank}: {len(record.losses)} losses")


if __name__ == "__main__":
    main()
