"""One rank of benchmarks/auto_parallel.py: one net trained under every plan, the plans' steps interleaved.

    tessel run -n 4 benchmarks/_auto_parallel_rank.py CONFIG_JSON      (started by benchmarks/auto_parallel.py)

CONFIG_JSON: {"net", "variants": [...], "warmup", "rounds", "steps", "out"}. The nets (NETS below):
- wide: 3 MatMul + ReLU layers of 2048 x 2048 weights, batch 16 (large weights, small batch);
- narrow: 4 MatMul + ReLU layers of 256 x 256 weights, batch 2048 (small weights, large batch);
- conv: two 3x3 convolutions (3 -> 16 -> 32 channels) on 32 images of 16 x 16, then a 8192 x 512 and a 512 x 10
  fully connected layer (convolutions with small weights and large activations, a head with one large weight).
Every net ends in a mean-square loss, trained with SGD. The variants, each its own copy of the net (same initial
weights) with its own train step:
- data_parallel: ParallelMode.DATA_PARALLEL (weights replicated, the batch cut, gradients all-reduced);
- expert: SEMI_AUTO_PARALLEL with a hand-written strategy: Megatron's on the MatMul layers (columns, then rows:
  one AllReduce forward per pair, every rank reading the whole batch); on the conv net, Krizhevsky's "one weird
  trick": the convolutions data parallel, the fully connected head Megatron's; expert_twin is a second copy of
  it (how far two identical plans' times drift apart on a shared machine);
- sharding_propagation, recursive_programming, dynamic_programming: AUTO_PARALLEL with that search_mode, nothing
  configured, the batch imported data parallel (full_batch=False, MindSpore's default); the coordinator plans with
  the job's measured cost model;
- the same three with the suffix "+full_batch" ("sharding_propagation+full_batch", ...): AUTO_PARALLEL with
  full_batch=True, every rank reading the whole batch as the expert does (the planner takes whatever slice of the
  data inputs its ops want, no all-gather; an input the plan reads only in slices is cut on the host and each rank
  is sent only its slice).
The parallel mode is read when a step compiles and when it is called, so it is set before every call.

Timed rounds: rank 0 first has the daemons measure again (GetCostModel refresh=True, as predict_step.py does: the
load of a shared machine moves) while the others wait at a barrier, then every variant runs `steps` steps, the
variants in an order that rotates from round to round; the round's time of a variant is the fastest of its steps
(a step another process's burst of work on the shared cores delayed says nothing about the plan). Every rank writes
OUT/rank<r>.json:
{"times": {variant: [seconds per step, per round]}}; rank 0 adds each variant's plan (the strategy of each op that
computes), its predicted step time per round (objective.predict_step_time, the round's measured model) and the
parts of the last prediction. A non-finite loss exits non-zero.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import tessel as ms
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.communication.comm_func import barrier

EXPERTS = ("expert", "expert_twin")
FULL_BATCH = "+full_batch"


def whole_batch(variant: str) -> bool:
    """True where every rank reads the whole batch (full_batch=True): the expert and the +full_batch searches."""
    return variant in EXPERTS or variant.endswith(FULL_BATCH)


def _weight(rng, shape, name: str) -> ms.Parameter:
    fan_in = math.prod(shape[1:]) if len(shape) > 2 else shape[0]
    value = rng.standard_normal(shape).astype(np.float32) / np.float32(math.sqrt(fan_in))
    return ms.Parameter(ms.Tensor(value), name)


class Layers(nn.Cell):
    """MatMul + ReLU layers of `width` x `width` weights; `mp` > 0: Megatron's strategies over mp devices (even
    layers cut by columns, odd ones by rows, the activation whole on every rank between pairs)."""

    def __init__(self, width: int, layers: int, mp: int = 0):
        super().__init__()
        rng = np.random.default_rng(0)
        self.weights, self.matmuls, self.relus = [], [], []
        for i in range(layers):
            weight = _weight(rng, (width, width), f"w{i}")
            setattr(self, f"w{i}", weight)
            matmul, relu = ops.MatMul(), ops.ReLU()
            if mp:
                column = i % 2 == 0
                matmul.shard(((1, 1), (1, mp)) if column else ((1, mp), (mp, 1)))
                relu.shard(((1, mp),) if column else ((1, 1),))
            self.weights.append(weight)
            self.matmuls.append(matmul)
            self.relus.append(relu)

    def construct(self, x):
        for weight, matmul, relu in zip(self.weights, self.matmuls, self.relus):
            x = relu(matmul(x, weight))
        return x


class ConvHead(nn.Cell):
    """Two convolutions and a two-layer fully connected head; `mp` > 0: the convolutions data parallel, the head
    Megatron's (the first layer cut by columns, the second by rows)."""

    def __init__(self, channels: tuple[int, int, int], image: int, hidden: int, classes: int, mp: int = 0):
        super().__init__()
        rng = np.random.default_rng(0)
        c0, c1, c2 = channels
        self.k1 = _weight(rng, (c1, c0, 3, 3), "k1")
        self.k2 = _weight(rng, (c2, c1, 3, 3), "k2")
        self.w1 = _weight(rng, (c2 * image * image, hidden), "w1")
        self.w2 = _weight(rng, (hidden, classes), "w2")
        self.conv1, self.conv2 = ops.Conv2D(c1, 3, pad_mode="same"), ops.Conv2D(c2, 3, pad_mode="same")
        self.relu1, self.relu2, self.relu3 = ops.ReLU(), ops.ReLU(), ops.ReLU()
        self.reshape, self.fc1, self.fc2 = ops.Reshape(), ops.MatMul(), ops.MatMul()
        self.flat = c2 * image * image
        if mp:
            for conv in (self.conv1, self.conv2):
                conv.shard(((mp, 1, 1, 1), (1, 1, 1, 1)))
            self.relu1.shard(((mp, 1, 1, 1),))
            self.relu2.shard(((mp, 1, 1, 1),))
            self.fc1.shard(((1, 1), (1, mp)))
            self.relu3.shard(((1, mp),))
            self.fc2.shard(((1, mp), (mp, 1)))

    def construct(self, x):
        h = self.relu2(self.conv2(self.relu1(self.conv1(x, self.k1)), self.k2))
        h = self.reshape(h, (x.shape[0], self.flat))
        return self.fc2(self.relu3(self.fc1(h, self.w1)), self.w2)


