"""A rank of a job across test-bed hosts (tests/integration/test_multi_host.py); prints one JSON line.

multi_host.py collectives '{"local0": [0, 1], "cross0": [0, 2]}'
    all_reduce / all_gather / broadcast / reduce_scatter on the world and on every group this rank is in, small
    and large (the TCP ring), each checked against numpy; then asks its daemon (TESSEL_DAEMON_ADDRESS) which
    transport each group took; last, a float all_reduce on the world against float64 within float32 rounding.
    Prints {"rank", "checks", "failures", "transports": {group: transport}, "rounding": worst error / bound}.
multi_host.py unreachable
    one all_reduce; prints {"rank", "error", "message", "culprit", "seconds"} for the error it raises, then
    raises it again, as a script that does not catch it would (which fails the job for the other ranks).
"""

import json
import os
import sys
import time
import zlib

import numpy as np

from tessel.communication import comm_func, create_group, get_group_size, get_rank, init
from tessel.core import rpc
from tessel.core.errors import TesselError
from tessel.daemon import hierarchy
from tessel.v1 import common_pb2, daemon_pb2_grpc

SIZES = (7, 1 << 18)  # elements per member: the small path (<= 64 KiB) and the large one (1 MiB and more)


def make(rank: int, case: str, size: int) -> np.ndarray:
    rng = np.random.default_rng([rank, zlib.crc32(case.encode())])
    return (rng.integers(-8, 9, size=size) / 4).astype(np.float32)  # quarter steps: sums are exact


def collectives(groups: dict[str, list[int]]) -> dict:
    rank, size = get_rank(), get_group_size()
    checks, failures = 0, []

    def check(case: str, got: np.ndarray, want: np.ndarray) -> None:
        nonlocal checks
        checks += 1
        if got.shape != want.shape or not np.array_equal(got, want):
            failures.append(f"{case}: got {got.shape} {got.ravel()[:4]} want {want.shape} {want.ravel()[:4]}")

    mine = {"world": list(range(size))}
    for name, ranks in groups.items():
        if rank in ranks:
            create_group(name, ranks)
            mine[name] = ranks
    for name, ranks in mine.items():
        group = {} if name == "world" else {"group": name}
        n = len(ranks)
        for count in SIZES:
            inputs = {r: make(r, f"{name}/{count}", count * n) for r in ranks}
            x = inputs[rank]
            check(f"{name} all_reduce {count}", comm_func.all_reduce(x, **group)[0].asnumpy(), sum(inputs.values()))
            gathered = comm_func.all_gather_into_tensor(x, **group)[0].asnumpy()
            check(f"{name} all_gather {count}", gathered, np.concatenate([inputs[r] for r in ranks]))
            root = ranks[-1]
            check(f"{name} broadcast {count}", comm_func.broadcast(x, src=root, **group).asnumpy(), inputs[root])
            chunk = comm_func.reduce_scatter_tensor(x, **group)[0].asnumpy()
            index = ranks.index(rank)
            want = sum(inputs.values())[index * count : (index + 1) * count]
            check(f"{name} reduce_scatter {count}", chunk, want)
    # Random floats, of a size no group divides: within float32 rounding of the float64 sum, whatever the order
    # (|error| <= (n - 1) * eps * sum |x_i| per element, the bound of any summation order).
    count = (1 << 20) + 3
    inputs = {r: np.random.default_rng([r, 7]).standard_normal(count).astype(np.float32) for r in range(size)}
    exact = np.sum([inputs[r].astype(np.float64) for r in range(size)], axis=0)
    bound = (size - 1) * np.finfo(np.float32).eps * np.sum([np.abs(inputs[r]) for r in range(size)], axis=0)
    # A hierarchical group's first large all_reduces of a size measure each way it may run them (whole, in
    # segments, flat: hierarchy.WAYS, WayTuner), the ones after take the way its members chose: every one is checked.
    worst = 0.0
    for _ in range(hierarchy.TUNING_CALLS + 2):
        error = np.abs(comm_func.all_reduce(inputs[rank])[0].asnumpy().astype(np.float64) - exact)
        worst = max(worst, float(np.max(error / np.maximum(bound, 1e-30))))
    checks += 1
    if worst > 1.0:
        failures.append(f"world all_reduce of floats: error {worst:.2f}x the float32 rounding bound")
    daemon = rpc.Client(os.environ["TESSEL_DAEMON_ADDRESS"], daemon_pb2_grpc.DaemonStub, rpc.cluster_token())
    status = daemon.Status(common_pb2.Empty())
    daemon.close()
    transports = {g.name: g.transport for g in status.groups}
    return {"rank": rank, "checks": checks, "failures": failures, "transports": transports, "rounding": worst}


def unreachable() -> dict:
    started = time.monotonic()
    try:
        comm_func.all_reduce(np.ones(1024, np.float32))
    except TesselError as exc:
        report = {
            "rank": get_rank(),
            "error": type(exc).__name__,
            "message": str(exc),
            "culprit": getattr(exc, "culprit_rank", None),
            "seconds": time.monotonic() - started,
        }
        print(json.dumps(report), flush=True)
        raise
    return {"rank": get_rank(), "error": None, "seconds": time.monotonic() - started}


init()
mode = sys.argv[1]
result = collectives(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}) if mode == "collectives" else unreachable()
print(json.dumps(result), flush=True)
sys.exit(0 if not result.get("failures") and not result.get("error") else 3)
