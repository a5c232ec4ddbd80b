"""Checkpoints without redundancy (save_checkpoint / CheckpointConfig remove_redundancy=True): each rank writes only
its share of the values several ranks hold, and loading gives every rank back exactly what it held.

    tessel run -n 4 redundancy_ckpt.py semi DIR     # SEMI_AUTO 2 x 2: train, save shares, zero, load, compare
    tessel run -n 4 redundancy_ckpt.py dp DIR       # DATA_PARALLEL through Model.train's ModelCheckpoint
    tessel run -n 2 redundancy_ckpt.py shared DIR   # both ranks save to one path: an error on every rank
    tessel run -n 2 redundancy_ckpt.py partial DIR  # every rank loads rank 0's file: an error on every rank
    tessel run -n 2 redundancy_ckpt.py uncompiled DIR  # loading into a network not laid out yet: an error on every rank
    tessel run -n 2 redundancy_ckpt.py restrategy DIR  # loading into a network cut another way: an error on every rank
    tessel run -n 2 redundancy_ckpt.py netonly DIR     # the network's values only: the optimizer's come back not loaded
    tessel run -n 2 redundancy_ckpt.py unfetched DIR   # laid out by a forward pass only: files hold slices, not wholes
    tessel run -n 4 redundancy_ckpt.py empty DIR       # DATA_PARALLEL, 2 values over 4 ranks: 2 files hold nothing
    tessel run -n 4 redundancy_ckpt.py emptyswap DIR   # the same, ranks 2 and 3 swap their empty files: an error
    python redundancy_ckpt.py single DIR               # one device given rank 1's share (of "semi"): an error
    python redundancy_ckpt.py merge DIR                # one device merges the 4 shares of "semi": its full values

Each rank prints the names its file holds ("saved by rank r: [...]") for the test to check every value was written
by one rank of each group holding it.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from semi_ckpt import BATCH, HIDDEN, IN, OUT, Net  # the Megatron MLP of the checkpoint tests (this folder)

import tessel as ms
from tessel import nn, train
from tessel.communication import comm_func, get_group_size, get_rank, init
from tessel.core.errors import ConfigurationError
from tessel.dataset import NumpySlicesDataset


def data(seed: int, rows: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, IN)).astype(np.float32), rng.standard_normal((rows, OUT)).astype(np.float32)


def held(cell: nn.Cell) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().copy() for p in cell.get_parameters()}


def zero(cell: nn.Cell) -> None:
    for p in cell.get_parameters():
        p.set_data(np.zeros_like(p.asnumpy()), slice_shape=p.layout is not None)


def compare(cell: nn.Cell, before: dict[str, np.ndarray], what: str) -> None:
    assert sorted(held(cell)) == sorted(before), (sorted(held(cell)), sorted(before))
    compare_some(cell, before, what)


def compare_some(cell: nn.Cell, before: dict[str, np.ndarray], what: str) -> None:
    after = held(cell)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=f"{what}: {name}")


def step(cell: nn.Cell, world: int, rank: int, seed: int) -> None:
    size = BATCH // world
    x, y = data(seed)
    cell(ms.Tensor(x[rank * size : (rank + 1) * size]), ms.Tensor(y[rank * size : (rank + 1) * size]))


def train_cell(net: Net) -> nn.Cell:
    return nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.05, 0.9))


def main() -> None:
    phase, folder = sys.argv[1], sys.argv[2]
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    world, rank = get_group_size(), get_rank()
    path = os.path.join(folder, f"rank_{rank}", "net.ckpt")
    if phase == "single":
        try:
            ms.load_checkpoint(os.path.join(folder, "rank_1", "net.ckpt"), train_cell(Net()))
        except ConfigurationError as error:
            print(f"single refused: {error}", flush=True)
            return
        raise SystemExit("one device loaded a share of a 4-rank job")
    if phase == "merge":  # every piece from the one file holding it: the full values "semi" also saved whole
        cell = train_cell(Net())
        ms.parallel.load_distributed_checkpoint(cell, [os.path.join(folder, f"rank_{r}", "net.ckpt") for r in range(4)])
        whole = {name: p.asnumpy() for name, p in ms.load_checkpoint(os.path.join(folder, "full.ckpt")).items()}
        compare(cell, whole, "merged")
        print(f"merge ok: {len(whole)} values", flush=True)
        return
    if phase == "unfetched":  # the host copies are still the whole values: each file must hold this rank's slices
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)
        net = Net(1, 2)
        net(ms.Tensor(data(0)[0]))
        for options in ({"remove_redundancy": True}, {"integrated_save": False}):
            ms.save_checkpoint(net, path, **options)
            shapes = {name: tuple(value.shape) for name, value in ms.load_checkpoint(path).items()}
            assert shapes == {"w1": (IN, HIDDEN // 2), "w2": (HIDDEN // 2, OUT)}, (options, shapes)
            np.testing.assert_array_equal(
                ms.load_checkpoint(path)["w1"].asnumpy(), net.w1.asnumpy()[:, rank * 16 : rank * 16 + 16]
            )
        print(f"redundancy {phase} ok on rank {rank} of {world}: slices saved", flush=True)
        return
    if phase in ("empty", "emptyswap"):  # ranks 2 and 3 hold no value: their files are empty, yet theirs
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
        net = Net()
        step(train_cell(net), world, rank, 0)
        ms.save_checkpoint(net, path, remove_redundancy=True)
        before = held(net)
        print(f"saved by rank {rank}: {json.dumps(sorted(ms.load_checkpoint(path)))}", flush=True)
        zero(net)
        comm_func.barrier()  # every file is written
        other = {2: 3, 3: 2}.get(rank, rank) if phase == "emptyswap" else rank
        source = os.path.join(folder, f"rank_{other}", "net.ckpt")
        not_loaded, unused = ms.load_param_into_net(net, ms.load_checkpoint(source))  # MindSpore's idiom
        assert not_loaded == [] and unused == [], (not_loaded, unused)
        compare(net, before, f"rank {rank}")
        print(f"redundancy {phase} ok on rank {rank} of {world}: {len(before)} values back", flush=True)
        return
    if phase == "dp":
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
        net = Net()
        model = ms.Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9))
        x, y = data(0, BATCH * world)
        dataset = NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank).batch(BATCH)
        config = train.CheckpointConfig(save_checkpoint_steps=1, keep_checkpoint_max=1, remove_redundancy=True)
        directory = os.path.dirname(path)
        model.train(1, dataset, callbacks=[train.ModelCheckpoint("net", directory, config)], dataset_sink_mode=False)
        saved = os.path.join(directory, sorted(f for f in os.listdir(directory) if f.endswith(".ckpt"))[-1])
        cell = model.train_network
    else:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)
        net = Net(2, 2) if world == 4 else Net(1, 2)
        cell = train_cell(net)
        for s in range(2):
            step(cell, world, rank, s)
        saved = os.path.join(folder, "shared.ckpt") if phase == "shared" else path
        ms.save_checkpoint(net if phase == "netonly" else cell, saved, remove_redundancy=True)  # "shared": raises
        if phase == "semi":
            ms.save_checkpoint(cell, os.path.join(folder, "full.ckpt"))  # whole, for "merge"
    before = held(cell)
    names = sorted(ms.load_checkpoint(saved))
    print(f"saved by rank {rank}: {json.dumps(names)}", flush=True)
    zero(cell)
    if phase == "uncompiled":  # a new network, not laid out yet: which ranks share a slice is not known
        cell = train_cell(Net(1, 2))
    if phase == "restrategy":  # a new network cut another way (2 x 1), compiled by a step
        cell = train_cell(Net(2, 1))
        step(cell, world, rank, 0)
    if phase == "netonly":  # the optimizer's values are in no file: they are returned as not loaded
        not_loaded, unused = ms.load_param_into_net(cell, ms.load_checkpoint(saved))
        optimizer = ["global_step", "learning_rate", "moments.w1", "moments.w2", "momentum"]
        assert sorted(not_loaded) == optimizer and unused == [], (not_loaded, unused)
        before = {name: value for name, value in before.items() if name in ("w1", "w2")}
        compare_some(cell, before, f"rank {rank}")
        print(f"redundancy {phase} ok on rank {rank} of {world}: {len(before)} values back", flush=True)
        return
    if phase == "partial":  # every rank reads rank 0's share only: the others' pieces are missing
        comm_func.barrier()  # rank 0's file is written
        ms.load_checkpoint(os.path.join(folder, "rank_0", "net.ckpt"), cell)
    ms.load_checkpoint(saved, cell)
    compare(cell, before, f"rank {rank}")
    print(f"redundancy {phase} ok on rank {rank} of {world}: {len(before)} values back", flush=True)


if __name__ == "__main__":
    main()