# name: (make(mp), input shape, output width, batch)
NETS = {
    "wide": (lambda mp: Layers(2048, 3, mp), (2048,), 2048, 16),
    "narrow": (lambda mp: Layers(256, 4, mp), (256,), 256, 2048),
    "conv": (lambda mp: ConvHead((3, 16, 32), 16, 512, 10, mp), (3, 16, 16), 10, 32),
}


def set_mode(variant: str) -> None:
    """The parallel context of a variant (set before its step compiles and before every call of it)."""
    if variant == "data_parallel":
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, full_batch=False)
    elif variant in EXPERTS:
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=True)
    else:
        search = variant.removesuffix(FULL_BATCH)
        ms.set_auto_parallel_context(
            parallel_mode=ms.ParallelMode.AUTO_PARALLEL, search_mode=search, full_batch=whole_batch(variant)
        )


class Variant:
    """One plan of the net: its train step and what it feeds (the whole batch under full_batch, this rank's rows
    otherwise)."""

    def __init__(self, name: str, net_name: str, x: np.ndarray, y: np.ndarray, rank: int, world: int):
        make, _, _, _ = NETS[net_name]
        self.name = name
        set_mode(name)
        self.net = make(world if name in EXPERTS else 0)
        self.loss = nn.WithLossCell(self.net, nn.MSELoss())
        self.step = nn.TrainOneStepCell(self.loss, nn.SGD(self.net.trainable_params(), 1e-3))
        rows = len(x) // world
        part = slice(None) if whole_batch(name) else slice(rank * rows, (rank + 1) * rows)
        self.x, self.y = ms.Tensor(np.ascontiguousarray(x[part])), ms.Tensor(np.ascontiguousarray(y[part]))
        self.global_x, self.global_y = x, y

    def run(self) -> float:
        set_mode(self.name)
        loss = float(self.step(self.x, self.y).asnumpy())
        if not math.isfinite(loss):
            sys.exit(f"rank {get_rank()}: {self.name}: loss {loss}")
        return loss

    def plan(self):
        """The ParallelPlan this variant runs (data parallel: the plan with every op cut by the batch)."""
        partition = self.step._fused._partition
        if partition is not None:
            return partition.plan
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, full_batch=False)
        return ms.parallel.plan(self.loss, self.global_x, self.global_y)


