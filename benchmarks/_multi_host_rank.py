"""One rank of benchmarks/multi_host.py: times AllReduce of daemon-resident float32 buffers; rank 0 prints JSON.

    python benchmarks/_multi_host_rank.py SIZES_BYTES SECONDS    (started by the test bed inside its host)

For each size: the buffer is put on the daemon once, one checked call, then hierarchy.TUNING_CALLS untimed (a
hierarchical group measures the ways it may run an all_reduce of a size on its first ones of that size and keeps
the quickest: a training job's thousands of all_reduces run the chosen way), then one Execute that repeats the
AllReduce `calls` times (sized to take about SECONDS on the slowest link), in BATCHES Executes, so the time is
the data plane's, not the client's gRPC transfers. Prints {"size": bytes, "calls": n, "seconds": per call, the
median of the batches' means: a burst of other work on the shared cores spoils one batch, not the figure} per
size, one line each.
"""

import json
import statistics
import sys
import time

import numpy as np

from tessel.communication import comm_func, get_group_size, get_rank, init
from tessel.communication.runtime import current
from tessel.daemon import hierarchy
from tessel.v1 import collective_pb2, daemon_pb2

init()
rank, size = get_rank(), get_group_size()
runtime = current()
sizes = [int(s) for s in sys.argv[1].split(",")]
budget_s = float(sys.argv[2])
BATCHES = 5
instruction = daemon_pb2.Instruction(
    collective=daemon_pb2.CollectiveOp(
        kind=collective_pb2.ALL_REDUCE, op=collective_pb2.SUM, inputs=["x"], outputs=["y"]
    )
)
program = daemon_pb2.Program(instructions=[instruction])
for nbytes in sizes:
    runtime.daemon.put(runtime.session_id, {"x": np.full(nbytes // 4, rank + 1, np.float32)})
    started = time.perf_counter()
    (total,) = runtime.daemon.execute(runtime.session_id, program, fetch=["y"]).fetched.values()
    first = time.perf_counter() - started
    if not np.all(total == size * (size + 1) / 2):
        sys.exit(f"rank {rank}: wrong AllReduce result at {nbytes} bytes: {total[:4]}")
    runtime.daemon.execute(runtime.session_id, program, repeat=hierarchy.TUNING_CALLS)
    calls = max(BATCHES, min(50, int(budget_s / max(first, 1e-4))))  # the same on every rank: rank 0 decides
    calls = int(comm_func.broadcast(np.array([calls], np.int64), src=0)[0]) // BATCHES
    comm_func.barrier()
    means = []
    for _ in range(BATCHES):
        started = time.perf_counter()
        runtime.daemon.execute(runtime.session_id, program, repeat=calls)
        means.append((time.perf_counter() - started) / calls)
    if rank == 0:
        print(json.dumps({"size": nbytes, "calls": calls * BATCHES, "seconds": statistics.median(means)}), flush=True)
    runtime.daemon.free(runtime.session_id, ["x", "y"])
