"""Misbehaving peers of a TCP data plane, for the tests that check a listener shrugs them off.

`malformed(address, count, token)` opens `count` connections that each break the handshake in one of the ways
below (some proving the token first, so the listener gets as far as parsing the key); `silent(address, count)`
opens connections that never say a word and returns them (close them when done).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
from concurrent.futures import ThreadPoolExecutor

from tessel.plugins.cpu import tcp_handshake as handshake


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=2.0)
    sock.settimeout(2.0)
    return sock


def _challenge(sock: socket.socket) -> tuple[bytes, bytes]:
    dialer_nonce = os.urandom(handshake.NONCE_BYTES)
    sock.sendall(handshake.MAGIC + dialer_nonce)
    reply = b""
    while len(reply) < handshake.CHALLENGE_BYTES:
        chunk = sock.recv(handshake.CHALLENGE_BYTES - len(reply))
        if not chunk:
            break
        reply += chunk
    return dialer_nonce, reply[: handshake.NONCE_BYTES]


def _signed(sock: socket.socket, token: bytes, body: bytes, length: int | None = None) -> None:
    dialer_nonce, listener_nonce = _challenge(sock)
    mac = handshake.dialer_proof(token, dialer_nonce, listener_nonce, body)
    sock.sendall(struct.pack("<I", len(body) if length is None else length) + body + mac)


def _kinds(token: bytes) -> list:
    """One callable per way of breaking the handshake: each gets a connected socket."""
    key = {"job": "j", "group": "g", "ranks": [0, 1], "from": 0, "to": 1, "channel": "group"}
    return [
        lambda s: s.sendall(os.urandom(int.from_bytes(os.urandom(1), "little"))),  # noise
        lambda s: s.sendall(b"TSL2" + os.urandom(5)),  # a hello cut short
        lambda s: s.sendall(b"TSL1" + struct.pack("<I", 13) + b'{"job": []}xx' + bytes(32)),  # the old protocol
        lambda s: s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),  # not even tessel
        lambda s: (_challenge(s), s.sendall(struct.pack("<I", 1 << 31))),  # an absurd length
        lambda s: (_challenge(s), s.sendall(struct.pack("<I", 0))),  # an empty request
        lambda s: _signed(s, b"not-the-token", json.dumps(key).encode()),  # a wrong token
        lambda s: _signed(s, token, b'{"job": []}'),  # proves the token, then a key that cannot be hashed
        lambda s: _signed(s, token, b"[" * 30000 + b"]" * 30000),  # nesting deeper than the parser allows
        lambda s: _signed(s, token, json.dumps({**key, "ranks": [1.5, "x"]}).encode()),
        lambda s: _signed(s, token, json.dumps({**key, "from": None}).encode()),
        lambda s: _signed(s, token, b"\xff\xfe not json"),
        lambda s: _signed(s, token, json.dumps(key).encode(), length=len(json.dumps(key)) + 100),  # too short
    ]


def malformed(address: str, count: int, token: str, workers: int = 8) -> int:
    """Open `count` malformed handshakes against `address` (several at a time); returns how many were sent."""
    kinds = _kinds(token.encode())

    def one(index: int) -> int:
        try:
            sock = _connect(address)
        except OSError:
            return 0
        try:
            kinds[index % len(kinds)](sock)
        except OSError:
            pass  # the listener dropped us mid-way: what it should do
        finally:
            with contextlib.suppress(OSError):
                sock.close()
        return 1

    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(one, range(count)))


def silent(address: str, count: int) -> list[socket.socket]:
    """`count` connections that say nothing (the caller closes them)."""
    return [_connect(address) for _ in range(count)]