def describe(plan) -> list[str]:
    """The strategy of every op of the plan that computes with a weight or a convolution (what tells plans
    apart), in graph order: 'MatMul ((1, 1), (1, 4))'."""
    parameters = set(plan.parameters)
    shown = []
    for node in plan.graph.nodes:
        if any(v.name in parameters for v in node.inputs) and node.op in ("MatMul", "Conv2D"):
            shown.append(f"{node.op} {plan.placements[node].strategy}")
    return shown


def dataset_moves(plan, model) -> float:
    """Predicted seconds a step spends moving the data inputs from the layout the dataset gives them (cut by the
    batch, MindSpore's default under AUTO_PARALLEL; whole under full_batch, where a move is a local slice) to the
    layout the plan's ops read. A data input has no gradient: forward only."""
    from tessel.compiler.parallel.search import objective

    data = {v for v in plan.graph.inputs if v.name not in set(plan.parameters)}
    seconds = 0.0
    for key, move in plan.redistributions.items():
        if key[0] != "output" and key[1] != "out" and key[0].inputs[key[1]] in data:
            value = key[0].inputs[key[1]]
            seconds += objective.move_time(model, move.source, move.target, value, backward=False)
    return seconds


def main() -> None:
    config = json.loads(sys.argv[1])
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(1)
    init()
    rank, world = get_rank(), get_group_size()
    _, shape, out_width, batch = NETS[config["net"]]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, *shape)).astype(np.float32)
    y = (rng.standard_normal((batch, out_width)) * 0.1).astype(np.float32)
    variants = [Variant(name, config["net"], x, y, rank, world) for name in config["variants"]]
    for variant in variants:
        for _ in range(config["warmup"]):
            variant.run()
    client = None
    if rank == 0:
        from tessel.core.coordinator_client import CoordinatorClient

        client = CoordinatorClient(os.environ["TESSEL_COORDINATOR"])
    plans = {v.name: v.plan() for v in variants} if rank == 0 else {}
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    predicted: dict[str, list[float]] = {v.name: [] for v in variants}
    parts: dict[str, str] = {}
    data_moves: dict[str, list[float]] = {v.name: [] for v in variants}
    for r in range(config["rounds"]):
        if client is not None:
            from tessel.compiler.parallel.search import predict_step_time
            from tessel.coordinator.plan_client import cluster_cost_model

            model = cluster_cost_model(client, os.environ["TESSEL_JOB_ID"], refresh=True)
            for name, plan in plans.items():
                step = predict_step_time(plan, model)
                predicted[name].append(step.total)
                parts[name] = repr(step)
                data_moves[name].append(dataset_moves(plan, model))
        barrier()  # the other ranks wait here for rank 0's refresh, not inside a timed step
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for variant in order:
            seconds = []
            for _ in range(config["steps"]):
                began = time.perf_counter()
                variant.run()
                seconds.append(time.perf_counter() - began)
            times[variant.name].append(min(seconds))
    report = {"rank": rank, "times": times}
    if rank == 0:
        report.update(
            plans={name: describe(plan) for name, plan in plans.items()},
            predicted=predicted,
            parts=parts,
            data_moves=data_moves,
            median_step_ms={k: statistics.median(v) * 1e3 for k, v in times.items()},
        )
        client.close()
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
