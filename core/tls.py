"""TLS for tessel's gRPC ports and, on request, its TCP data plane: a cluster CA pinned by every client.

* The cluster CA (`ca.pem`, `ca.key`, mode 0600) lives next to the token, in `$TESSEL_HOME/tls` (default
  `~/.tessel/tls`). The first server that needs TLS creates it, as the coordinator's first start creates the token;
  the other hosts of a cluster get a copy of that directory, as they get the token.
* Each server start signs a fresh key of its own with the CA (P-256, in memory only). Its certificate names the
  cluster (`SERVER_NAME`), not a host: a client accepts exactly the servers whose certificate the pinned CA signed,
  whatever address it dialled. Nothing else is trusted: neither the system's CAs nor a certificate its server made.
* When TLS is on: `TESSEL_TLS` = `auto` (default: on for every server that binds, and every client that dials, an
  address other than loopback), `on` (everywhere, loopback too) or `off`. Every process of a cluster must see the
  same setting. The TCP data plane encrypts when `TESSEL_DATA_TLS` is `on` (default `off`; its peers already prove the
  token by challenge–response).

    credentials = tls.server_credentials()      # grpc.ServerCredentials: a fresh key signed by the cluster CA
    tls.channel_credentials(), tls.CHANNEL_OPTIONS
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import ssl
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

from tessel.core import errors

SERVER_NAME = "tessel-cluster"  # the name every server certificate carries and every client checks
CHANNEL_OPTIONS = (("grpc.ssl_target_name_override", SERVER_NAME), ("grpc.default_authority", SERVER_NAME))
_MODES = {"auto": "auto", "": "auto", "on": "on", "1": "on", "true": "on", "off": "off", "0": "off", "false": "off"}
_LOCK = threading.Lock()


def tls_dir() -> Path:
    return Path(os.environ.get("TESSEL_HOME", Path.home() / ".tessel")) / "tls"


def _mode(variable: str, default: str) -> str:
    value = os.environ.get(variable, default).strip().lower()
    if value not in _MODES:
        raise errors.ConfigurationError(f"{variable}={value!r} is not one of auto, on, off; set it to one of them")
    return _MODES[value]


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or name, optionally [bracketed]) only reaches this host."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_of(address: str) -> str:
    """'10.0.0.1:7070' -> '10.0.0.1', '[::1]:7070' -> '::1'."""
    host, _, _ = address.rpartition(":")
    return (host or address).strip("[]")


def wanted(host: str) -> bool:
    """Whether a server binding `host`, or a client dialling it, speaks TLS (TESSEL_TLS: auto, on, off)."""
    mode = _mode("TESSEL_TLS", "auto")
    return mode == "on" or (mode == "auto" and not is_loopback(host))


def data_plane_wanted() -> bool:
    """Whether the TCP data plane encrypts its connections (TESSEL_DATA_TLS: on, off; auto = off)."""
    return _mode("TESSEL_DATA_TLS", "off") == "on"


# ------------------------------------------------------------------------------------------------ the cluster CA


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _new_ca() -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessel cluster CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def cluster_ca(create: bool = False) -> tuple[bytes, bytes | None]:
    """(CA certificate, CA key or None where only the certificate was copied here), both PEM.

    Created in tls_dir() when missing and `create` (under a file lock: servers starting together share one CA)."""
    directory = tls_dir()
    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    with _LOCK:
        if not cert_path.exists():
            if not create:
                raise errors.ConfigurationError(
                    f"TLS is on but there is no cluster CA at {cert_path}: copy the directory {directory} from the "
                    "coordinator's host (it is made at the coordinator's first start), or set TESSEL_TLS=off on "
                    "every process of a cluster on one trusted network"
                )
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(directory / ".lock", "a") as lock:  # servers starting together make one CA between them
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not cert_path.exists():
                    cert_pem, key_pem = _new_ca()
                    _write_private(key_path, key_pem)  # the key first: whoever sees ca.pem also finds its key
                    staging = directory / f".ca.pem.{os.getpid()}"
                    staging.write_bytes(cert_pem)
                    staging.replace(cert_path)
        cert = cert_path.read_bytes()
        key = key_path.read_bytes() if key_path.exists() else None
    return cert, key


@lru_cache(maxsize=4)
def _server_pair(ca_cert: bytes, ca_key: bytes) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    issuer = x509.load_pem_x509_certificate(ca_cert)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=825))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(signer, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def server_pair() -> tuple[bytes, bytes]:
    """(key, certificate chain) PEM for a server of this process, signed by the cluster CA (made if missing)."""
    ca_cert, ca_key = cluster_ca(create=True)
    if ca_key is None:
        raise errors.ConfigurationError(
            f"TLS is on but {tls_dir() / 'ca.key'} is missing: a server signs its certificate with the cluster CA's "
            f"key; copy ca.key along with ca.pem from the coordinator's host into {tls_dir()}"
        )
    key, cert = _server_pair(ca_cert, ca_key)
    return key, cert + ca_cert


def server_credentials():
    import grpc

    key, chain = server_pair()
    return grpc.ssl_server_credentials([(key, chain)])


def channel_credentials():
    """Credentials that trust the cluster CA only (a certificate of anyone else fails the handshake)."""
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=cluster_ca()[0])


# -------------------------------------------------------------------------------------------- the data plane


def server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    key, chain = server_pair()
    with tempfile.TemporaryDirectory(prefix="tessel-tls-") as scratch:  # ssl loads keys from files only
        key_path, chain_path = Path(scratch) / "key.pem", Path(scratch) / "chain.pem"
        _write_private(key_path, key)
        chain_path.write_bytes(chain)
        context.load_cert_chain(chain_path, key_path)
    return context


def client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(cadata=cluster_ca()[0].decode())
    context.check_hostname = True
    return context
