"""gRPC plumbing shared by the coordinator, the daemons and the SDK — one place for the contracts:

* every call carries the cluster token (`x-tessel-token` metadata); a wrong or missing token is UNAUTHENTICATED;
* requests are parsed here, so a malformed or oversized request is INVALID_ARGUMENT and the server keeps serving;
* tessel exceptions raised by a handler travel as status codes plus the exception's class name, and the client
  raises the same class again;
* every client call has a deadline.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError

from tessel.core import errors, tls
from tessel.core.limits import DEFAULT as DEFAULT_LIMITS
from tessel.core.limits import clip
from tessel.core.token import cluster_token, token_path  # noqa: F401 (the token's home; callers use rpc's names)

TOKEN_HEADER = "x-tessel-token"
ERROR_HEADER = "x-tessel-error"
CULPRIT_HEADER = "x-tessel-culprit"
DEFAULT_MAX_REQUEST_BYTES = 1 << 30
DEFAULT_TIMEOUT_S = 60.0

_STATUS_OF = [  # most specific first
    (errors.CollectiveMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.JobFailedError, grpc.StatusCode.ABORTED),
    (errors.RendezvousTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.CollectiveTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.MissingRuntimeError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.LimitExceededError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.ConfigurationError, grpc.StatusCode.INVALID_ARGUMENT),
    (KeyError, grpc.StatusCode.NOT_FOUND),
    (errors.TesselError, grpc.StatusCode.FAILED_PRECONDITION),
]


# ---------------------------------------------------------------------------------------------------- server


def _status_for(exc: BaseException) -> grpc.StatusCode:
    for cls, code in _STATUS_OF:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def error_fields(exc: BaseException) -> tuple[str, str, int | None]:
    """(class name, message, culprit rank or None): what travels back to the client for a failed call."""
    message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    if _status_for(exc) == grpc.StatusCode.INTERNAL:
        message = f"{type(exc).__name__}: {message}"
    # Cut long texts (an error may quote what the caller sent): they travel in a header, and a caller never needs more.
    return type(exc).__name__, clip(str(message), DEFAULT_LIMITS.max_text_chars), getattr(exc, "culprit_rank", None)


def rebuilt_error(kind: str, message: str, culprit: int | None) -> Exception | None:
    """The client-side exception for error_fields' values: the tessel.core.errors class `kind` (or KeyError), or None
    when `kind` names neither."""
    if kind == "KeyError":
        return KeyError(message)
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return None
    if issubclass(cls, errors.CollectiveMismatchError):
        return cls(message, -1 if culprit is None else culprit, "")
    if issubclass(cls, errors.JobFailedError):
        return cls(message, -1 if culprit is None else culprit)
    return cls(message)


def _abort_with(context: grpc.ServicerContext, exc: BaseException) -> None:
    kind, message, culprit = error_fields(exc)
    trailers = [(ERROR_HEADER, kind)]
    if culprit is not None:
        trailers.append((CULPRIT_HEADER, str(culprit)))
    context.set_trailing_metadata(tuple(trailers))
    context.abort(_status_for(exc), message)


class _Method:
    """Parses, authenticates and error-maps one RPC before handing it to the servicer's method."""

    def __init__(self, impl: Callable, request_cls: type, token: str, max_request_bytes: int):
        self.impl, self.request_cls, self.token, self.max_bytes = impl, request_cls, token, max_request_bytes
        # A method marked `raw_request` parses the request itself (the daemon's Execute: it lets go of the parsed
        # message, and the tensors it feeds, before running the program).
        self.raw = bool(getattr(impl, "raw_request", False))

    def _authenticate(self, context: grpc.ServicerContext) -> None:
        sent = dict(context.invocation_metadata()).get(TOKEN_HEADER, "")
        if not secrets.compare_digest(sent, self.token):
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong cluster token: set TESSEL_TOKEN to the token this cluster was started with",
            )

    def parse(self, raw: bytes, context: grpc.ServicerContext) -> Any:
        if len(raw) > self.max_bytes:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request of {len(raw)} bytes exceeds this server's limit of {self.max_bytes} bytes; "
                "send large tensors in several calls or start the server with a larger --max-request-mb",
            )
        if self.raw:
            return raw
        try:
            return self.request_cls.FromString(raw)
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {self.request_cls.__name__}: {exc}")

    def unary(self, raw: bytes, context: grpc.ServicerContext) -> Any:
        self._authenticate(context)
        request = self.parse(raw, context)
        try:
            return self.impl(request, context)
        except Exception as exc:
            if isinstance(exc, grpc.RpcError) or context.code() is not None:
                raise
            _abort_with(context, exc)

    def unary_stream(self, raw: bytes, context: grpc.ServicerContext) -> Iterator[Any]:
        self._authenticate(context)
        request = self.parse(raw, context)
        try:
            yield from self.impl(request, context)
        except Exception as exc:
            if isinstance(exc, grpc.RpcError) or context.code() is not None:
                raise
            _abort_with(context, exc)

    def stream(self, raw_iterator: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[Any]:
        self._authenticate(context)
        requests = (self.parse(raw, context) for raw in raw_iterator)
        try:
            yield from self.impl(requests, context)
        except Exception as exc:
            if isinstance(exc, grpc.RpcError) or context.code() is not None:
                raise
            _abort_with(context, exc)


def generic_handler(
    servicer: Any, service: ServiceDescriptor, token: str, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
) -> grpc.GenericRpcHandler:
    """A handler for `service` whose methods are the servicer's methods of the same names."""
    handlers = {}
    for method in service.methods:
        impl = getattr(servicer, method.name)
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        wrapped = _Method(impl, request_cls, token, max_request_bytes)
        kind = (method.client_streaming, method.server_streaming)
        make = {
            (False, False): (grpc.unary_unary_rpc_method_handler, wrapped.unary),
            (True, True): (grpc.stream_stream_rpc_method_handler, wrapped.stream),
            (False, True): (grpc.unary_stream_rpc_method_handler, wrapped.unary_stream),
            (True, False): (grpc.stream_unary_rpc_method_handler, None),
        }[kind]
        if make[1] is None:
            raise NotImplementedError(f"{service.full_name}.{method.name}: streaming shape {kind} not wired")
        handlers[method.name] = make[0](make[1], response_serializer=response_cls.SerializeToString)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def check_port_free(host: str, port: int) -> None:
    """Raise a clear error if host:port cannot be bound (gRPC alone reports it obscurely)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # an IPv6 address ("::", "::1") too
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise errors.ConfigurationError(
                f"cannot listen on {host}:{port}: {exc.strerror}; another process holds the port — "
                "stop it, pick another --port, or pass --port 0 for any free port"
            ) from None


def start_server(
    handlers: list[grpc.GenericRpcHandler],
    host: str = "127.0.0.1",
    port: int = 0,
    max_workers: int = 32,
    max_request_bytes: int | None = None,
) -> tuple[grpc.Server, int]:
    """Start a gRPC server on host:port (0 = any free port); returns (server, bound port).

    It speaks TLS with a certificate signed by the cluster CA where tls.wanted(host): by default whenever it binds
    anything other than loopback (TESSEL_TLS). `max_request_bytes`: the handlers' limit. gRPC itself refuses a
    message over twice that before it is buffered whole (the handlers see a message, and check its token, only once
    it has all arrived: an unauthenticated client could otherwise make the server hold gigabytes); between once and
    twice, the handler's own error says which limit and how to raise it."""
    check_port_free(host, port)
    credentials = tls.server_credentials() if tls.wanted(host) else None
    receive = -1 if max_request_bytes is None else min(2 * max_request_bytes, (1 << 31) - 1)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tessel-rpc"),
        handlers=handlers,
        options=[
            ("grpc.max_receive_message_length", receive),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ],
    )
    try:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        bound = server.add_insecure_port(target) if credentials is None else server.add_secure_port(target, credentials)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise errors.ConfigurationError(
            f"cannot listen on {host}:{port}; pick another --port, or pass --port 0 for any free port"
        )
    server.start()
    return server, bound


