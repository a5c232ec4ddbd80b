"""Every rank prints LINES numbered lines (and rank 0 as many to stderr), meets the others, and then rank 1 exits
with EXIT_CODE: `tessel run -n 2 chatty.py LINES EXIT_CODE`.

Its logs show whether anything was lost: each rank's stdout must hold "rank r line 0" .. "rank r line LINES-1"
followed by "rank r done"."""

import sys

from tessel.communication import comm_func, get_rank, init

lines, exit_code = int(sys.argv[1]), int(sys.argv[2])
init()
rank = get_rank()
for i in range(lines):
    print(f"rank {rank} line {i}")
    if rank == 0:
        print(f"rank {rank} error line {i}", file=sys.stderr)
print(f"rank {rank} done", flush=True)
comm_func.barrier()  # everything is written before any rank exits
sys.exit(exit_code if rank == 1 else 0)
