"""MindSpore's other ways to say how a network is cut, each trained under SEMI_AUTO_PARALLEL against its standalone
run (like semi_ways.py): Primitive.shard with Layouts, Cell.shard with a parameter_plan, ms.parallel.shard on a
function, AutoParallel wrapping a training-step function, and a split moved to another dim with and without
AlltoAll (set_auto_parallel_context(enable_alltoall=...), the collectives read from save_graphs' output).

    python semi_api.py VARIANT reference.json           # standalone: writes the losses
    tessel run -n 4 semi_api.py VARIANT reference.json   # every rank compares, and checks its slices
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.parallel import Layout
from tessel.parallel.auto_parallel import AutoParallel

STEPS, BATCH, IN, HIDDEN, OUT = 3, 16, 12, 32, 8


def weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return (rng.standard_normal((IN, HIDDEN)).astype(np.float32) * 0.3,
            rng.standard_normal((HIDDEN, OUT)).astype(np.float32) * 0.3)  # fmt: skip


class Mlp(nn.Cell):
    def __init__(self, matmul1=None, matmul2=None):
        super().__init__()
        w1, w2 = weights()
        self.w1, self.w2 = ms.Parameter(ms.Tensor(w1), name="w1"), ms.Parameter(ms.Tensor(w2), name="w2")
        self.matmul1, self.matmul2 = matmul1 or ops.MatMul(), matmul2 or ops.MatMul()
        self.relu = ops.ReLU()

    def construct(self, x):
        return self.matmul2(self.relu(self.matmul1(x, self.w1)), self.w2)


class Block(nn.Cell):
    """A cell sharded as a whole: Cell.shard gives its input's layout and its weights' (parameter_plan)."""

    def __init__(self):
        super().__init__()
        self.inner = Mlp()

    def construct(self, x):
        return self.inner(x)


def network(variant: str, world: int) -> nn.Cell:
    if world == 1:
        return Block() if variant.startswith("cellshard") else Mlp()
    if variant == "layout":  # Megatron, written with named axes
        layout = Layout((world // 2, 2), ("dp", "mp"))
        matmul1 = ops.MatMul().shard((layout("dp", "None"), layout("None", "mp")))
        matmul2 = ops.MatMul().shard((layout("dp", "mp"), layout("mp", "None")))
        return Mlp(matmul1, matmul2)
    if variant.startswith("cellshard"):
        block = Block()
        plan = {"self.inner.w1": (1, 2), "self.inner.w2": (2, 1)}
        block.shard(in_strategy=((world, 1),), parameter_plan=plan)
        return block
    if variant == "fnshard":
        net = Mlp()
        net.matmul1 = ms.parallel.shard(ops.matmul, in_strategy=((world // 2, 1), (1, 2)))
        return net
    if variant == "autoparallel":
        net = Mlp(ops.MatMul().shard(((world // 2, 1), (1, 2))), ops.MatMul().shard(((world // 2, 2), (2, 1))))
        return net
    if variant == "exchange":  # the tutorial's fc then fc2: the columns fc computes become the rows fc2 reads
        return Mlp(ops.MatMul().shard(((1, 1), (1, world))), ops.MatMul().shard(((world, 1), (1, 1))))
    raise SystemExit(f"unknown variant {variant!r}")


def train(variant: str, world: int, rank: int) -> list[float]:
    net = network(variant, world)
    loss_fn = nn.MSELoss()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, optimizer.parameters)

    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss

    if variant == "autoparallel":
        step = AutoParallel(train_step, parallel_mode="semi_auto")
    elif variant == "cellshard_step":  # the parameter_plan through TrainOneStepCell (Model.train's step)
        step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
    else:
        step = ms.jit(train_step)
    rng = np.random.default_rng(11)
    share = BATCH // world
    losses = []
    for _ in range(STEPS):
        x = rng.standard_normal((BATCH, IN)).astype(np.float32)
        y = rng.standard_normal((BATCH, OUT)).astype(np.float32)
        part = slice(rank * share, (rank + 1) * share)
        losses.append(float(step(ms.Tensor(x[part]), ms.Tensor(y[part])).asnumpy()))
    if world > 1:
        params = {p.name.rsplit(".", 1)[-1]: p for p in net.trainable_params()}
        shapes = {name: p.asnumpy().shape for name, p in params.items()}
        # ms.parallel.shard cuts only the first matmul's inputs: the second runs data parallel, its weight whole;
        # exchange cuts w1's columns four ways and keeps w2 whole.
        w1 = (IN, HIDDEN // world) if variant == "exchange" else (IN, HIDDEN // 2)
        w2 = (HIDDEN, OUT) if variant in ("fnshard", "exchange") else (HIDDEN // 2, OUT)
        assert shapes == {"w1": w1, "w2": w2}, shapes
    return losses


def collectives(graphs: Path, rank: int) -> set[str]:
    """The collectives in this rank's partitioned graphs that save_graphs wrote."""
    text = "".join(path.read_text() for path in (graphs / f"rank_{rank}").glob("step_parallel_end_*.ir"))
    return {op for op in ("AlltoAll", "AllGather") if f"= {op}(" in text}


def main() -> None:
    variant, reference = sys.argv[1], sys.argv[2]
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    world, rank = get_group_size(), get_rank()
    if world > 1 and variant != "autoparallel":
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)
    if world == 1:
        losses = train(variant, world, rank)
        with open(reference, "w") as f:
            json.dump(losses, f)
        print(f"semi api {variant} standalone losses {losses}")
        return
    with open(reference) as f:
        want = json.load(f)
    # exchange's columns become rows by an AlltoAll, or without it (enable_alltoall=False, MindSpore's default) by
    # an AllGather and a slice; both train alike.
    for alltoall in (True, False) if variant == "exchange" else (True,):
        ms.set_auto_parallel_context(enable_alltoall=alltoall)
        graphs = Path(reference).parent / f"graphs-{alltoall}"
        ms.set_context(save_graphs=variant == "exchange", save_graphs_path=str(graphs))
        losses = train(variant, world, rank)
        error = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, want))
        how = "" if alltoall else " without alltoall"
        if variant == "exchange":
            used = collectives(graphs, rank)
            assert ("AlltoAll" in used) == alltoall and "AllGather" in used, (alltoall, used)
        print(f"semi api {variant}{how} ok on rank {rank} of {world}: loss error {error:.3g}; losses {losses}")


if __name__ == "__main__":
    main()
