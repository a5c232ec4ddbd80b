"""Run under `tessel run -n N`: a rank program where overlap is possible, on the daemons, with the timeline on.

Two independent copies of a tensor-parallel pair (x_i @ W1 column slice, ReLU, @ W2 row slice, AllReduce), each
followed by its own reader. The schedule starts copy 0's AllReduce, runs copy 1's products while it is in flight,
starts copy 1's and waits only where the results are read. Checked here:
- the results equal the numpy reference of the whole (unsplit) network;
- the daemon's timeline (ExecuteRequest.timeline): copy 0's AllReduce was issued before a RunSegment began and
  waited for after it ended, each communicator ran its AllReduce between its issue and the end of its wait, and
  two AllReduces were in flight at once (both issued before the first wait);
- with OVERLAP=0 in the environment (shared memory on a host whose cores the ranks' compute threads already use:
  the daemon's thread budget), each AllReduce is instead deferred: it ran after its start instruction returned,
  and both ran back to back inside the first wait.

Prints "overlap ok on rank r of n: ..." or raises.
"""

import os
import sys

import numpy as np

from tessel.communication import get_group_size, get_rank, init
from tessel.communication import runtime as _runtime
from tessel.compiler import TensorSpec, apply, lower_rank_program, trace

ROWS, IN, HIDDEN = 256, 256, 512  # big enough to be worth overlapping (rank_plan.MIN_OVERLAP_S)
init()
rank, world = get_rank(), get_group_size()
daemon, session = _runtime.current().daemon, _runtime.current().session_id
group = tuple(range(world))
k = HIDDEN // world


def forward(x, w1, w2):
    total = None
    for part in (x[: ROWS // 2], x[ROWS // 2 :]):
        out = apply("AllReduce", apply("ReLU", part @ w1) @ w2, group=group)
        value = apply("Tanh", out).sum()
        total = value if total is None else total + value
    return total


graph = trace(forward, TensorSpec((ROWS, IN)), TensorSpec((IN, k)), TensorSpec((k, IN))).graph
program = lower_rank_program(graph, world_size=world)
rng = np.random.default_rng(0)
x = rng.standard_normal((ROWS, IN)).astype(np.float32)
w1 = (rng.standard_normal((IN, HIDDEN)) / np.sqrt(IN)).astype(np.float32)
w2 = (rng.standard_normal((HIDDEN, IN)) / np.sqrt(HIDDEN)).astype(np.float32)
mine = {"x": x, "w1": w1[:, rank * k : (rank + 1) * k], "w2": w2[rank * k : (rank + 1) * k]}
installed = daemon.install(program, session)
for _ in range(2):  # the first run compiles and allocates; the second is the one looked at
    result = installed.run(feed=mine, timeline=True)

want = sum(np.tanh(np.maximum(p.astype(np.float64) @ w1, 0) @ w2).sum() for p in (x[: ROWS // 2], x[ROWS // 2 :]))
got = float(result.fetched[program.outputs[0]])
assert abs(got - want) <= 1e-4 * max(1.0, abs(want)), (got, want)

events = sorted(result.timeline, key=lambda e: e.index)
assert [e.index for e in events] == list(range(len(program.program.instructions)))
issued = {e.handle: e for e in events if e.kind == "all_reduce" and e.handle}
waits = {e.handle: e for e in events if e.kind == "wait"}
segments = [e for e in events if e.kind == "run_segment"]
assert len(issued) == 2, program.dump()
if os.environ.get("OVERLAP", "1") == "0":
    # deferred (daemon/executor.py Deferred): each ran after its start returned, and both back to back inside the
    # first wait, since both were started before it
    first_wait = min((waits[h] for h in issued), key=lambda w: w.index)
    for handle, start in issued.items():
        assert start.end_ns <= start.comm_start_ns <= start.comm_end_ns <= waits[handle].end_ns, (start, waits[handle])
        assert first_wait.start_ns <= start.comm_start_ns and start.comm_end_ns <= first_wait.end_ns, (
            start,
            first_wait,
        )
    print(
        f"overlap ok on rank {rank} of {world}: result {got:.6f}, AllReduces deferred to the first wait (thread budget)"
    )
    sys.exit(0)
overlapped = []
for handle, start in issued.items():
    wait = waits[handle]
    between = [s for s in segments if start.end_ns <= s.start_ns and s.end_ns <= wait.start_ns]
    overlapped += [handle] if between else []
    assert start.start_ns <= start.comm_start_ns <= start.comm_end_ns <= wait.end_ns, (start, wait)
    assert start.bytes == (ROWS // 2) * IN * 4, start
# copy 0's AllReduce spans copy 1's products (the readers after both are too little work to hide anything)
assert overlapped == [min(issued, key=lambda h: issued[h].index)], f"{overlapped}\n{program.dump()}"
assert max(e.end_ns for e in issued.values()) <= min(w.start_ns for w in waits.values())  # both in flight
print(f"overlap ok on rank {rank} of {world}: result {got:.6f}, {len(segments)} segments, 2 AllReduces in flight")
