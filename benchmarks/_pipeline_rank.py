"""One rank of benchmarks/pipeline.py: an MLP trained with Adam in pipeline stages under every schedule, and with
data parallel, side by side in one job.

    python benchmarks/_pipeline_rank.py CONFIG_JSON      (started by the test bed inside its host)

CONFIG_JSON: {"width", "layers", "batch", "micro", "stages", "schedules": [name, ...], "dp": bool, "warmup", "rounds",
"recorded", "timeline"}. The network: `layers` Dense layers of `width` (ReLU between), softmax cross- entropy,
nn.PipelineCell(.., micro) over `stages` stages (layer i on stage i * stages // layers; "interleaved": the layers cut
into 2 chunks per stage, 1F1B with pipeline_interleave), the ranks of a stage sharing the batch. Each schedule (and data
parallel: the same network, DATA_PARALLEL over every rank, no stages) gets its own copy of the network (created under
no_init_parameters: a rank draws only what it holds) and its own TrainOneStepCell. Their steps are timed interleaved,
one of each per round, so that load from elsewhere on a shared machine falls on all alike; then `recorded` rounds of
one step of each with the timeline on (ms.Profiler into timeline/<name>/step<k>). Each rank prints one JSON line:
{"rank", "times": {name: [step ms]}, "held_bytes": {name: bytes of the parameters and optimizer state it holds},
"total_bytes"}; a non-finite loss exits non-zero.
"""

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

import tessel as ms
from tessel import nn
from tessel.communication import get_group_size, get_rank, init
from tessel.nn.utils import no_init_parameters


class MLP(nn.Cell):
    def __init__(self, width: int, layers: int, stage_of):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(width, width) for _ in range(layers)])
        self.relu = nn.ReLU()
        if stage_of is not None:
            for i, layer in enumerate(self.layers):
                layer.pipeline_stage = stage_of(i)

    def construct(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.relu(x)
        return x


def context(name: str, config: dict) -> None:
    """The auto-parallel context a schedule compiles and runs under."""
    if name == "data_parallel":
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, pipeline_stages=1,
                                     gradients_mean=False)  # fmt: skip
        return
    scheduler = "1f1b" if name == "interleaved" else name
    config_ = {"pipeline_interleave": name == "interleaved", "pipeline_scheduler": scheduler}
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, pipeline_stages=config["stages"],
                                 pipeline_config=config_, gradients_mean=False)  # fmt: skip


def build(name: str, config: dict, world: int):
    stages, layers = config["stages"], config["layers"]
    if name == "data_parallel":
        stage_of = None
    elif name == "interleaved":  # two chunks per stage: virtual stage i * 2S // L on stage v % S
        stage_of = lambda i: (i * 2 * stages // layers) % stages  # noqa: E731
    else:
        stage_of = lambda i: i * stages // layers  # noqa: E731
    with no_init_parameters():
        net = MLP(config["width"], layers, stage_of)
        optimizer = nn.Adam(net.trainable_params(), 1e-4)
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    if name != "data_parallel":
        loss = nn.PipelineCell(loss, config["micro"])
    return net, nn.TrainOneStepCell(loss, optimizer)


def held_bytes(net: nn.Cell) -> int:
    """Bytes of the parameters this rank holds, and of their Adam moments (two more of each)."""
    total = 0
    for p in net.trainable_params():
        if p.held:
            local = p.layout.local_shape(p.shape) if p.layout is not None else p.shape
            total += 3 * int(np.prod(local)) * p.dtype.numpy.itemsize
    return total


def main() -> None:
    config = json.loads(sys.argv[1])
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    rank, world = get_rank(), get_group_size()
    ms.set_seed(1)
    names = list(config["schedules"]) + (["data_parallel"] if config["dp"] else [])
    rng = np.random.default_rng(0)
    batch = config["batch"]
    x = rng.standard_normal((batch, config["width"])).astype(np.float32)
    y = rng.integers(0, config["width"], batch).astype(np.int32)
    steps, nets, feeds = {}, {}, {}
    for name in names:
        context(name, config)
        nets[name], steps[name] = build(name, config, world)
        share = batch // (world if name == "data_parallel" else world // config["stages"])
        mine = rank % (world if name == "data_parallel" else world // config["stages"])
        feeds[name] = (ms.Tensor(x[mine * share : (mine + 1) * share]), ms.Tensor(y[mine * share : (mine + 1) * share]))
        for _ in range(config["warmup"]):
            steps[name](*feeds[name])
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(config["rounds"]):
        for name in names:
            context(name, config)
            start = time.perf_counter()
            loss = float(steps[name](*feeds[name]).asnumpy())
            times[name].append((time.perf_counter() - start) * 1e3)
            if not math.isfinite(loss):
                sys.exit(f"rank {rank} of {world}: {name}: loss {loss}")
    for k in range(config["recorded"]):  # interleaved too: a burst of load from elsewhere hits one step of each
        for name in names:
            context(name, config)
            profiler = ms.Profiler(output_path=str(Path(config["timeline"]) / name / f"step{k}"))
            steps[name](*feeds[name])
            profiler.analyse()
    total = 3 * sum(int(np.prod(p.shape)) * 4 for p in nets[names[0]].trainable_params())
    held = {name: held_bytes(net) for name, net in nets.items()}
    print(json.dumps({"rank": rank, "times": times, "held_bytes": held, "total_bytes": total}), flush=True)


if __name__ == "__main__":
    main()
