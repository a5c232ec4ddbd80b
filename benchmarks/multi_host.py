"""AllReduce between hosts: what tessel's TCP data plane gets out of a link limited to a given rate.

Usage: python benchmarks/multi_host.py [--rates 1gbit,10gbit,none] [--sizes 16M,64M] [--hosts 2] [--seconds 3]

For each link rate the network-namespace test bed (tests/integration/testbed.py: one namespace per host on a
switch, every link limited both ways by tc tbf; needs root and iproute2) is built with one daemon per host, and
- the link alone is measured: one TCP stream (Python sockets) from host 0 to host 1 for about --seconds;
- tessel's AllReduce of float32 buffers resident on the daemons, one rank per host (one Execute repeats the call,
  so the client's gRPC transfers are not timed).
Prints per rate and size the time per call and the bus bandwidth (NCCL-tests: size/time x 2(n-1)/n, which for a
ring is what every link carries in each direction) next to the link's nominal rate and the stream's figure.
The machine is usually shared: expect +-10 % between runs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from testbed import Testbed, TestbedUnavailable, rate_bits  # noqa: E402
from testbed_cluster import TestbedCluster, describe  # noqa: E402

RANK = str(Path(__file__).with_name("_multi_host_rank.py"))
RECEIVER = """
import socket, sys, time
server = socket.create_server((sys.argv[1], 0))
server.settimeout(60)
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.settimeout(60)
buffer = bytearray(1 << 20)
total, started = 0, None
while True:
    got = conn.recv_into(buffer)
    if not got:
        break
    started = started or time.perf_counter()
    total += got
print(total, time.perf_counter() - started, flush=True)
"""
SENDER = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
chunk, end = bytes(1 << 20), time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    conn.sendall(chunk)
conn.close()
"""


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper().removesuffix("IB").removesuffix("B"))
    if match is None:
        raise argparse.ArgumentTypeError(f"size {text!r} is not like 4M or 64M")
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2)]


def stream_gbits(bed: Testbed, seconds: float) -> float:
    """One TCP stream from host 0 to host 1 for `seconds`, in Gbit/s as the receiver saw it."""
    sender, receiver = bed.hosts[0], bed.hosts[1]
    listening = bed.popen(
        receiver, [sys.executable, "-c", RECEIVER, receiver.address], stdout=subprocess.PIPE, text=True
    )
    port = listening.stdout.readline().strip()
    bed.run(sender, [sys.executable, "-c", SENDER, receiver.address, port, str(seconds)], timeout_s=seconds + 60)
    total, elapsed = listening.stdout.readline().split()
    listening.wait(10)
    return int(total) * 8 / float(elapsed) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="1gbit,10gbit", help="link rates, comma-separated; 'none' = unlimited")
    parser.add_argument("--sizes", default="16M,64M", help="AllReduce buffer sizes (float32), e.g. 4M,64M")
    parser.add_argument("--hosts", type=int, default=2, help="hosts, one daemon and one rank each (default 2)")
    parser.add_argument("--seconds", type=float, default=3.0, help="about how long each figure is measured")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rates = [None if r.strip().lower() == "none" else r.strip() for r in args.rates.split(",")]
    n = args.hosts
    print(f"AllReduce, {n} hosts x 1 daemon, float32 buffers on the daemons; busbw = size/time x 2(n-1)/n")
    print(f"{'link':>9} {'size':>7} {'calls':>5} {'time/call':>10} {'busbw':>12} {'of link':>8} {'1 TCP stream':>13}")
    for rate in rates:
        try:
            with Testbed(n, rate) as bed, tempfile.TemporaryDirectory() as workdir:
                stream = stream_gbits(bed, args.seconds)
                # A generous heartbeat timeout: on a busy shared machine a saturated host may beat late.
                with TestbedCluster(bed, Path(workdir), heartbeat_timeout_ms=10_000) as cluster:
                    sizes_arg = ",".join(str(s) for s in sizes)
                    results = cluster.run_ranks([RANK, sizes_arg, str(args.seconds)], timeout_s=600)
                    if any(r.returncode != 0 for r in results):
                        print(describe(results), file=sys.stderr)
                        return 1
        except TestbedUnavailable as exc:
            print(f"cannot build the test bed: {exc}", file=sys.stderr)
            return 2
        nominal = None if rate is None else rate_bits(rate) / 1e9
        for line in results[0].output.splitlines():
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            busbw = row["size"] * 8 / row["seconds"] / 1e9 * 2 * (n - 1) / n
            share = f"{busbw / nominal:7.0%}" if nominal else "      -"
            print(
                f"{rate or 'unlimited':>9} {row['size'] >> 20:>5}Mi {row['calls']:>5} {row['seconds'] * 1e3:>8.1f}ms"
                f" {busbw:>7.2f}Gbit/s {share:>8} {stream:>7.2f}Gbit/s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
