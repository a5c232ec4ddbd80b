"""The seed's SemiAutoParallelNet (tutorial "Distributed Parallel Training Mode", semi-automatic parallelism):
what the parallel pass makes of fc.shard(((1, 1), (1, 2))) followed by fc2.shard(((8, 1), (1, 1))) on 8 devices,
and that the 8 ranks' graphs compute what one device computes.

    python examples/semi_auto_explain.py                  # explain on 8 devices, then check the 8 ranks
    python examples/semi_auto_explain.py --save-graphs ir # also write step_parallel_begin/end_*.ir into ./ir

No cluster is needed: the ranks run in this process on tessel's rank simulator.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TESSEL_THREADS", "1")

import numpy as np

import tessel as ms
import tessel.parallel
from tessel import nn, ops
from tessel.compiler.parallel import assemble
from tessel.compiler.parallel.simulate import run_ranks
from tessel.parallel.semi_auto import partition_for_rank

DEVICES = 8


class SemiAutoParallelNet(nn.Cell):
    def __init__(self):
        super().__init__()
        weight_init = np.random.default_rng(0).random((128, 128)).astype(np.float32)
        self.weight = ms.Parameter(ms.Tensor(weight_init))
        self.weight2 = ms.Parameter(ms.Tensor(weight_init))
        self.fc = ops.MatMul().shard(((1, 1), (1, 2)))
        self.fc2 = ops.MatMul().shard(((8, 1), (1, 1)))
        self.reduce = ops.ReduceSum()

    def construct(self, x):
        x = self.fc(x, self.weight)
        x = self.fc2(x, self.weight2)
        return self.reduce(x, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description="explain the seed's SemiAutoParallelNet on 8 devices")
    parser.add_argument("--save-graphs", metavar="DIR", help="write the graphs before/after the parallel pass")
    args = parser.parse_args()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, device_num=DEVICES, full_batch=True)
    if args.save_graphs:
        ms.set_context(save_graphs=True, save_graphs_path=args.save_graphs)
    net = SemiAutoParallelNet()
    x = np.random.default_rng(1).random((32, 128)).astype(np.float32)
    tessel.parallel.explain(net, x)

    graph, trace = tessel.parallel.trace_network(net, x)
    full = {p.key: p.asnumpy() for p in trace.parameters()}
    parts = [partition_for_rank(graph, trace, list(full), full, r, DEVICES) for r in range(DEVICES)]
    outs = run_ranks([p.graph for p in parts], [p.params | p.slice_feeds({"x": x}) for p in parts])
    y = assemble([o[0] for o in outs], parts[0].plan.output_layouts[0], graph.outputs[0].shape)
    w = full[net.weight.key].astype(np.float64)
    want = (x @ w @ w).sum(-1)
    error = float(np.abs(y - want).max() / np.abs(want).max())
    print(f"{DEVICES} ranks vs one device (float64): max relative difference {error:.2e}")


if __name__ == "__main__":
    main()
