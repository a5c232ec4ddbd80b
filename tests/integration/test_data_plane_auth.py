"""The TCP data plane admits only peers that prove the cluster token by challenge–response, and no malformed or
silent peer can stop its accept loop or delay the others (tcp_handshake.py).

The fast tests run transports in this process over real sockets; the slow one abuses a real daemon's data plane
and then times a TCP job on it against the same job on the same cluster before the abuse.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from data_plane_abuse import malformed, silent

from tessel.core.plugin import GroupContext, Peer
from tessel.plugins.cpu import tcp_handshake as handshake
from tessel.plugins.cpu.tcp import TcpTransport
from tests.conftest import ROOT

SCRIPTS = ROOT / "tests" / "integration" / "scripts"


def _groups(transports: list[TcpTransport], tag: str, groups: int, steps: int) -> float:
    """Seconds for `groups` fresh 2-rank groups (each a new connection) to run `steps` all_reduces each."""
    peers = tuple(Peer(r, f"host-{r}", t.address, os.getpid()) for r, t in enumerate(transports))
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            for g in range(groups):
                context = GroupContext("job", f"{tag}-{g}", (0, 1), r, peers, 20.0)
                comm = transports[r].communicator(context)
                for _ in range(steps):
                    assert comm.all_reduce(np.ones(256, np.float32))[0] == 2
                comm.close()
        except BaseException as exc:
            errors.append(exc)

    start = time.perf_counter()
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return time.perf_counter() - start


def test_the_token_never_crosses_the_wire_and_a_recorded_handshake_cannot_be_replayed():
    token = "secret-token-0123456789abcdef"
    listener, dialer = TcpTransport("127.0.0.1", token=token), TcpTransport("127.0.0.1", token=token)
    recorded = bytearray()
    relay = socket.create_server(("127.0.0.1", 0))

    def forward() -> None:  # dialer -> relay -> listener, recording what the dialer sends
        inbound, _ = relay.accept()
        host, port = listener.address.split(":")
        outbound = socket.create_connection((host, int(port)))
        for src, dst, record in ((inbound, outbound, True), (outbound, inbound, False)):
            threading.Thread(target=_pump, args=(src, dst, recorded if record else None), daemon=True).start()

    threading.Thread(target=forward, daemon=True).start()
    relay_address = f"127.0.0.1:{relay.getsockname()[1]}"
    peers = (Peer(0, "a", dialer.address, os.getpid()), Peer(1, "b", relay_address, os.getpid()))
    results = [None, None]
    try:

        def run(r: int, transport: TcpTransport) -> None:
            context = GroupContext("job", "world", (0, 1), r, peers, 10.0)
            results[r] = transport.communicator(context).all_reduce(np.ones(4, np.float32))

        threads = [threading.Thread(target=run, args=(0, dialer)), threading.Thread(target=run, args=(1, listener))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert [list(r) for r in results] == [[2] * 4, [2] * 4]
        wire = bytes(recorded)
        assert wire.startswith(handshake.MAGIC)
        assert token.encode() not in wire and token.encode().hex().encode() not in wire

        # Replaying the dialer's handshake byte for byte: the listener draws a new nonce, so the proof is stale.
        length = len(handshake.MAGIC) + handshake.NONCE_BYTES
        host, port = listener.address.split(":")
        with socket.create_connection((host, int(port)), timeout=5) as replay:
            replay.sendall(wire[:length])
            assert len(_read(replay, handshake.CHALLENGE_BYTES)) == handshake.CHALLENGE_BYTES
            (size,) = struct.unpack("<I", wire[length : length + 4])
            replay.sendall(wire[length : length + 4 + size + handshake.MAC_BYTES])
            assert _read(replay, 1) == handshake.BAD_TOKEN
    finally:
        relay.close()
        listener.close()
        dialer.close()


def _pump(src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
    try:
        while chunk := src.recv(65536):
            if record is not None:
                record += chunk
            dst.sendall(chunk)
    except OSError:
        pass


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size and (chunk := sock.recv(size - len(data))):
        data += chunk
    return data


def test_a_dialer_without_the_token_gets_nothing_but_a_refusal():
    transport = TcpTransport("127.0.0.1", token="right")
    host, port = transport.address.split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            nonce = os.urandom(handshake.NONCE_BYTES)
            sock.sendall(handshake.MAGIC + nonce)
            challenge = _read(sock, handshake.CHALLENGE_BYTES)
            body = handshake.encode_key("job", "world", (0, 1), 0, 1, "group")
            mac = handshake.dialer_proof(b"wrong", nonce, challenge[: handshake.NONCE_BYTES], body)
            sock.sendall(struct.pack("<I", len(body)) + body + mac)
            assert _read(sock, 1) == handshake.BAD_TOKEN
            assert _read(sock, 1) == b""  # and the connection is closed
        assert not transport._arrived
    finally:
        transport.close()


def test_malformed_and_silent_peers_neither_stop_nor_delay_the_listener():
    transports = [TcpTransport("127.0.0.1", token="t0k"), TcpTransport("127.0.0.1", token="t0k")]
    try:
        baseline = _groups(transports, "baseline", groups=20, steps=5)
        quiet = silent(transports[1].address, 50)  # rank 1 listens: every new group's connection is accepted there
        try:
            assert malformed(transports[1].address, 1000, "t0k") == 1000
            abused = _groups(transports, "abused", groups=20, steps=5)
        finally:
            for sock in quiet:
                sock.close()
        assert transports[1]._thread.is_alive() and transports[1]._admitter._thread.is_alive()
        assert transports[1]._admitter.refused >= 1000 - handshake.MAX_PENDING
        print(f"20 groups: {baseline:.3f} s before, {abused:.3f} s after the abuse")
        assert abused < 3 * baseline + 3.0, (baseline, abused)  # each silent peer used to cost 5 s
    finally:
        for transport in transports:
            transport.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_daemons_data_plane_shrugs_off_1000_malformed_and_50_silent_peers(cluster):
    cluster.env["TESSEL_TRANSPORT"] = "tcp"
    ids = cluster.start_daemons(2)
    status = cluster.client().cluster_status()
    data_addresses = [d.data_address for d in status.daemons]

    def job(name: str) -> float:
        env = dict(cluster.env, TESSEL_JOB_ID=name, TESSEL_WORLD_SIZE="2")
        start = time.perf_counter()
        ranks = [
            subprocess.Popen(
                [sys.executable, str(SCRIPTS / "timed_collectives.py"), "50", "100000"],
                env=dict(env, TESSEL_RANK=str(r), TESSEL_DAEMON_ID=ids[r]),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in (0, 1)
        ]
        outputs = [proc.communicate(timeout=120) for proc in ranks]
        assert [proc.returncode for proc in ranks] == [0, 0], outputs
        return time.perf_counter() - start

    job("warm-up")
    baseline = job("baseline")
    quiet = [sock for address in data_addresses for sock in silent(address, 25)]
    try:
        sent = sum(malformed(address, 500, cluster.token) for address in data_addresses)
        assert sent == 1000
        abused = job("abused")
    finally:
        for sock in quiet:
            sock.close()
    print(f"TCP job: {baseline:.2f} s before, {abused:.2f} s after the abuse")
    assert abused < 3 * baseline + 5.0, (baseline, abused)  # each silent peer used to cost 5 s
    assert all(proc.poll() is None for proc, _, _ in cluster.daemons)  # both daemons still serve
