"""The TCP data plane of the CPU plugin: one listening socket per process, shared by every group and job.

Connections between members of a group are made on first use. The member with the lower group rank connects;
its handshake (tcp_handshake.py) proves by challenge–response that both ends hold the cluster token
($TESSEL_TOKEN, else the token file: the same source as every RPC) and names (job, group, group ranks, sender's
and receiver's global ranks, channel), so one listener serves any number of groups and jobs. The accept loop only
accepts: an `Admitter` thread runs the handshakes, each with its own deadline, and files each admitted connection
under its key until the receiving communicator asks for it.

    transport = TcpTransport("10.0.0.5")    # listens there; TcpTransport("0.0.0.0", advertise_host="10.0.0.5")
    transport.address                       # "10.0.0.5:40123": the daemon registers this as its data address
    comm = transport.communicator(context)  # a TcpCommunicator; collectives in tcp_communicator.py
    transport.close()
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import socket
import ssl
import threading
import time
import weakref

from tessel.core.errors import ConfigurationError, PeerFailedError, PeerUnreachableError
from tessel.core.plugin import GroupContext
from tessel.plugins.cpu import tcp_handshake as handshake
from tessel.plugins.cpu.tcp_wire import POLL_SLICE_S, Clock, Link, Who, process_alive

log = logging.getLogger("tessel.plugins.cpu")

# Socket buffers big enough to keep a multi-MiB ring step in flight (the kernel caps them at net.core.*mem_max).
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
# How long a peer may stay unreachable (refused, no route, no answer) before a collective gives up on it: enough
# for a dropped SYN to be sent again (after 1 s), short enough that a wrong address or a dead link is an error
# naming the peer within seconds instead of a wait until the collective's timeout. A registered peer's listener is
# up before its address is published, so a healthy peer never needs longer.
CONNECT_TIMEOUT_S = float(os.environ.get("TESSEL_CONNECT_TIMEOUT", "5"))
_WILDCARDS = ("", "0.0.0.0", "::")
HANDSHAKE_TLS_S = 10.0  # a TLS handshake after the token's proof: both ends are cluster members, and alive


_PROCESS_SECRET = secrets.token_hex(16)


def _cluster_token() -> str:
    """The token every RPC of this process carries. Where none is set up, a secret of this process: its transports
    reach each other (ranks as threads, in tests) and refuse every other process."""
    from tessel.core.rpc import cluster_token  # the one token source; imported late, it brings gRPC along

    try:
        return cluster_token()
    except ConfigurationError:
        return _PROCESS_SECRET


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    # Keepalive finds a peer host that vanished without a reset within seconds, not hours.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _read_some(sock: socket.socket, size: int) -> bytes:
    """Up to `size` bytes from a blocking socket (fewer only if the peer closed)."""
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigurationError(f"data address {address!r} is not 'host:port'; the peer daemon registered it wrongly")
    return host.strip("[]"), int(port)


class _Refused(Exception):
    """The listener closed the connection before it answered our hello (it was busy, or is shutting down)."""


class TcpTransport:
    """The process's TCP listener plus the connections of its groups. `close()` ends everything; idempotent."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        token: str | None = None,
        advertise_host: str = "",
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        tls: bool | None = None,
    ):
        """`tls`: encrypt every connection after the handshake (default: TESSEL_DATA_TLS=on), the listener with a
        certificate of the cluster CA, the dialer pinning that CA (core/tls.py)."""
        from tessel.core import tls as cluster_tls

        self.host = host
        self.tls = cluster_tls.data_plane_wanted() if tls is None else tls
        self._tls_server = cluster_tls.server_context() if self.tls else None
        self._tls_client = cluster_tls.client_context() if self.tls else None
        advertised = advertise_host or host
        if advertised in _WILDCARDS:
            raise ConfigurationError(
                f"the TCP data plane listens on every interface ({host!r}) but was given no address for peers to "
                "dial: pass the address other hosts reach this one at (tessel daemon --advertise-host ADDR)"
            )
        # A daemon started from the token file must prove it too, or it would accept any connection.
        self._token = (_cluster_token() if token is None else token or _PROCESS_SECRET).encode()
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
        self._admitter = handshake.Admitter(self._token, self._file, f"tessel-tcp-handshake-{port}")
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
            except _Refused as exc:
                # Dropped before the listener's answer (its handshake queue was full, or it is closing): dial again.
                sock.close()
                self._check_peer(context, peer_rank, clock)
                if time.monotonic() >= give_up:
                    raise self._unreachable(context, peer_rank, clock, ConnectionError(str(exc))) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
                continue
            except BaseException:
                sock.close()
                raise
            return self._encrypt_dialled(sock, context, peer_rank, clock)

    def _encrypt_dialled(self, sock: socket.socket, context: GroupContext, peer_rank: int, clock: Clock):
        """The dialer's TLS handshake on an admitted connection (when TLS is on): the listener must prove a
        certificate of the cluster CA."""
        if self._tls_client is None:
            return sock
        from tessel.core.tls import SERVER_NAME

        sock.settimeout(max(0.05, min(HANDSHAKE_TLS_S, clock.remaining())))
        try:
            return self._tls_client.wrap_socket(sock, server_hostname=SERVER_NAME)
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            peer = context.peers[peer_rank]
            raise PeerFailedError(
                f"TLS with {Who(peer_rank, peer.rank)} at {peer.data_address} failed ({exc}): every daemon of the "
                "job must set the same TESSEL_DATA_TLS and hold the same cluster CA (~/.tessel/tls)",
                culprit_rank=peer.rank,
            ) from None

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

    def dial_probe(self, address: str) -> socket.socket:
        """A connection to the data plane at `address` for a link probe (tcp_probe.py), handshake done (the same
        challenge–response as any peer; a probe carries no data of a job, so it is never encrypted)."""
        from tessel.plugins.cpu.tcp_probe import PROBE_CHANNEL

        host, port = _split_address(address)
        sock = socket.create_connection((host, port), timeout=self.connect_timeout_s)
        try:
            _tune(sock)
            body = handshake.encode_key("", "", (), -1, -1, PROBE_CHANNEL)
            answer = self._prove(sock, body, lambda size: _read_some(sock, size))
        except BaseException:
            sock.close()
            raise
        if answer != handshake.ACCEPTED:
            sock.close()
            why = "wrong cluster token" if answer in (handshake.BAD_TOKEN, b"?") else "the peer closed the connection"
            raise ConfigurationError(f"the data plane at {address} refused a link probe: {why}")
        return sock

    def _prove(self, sock: socket.socket, body: bytes, receive) -> bytes:
        """The dialer's side of tcp_handshake's challenge–response for a connection named by `body`; returns the
        listener's one-byte answer (b"" if it closed, b"?" if it could not prove the token). `receive(n)` reads."""
        dialer_nonce = os.urandom(handshake.NONCE_BYTES)
        sock.sendall(handshake.MAGIC + dialer_nonce)
        challenge = receive(handshake.CHALLENGE_BYTES)
        if len(challenge) < handshake.CHALLENGE_BYTES:
            raise _Refused("the listener closed the connection before answering the handshake")
        listener_nonce, proof = challenge[: handshake.NONCE_BYTES], challenge[handshake.NONCE_BYTES :]
        if not hmac.compare_digest(proof, handshake.listener_proof(self._token, dialer_nonce, listener_nonce)):
            return b"?"
        mac = handshake.dialer_proof(self._token, dialer_nonce, listener_nonce, body)
        sock.sendall(handshake.LENGTH.pack(len(body)) + body + mac)
        return receive(1)

    def _handshake(
        self, sock: socket.socket, context: GroupContext, peer_rank: int, clock: Clock, channel: str
    ) -> None:
        """The dialer's side of tcp_handshake's challenge–response; returns once the listener accepted."""
        address = context.peers[peer_rank].data_address
        body = handshake.encode_key(
            context.job_id, context.name, context.ranks, context.rank, context.ranks[peer_rank], channel
        )
        try:
            answer = self._prove(sock, body, lambda size: self._receive(sock, size, context, peer_rank, clock))
        except _Refused:
            raise _Refused(f"{address} closed the connection before answering the handshake") from None
        if answer == b"?":
            raise self._wrong_token(context, address, "it could not prove that it holds this cluster's token")
        if answer == handshake.BAD_TOKEN:
            raise self._wrong_token(context, address, "it refused this daemon's proof of the token")
        if answer != handshake.ACCEPTED:
            raise PeerFailedError(
                f"{Who(peer_rank, context.ranks[peer_rank])} closed the connection during the handshake",
                culprit_rank=context.ranks[peer_rank],
            )

    @staticmethod
    def _wrong_token(context: GroupContext, address: str, why: str) -> ConfigurationError:
        return ConfigurationError(
            f"{address} refused group {context.name!r}'s connection: wrong cluster token ({why}). Start every "
            "daemon with the same TESSEL_TOKEN (or the same ~/.tessel/token file)."
        )

    def _receive(self, sock: socket.socket, size: int, context: GroupContext, peer_rank: int, clock: Clock) -> bytes:
        """Up to `size` bytes (fewer only if the peer closed), waiting in poll slices that check the peer and clock."""
        data = bytearray()
        sock.settimeout(POLL_SLICE_S)
        while len(data) < size:
            try:
                chunk = sock.recv(size - len(data))
            except TimeoutError:
                self._check_peer(context, peer_rank, clock)
                continue
            except ConnectionError:
                break
            if not chunk:
                break
            data += chunk
        return bytes(data)

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
        """Only accepts: the handshakes run on the Admitter's thread, so no peer can stop or slow this loop."""
        try:
            while not self._closed:
                try:
                    sock, _ = self._listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    time.sleep(POLL_SLICE_S)  # out of file descriptors or similar: keep serving
                    continue
                try:
                    _tune(sock)
                except OSError:  # reset before we got to it
                    sock.close()
                    continue
                self._admitter.admit(sock)
        except Exception:  # not expected; a dead loop would hang every later job on this daemon, so say so
            log.exception("the data plane's accept loop at %s failed", self.address)
        finally:
            self._listener.close()

    def _file(self, key: handshake.Key, sock: socket.socket) -> None:
        """File an admitted connection under its key until its communicator claims it (Admitter's thread); with
        TLS on, its handshake runs first on a thread of its own (the peer proved the token: it is a cluster member)."""
        if key[-1] == "probe":  # a link probe (tcp_probe.py), authenticated like any peer: answer it on its own thread
            from tessel.plugins.cpu.tcp_probe import serve_probe

            threading.Thread(target=serve_probe, args=(sock,), name="tessel-tcp-probe", daemon=True).start()
            return
        if self._tls_server is not None:
            encrypt = threading.Thread(target=self._encrypt_admitted, args=(key, sock), name="tessel-tcp-tls")
            encrypt.daemon = True
            encrypt.start()
            return
        self._claimable(key, sock)

    def _encrypt_admitted(self, key: handshake.Key, sock: socket.socket) -> None:
        sock.settimeout(HANDSHAKE_TLS_S)
        try:
            wrapped = self._tls_server.wrap_socket(sock, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            log.warning("data plane %s: TLS handshake with an admitted peer failed: %s", self.address, exc)
            sock.close()
            return
        wrapped.settimeout(None)
        self._claimable(key, wrapped)

    def _claimable(self, key: handshake.Key, sock: socket.socket) -> None:
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
        self._admitter.close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * POLL_SLICE_S)
