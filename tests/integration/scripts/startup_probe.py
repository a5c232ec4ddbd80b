"""What a startup method gave this process: its rank and world, one all_reduce through the daemons, and whether the
code after init() ran at all (in a dynamic cluster's scheduler it must not).

    python startup_probe.py [seconds to stay in the job after the all_reduce]
"""

import sys
import time

import numpy as np

import tessel as ms
from tessel.communication import comm_func, get_group_size, get_rank, init

print("before init", flush=True)
init()
rank, size = get_rank(), get_group_size()
total = comm_func.all_reduce(np.full(2, rank + 1, np.float32))[0].asnumpy()
assert total[0] == size * (size + 1) / 2, total
print(f"rank {rank} of {size}: all_reduce={total[0]:g} device_target={ms.get_context('device_target')}", flush=True)
if len(sys.argv) > 1:
    time.sleep(float(sys.argv[1]))
