"""One rank of a job that all-reduces until a fault ends it, then prints how it learned of the failure.

    python supervised.py MODE     (as a rank: tessel run, or TESSEL_* set by the test)

MODE: loop (every rank loops; the test kills or stops a process) | skip (rank 1 skips its fourth all_reduce and
sleeps: alive, but missing) | exit3 (rank 1 exits with status 3 before its fourth all_reduce).
Each rank prints "rank R looping" at its fourth step, and on the failure
"rank R: <ErrorClass> at <time.time()> culprit=<rank>: <message>", then exits with status 4.
"""

import sys
import time

import numpy as np

from tessel.communication import comm_func, get_rank, init
from tessel.core.errors import TesselError

mode = sys.argv[1]
init()
rank = get_rank()
comm_func.barrier()
x = np.ones(1000, np.float32)
try:
    for step in range(1_000_000):
        if step == 3:
            print(f"rank {rank} looping", flush=True)
            if rank == 1 and mode == "skip":
                time.sleep(120)
            if rank == 1 and mode == "exit3":
                sys.exit(3)
        comm_func.all_reduce(x)
        time.sleep(0.01)
except TesselError as exc:
    culprit = getattr(exc, "culprit_rank", None)
    print(f"rank {rank}: {type(exc).__name__} at {time.time():.3f} culprit={culprit}: {exc}", flush=True)
    sys.exit(4)
