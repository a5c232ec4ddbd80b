"""Run under `tessel run -n N` with a fault mode; the other ranks report how they learned of it.

modes: raise (rank 1 raises) | kill (rank 1 SIGKILLs itself while the others wait in a collective) |
mismatch-shape | mismatch-dtype | mismatch-op (rank 1 disagrees on the collective)
"""

import os
import signal
import sys
import time

import numpy as np

from tessel.communication import comm_func, get_group_size, get_rank, init
from tessel.core.errors import CollectiveMismatchError, JobFailedError

mode = sys.argv[1]
init()
rank, size = get_rank(), get_group_size()
comm_func.barrier()  # everyone is up: the fault happens mid-job, not at start
shape, dtype, op = (8,), np.float32, "sum"
if rank == 1:
    if mode == "raise":
        raise ValueError("rank 1 fails on purpose")
    if mode == "kill":
        time.sleep(0.5)  # the others are inside the all_reduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    shape = (9,) if mode == "mismatch-shape" else shape
    dtype = np.float64 if mode == "mismatch-dtype" else dtype
    op = "max" if mode == "mismatch-op" else op
start = time.monotonic()
try:
    comm_func.all_reduce(np.ones(shape, dtype), op)
except CollectiveMismatchError as exc:
    print(f"rank {rank}: CollectiveMismatchError culprit={exc.culprit_rank}: {exc}", flush=True)
    sys.exit(3)
except JobFailedError as exc:
    print(f"rank {rank}: {type(exc).__name__} after {time.monotonic() - start:.2f} s: {exc}", flush=True)
    sys.exit(4)
print(f"rank {rank}: no error", flush=True)
