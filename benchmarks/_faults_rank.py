"""One rank of the fault campaign (benchmarks/faults.py): all-reduces for SECONDS; with a checkpoint path, rank 0
also saves a checkpoint every few steps. Prints "rank R running" once, and on a failure
"rank R: <ErrorClass> at <time.time()> culprit=<rank>: <message>" before exiting with status 4.

    python _faults_rank.py SECONDS [CHECKPOINT]
"""

import sys
import time

import numpy as np

from tessel.communication import comm_func, get_rank, init
from tessel.core.errors import TesselError

seconds = float(sys.argv[1])
checkpoint = sys.argv[2] if len(sys.argv) > 2 else ""
init()
rank = get_rank()
weights = {"w": np.ones(4 << 20, np.float32)} if checkpoint and rank == 0 else {}  # 16 MiB
comm_func.barrier()
print(f"rank {rank} running", flush=True)
end = time.monotonic() + seconds
try:
    step = 0
    while True:
        # The ranks stop together: each says whether its time is up, and the all-reduced flag decides for all (a
        # rank that left on its own clock one step early would leave the others waiting in that step).
        values = np.ones(1000, np.float32)
        values[0] = float(time.monotonic() >= end)
        total, _ = comm_func.all_reduce(values)
        if np.asarray(total.asnumpy() if hasattr(total, "asnumpy") else total)[0] > 0:
            break
        if weights and step % 5 == 0:
            from tessel.train.serialization import save_checkpoint

            save_checkpoint(weights, checkpoint)
        step += 1
        time.sleep(0.02)
except TesselError as exc:
    culprit = getattr(exc, "culprit_rank", None)
    print(f"rank {rank}: {type(exc).__name__} at {time.time():.3f} culprit={culprit}: {exc}", flush=True)
    sys.exit(4)
print(f"rank {rank} done", flush=True)
