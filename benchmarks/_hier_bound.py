"""The physical bound of AllReduce across 2 test-bed hosts x 2 ranks, flat ring vs hierarchical, on this machine
(used by benchmarks/heterogeneous.py part 2; also `python benchmarks/_hier_bound.py RATE` as root).

What each algorithm must do for an all_reduce of S bytes per rank (ranks 0, 1 on host 0; 2, 3 on host 1):

    flat ring 0-1-2-3 over TCP   every rank sends and receives 2 x 3/4 S = 1.5 S; the hops 1->2 and 3->0 cross
                                 hosts, so each host's link carries 1.5 S each way, and 0->1, 2->3 go over the
                                 host's loopback: 3 S of TCP across hosts, 3 S inside them; every rank reduces
                                 3/4 S (3 S of reductions in all)
    hierarchical                 reduce_scatter in each host over shared memory (every rank writes S/2 for its
                                 peer and reduces S/2), all_reduce of S/2 in each cross pair over TCP (sends
                                 S/2, reduces S/4), all_gather in the host (writes S/2 into the peer's output):
                                 each host's link carries S each way (2 S of TCP in all), 3 S of reductions,
                                 4 S of copies through shared memory

so on the link alone the hierarchy can be at most 1.5x the ring (S against 1.5 S: a lower bound on any 2-host
all_reduce is S each way). But the two "hosts" are namespaces on one machine whose cores run all four ranks and
every TCP byte's kernel work (a copy out of the sender, one into the receiver, the protocol, the veth and the
bridge). This measures those per-byte CPU costs here (CPU time, not wall time, so other work's load does not
enter): reducing and copying float32 with numpy, and TCP between the hosts at the link rate and over a host's
loopback (sender's and receiver's CPU per byte moved). The bound of each algorithm is then

    max(link bytes / link rate, CPU seconds / cores)

(both steps overlapping perfectly, and the cores free of other work), and their ratio the best speedup this
machine allows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

_TCP_BYTES = 256 << 20
_CHUNK = 16 << 20  # reduce and copy: a buffer past the L2 caches, as the 4-16 MiB all_reduces are
_RECEIVER = r"""
import json, resource, socket, sys
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], 0)); server.listen(1); print(server.getsockname()[1], flush=True)
conn, _ = server.accept(); buffer = bytearray(4 << 20); view = memoryview(buffer); total = 0
while True:
    got = conn.recv_into(view)
    if not got: break
    total += got
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"bytes": total, "cpu": usage.ru_utime + usage.ru_stime}), flush=True)
"""
_SENDER = r"""
import json, resource, socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2]))); payload = bytes(4 << 20)
total, started = int(sys.argv[3]), time.perf_counter()
for _ in range(total // len(payload)): conn.sendall(payload)
conn.shutdown(socket.SHUT_WR); conn.recv(1); wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime}), flush=True)
"""


@dataclass(frozen=True)
class Costs:
    """CPU seconds per byte on this machine, and the cores the test bed's ranks share."""

    reduce: float  # numpy float32 a += b, per byte of a
    copy: float  # numpy copyto, per byte
    tcp_across: float  # sender + receiver, per byte between two test-bed hosts
    tcp_loopback: float  # sender + receiver, per byte inside one host
    across_rate: float  # bytes/s one TCP stream reached between the hosts (wall)
    cores: int


def _cpu_per_byte(fn, nbytes: int, repeats: int = 8) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time()
        fn()
        best = min(best, time.thread_time() - started)
    return best / nbytes


def _tcp(bed, sender_host, receiver_host, nbytes: int = _TCP_BYTES) -> tuple[float, float]:
    """(CPU seconds per byte of sender + receiver, wall bytes/s) of one TCP stream from one host to another."""
    receiver = bed.popen(receiver_host, [sys.executable, "-c", _RECEIVER, receiver_host.address],
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        port = receiver.stdout.readline().strip()
        sent = bed.run(sender_host, [sys.executable, "-c", _SENDER, receiver_host.address, port, str(nbytes)], 120)
        if sent.returncode != 0:
            raise RuntimeError(f"TCP sender failed: {sent.stderr[-500:]}")
        received = json.loads(receiver.stdout.readline())
        sender = json.loads(sent.stdout.strip().splitlines()[-1])
    finally:
        receiver.wait(10)
    return (sender["cpu"] + received["cpu"]) / received["bytes"], received["bytes"] / sender["wall"]


def measure(bed) -> Costs:
    """Measure the per-byte costs on the test bed `bed` (2 hosts), at its link rate."""
    a = np.ones(_CHUNK // 4, np.float32)
    b = np.ones_like(a)
    reduce = _cpu_per_byte(lambda: np.add(a, b, out=a), a.nbytes)
    copy = _cpu_per_byte(lambda: np.copyto(a, b), a.nbytes)
    first, second = bed.hosts[:2]
    across = min(_tcp(bed, first, second) for _ in range(2))
    loopback = min(_tcp(bed, first, first)[0] for _ in range(2))
    return Costs(reduce, copy, across[0], loopback, across[1], os.cpu_count() or 1)


def bound(costs: Costs, rate_bits: float, size: int) -> dict[str, dict[str, float]]:
    """Per algorithm: seconds on the link, seconds of CPU over the cores, and the bound (their max)."""
    s, rate = float(size), rate_bits / 8
    work = {
        "flat": (1.5 * s, 3 * s * costs.tcp_across + 3 * s * costs.tcp_loopback + 3 * s * costs.reduce),
        "hierarchical": (s, 2 * s * costs.tcp_across + 3 * s * costs.reduce + 4 * s * costs.copy),
    }
    out = {}
    for name, (link_bytes, cpu) in work.items():
        link_s, cores_s = link_bytes / rate, cpu / costs.cores
        out[name] = {"link_s": link_s, "cpu_s": cpu, "cores_s": cores_s, "bound_s": max(link_s, cores_s)}
    return out


def rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, factor in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * factor
    raise ValueError(f"link rate {rate!r}: give it like 1gbit or 10gbit")


def describe(costs: Costs) -> str:
    return (
        f"measured CPU per byte: reduce {costs.reduce * 1e9:.2f} ns, copy {costs.copy * 1e9:.2f} ns, "
        f"TCP across hosts {costs.tcp_across * 1e9:.2f} ns (sender + receiver; one stream reached "
        f"{costs.across_rate * 8 / 1e9:.1f} Gbit/s), TCP in a host {costs.tcp_loopback * 1e9:.2f} ns; "
        f"{costs.cores} cores"
    )


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
    from testbed import Testbed

    rate = sys.argv[1] if len(sys.argv) > 1 else "10gbit"
    with Testbed(2, rate) as bed:
        found = measure(bed)
    print(describe(found))
    for size in (4 << 20, 16 << 20):
        b = bound(found, rate_bits(rate), size)
        print(size >> 20, "MiB", json.dumps({k: {n: round(v * 1e3, 1) for n, v in d.items()} for k, d in b.items()}))