# ---------------------------------------------------------------------------------------------------- client


def _error_from(exc: grpc.RpcError, what: str) -> Exception:
    trailers = dict(exc.trailing_metadata() or ())
    message = f"{exc.details()}"
    culprit = trailers.get(CULPRIT_HEADER)
    rebuilt = rebuilt_error(trailers.get(ERROR_HEADER, ""), message, None if culprit is None else int(culprit))
    if rebuilt is not None and not isinstance(rebuilt, KeyError):
        return rebuilt
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return errors.JobFailedError(f"{what} is unreachable: {message}{tls_hint(what, message)}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.RendezvousTimeoutError(f"{what}: {message}")
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return errors.ConfigurationError(f"{what}: {message}")
    if code == grpc.StatusCode.NOT_FOUND:
        return KeyError(message)
    return errors.TesselError(f"{what} failed ({code.name}): {message}")


def tls_hint(what: str, message: str) -> str:
    """What to check when a connection failed the way a TLS mismatch or a foreign certificate fails it."""
    if "ssl" in message.lower() or "handshake" in message.lower():
        return (
            f" (TLS: {what} did not prove a certificate signed by this cluster's CA ({tls.tls_dir() / 'ca.pem'}), "
            "or it does not speak TLS: give every process of the cluster the same CA and the same TESSEL_TLS)"
        )
    if "socket closed" in message.lower():
        return " (if that server speaks TLS, set TESSEL_TLS=on on this side too)"
    return ""


class Client:
    """A stub whose calls carry the token, have a deadline and raise tessel exceptions.

    Example: `Client("127.0.0.1:7000", daemon_pb2_grpc.DaemonStub, token).Status(common_pb2.Empty())`
    """

    def __init__(
        self,
        address: str,
        stub_cls: type,
        token: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        unreachable: Callable[[str], Exception] | None = None,
    ):
        """`unreachable(message)`: the exception for a server that cannot be reached (default JobFailedError)."""
        self.address, self.timeout_s, self.unreachable = address, timeout_s, unreachable
        options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        if tls.wanted(tls.host_of(address)):  # the cluster CA pinned: only a server it signed sees the token
            self.channel = grpc.secure_channel(address, tls.channel_credentials(), options + list(tls.CHANNEL_OPTIONS))
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        self.stub = stub_cls(self.channel)
        self.metadata = ((TOKEN_HEADER, token),)
        self.what = f"{stub_cls.__name__.removesuffix('Stub').lower()} at {address}"
        self._aborted: Exception | None = None

    def _stub(self) -> Any:
        stub = self.stub  # read before the check: close() marks the client before it lets the stub go
        if self._aborted is not None:
            raise self._aborted
        return stub

    def call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        stub = self._stub()
        try:
            return getattr(stub, method)(request, timeout=timeout_s or self.timeout_s, metadata=self.metadata)
        except grpc.RpcError as exc:
            if self._aborted is not None:
                raise self._aborted from None
            if exc.code() == grpc.StatusCode.UNAVAILABLE and self.unreachable is not None:
                details = exc.details() or ""
                raise self.unreachable(
                    f"{self.what} {method} is unreachable: {details}{tls_hint(self.what, details)}"
                ) from None
            raise _error_from(exc, f"{self.what} {method}") from None
        except ValueError:  # "Cannot invoke RPC on closed channel": abort() closed it meanwhile
            if self._aborted is not None:
                raise self._aborted from None
            raise

    def abort(self, error: Exception) -> None:
        """End the calls in flight and fail every later one with `error` (e.g. the job failed: a call waiting on a
        stopped daemon would last until its deadline). Closing the channel ends its calls at once; a blocking call
        stays the fast path (a cancellable future costs twice as much per call)."""
        self._aborted = error
        channel = self.channel
        if channel is not None:
            channel.close()

    def stream(self, method: str, requests: Iterator[Any]) -> Iterator[Any]:
        """A long-lived bidirectional stream (no deadline: liveness is its purpose)."""
        return getattr(self._stub(), method)(requests, metadata=self.metadata)

    def replies(self, method: str, request: Any, timeout_s: float | None = None) -> Iterator[Any]:
        """The replies of a server-streaming call as they come, under one deadline for the whole call; errors
        raise tessel exceptions as `call` does."""
        stub = self._stub()
        try:
            yield from getattr(stub, method)(request, timeout=timeout_s or self.timeout_s, metadata=self.metadata)
        except grpc.RpcError as exc:
            if self._aborted is not None:  # abort() closed the channel: its error (the job's cause), as `call`
                raise self._aborted from None
            raise _error_from(exc, f"{self.what} {method}") from None
        except ValueError:  # "Cannot invoke RPC on closed channel": abort() closed it meanwhile
            if self._aborted is not None:
                raise self._aborted from None
            raise

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda request, timeout_s=None: self.call(method, request, timeout_s)

    def close(self) -> None:
        """Close the channel and let it go now, while grpc's threads run: freed by the interpreter's end instead,
        after that end stopped them, it could wait forever on a lock one of them held. Later calls raise."""
        if self._aborted is None:
            self._aborted = errors.TesselError(f"{self.what} is closed: this client makes no more calls")
        channel, self.channel, self.stub = self.channel, None, None
        if channel is not None:
            channel.close()
