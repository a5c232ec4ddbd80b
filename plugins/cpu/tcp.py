"""The TCP data plane of the CPU plugin: one listening socket per process, shared by every group and job.

Connections between members of a group are made on first use. The member with the lower group rank connects;
its first bytes are a handshake naming (job, group, group ranks, sender's and receiver's global ranks, channel), so one
listener serves any number of groups and jobs, and the accept thread files each connection under that key until
the receiving communicator asks for it. With a cluster token ($TESSEL_TOKEN, else the token file: the same source as
every RPC) the handshake carries an HMAC of its contents and connections without the right one are refused.

    transport = TcpTransport("10.0.0.5")    # listens there; TcpTransport("0.0.0.0", advertise_host="10.0.0.5")
    transport.address                       # "10.0.0.5:40123": the daemon registers this as its data address
    comm = transport.communicator(context)  # a TcpCommunicator; collectives in tcp_communicator.py
    transport.close()
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import threading
import time
import weakref

from tessel.core.errors import ConfigurationError, PeerFailedError, PeerUnreachableError
from tessel.core.plugin import GroupContext
from tessel.plugins.cpu.tcp_wire import POLL_SLICE_S, Clock, Link, Who, process_alive

_MAGIC = b"TSL1"
_HEADER = struct.Struct("<4sI")  # magic, length of the JSON handshake that follows
_MAX_HANDSHAKE = 64 * 1024
_ACCEPTED, _BAD_TOKEN = b"\x01", b"\x02"
# Socket buffers big enough to keep a multi-MiB ring step in flight (the kernel caps them at net.core.*mem_max).
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
_HANDSHAKE_TIMEOUT_S = 5.0
# How long a peer may stay unreachable (refused, no route, no answer) before a collective gives up on it: enough
# for a dropped SYN to be sent again (after 1 s), short enough that a wrong address or a dead link is an error
# naming the peer within seconds instead of a wait until the collective's timeout. A registered peer's listener is
# up before its address is published, so a healthy peer never needs longer.
CONNECT_TIMEOUT_S = float(os.environ.get("TESSEL_CONNECT_TIMEOUT", "5"))
_WILDCARDS = ("", "0.0.0.0", "::")


def _cluster_token() -> str:
    """The token every RPC of this process carries, or "" where none is set up (then handshakes carry no HMAC)."""
    from tessel.core.rpc import cluster_token  # the one token source; imported late, it brings gRPC along

    try:
        return cluster_token()
    except ConfigurationError:
        return ""


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    # Keepalive finds a peer host that vanished without a reset within seconds, not hours.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigurationError(f"data address {address!r} is not 'host:port'; the peer daemon registered it wrongly")
    return host.strip("[]"), int(port)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed during the handshake")
        data += chunk
    return bytes(data)


class TcpTransport:
    """The process's TCP listener plus the connections of its groups. `close()` ends everything; idempotent."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        token: str | None = None,
        advertise_host: str = "",
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ):
        self.host = host
        advertised = advertise_host or host
        if advertised in _WILDCARDS:
            raise ConfigurationError(
                f"the TCP data plane listens on every interface ({host!r}) but was given no address for peers to "
                "dial: pass the address other hosts reach this one at (tessel daemon --advertise-host ADDR)"
            )
        # A daemon started from the token file must sign with it too, or it would accept any connection.
        self._token = (_cluster_token() if token is None else token).encode()
        self.connect_timeout_s = connect_timeout_s
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        _tune(self._listener)  # accepted connections inherit the buffer sizes, which must be set before connecting
        try:
            self._listener.bind((host, 0))
        except OSError as exc:
            self._listener.close()
            raise ConfigurationError(
                f"the TCP data plane cannot listen on {host!r}: {exc}. Pass an address of this host (--host)."
            ) from None
        self._listener.listen(256)
        self._listener.settimeout(POLL_SLICE_S)
        port = self._listener.getsockname()[1]
        self.address = f"[{advertised}]:{port}" if ":" in advertised else f"{advertised}:{port}"
        self._arrived: dict[tuple, socket.socket] = {}
        self._cond = threading.Condition()
        self._communicators: weakref.WeakSet = weakref.WeakSet()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name=f"tessel-tcp-accept-{port}", daemon=True)
        self._thread.start()

    def communicator(self, context: GroupContext):
        """A communicator for `context`'s group; connections to its members are made on first use."""
        from tessel.plugins.cpu.tcp_communicator import TcpCommunicator

        if self._closed:
            raise ConfigurationError(f"TCP transport {self.address} is closed; create a new plugin")
        if context.rank not in context.ranks or len(context.peers) != len(context.ranks):
            raise ConfigurationError(
                f"group {context.name!r}: rank {context.rank} must be one of ranks {context.ranks}, with one peer "
                f"per rank (got {len(context.peers)} peers)"
            )
        for peer in context.peers:
            _split_address(peer.data_address)
        communicator = TcpCommunicator(context, self)
        self._communicators.add(communicator)
        return communicator

    def connect(self, context: GroupContext, peer_rank: int, clock: Clock, channel: str = "group") -> Link:
        """The link to group rank `peer_rank` for `channel` (a group may use several connections to one peer):
        dialled by the lower group rank, awaited by the higher one."""
        who = Who(peer_rank, context.ranks[peer_rank])
        if context.group_rank < peer_rank:
            sock = self._dial(context, peer_rank, clock, channel)
        else:
            sock = self._await(context, peer_rank, clock, channel)
        return Link(sock, who)

    def _check_peer(self, context: GroupContext, peer_rank: int, clock: Clock) -> None:
        peer = context.peers[peer_rank]
        who = Who(peer_rank, peer.rank)
        same_host = peer.host_id == context.peers[context.group_rank].host_id
        if same_host and not process_alive(peer.pid):
            raise PeerFailedError(
                f"{clock.what} on group {context.name!r}: {who} (pid {peer.pid} on this host) is not running",
                culprit_rank=peer.rank,
            )
        clock.check([who])

    def _dial(self, context: GroupContext, peer_rank: int, clock: Clock, channel: str) -> socket.socket:
        host, port = _split_address(context.peers[peer_rank].data_address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        delay = 0.005
        give_up = time.monotonic() + self.connect_timeout_s
        while True:
            if self._closed:
                raise ConfigurationError(f"TCP transport {self.address} was closed while connecting")
            sock = socket.socket(family, socket.SOCK_STREAM)
            _tune(sock)
            sock.settimeout(max(0.05, min(1.0, clock.remaining(), give_up - time.monotonic())))
            try:
                sock.connect((host, port))
            except OSError as exc:
                sock.close()
                # Refused, no route or no answer: retry briefly, unless the peer is known dead or the job failed.
                self._check_peer(context, peer_rank, clock)
                if time.monotonic() >= give_up:
                    raise self._unreachable(context, peer_rank, clock, exc) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
                continue
            try:
                self._handshake(sock, context, peer_rank, clock, channel)
            except BaseException:
                sock.close()
                raise
            return sock

    def _unreachable(self, context: GroupContext, peer_rank: int, clock: Clock, cause: OSError) -> PeerUnreachableError:
        peer = context.peers[peer_rank]
        reason = "no answer" if isinstance(cause, TimeoutError) else (cause.strerror or str(cause))
        return PeerUnreachableError(
            f"{clock.what} on group {context.name!r}: cannot reach {Who(peer_rank, peer.rank)} at "
            f"{peer.data_address} from {self.address} ({reason}, for {self.connect_timeout_s:g} s). Its daemon "
            "registered that data address: start it with --host (or --advertise-host) set to an address the other "
            "hosts can route to, and check that the link between the hosts is up and lets TCP through.",
            culprit_rank=peer.rank,
        )

    def _hello(self, fields: dict) -> bytes:
        """The signed handshake a dialling side sends first."""
        body = json.dumps(fields, sort_keys=True).encode()
        mac = hmac.new(self._token, body, hashlib.sha256).digest() if self._token else b""
        return _HEADER.pack(_MAGIC, len(body)) + body + mac.ljust(32, b"\0")

    def dial_probe(self, address: str) -> socket.socket:
        """A connection to the data plane at `address` for a link probe (tcp_probe.py), handshake done."""
        from tessel.plugins.cpu.tcp_probe import PROBE_CHANNEL

        host, port = _split_address(address)
        sock = socket.create_connection((host, port), timeout=self.connect_timeout_s)
        try:
            _tune(sock)
            fields = {"job": "", "group": "", "ranks": [], "from": -1, "to": -1, "channel": PROBE_CHANNEL}
            sock.sendall(self._hello(fields))
            answer = sock.recv(1)
        except BaseException:
            sock.close()
            raise
        if answer != _ACCEPTED:
            sock.close()
            why = "wrong cluster token" if answer == _BAD_TOKEN else "the peer closed the connection"
            raise ConfigurationError(f"the data plane at {address} refused a link probe: {why}")
        return sock

    def _handshake(
        self, sock: socket.socket, context: GroupContext, peer_rank: int, clock: Clock, channel: str
    ) -> None:
        fields = {
            "job": context.job_id,
            "group": context.name,
            "ranks": list(context.ranks),
            "from": context.rank,
            "to": context.ranks[peer_rank],
            "channel": channel,
        }
        sock.sendall(self._hello(fields))
        sock.settimeout(POLL_SLICE_S)
        while True:
            try:
                answer = sock.recv(1)
                break
            except TimeoutError:
                self._check_peer(context, peer_rank, clock)
        if answer == _BAD_TOKEN:
            raise ConfigurationError(
                f"{context.peers[peer_rank].data_address} refused group {context.name!r}'s connection: wrong "
                "cluster token. Start every daemon with the same TESSEL_TOKEN (or the same ~/.tessel/token file)."
            )
        if answer != _ACCEPTED:
            raise PeerFailedError(
                f"{Who(peer_rank, context.ranks[peer_rank])} closed the connection during the handshake",
                culprit_rank=context.ranks[peer_rank],
            )

    def _await(self, context: GroupContext, peer_rank: int, clock: Clock, channel: str) -> socket.socket:
        key = (context.job_id, context.name, tuple(context.ranks), context.ranks[peer_rank], context.rank, channel)
        with self._cond:
            while key not in self._arrived:
                if self._closed:
                    raise ConfigurationError(f"TCP transport {self.address} was closed while waiting for a peer")
                self._check_peer(context, peer_rank, clock)
                self._cond.wait(min(POLL_SLICE_S, max(0.001, clock.remaining())))
            return self._arrived.pop(key)

    def _accept_loop(self) -> None:
        try:
            while not self._closed:
                try:
                    sock, _ = self._listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    time.sleep(POLL_SLICE_S)  # out of file descriptors or similar: keep serving
                    continue
                self._admit(sock)
        finally:
            self._listener.close()

    def _admit(self, sock: socket.socket) -> None:
        """Read a handshake and file the connection under its key (or drop one that is not a tessel peer)."""
        try:
            _tune(sock)
            sock.settimeout(_HANDSHAKE_TIMEOUT_S)
            magic, size = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
            if magic != _MAGIC or size > _MAX_HANDSHAKE:
                raise ValueError("not a tessel handshake")
            body = _read_exactly(sock, size)
            mac = _read_exactly(sock, 32)
            if self._token and not hmac.compare_digest(mac, hmac.new(self._token, body, hashlib.sha256).digest()):
                sock.sendall(_BAD_TOKEN)
                raise ValueError("wrong cluster token")
            fields = json.loads(body)
            ranks, sender, receiver = tuple(fields["ranks"]), int(fields["from"]), int(fields["to"])
            key = (fields["job"], fields["group"], ranks, sender, receiver, str(fields["channel"]))
            sock.sendall(_ACCEPTED)
        except (OSError, ValueError, KeyError, TypeError):
            sock.close()
            return
        if key[-1] == "probe":  # a link probe (tcp_probe.py), authenticated like any peer: answer it on its own thread
            from tessel.plugins.cpu.tcp_probe import serve_probe

            threading.Thread(target=serve_probe, args=(sock,), name="tessel-tcp-probe", daemon=True).start()
            return
        with self._cond:
            if self._closed:
                sock.close()
                return
            stale = self._arrived.pop(key, None)
            if stale is not None:  # the peer re-created the group: the old connection is dead to it
                stale.close()
            self._arrived[key] = sock
            self._cond.notify_all()

    def close(self) -> None:
        """Close the listener, every group's connections and every connection not yet claimed. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            arrived, self._arrived = list(self._arrived.values()), {}
            self._cond.notify_all()
        for communicator in list(self._communicators):
            communicator.close()
        for sock in arrived:
            sock.close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * POLL_SLICE_S + _HANDSHAKE_TIMEOUT_S)
