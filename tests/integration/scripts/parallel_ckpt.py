"""Checkpoints that follow the parameters under optimizer parallel and pipeline parallel (issue 16, point 1), the
way semi_ckpt.py checks SEMI_AUTO (its network, data and evaluation are reused): train on 4 ranks with Model.train,
where ModelCheckpoint saves whole (integrated_save=True: the network and its optimizer state, gathered) and as
slices (integrated_save=False: each rank's slices and their layouts), then load elsewhere: the eval loss is the
trained one to 1e-6, and the slices merged are the whole file, tensor for tensor (optimizer state included).

MODES: zero (DATA_PARALLEL + enable_parallel_optimizer, optimizer_level level3: every parameter stored as blocks)
and pipe (SEMI_AUTO, pipeline_stages=2, 2 data-parallel ranks per stage, nn.PipelineCell).

    tessel run -n 4 parallel_ckpt.py train DIR    # trains each mode, saves DIR/MODE/full/, DIR/MODE/slices/rank_k/
    python parallel_ckpt.py one DIR               # one device: the full file, load_distributed_checkpoint of the
                                                  # slices, transform_checkpoints' merged file
    tessel run -n 2 parallel_ckpt.py dp DIR       # 2 ranks DATA_PARALLEL: the full file, then the slices
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from semi_ckpt import BATCH, HIDDEN, IN, OUT, Net, data, evaluate

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.communication import get_group_size, get_rank, init
from tessel.train import CheckpointConfig, ModelCheckpoint

MODES, MICRO, STEPS = ("zero", "pipe"), 2, 3
FILE = f"net-1_{STEPS}.ckpt"  # ModelCheckpoint's name for the last step of epoch 1


class PipeNet(nn.Cell):
    """semi_ckpt's Net as two Dense layers, so that each can go to its own pipeline stage."""

    def __init__(self, stages: int = 1):
        super().__init__()
        rng = np.random.default_rng(3)
        self.layers = nn.CellList([nn.Dense(IN, HIDDEN), nn.Dense(HIDDEN, OUT)])
        self.relu = nn.ReLU()
        for i, layer in enumerate(self.layers):
            for param in (layer.weight, layer.bias):
                param.set_data(ms.Tensor((rng.standard_normal(param.shape) * 0.3).astype(np.float32)))
            if stages > 1:
                layer.pipeline_stage = i

    def construct(self, x):
        return self.layers[1](self.relu(self.layers[0](x)))


def network(mode: str, stages: int = 1) -> nn.Cell:
    return PipeNet(stages) if mode == "pipe" else Net()


def train(mode: str, folder: str, world: int, rank: int) -> None:
    """4 ranks in `mode`; on 1 device (world 1) the same network, loss cell and steps: the reference."""
    ms.reset_auto_parallel_context()
    stages = 2 if mode == "pipe" and world > 1 else 1
    net = network(mode, stages)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    shards = (world, rank)
    if mode == "pipe":
        loss_net, shards = nn.PipelineCell(loss_net, MICRO), (world // stages, rank % (world // stages))
    if world > 1 and mode == "zero":
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
        ms.set_auto_parallel_context(
            enable_parallel_optimizer=True,
            parallel_optimizer_config={"optimizer_level": "level3", "parallel_optimizer_threshold": 0},
        )
    elif world > 1:  # the 2 ranks of a stage share each batch
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, pipeline_stages=2)
    x, y = (np.concatenate(a) for a in zip(*(data(s) for s in range(STEPS))))
    source = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=shards[0], shard_id=shards[1])
    dataset = source.batch(BATCH // shards[0])
    saves = [
        ModelCheckpoint("net", os.path.join(folder, where), CheckpointConfig(STEPS, integrated_save=whole))
        for where, whole in (("full", True), (os.path.join("slices", f"rank_{rank}"), False))
    ]
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    ms.Model(loss_net, optimizer=optimizer).train(1, dataset, callbacks=saves, dataset_sink_mode=False)
    loss = evaluate(net, world, rank, False)  # every rank: the whole evaluation batch
    if rank == 0:
        with open(os.path.join(folder, "trained.json"), "w") as f:
            json.dump(loss, f)
    print(f"parallel ckpt {mode} {'train' if world > 1 else 'reference'} on rank {rank}: eval loss {loss}", flush=True)


def check(net: nn.Cell, how: str, mode: str, folder: str, world: int, rank: int) -> None:
    loss = evaluate(net, world, rank, False)
    with open(os.path.join(folder, "trained.json")) as f:
        want = json.load(f)
    error = abs(loss - want) / abs(want)
    assert error <= 1e-6, f"{mode} {how}: eval loss {loss}, trained {want}"
    print(f"parallel ckpt {mode} {how} ok on rank {rank} of {world}: eval loss {loss} (error {error:.2g})", flush=True)


def load(mode: str, phase: str, folder: str, world: int, rank: int) -> None:
    full = os.path.join(folder, "full", FILE)
    slices = [os.path.join(folder, "slices", f"rank_{r}", FILE) for r in range(4)]
    net = network(mode)
    ms.load_param_into_net(net, ms.load_checkpoint(full))
    check(net, "full", mode, folder, world, rank)
    net = network(mode)
    ms.parallel.load_distributed_checkpoint(net, slices)
    check(net, "slices", mode, folder, world, rank)
    if phase == "one":  # the slices merged offline are the whole file, every tensor (optimizer state included)
        merged = os.path.join(folder, "merged")
        ms.parallel.transform_checkpoints(os.path.join(folder, "slices"), merged, "net")
        whole, again = ms.load_checkpoint(full), ms.load_checkpoint(os.path.join(merged, "rank_0", "net0.ckpt"))
        assert sorted(whole) == sorted(again), (sorted(whole), sorted(again))
        for name, value in whole.items():
            assert np.array_equal(value.asnumpy(), again[name].asnumpy()), f"{mode}: {name} merged differs"
        reference = os.path.join(folder, "reference")  # the same steps on one device: every tensor, to 1e-5
        train(mode, reference, 1, 0)
        for name, value in ms.load_checkpoint(os.path.join(reference, "full", FILE)).items():
            want, got = value.asnumpy(), whole[name].asnumpy()
            assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), f"{mode}: {name} differs"
        net = network(mode)
        ms.load_param_into_net(net, again)
        check(net, "merged", mode, folder, world, rank)


def main() -> None:
    phase, root = sys.argv[1], sys.argv[2]
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    world, rank = get_group_size(), get_rank()
    if phase != "train" and world > 1:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    for mode in MODES:
        folder = os.path.join(root, mode)
        os.makedirs(folder, exist_ok=True)
        if phase == "train":
            train(mode, folder, world, rank)
        else:
            load(mode, phase, folder, world, rank)


if __name__ == "__main__":
    main()
