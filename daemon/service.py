"""The daemon's gRPC service: a thin translation between protobuf messages and `DaemonCore`."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np
from google.protobuf.message import DecodeError

from tessel.core import rpc
from tessel.core.errors import ConfigurationError
from tessel.core.wire import from_proto, to_proto
from tessel.daemon.core import DaemonCore
from tessel.v1 import common_pb2, daemon_pb2

PROGRESS_INTERVAL_S = 0.05  # ExecuteStream: at most one progress message per this long, after the first

SERVICE = daemon_pb2.DESCRIPTOR.services_by_name["Daemon"]
log = logging.getLogger("tessel.daemon")


class DaemonServicer:
    """`local_socket`: the path of the daemon's Unix socket for Execute (daemon/local_channel.py), if it has one."""

    def __init__(self, core: DaemonCore, local_socket: str = ""):
        self.core, self.local_socket = core, local_socket

    def OpenSession(self, request, context):
        session_id = self.core.open_session(
            request.job_id, request.rank, request.world_size, request.members, request.job_nonce, request.collectives
        )
        return daemon_pb2.OpenSessionReply(
            session_id=session_id, local_socket=self.local_socket, host_id=self.core.host_id
        )

    def CloseSession(self, request, context):
        self.core.close_session(request.session_id)
        return common_pb2.Empty()

    def CreateGroup(self, request, context):
        # The rendezvous waits no longer than the caller does: an abandoned call must not hold a worker thread.
        remaining = context.time_remaining() if context is not None else None
        timeout_s = 60.0 if remaining is None else max(0.1, min(60.0, remaining - 0.5))
        self.core.create_group(request.session_id, request.name, request.ranks, timeout_s)
        return common_pb2.Empty()

    def DestroyGroup(self, request, context):
        self.core.destroy_group(request.session_id, request.name)
        return common_pb2.Empty()

    def PutTensors(self, request, context):
        tensors = {t.name: from_proto(t.tensor, t.name) for t in request.tensors}
        self.core.put(request.session_id, tensors)
        return common_pb2.Empty()

    def GetTensors(self, request, context):
        found = self.core.get(request.session_id, request.names)
        return daemon_pb2.GetTensorsReply(tensors=[_named(n, v) for n, v in found.items()])

    def FreeTensors(self, request, context):
        self.core.free(request.session_id, request.names)
        return common_pb2.Empty()

    def CompileSegment(self, request, context):
        self.core.compile_segment(request.session_id, request.name, request.onnx_model, request.state)
        return common_pb2.Empty()

    def OpenDataset(self, request, context):
        cursor = self.core.open_dataset(request.session_id, request.name, request.spec, request.columns)
        return daemon_pb2.OpenDatasetReply(batches_per_epoch=cursor.batches_per_epoch, columns=cursor.columns)

    def PutInlineData(self, request, context):
        self.core.put_inline_data(request.session_id, request.digest, request.total_bytes, request.offset, request.data)
        return common_pb2.Empty()

    def Execute(self, request, context):
        """`request`: an ExecuteRequest or its serialized bytes (see `_unpack`: parsed here, the tensors it feeds
        are decoded and the message let go of before the program runs)."""
        cancelled = _cancelled(context)
        call = _unpack(request)
        del request
        return _reply(self.core.execute(**call, cancelled=cancelled))

    Execute.raw_request = True  # rpc._Method hands it the request's bytes

    def ExecuteStream(self, request, context):
        """Execute in a worker thread, sending the repetitions' collected values as they end and the reply last.
        Repetitions that end within PROGRESS_INTERVAL_S of the last message share the next one: a message per
        step cost a sink-mode step of the seed MLP a third of its time (the CPU its compute needed)."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        cancelled = _cancelled(context, events)
        call = _unpack(request)
        del request

        def run():
            try:
                result = self.core.execute(
                    **call, progress=lambda repetition, values: events.put((repetition, values)), cancelled=cancelled
                )
                events.put(_reply(result, collected=False))
            except BaseException as exc:  # handed to the RPC thread, which reports it to the client
                events.put(exc)

        threading.Thread(target=run, name="tessel-execute-stream", daemon=True).start()
        pending: list[tuple[int, dict]] = []
        sent_at = time.monotonic() - PROGRESS_INTERVAL_S  # the first message goes as soon as a repetition ends
        while True:
            wait = max(0.0, sent_at + PROGRESS_INTERVAL_S - time.monotonic()) if pending else None
            try:
                event = events.get(timeout=wait)
            except queue.Empty:
                event = None  # the interval is over: send what ended meanwhile
            if isinstance(event, tuple):
                pending.append(event)
                if time.monotonic() < sent_at + PROGRESS_INTERVAL_S:
                    continue
            elif event is _GONE:  # the caller went away: the run stops between repetitions, nobody reads on
                return
            elif event is not None:  # the reply, or the error the run ended with
                if pending:
                    yield _progress(pending)
                if isinstance(event, BaseException):
                    raise event
                yield daemon_pb2.ExecuteProgress(done=event)
                return
            yield _progress(pending)
            pending, sent_at = [], time.monotonic()

    ExecuteStream.raw_request = True

    def Status(self, request, context):
        sessions = self.core.sessions()
        return daemon_pb2.DaemonStatusReply(
            daemon_id=self.core.daemon_id,
            plugin=self.core.plugin.name,
            sessions=[s.session_id for s in sessions],
            tensor_bytes=sum(s.tensor_bytes() for s in sessions),
            groups=[
                daemon_pb2.GroupStatus(
                    session_id=s.session_id, name=name, ranks=comm.context.ranks, transport=comm.transport
                )
                for s in sessions
                for name, comm in list(s.groups.items())
            ],
            loads=[
                daemon_pb2.SessionLoad(
                    session_id=s.session_id, job_id=s.job_id, rank=s.rank, run_s=s.run_s, blocked_s=s.blocked_s
                )
                for s in sessions
            ],
        )

    def Measure(self, request, context):
        from tessel.daemon.calibration import measure_device

        found = measure_device(self.core.plugin, wait=False)
        if found is None:
            raise ConfigurationError(
                f"Measure: the {self.core.plugin.name} plugin measures nothing here (or TESSEL_MEASURE=0 is set)"
            )
        return found

    def ProbeLink(self, request, context):
        link = self.core.probe_link(request.data_address)
        return daemon_pb2.ProbeLinkReply(latency_s=link.latency_s, bandwidth=link.bandwidth)

    def ProbeGroup(self, request, context):
        seconds = self.core.probe_group(request.probe_id, request.rank, list(request.members), request.collectives)
        return daemon_pb2.ProbeGroupReply(collective_s=seconds)


DETACH_BYTES = 1 << 20  # a request this large has its program copied out of it, so that the request can go


def _unpack(request) -> dict:
    """core.execute's arguments from an ExecuteRequest, or from its serialized bytes: the local socket's frame (a
    bytearray, emptied once parsed) or gRPC's. Nothing returned refers to the parsed message, so that the caller,
    dropping it, frees the request before the program runs. A message keeps its whole request alive (one upb
    arena per request): measured, a first step feeding 128 MiB of optimizer state kept the frame and the parsed
    request resident through the step (256 MiB beside the store; at level3 384 MiB), and as long as the
    bound program referred to the request, through every later step too (daemon/core.py binds a copy)."""
    size = 0
    if isinstance(request, (bytes, bytearray, memoryview)):
        frame, size = request, len(request)
        try:
            request = daemon_pb2.ExecuteRequest.FromString(frame)
        except DecodeError as exc:
            raise ConfigurationError(f"malformed ExecuteRequest ({size} bytes): {exc}") from None
        if isinstance(frame, bytearray):
            frame.clear()  # its buffer goes back to the system now: the message holds its own copy
        del frame
    program = request.program
    if size >= DETACH_BYTES:
        program = daemon_pb2.Program.FromString(program.SerializeToString())
    return {
        "session_id": request.session_id,
        "program": program,
        "repeat": request.repeat,
        "fetch": list(request.fetch),
        "timings": request.timings,
        "feed": {t.name: from_proto(t.tensor, t.name) for t in request.feed},
        "collect": list(request.collect),
        "timeline": request.timeline,
        "per_repetition": {t.name: from_proto(t.tensor, t.name) for t in request.per_repetition},
    }


def _reply(result, collected: bool = True) -> daemon_pb2.ExecuteReply:
    return daemon_pb2.ExecuteReply(
        fetched=[_named(n, v) for n, v in result.fetched.items()],
        collected=[_named(n, v) for n, v in result.collected.items()] if collected else [],
        timings=[daemon_pb2.InstructionTiming(index=i, kind=k, seconds=s) for i, (k, s) in enumerate(result.timings)],
        timeline=result.timeline,
    )


def _progress(pending: list[tuple[int, dict]]) -> daemon_pb2.ExecuteProgress:
    """One ExecuteProgress for consecutive repetitions: each collected name's values stacked on dim 0."""
    names = pending[0][1]
    return daemon_pb2.ExecuteProgress(
        repetition=pending[0][0],
        count=len(pending),
        collected=[_named(n, np.stack([values[n] for _, values in pending])) for n in names],
    )


