"""A link probe over the TCP data plane: how long a small message takes and how fast bulk data flows between two
daemons, so the coordinator's cost model knows the link between two hosts from measurement.

The prober dials the peer's data plane with the usual signed handshake (channel "probe": a connection without the
cluster token's HMAC is refused, as any other), then sends messages `[kind u8][length u64][length bytes]`; the
peer answers each with one byte. Kind 1 is a ping (small), 2 a bulk transfer, 0 the end. The peer serves one probe
connection for at most PROBE_BUDGET_S and PROBE_MAX_BYTES, then closes it.

    >>> probe(transport, "10.0.0.6:40123")
    LinkMeasurement(latency_s=4.1e-05, bandwidth=1.2e+09)
"""

from __future__ import annotations

import socket
import statistics
import struct
import time

from tessel.core.errors import ConfigurationError
from tessel.core.plugin import LinkMeasurement

PROBE_CHANNEL = "probe"
PROBE_MAX_BYTES = 256 << 20  # what one probe connection may move at most
PROBE_BUDGET_S = 10.0  # how long a peer serves one probe connection
_MESSAGE = struct.Struct("<BQ")
_END, _PING, _BULK = 0, 1, 2
PINGS = 30
BULK_BYTES = 4 << 20
BULK_ROUNDS = 4


def probe(transport, data_address: str, pings: int = PINGS, bulk_bytes: int = BULK_BYTES) -> LinkMeasurement:
    """One-way latency (half the median ping round trip) and bandwidth (the best of a few bulk transfers, less a
    round trip) from this transport to the daemon at `data_address`."""
    sock = transport.dial_probe(data_address)
    try:
        sock.settimeout(PROBE_BUDGET_S)
        trips = [_send(sock, _PING, b"\0" * 8) for _ in range(pings)]
        round_trip = statistics.median(trips)
        payload = bytes(bulk_bytes)
        best = min(_send(sock, _BULK, payload) for _ in range(BULK_ROUNDS))
        sock.sendall(_MESSAGE.pack(_END, 0))
    except OSError as exc:
        raise ConfigurationError(f"probing the link to {data_address} failed: {exc}") from None
    finally:
        sock.close()
    return LinkMeasurement(round_trip / 2, bulk_bytes / max(best - round_trip, best / 2))


def _send(sock: socket.socket, kind: int, payload: bytes) -> float:
    began = time.perf_counter()
    sock.sendall(_MESSAGE.pack(kind, len(payload)))
    sock.sendall(payload)
    if sock.recv(1) != b"\1":
        raise ConnectionError("the peer closed the probe connection")
    return time.perf_counter() - began


def serve_probe(sock: socket.socket) -> None:
    """Answer one probe connection (on its own thread), within PROBE_BUDGET_S and PROBE_MAX_BYTES."""
    deadline = time.monotonic() + PROBE_BUDGET_S
    moved = 0
    buffer = bytearray(1 << 20)
    try:
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            kind, length = _MESSAGE.unpack(_read(sock, _MESSAGE.size))
            moved += length
            if kind == _END or kind not in (_PING, _BULK) or moved > PROBE_MAX_BYTES:
                return
            while length:
                got = sock.recv_into(buffer, min(length, len(buffer)))
                if not got:
                    return
                length -= got
            sock.sendall(b"\1")
    except (OSError, ConnectionError, struct.error):
        return
    finally:
        sock.close()


def _read(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("probe connection closed")
        data += chunk
    return bytes(data)
