"""Execute over a Unix socket: the hot path between a client and a daemon on the same host.

gRPC's Python stack costs about half a millisecond per call on a 2-core host (measured here: an empty Execute
took 0.56 ms, a raw Unix-socket round trip 7 us), which is most of a small training step in feed mode, where
every step is one Execute. So a daemon also listens on a Unix socket in a private directory (mode 0700) and
serves Execute there, and only Execute: everything else stays on gRPC. The frames hold the same protobuf
messages as the gRPC call (never pickle): one kind byte, an 8-byte little-endian length, the payload.

    client -> TOKEN (the cluster token, once per connection), then REQUEST (an ExecuteRequest) ...
    daemon -> REPLY (an ExecuteReply) or ERROR (a LocalExecuteError: the exception the gRPC path would raise)

A wrong token or an oversized frame closes the connection. The directory is named after the daemon's pid
(`tessel-daemon-<pid>-<random>`); a daemon killed with SIGKILL cannot remove its own, so every daemon that starts
removes those of dead daemons (`remove_stale_directories`). The client side (LocalExecuteClient) is used by
RemoteDaemon when the daemon reports this socket and the same host id; a daemon that dies closes the socket,
so a waiting client fails at once instead of at its deadline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from tessel.core import rpc
from tessel.core.errors import (
    ConfigurationError,
    DaemonUnreachableError,
    JobFailedError,
    RendezvousTimeoutError,
    TesselError,
)
from tessel.core.process import pid_alive
from tessel.v1 import daemon_pb2

log = logging.getLogger("tessel.daemon")

TOKEN, REQUEST, REPLY, ERROR = 1, 2, 3, 4
_HEADER = struct.Struct("<BQ")
_MAX_PATH = 100  # sun_path holds 108 bytes on Linux
TOKEN_TIMEOUT_S = 5.0  # a connection must send the token this soon
DIRECTORY_PREFIX = "tessel-daemon-"
SOCKET_NAME = "execute.sock"
_STARTING_S = 60.0  # a directory younger than this whose socket does not answer may belong to a daemon starting


def _answers(path: str) -> bool:
    """Whether a server accepts connections on the Unix socket `path` (a live daemon's does)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def remove_stale_directories(root: str | None = None) -> list[str]:
    """Remove this user's daemon socket directories under `root` (the temp dir) whose daemon is dead: its pid is
    gone, or for a minute its socket has not answered (a reused pid, or a directory of an older naming)."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(DIRECTORY_PREFIX):
            continue
        try:
            stat = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_dir(follow_symlinks=False) or stat.st_uid != os.getuid():
            continue
        pid_text = entry.name[len(DIRECTORY_PREFIX) :].split("-", 1)[0]
        pid = int(pid_text) if pid_text.isdigit() else None
        if pid is not None and not pid_alive(pid):
            dead = True
        else:  # alive (maybe a reused pid) or unknown: dead only if its socket has long stopped answering
            dead = time.time() - stat.st_mtime > _STARTING_S and not _answers(os.path.join(entry.path, SOCKET_NAME))
        if dead:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


class ChannelClosed(Exception):
    """The peer closed the connection (or sent something that is not a frame)."""


def send_frame(sock: socket.socket, kind: int, payload: bytes) -> None:
    header = _HEADER.pack(kind, len(payload))
    if len(payload) < 1 << 16:
        sock.sendall(header + payload)  # one system call for a small frame
    else:
        sock.sendall(header)
        sock.sendall(payload)


def recv_frame(sock: socket.socket, max_bytes: int) -> tuple[int, bytearray]:
    kind, size = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    if size > max_bytes:
        raise ChannelClosed(f"a {size}-byte frame is over the {max_bytes}-byte limit")
    return kind, _recv_exactly(sock, size)


def _recv_exactly(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        count = sock.recv_into(view[got:], size - got)
        if count == 0:
            raise ChannelClosed("the connection was closed")
        got += count
    return buffer  # protobuf parses a bytearray as it is: no copy


class LocalExecuteServer:
    """Serves `execute(frame) -> ExecuteReply` on a Unix socket, one thread per connection. `frame` is the
    serialized ExecuteRequest, a bytearray that `execute` parses and may empty (`frame.clear()`): nothing else here
    keeps the request, so a large feed is freed as soon as it is decoded (daemon/service.py `_unpack`)."""

    def __init__(self, execute: Callable[[Any], Any], token: str, max_request_bytes: int):
        self.execute, self.token, self.max_bytes = execute, token, max_request_bytes
        for stale in remove_stale_directories():
            log.info("removed %s, the socket directory of a daemon that died", stale)
        # Mode 0700: only this user can connect.
        self.directory = tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-")
        self.path = os.path.join(self.directory, SOCKET_NAME)
        if len(self.path) > _MAX_PATH:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise ConfigurationError(f"the socket path {self.path} is too long for a Unix socket; set TMPDIR shorter")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(self.path)
            self._listener.listen(64)
        except OSError:
            self._listener.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self._closed = False
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="tessel-local-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="tessel-local-execute", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(TOKEN_TIMEOUT_S)  # a silent connection does not hold a thread for ever
            kind, token = recv_frame(conn, 1024)
            if kind != TOKEN or not secrets.compare_digest(token, self.token.encode()):
                log.warning("local Execute socket: a connection without the cluster token was closed")
                return
            conn.settimeout(None)  # between a client's requests: as long as it likes
            while True:
                kind, payload = recv_frame(conn, self.max_bytes)
                if kind != REQUEST:
                    return
                send_frame(conn, *self._answer(payload))
        except (ChannelClosed, OSError):
            pass
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _answer(self, payload: bytearray) -> tuple[int, bytes]:
        try:
            reply = self.execute(payload)
            return REPLY, reply.SerializeToString()
        except Exception as exc:  # the same mapping as the gRPC path (rpc._abort_with)
            kind, message, culprit = rpc.error_fields(exc)
            error = daemon_pb2.LocalExecuteError(
                kind=kind, message=message, has_culprit=culprit is not None, culprit_rank=culprit or 0
            )
            return ERROR, error.SerializeToString()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for conn in self._connections:
                with contextlib.suppress(OSError):  # already closed by the peer
                    conn.shutdown(socket.SHUT_RDWR)  # wakes its thread, and a client waiting on it fails at once
        shutil.rmtree(self.directory, ignore_errors=True)


class LocalExecuteClient:
    """Sends Execute requests over a daemon's Unix socket; one call at a time (calls from threads queue)."""

    def __init__(self, path: str, token: str, timeout_s: float, what: str, rank: int = -1):
        """`rank`: the rank this daemon serves, blamed when the daemon goes away (DaemonUnreachableError)."""
        self.what, self.timeout_s, self.rank = what, timeout_s, rank
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(10.0)
            self._sock.connect(path)
            send_frame(self._sock, TOKEN, token.encode())
        except OSError:
            self._sock.close()
            raise
        self._lock = threading.Lock()
        self._aborted: Exception | None = None

    def abort(self, error: Exception) -> None:
        """End the call in flight now and fail every later one with `error` (see rpc.Client.abort)."""
        self._aborted = error
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the waiting recv without the call's lock

    def execute(self, request: daemon_pb2.ExecuteRequest, timeout_s: float | None = None) -> daemon_pb2.ExecuteReply:
        payload = request.SerializeToString()
        with self._lock:
            sock = self._sock
            if self._aborted is not None:
                raise self._aborted
            if sock is None:
                raise JobFailedError(f"{self.what}: the connection to the daemon was lost earlier")
            sock.settimeout(timeout_s or self.timeout_s)
            try:
                send_frame(sock, REQUEST, payload)
                kind, body = recv_frame(sock, 1 << 62)
            except TimeoutError:
                self._drop()  # a late reply would answer the next request
                raise RendezvousTimeoutError(
                    f"{self.what}: no reply within {timeout_s or self.timeout_s:g} s; the program may be stuck in a "
                    "collective that another rank never called"
                ) from None
            except (ChannelClosed, OSError) as exc:
                self._drop()
                if self._aborted is not None:
                    raise self._aborted from None
                raise DaemonUnreachableError(
                    f"{self.what} is unreachable: {exc}; is the daemon of rank {self.rank} still running?", self.rank
                ) from None
        if kind == REPLY:
            return daemon_pb2.ExecuteReply.FromString(body)
        error = daemon_pb2.LocalExecuteError.FromString(body)
        culprit = error.culprit_rank if error.has_culprit else None
        rebuilt = rpc.rebuilt_error(error.kind, error.message, culprit)
        raise rebuilt if rebuilt is not None else TesselError(f"{self.what} failed: {error.message}")

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        with self._lock:
            self._drop()