def _named(name, array):
    return common_pb2.NamedTensor(name=name, tensor=to_proto(array))


def handler(
    core: DaemonCore, token: str, max_request_bytes: int = rpc.DEFAULT_MAX_REQUEST_BYTES, local_socket: str = ""
):
    return rpc.generic_handler(DaemonServicer(core, local_socket), SERVICE, token, max_request_bytes)


def serve_local(core: DaemonCore, token: str, max_request_bytes: int = rpc.DEFAULT_MAX_REQUEST_BYTES):
    """A LocalExecuteServer for `core` (Execute over a Unix socket), or None where it cannot listen."""
    from tessel.daemon.local_channel import LocalExecuteServer

    servicer = DaemonServicer(core)
    try:
        return LocalExecuteServer(lambda frame: servicer.Execute(frame, None), token, max_request_bytes)
    except (OSError, ConfigurationError) as exc:
        log.warning("no local Execute socket (%s); clients on this host use gRPC", exc)
        return None


_GONE = object()  # ExecuteStream's queue item: the caller went away


def _cancelled(context, events: queue.SimpleQueue | None = None) -> Callable[[], bool] | None:
    """A check that the caller went away (cancelled, or past its deadline): a long run stops between repetitions.
    With `events`, the RPC thread waiting on it is woken too. None without a gRPC context (the local socket)."""
    if context is None:
        return None
    ended = threading.Event()

    def gone() -> None:
        ended.set()
        if events is not None:
            events.put(_GONE)

    return ended.is_set if context.add_callback(gone) else None
