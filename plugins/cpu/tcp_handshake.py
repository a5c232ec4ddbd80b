"""Admitting data-plane connections: a challenge–response handshake in which each end proves it holds the cluster
token, without the token ever crossing the wire.

    dialer                                            listener
    HELLO     "TSL2" + dialer nonce (16 B)        ->
                                                  <-  listener nonce (16 B) + HMAC(token, LISTENER|nd|nl)
    (the dialer checks the listener's proof: a listener without the token is refused as well)
    REQUEST   length (4 B) + JSON key + HMAC(token, DIALER|nd|nl|JSON)  ->
                                                  <-  ACCEPTED or BAD_TOKEN

Both nonces enter both MACs, so a recorded handshake replayed later is refused (the listener draws a new nonce
every time). The key names (job, group, group ranks, sender, receiver, channel): one listener serves every group.

The listener's side runs on one `Admitter` thread, apart from the accept loop: it multiplexes the pending
handshakes (`selectors`), never blocking on one peer; each has its own deadline and at most `max_pending` are
pending at once (a newcomer pushes out the oldest). So a malformed or silent peer can neither stop the accept loop
nor delay another peer's handshake.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

log = logging.getLogger("tessel.plugins.cpu")

MAGIC = b"TSL2"
NONCE_BYTES = 16
MAC_BYTES = 32
HELLO_BYTES = len(MAGIC) + NONCE_BYTES
CHALLENGE_BYTES = NONCE_BYTES + MAC_BYTES
LENGTH = struct.Struct("<I")
MAX_REQUEST_BYTES = 64 * 1024
MAX_NAME_CHARS = 1024  # job ids and group names in a key
ACCEPTED, BAD_TOKEN = b"\x01", b"\x02"
HANDSHAKE_TIMEOUT_S = 5.0
MAX_PENDING = 256
_LISTENER, _DIALER = b"tessel-data-plane-listener", b"tessel-data-plane-dialer"

Key = tuple[str, str, tuple[int, ...], int, int, str]


def listener_proof(token: bytes, dialer_nonce: bytes, listener_nonce: bytes) -> bytes:
    return hmac.new(token, _LISTENER + dialer_nonce + listener_nonce, hashlib.sha256).digest()


def dialer_proof(token: bytes, dialer_nonce: bytes, listener_nonce: bytes, body: bytes) -> bytes:
    return hmac.new(token, _DIALER + dialer_nonce + listener_nonce + body, hashlib.sha256).digest()


def encode_key(job: str, group: str, ranks: tuple[int, ...], sender: int, receiver: int, channel: str) -> bytes:
    fields = {"job": job, "group": group, "ranks": list(ranks), "from": sender, "to": receiver, "channel": channel}
    return json.dumps(fields, sort_keys=True).encode()


def decode_key(body: bytes) -> Key:
    """The connection's key, or ValueError for anything but the exact shape encode_key writes."""
    fields = json.loads(body)
    if not isinstance(fields, dict):
        raise ValueError("the handshake is not a JSON object")
    job, group, channel = fields.get("job"), fields.get("group"), fields.get("channel")
    ranks, sender, receiver = fields.get("ranks"), fields.get("from"), fields.get("to")
    if not all(isinstance(s, str) and len(s) <= MAX_NAME_CHARS for s in (job, group, channel)):
        raise ValueError("job, group and channel must be short strings")
    if not isinstance(ranks, list) or not all(type(r) is int for r in ranks):
        raise ValueError("ranks must be a list of integers")
    if type(sender) is not int or type(receiver) is not int:
        raise ValueError("from and to must be integers")
    return job, group, tuple(ranks), sender, receiver, channel


