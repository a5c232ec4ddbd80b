"""TLS on the gRPC ports: a process that takes over a dead coordinator's port learns nothing it can use, while a
job of a TLS cluster runs as before (its data plane encrypted too)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from tests.conftest import ROOT, Cluster, rank_log, run_tessel

pytestmark = pytest.mark.slow
HELLO = ROOT / "examples" / "hello_collectives.py"
# The daemon notices the lost coordinator after 3 s, then registers again every 0.2 s (gRPC dials with backoff).
WATCH_S = 15.0


class _Listener:
    """An impostor on `port`: accepts connections and keeps what they send (in TLS with `context`, if given)."""

    def __init__(self, port: int, context: ssl.SSLContext | None = None):
        self.context, self.connections, self.handshakes, self.received = context, 0, 0, b""
        self.ended = 0  # connections served to their end (the peer closed, or the read or handshake failed)
        self.failures: list[str] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.settimeout(1.0)
            try:
                if self.context is not None:
                    conn = self.context.wrap_socket(conn, server_side=True)
                    self.handshakes += 1
                while chunk := conn.recv(65536):
                    self.received += chunk
            except (OSError, ssl.SSLError) as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            finally:
                conn.close()
                self.ended += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


class _Recorder(grpc.GenericRpcHandler):
    """A gRPC impostor: answers nothing, keeps every call's metadata."""

    def __init__(self):
        self.metadata: list[dict] = []

    def service(self, handler_call_details):
        self.metadata.append(dict(handler_call_details.invocation_metadata))
        return None


def _foreign_context(tmp: Path) -> ssl.SSLContext:
    """A server context whose certificate names the cluster but is signed by a CA of the impostor's own."""
    from tessel.core import tls

    ca_cert, ca_key = tls._new_ca()
    key, cert = tls._server_pair(ca_cert, ca_key)
    (tmp / "key.pem").write_bytes(key)
    (tmp / "chain.pem").write_bytes(cert + ca_cert)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "chain.pem", tmp / "key.pem")
    context.set_alpn_protocols(["h2"])
    return context


def _watch(what, seconds: float, until=lambda: False) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not until():
        time.sleep(0.1)


def test_a_process_that_takes_over_the_coordinators_port_learns_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSEL_TLS", "on")  # a loopback cluster asks for TLS (any other address has it by default)
    cluster = Cluster(tmp_path)
    listener = None
    try:
        cluster.start_daemons(1)
        monkeypatch.setenv("TESSEL_HOME", cluster.env["TESSEL_HOME"])  # this test's clients pin the cluster's CA
        with cluster.client() as client:
            assert len(client.cluster_status().daemons) == 1
        port = int(cluster.address.rsplit(":", 1)[1])
        cluster.coordinator.kill()
        cluster.coordinator.wait(10)

        # 1. A plaintext listener gets the daemon's connections, and nothing but TLS handshakes on them.
        listener = _Listener(port)
        _watch("plaintext", WATCH_S, lambda: listener.ended >= 1)
        listener.close()
        assert listener.connections >= 1, "the daemon never dialled the coordinator's port again"
        assert listener.received.startswith(b"\x16\x03"), listener.received[:40]  # a TLS ClientHello
        assert cluster.token.encode() not in listener.received

        # 2. A TLS listener with a certificate of another CA (naming the cluster): every handshake fails.
        listener = _Listener(port, _foreign_context(tmp_path))
        _watch("foreign CA", WATCH_S, lambda: listener.ended >= 1)
        listener.close()
        assert listener.connections >= 1, "the daemon never dialled the coordinator's port again"
        assert listener.handshakes == 0 and not listener.received, (listener.handshakes, listener.received[:80])
        assert cluster.token.encode() not in listener.received

        # 3. Control: a server holding a certificate of the cluster's own CA would see the token, so the checks
        #    above look where the token would be.
        from tessel.core import tls

        recorder = _Recorder()
        impostor = grpc.server(futures.ThreadPoolExecutor(2), handlers=[recorder])
        impostor.add_secure_port(f"127.0.0.1:{port}", tls.server_credentials())
        impostor.start()
        try:
            _watch("cluster CA", WATCH_S, lambda: recorder.metadata)
        finally:
            impostor.stop(0)
        assert any(m.get("x-tessel-token") == cluster.token for m in recorder.metadata), recorder.metadata
        assert cluster.daemons[0][0].poll() is None, "the daemon died instead of waiting for its coordinator"
    finally:
        if listener is not None:
            listener.close()
        cluster.close()


def test_a_job_runs_on_a_tls_cluster_with_an_encrypted_data_plane(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSEL_TLS", "on")
    monkeypatch.setenv("TESSEL_DATA_TLS", "on")
    monkeypatch.setenv("TESSEL_TRANSPORT", "tcp")
    cluster = Cluster(tmp_path)
    try:
        cluster.start_daemons(2)
        env = {"TESSEL_TOKEN": cluster.token, "TESSEL_COORDINATOR": cluster.address}
        result = run_tessel(["run", "-n", "2", "--coordinator", cluster.address, str(HELLO)], tmp_path, env=env)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        assert "rank 1/2: all_reduce=1" in rank_log(tmp_path, 1).read_text()
        # Without the cluster's CA, a client cannot even ask: it does not trust the server.
        (tmp_path / "elsewhere").mkdir()
        bad = run_tessel(["status", "--coordinator", cluster.address], tmp_path / "elsewhere", env=env)
        assert bad.returncode != 0 and "ca.pem" in (bad.stdout + bad.stderr), bad.stdout + bad.stderr[-2000:]
    finally:
        cluster.close()
