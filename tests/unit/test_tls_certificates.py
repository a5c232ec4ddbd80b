"""core/tls.py: when TLS is on, the cluster CA made once, and clients that trust that CA and nothing else."""

from __future__ import annotations

import stat
from concurrent import futures

import grpc
import pytest

from tessel.core import errors, rpc, tls
from tessel.core.errors import ConfigurationError
from tessel.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TESSEL_TLS", raising=False)


@pytest.mark.parametrize(
    "mode, host, expected",
    [
        ("auto", "127.0.0.1", False),
        ("auto", "localhost", False),
        ("auto", "::1", False),
        ("auto", "0.0.0.0", True),
        ("auto", "10.0.0.5", True),
        ("auto", "node7.cluster", True),
        ("on", "127.0.0.1", True),
        ("off", "10.0.0.5", False),
    ],
)
def test_tls_is_on_whenever_the_address_is_not_loopback_unless_asked(monkeypatch, mode, host, expected):
    monkeypatch.setenv("TESSEL_TLS", mode)
    assert tls.wanted(host) is expected
    assert tls.host_of("[::1]:7070") == "::1" and tls.host_of("10.0.0.5:7070") == "10.0.0.5"


def test_a_wrong_setting_is_named(monkeypatch):
    monkeypatch.setenv("TESSEL_TLS", "yes please")
    with pytest.raises(errors.ConfigurationError, match="TESSEL_TLS"):
        tls.wanted("10.0.0.5")


def test_the_ca_is_made_once_with_a_private_key_and_clients_need_it(tmp_path):
    with pytest.raises(errors.ConfigurationError, match=r"ca\.pem"):
        tls.cluster_ca()
    first = tls.cluster_ca(create=True)
    assert tls.cluster_ca(create=True) == first == tls.cluster_ca()
    assert stat.S_IMODE((tls.tls_dir() / "ca.key").stat().st_mode) == 0o600


def _serve(credentials):
    """A gRPC server on loopback with `credentials` whose ClusterStatus answers an empty reply."""
    service = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"]
    status = grpc.unary_unary_rpc_method_handler(
        lambda request, context: coordinator_pb2.ClusterStatusReply(),
        response_serializer=coordinator_pb2.ClusterStatusReply.SerializeToString,
    )
    handler = grpc.method_handlers_generic_handler(service.full_name, {"ClusterStatus": status})
    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[handler])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port


def test_a_client_talks_to_servers_of_the_cluster_ca_only(monkeypatch):
    monkeypatch.setenv("TESSEL_TLS", "on")
    ours, port = _serve(tls.server_credentials())
    client = rpc.Client(f"127.0.0.1:{port}", coordinator_pb2_grpc.CoordinatorStub, "t", timeout_s=10)
    try:
        client.ClusterStatus(common_pb2.Empty())
    finally:
        client.close()
        ours.stop(0)
    # A server whose certificate names the cluster but comes from another CA: the handshake fails, nothing is sent.
    key, cert = tls._server_pair(*tls._new_ca())
    theirs, port = _serve(grpc.ssl_server_credentials([(key, cert)]))
    client = rpc.Client(f"127.0.0.1:{port}", coordinator_pb2_grpc.CoordinatorStub, "t", timeout_s=5)
    try:
        with pytest.raises(errors.TesselError, match="CA"):
            client.ClusterStatus(common_pb2.Empty())
    finally:
        client.close()
        theirs.stop(0)


def test_a_blank_token_is_refused_not_taken_as_no_authentication(tmp_path, monkeypatch):
    from tessel.core import token

    monkeypatch.setenv("TESSEL_HOME", str(tmp_path))
    monkeypatch.setenv("TESSEL_TOKEN", "  ")
    with pytest.raises(ConfigurationError, match="TESSEL_TOKEN is blank"):
        token.cluster_token()
    monkeypatch.delenv("TESSEL_TOKEN")
    (tmp_path / "token").write_text("\n")  # echo $UNSET > ~/.tessel/token
    with pytest.raises(ConfigurationError, match=r"token file .* is empty"):
        token.cluster_token()
    (tmp_path / "token").unlink()
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("TESSEL_HOME", str(fresh))
    assert token.cluster_token(create=True) and (fresh.stat().st_mode & 0o777) == 0o700
