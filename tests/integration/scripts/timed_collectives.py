"""`python timed_collectives.py STEPS ELEMENTS`, as one rank of a job: STEPS all_reduces of ELEMENTS float32,
then prints "elapsed <seconds>" (the loop only, after init) and checks the last result."""

import sys
import time

import numpy as np

from tessel.communication import comm_func, get_group_size, get_rank, init

steps, elements = int(sys.argv[1]), int(sys.argv[2])
init()
rank, size = get_rank(), get_group_size()
x = np.full(elements, rank + 1, np.float32)
comm_func.barrier()
start = time.perf_counter()
for _ in range(steps):
    total, _ = comm_func.all_reduce(x)
elapsed = time.perf_counter() - start
assert float(total[0]) == size * (size + 1) / 2, total[:4]
print(f"rank {rank} elapsed {elapsed:.4f}", flush=True)