class _Pending:
    """One connection in the middle of its handshake, on the listener's side."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline
        self.inbox = bytearray()
        self.want = HELLO_BYTES
        self.stage = "hello"
        self.outbox = b""
        self.dialer_nonce = b""
        self.listener_nonce = os.urandom(NONCE_BYTES)
        self.key: Key | None = None
        self.then_close = False


class Admitter:
    """Runs the listener's side of every handshake on one thread; `admit(sock)` hands it a fresh connection.

    `on_admitted(key, sock)` receives each connection that proved the token (a blocking socket, handshake done).
    """

    def __init__(
        self,
        token: bytes,
        on_admitted: Callable[[Key, socket.socket], None],
        name: str,
        timeout_s: float = HANDSHAKE_TIMEOUT_S,
        max_pending: int = MAX_PENDING,
    ):
        self.token, self.on_admitted = token, on_admitted
        self.timeout_s, self.max_pending = timeout_s, max_pending
        self.refused = 0  # connections dropped: malformed, wrong token, too slow or pushed out (for tests and logs)
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, None)
        self._incoming: list[socket.socket] = []
        self._lock = threading.Lock()
        self._pending: dict[socket.socket, _Pending] = {}  # insertion order = age
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def admit(self, sock: socket.socket) -> None:
        with self._lock:
            if self._closed:
                sock.close()
                return
            self._incoming.append(sock)
        with contextlib.suppress(OSError):  # a full wake-up pipe already wakes the thread
            self._wake_writer.send(b"\0")

    def close(self) -> None:
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._wake_writer.send(b"\0")
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    # -- the thread -------------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closed:
                self._take_incoming()
                now = time.monotonic()
                for pending in [p for p in self._pending.values() if p.deadline <= now]:
                    self._drop(pending)
                wait = min((p.deadline for p in self._pending.values()), default=now + 1.0) - now
                for selected, _ in self._selector.select(timeout=max(0.0, min(wait, 1.0))):
                    pending = selected.data
                    if pending is None:
                        with contextlib.suppress(OSError):
                            self._wake_reader.recv(4096)
                    elif pending.sock in self._pending:
                        self._step(pending)
        except Exception:  # never expected: log it, and refuse new connections rather than leave them hanging
            log.exception("the data plane's handshake thread failed")
        finally:
            with self._lock:
                self._closed = True
                incoming, self._incoming = self._incoming, []
            for sock in incoming:
                sock.close()
            for pending in list(self._pending.values()):
                self._drop(pending, count=False)
            self._selector.close()
            self._wake_reader.close()
            self._wake_writer.close()

    def _take_incoming(self) -> None:
        with self._lock:
            incoming, self._incoming = self._incoming, []
        for sock in incoming:
            while len(self._pending) >= self.max_pending:  # the oldest has had the longest to speak
                self._drop(next(iter(self._pending.values())))
            pending = _Pending(sock, time.monotonic() + self.timeout_s)
            try:
                sock.setblocking(False)
                self._selector.register(sock, selectors.EVENT_READ, pending)
            except (OSError, ValueError):
                sock.close()
                continue
            self._pending[sock] = pending

    def _drop(self, pending: _Pending, count: bool = True) -> None:
        self._pending.pop(pending.sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(pending.sock)
        pending.sock.close()
        if count:
            self.refused += 1

    def _step(self, pending: _Pending) -> None:
        try:
            if pending.outbox:
                sent = pending.sock.send(pending.outbox)
                pending.outbox = pending.outbox[sent:]
            else:
                chunk = pending.sock.recv(pending.want - len(pending.inbox))
                if not chunk:
                    raise ConnectionError("closed during the handshake")
                pending.inbox += chunk
                if len(pending.inbox) == pending.want:
                    data, pending.inbox = bytes(pending.inbox), bytearray()
                    self._advance(pending, data)
        except (BlockingIOError, InterruptedError):
            return
        except Exception:  # closed, malformed (bad JSON, absurd nesting, wrong types): this peer only
            self._drop(pending)
            return
        if pending.outbox:
            self._selector.modify(pending.sock, selectors.EVENT_WRITE, pending)
            return
        if pending.then_close:
            self._drop(pending)
        elif pending.key is not None:
            self._hand_over(pending)
        else:
            self._selector.modify(pending.sock, selectors.EVENT_READ, pending)

    def _advance(self, pending: _Pending, data: bytes) -> None:
        """Act on a complete message of the current stage (ValueError drops the connection)."""
        if pending.stage == "hello":
            if data[: len(MAGIC)] != MAGIC:
                raise ValueError("not a tessel data-plane handshake")
            pending.dialer_nonce = data[len(MAGIC) :]
            proof = listener_proof(self.token, pending.dialer_nonce, pending.listener_nonce)
            pending.outbox = pending.listener_nonce + proof
            pending.stage, pending.want = "length", LENGTH.size
        elif pending.stage == "length":
            (size,) = LENGTH.unpack(data)
            if not 0 < size <= MAX_REQUEST_BYTES:
                raise ValueError(f"a {size}-byte handshake request")
            pending.stage, pending.want = "request", size + MAC_BYTES
        else:
            body, mac = data[:-MAC_BYTES], data[-MAC_BYTES:]
            expected = dialer_proof(self.token, pending.dialer_nonce, pending.listener_nonce, body)
            if not hmac.compare_digest(mac, expected):
                pending.outbox, pending.then_close = BAD_TOKEN, True
                return
            pending.key = decode_key(body)
            pending.outbox = ACCEPTED

    def _hand_over(self, pending: _Pending) -> None:
        self._pending.pop(pending.sock, None)
        self._selector.unregister(pending.sock)
        pending.sock.setblocking(True)
        try:
            self.on_admitted(pending.key, pending.sock)
        except Exception:
            log.exception("filing an admitted data-plane connection failed")
            pending.sock.close()
