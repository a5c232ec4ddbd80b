"""One interface to a daemon, whether it runs in this process (embedded) or behind gRPC: `DaemonHandle`.

The SDK depends on this contract only. `LocalDaemon` calls a `DaemonCore` in this process (tensors are not sent
anywhere; values crossing the boundary are copied so that neither side sees the other write); `RemoteDaemon`
speaks gRPC to `tessel daemon` (Execute over its Unix socket when on the same host). Rank programs (the compiler's
`RankProgram`) are installed and run through the handle:

    installed = daemon.install(program, session_id, initial=params)   # groups, segments, initial values
    loss = installed.run(feed={"x": x, "y": y}).fetched[program.outputs[0]]
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tessel.compiler.rank_program import RankProgram
from tessel.core import rpc
from tessel.core.errors import ConfigurationError, DaemonUnreachableError
from tessel.core.wire import from_proto, to_proto
from tessel.daemon.local_channel import LocalExecuteClient
from tessel.daemon.results import Result, host_id
from tessel.v1 import common_pb2, daemon_pb2, daemon_pb2_grpc, dataset_pb2

if TYPE_CHECKING:  # a client of a remote daemon never loads the daemon's executor
    from tessel.daemon.core import DaemonCore

# Largest request the client builds at once. Serializing a request holds the GIL; a 256 MiB one held it long enough
# on a loaded machine for this rank's heartbeat to lapse, and the coordinator failed the job. Bounded requests let
# the heartbeat thread run between them.
REQUEST_CHUNK_BYTES = 32 << 20


def _batches_of(tensors: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """Tensors grouped so that a group stays under REQUEST_CHUNK_BYTES (a larger tensor goes alone)."""
    group: dict[str, np.ndarray] = {}
    size = 0
    for name, value in tensors.items():
        nbytes = np.asarray(value).nbytes
        if group and size + nbytes > REQUEST_CHUNK_BYTES:
            yield group
            group, size = {}, 0
        group[name] = value
        size += nbytes
    if group or not tensors:
        yield group


class InstalledProgram:
    """A RankProgram whose groups and segments exist on a daemon session; `run` executes it."""

    def __init__(self, program: RankProgram, daemon: DaemonHandle, session_id: str):
        self.program, self.daemon, self.session_id = program, daemon, session_id

    def run(
        self,
        feed: Mapping[str, Any] | None = None,
        *,
        fetch: Sequence[str] | None = None,
        repeat: int = 1,
        collect: Sequence[str] = (),
        timings: bool = False,
        timeline: bool = False,
    ) -> Result:
        """Store `feed`, run the program `repeat` times, return the daemon's Result (fetched = the program's
        outputs unless `fetch` names others; collected = per-repetition values of `collect`; with `timeline`,
        every instruction's wall-clock span on the daemon)."""
        return self.daemon.execute(
            self.session_id,
            self.program.program,
            repeat=repeat,
            fetch=list(self.program.outputs if fetch is None else fetch),
            timings=timings,
            feed=dict(feed or {}),
            collect=list(collect),
            timeline=timeline,
        )

    def state(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Current values of state tensors (default: all of the program's state)."""
        return self.daemon.get(self.session_id, list(self.program.state_inputs if names is None else names))


class DaemonHandle(ABC):
    """What the SDK asks of its daemon: sessions, groups, the tensor store, segments, datasets and programs.

    A session is one (job, rank) on the daemon; every other call names it. Tensors are numpy arrays by store name.
    """

    def __init__(self) -> None:
        self._groups: dict[str, set[str]] = {}  # session -> groups created (creating one twice is an error)
        self._installed: dict[tuple[str, str], InstalledProgram] = {}  # (session, program name) -> installed

    @abstractmethod
    def open_session(self, job_id: str, rank: int, world_size: int, members: Sequence = ()) -> str:
        """Open the session of `rank` in job `job_id`; `members` are the coordinator's JobMembers (peers)."""

    @abstractmethod
    def close_session(self, session_id: str) -> None: ...

    @abstractmethod
    def create_group(self, session_id: str, name: str, ranks: Sequence[int]) -> None:
        """Create a communicator over global `ranks` (a rendezvous: every member must create it)."""

    @abstractmethod
    def destroy_group(self, session_id: str, name: str) -> None: ...

    @abstractmethod
    def put(self, session_id: str, tensors: dict[str, np.ndarray]) -> None:
        """Store copies of `tensors` under their names."""

    @abstractmethod
    def get(self, session_id: str, names: Iterable[str]) -> dict[str, np.ndarray]:
        """Copies of the stored tensors `names`."""

    @abstractmethod
    def free(self, session_id: str, names: Iterable[str]) -> None: ...

    @abstractmethod
    def compile_segment(self, session_id: str, name: str, onnx_model: bytes, state: Sequence[str] = ()) -> None:
        """Compile an ONNX model as segment `name`; `state` inputs are updated in place by "<name>/new" outputs."""

    @abstractmethod
    def open_dataset(self, session_id: str, name: str, spec, columns: Sequence[str] = ()) -> tuple[int, list[str]]:
        """Sink mode: the daemon reads its shard of `spec` (a dataset_pb2.DatasetSpec, or the declarative Dataset to
        make it of); returns (batches per epoch, columns)."""

    @abstractmethod
    def execute(
        self,
        session_id: str,
        program: daemon_pb2.Program,
        repeat: int = 1,
        fetch: Sequence[str] = (),
        timings: bool = False,
        feed: dict[str, np.ndarray] | None = None,
        collect: Sequence[str] = (),
        timeline: bool = False,
        per_repetition: dict[str, np.ndarray] | None = None,
    ) -> Result:
        """Store `feed`, run `program` `repeat` times; return `fetch`ed values, per-repetition `collect`ed values,
        (with `timings`) per-instruction timings and (with `timeline`) daemon_pb2.TimelineEvents. Each
        `per_repetition` array has one row per repetition, stored under its name before that repetition."""

    @abstractmethod
    def execute_steps(
        self,
        session_id: str,
        program: daemon_pb2.Program,
        repeat: int,
        feed: dict[str, np.ndarray] | None = None,
        collect: Sequence[str] = (),
        per_repetition: dict[str, np.ndarray] | None = None,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Store `feed`, run `program` `repeat` times, yielding each repetition's `collect`ed values as soon as it
        has ended (sink mode's per-step losses, while the epoch still runs); an error raises where it happened.
        `per_repetition` as in execute."""

    @abstractmethod
    def load(self, session_id: str) -> tuple[float, float]:
        """(seconds the session has run programs, the part of them blocked in collectives) so far."""

    @abstractmethod
    def close(self) -> None: ...

    def abort(self, error: Exception) -> None:  # noqa: B027 - only a remote daemon has calls to end
        """The job failed: end this rank's calls to the daemon in flight and fail later ones with `error` (a
        stopped daemon would otherwise hold them until their deadline)."""

    # --- rank programs -----------------------------------------------------------------------------------------

    def install(
        self, program: RankProgram, session_id: str, initial: Mapping[str, Any] | None = None
    ) -> InstalledProgram:
        """Create the program's groups (once per session), compile its segments and store `initial` values
        (parameters). Every member of a group must install its program too: creating a group is a rendezvous."""
        created = self._groups.setdefault(session_id, set())
        for name, ranks in program.groups.items():
            if name not in created:
                self.create_group(session_id, name, list(ranks))
                created.add(name)
        for segment in program.segments.values():
            self.compile_segment(session_id, segment.name, segment.onnx, list(segment.state))
        if initial:
            self.put(session_id, dict(initial))
        installed = InstalledProgram(program, self, session_id)
        self._installed[(session_id, program.name)] = installed
        return installed

    def installed(self, program: RankProgram, session_id: str) -> InstalledProgram:
        """`program` as installed on `session_id`, installing it on first use."""
        found = self._installed.get((session_id, program.name))
        return found if found is not None and found.program is program else self.install(program, session_id)


class LocalDaemon(DaemonHandle):
    """A daemon hosted in this process: calls go straight to `DaemonCore`; no tensor is serialized."""

    def __init__(self, core: DaemonCore):
        super().__init__()
        self.core = core

    def open_session(
        self,
        job_id: str,
        rank: int,
        world_size: int,
        members: Sequence = (),
        job_nonce: str = "",
        collectives: str = "",
    ) -> str:
        return self.core.open_session(job_id, rank, world_size, members, job_nonce, collectives)

    def close_session(self, session_id: str) -> None:
        self.core.close_session(session_id)

    def create_group(self, session_id: str, name: str, ranks: Sequence[int]) -> None:
        self.core.create_group(session_id, name, ranks)

    def destroy_group(self, session_id: str, name: str) -> None:
        self.core.destroy_group(session_id, name)

    def put(self, session_id: str, tensors: dict[str, np.ndarray]) -> None:
        self.core.put(session_id, {k: np.array(v) for k, v in tensors.items()})

    def get(self, session_id: str, names: Iterable[str]) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.core.get(session_id, names).items()}

    def free(self, session_id: str, names: Iterable[str]) -> None:
        self.core.free(session_id, names)

    def compile_segment(self, session_id: str, name: str, onnx_model: bytes, state: Sequence[str] = ()) -> None:
        self.core.compile_segment(session_id, name, onnx_model, state)

    def open_dataset(self, session_id: str, name: str, spec, columns: Sequence[str] = ()) -> tuple[int, list[str]]:
        spec = spec if isinstance(spec, dataset_pb2.DatasetSpec) else spec.to_spec()
        cursor = self.core.open_dataset(session_id, name, spec, columns)
        return cursor.batches_per_epoch, list(cursor.columns)

    def execute(
        self,
        session_id: str,
        program: daemon_pb2.Program,
        repeat: int = 1,
        fetch: Sequence[str] = (),
        timings: bool = False,
        feed: dict[str, np.ndarray] | None = None,
        collect: Sequence[str] = (),
        timeline: bool = False,
        per_repetition: dict[str, np.ndarray] | None = None,
    ) -> Result:
        # Feeds are borrowed for the call (the daemon never writes into them); fetched values are copied because
        # they may be live buffers the next step overwrites in place.
        feed = {k: np.asarray(v) for k, v in (feed or {}).items()}
        rows = {k: np.asarray(v) for k, v in (per_repetition or {}).items()}
        result = self.core.execute(
            session_id, program, repeat, fetch, timings, feed, collect, timeline, per_repetition=rows
        )
        return result._replace(fetched={k: v.copy() for k, v in result.fetched.items()})

    def execute_steps(
        self,
        session_id: str,
        program: daemon_pb2.Program,
        repeat: int,
        feed: dict[str, np.ndarray] | None = None,
        collect: Sequence[str] = (),
        per_repetition: dict[str, np.ndarray] | None = None,
    ) -> Iterator[dict[str, np.ndarray]]:
        feed = {k: np.asarray(v) for k, v in (feed or {}).items()}
        rows = {k: np.asarray(v) for k, v in (per_repetition or {}).items()}
        done = object()
        events: queue.SimpleQueue = queue.SimpleQueue()

        def run() -> None:
            try:
                self.core.execute(
                    session_id, program, repeat, (), False, feed, collect, False, _put_to(events), per_repetition=rows
                )
            except BaseException as exc:  # raised in the caller's thread, below
                events.put(exc)
            events.put(done)

        threading.Thread(target=run, name="tessel-execute-steps", daemon=True).start()
        while (event := events.get()) is not done:
            if isinstance(event, BaseException):
                raise event
            yield event

    def load(self, session_id: str) -> tuple[float, float]:
        session = self.core.session(session_id)
        return session.run_s, session.blocked_s

    def close(self) -> None:
        self.core.close()


class RemoteDaemon(DaemonHandle):
    """A daemon behind gRPC (`tessel daemon`)."""

    def __init__(self, address: str, token: str, timeout_s: float = 3600.0):
        super().__init__()
        # Programs may legitimately run long (many steps per call); liveness comes from the coordinator, and a job
        # that fails ends the calls in flight (abort). A daemon that went away is this rank's failure.
        self.rank = -1  # the rank of the session opened here
        self.client = rpc.Client(address, daemon_pb2_grpc.DaemonStub, token, timeout_s, self._unreachable)
        self.token, self.timeout_s = token, timeout_s
        self.local: LocalExecuteClient | None = None  # Execute over the daemon's Unix socket, when on this host
        self._inline: dict[str, Any] = {}  # session -> dataset.spec.InlineCache of what its opens sent

    def open_session(
        self,
        job_id: str,
        rank: int,
        world_size: int,
        members: Sequence = (),
        job_nonce: str = "",
        collectives: str = "",
    ) -> str:
        request = daemon_pb2.OpenSessionRequest(
            job_id=job_id,
            rank=rank,
            world_size=world_size,
            members=members,
            job_nonce=job_nonce,
            collectives=collectives,
        )
        reply = self.client.OpenSession(request, 60.0)
        self.rank = rank
        if self.local is None and reply.local_socket and reply.host_id == host_id():
            try:
                what = f"daemon at {self.client.address} Execute (Unix socket)"
                self.local = LocalExecuteClient(reply.local_socket, self.token, self.timeout_s, what, rank)
            except OSError:
                self.local = None  # e.g. another mount namespace: gRPC works everywhere
        return reply.session_id

    def close_session(self, session_id: str) -> None:
        self._inline.pop(session_id, None)
        self.client.CloseSession(daemon_pb2.SessionRef(session_id=session_id), 60.0)

    def create_group(self, session_id: str, name: str, ranks: Sequence[int]) -> None:
        self.client.CreateGroup(daemon_pb2.DaemonGroupRequest(session_id=session_id, name=name, ranks=ranks))

    def destroy_group(self, session_id: str, name: str) -> None:
        self.client.DestroyGroup(daemon_pb2.DaemonGroupRequest(session_id=session_id, name=name), 60.0)

    def put(self, session_id: str, tensors: dict[str, np.ndarray]) -> None:
        for group in _batches_of(tensors):
            named = [common_pb2.NamedTensor(name=k, tensor=to_proto(v)) for k, v in group.items()]
            self.client.PutTensors(daemon_pb2.PutTensorsRequest(session_id=session_id, tensors=named))

    def get(self, session_id: str, names: Iterable[str]) -> dict[str, np.ndarray]:
        reply = self.client.GetTensors(daemon_pb2.GetTensorsRequest(session_id=session_id, names=list(names)))
        return {t.name: from_proto(t.tensor, t.name) for t in reply.tensors}

    def free(self, session_id: str, names: Iterable[str]) -> None:
        self.client.FreeTensors(daemon_pb2.FreeTensorsRequest(session_id=session_id, names=list(names)), 60.0)

    def compile_segment(self, session_id: str, name: str, onnx_model: bytes, state: Sequence[str] = ()) -> None:
        request = daemon_pb2.CompileSegmentRequest(
            session_id=session_id, name=name, onnx_model=onnx_model, state=list(state)
        )
        self.client.CompileSegment(request)

    def open_dataset(self, session_id: str, name: str, spec, columns: Sequence[str] = ()) -> tuple[int, list[str]]:
        from tessel.dataset.spec import InlineCache, thin, to_spec

        # In-memory data the daemon session was sent before travels as its digest alone (dataset.spec.InlineCache:
        # this side follows the session's opens as the daemon does). An open that fails (here, making the spec, or
        # on the daemon, which may have stopped half way through its sources) leaves the two unsure of each other:
        # forget them here, and the next opens send their data again.
        held = self._inline.setdefault(session_id, InlineCache())
        try:
            self._send_inline_data(session_id, spec, held)
            spec = thin(spec, held) if isinstance(spec, dataset_pb2.DatasetSpec) else to_spec(spec, held)
            request = daemon_pb2.OpenDatasetRequest(session_id=session_id, name=name, spec=spec, columns=list(columns))
            reply = self.client.OpenDataset(request)
        except BaseException:
            self._inline.pop(session_id, None)
            raise
        return reply.batches_per_epoch, list(reply.columns)

    def _send_inline_data(self, session_id: str, dataset, held) -> None:
        """Send the in-memory sources of `dataset` (a pipeline or its spec) larger than a request
        (REQUEST_CHUNK_BYTES) that the session does not hold, in pieces of that size, and note them as held: the
        spec names them by digest alone. All of them go before the spec is built, not source by source while
        to_spec walks the pipeline: the daemon notes each upload before its OpenDataset reads any source, and the
        two InlineCaches stay alike only if this side notes them in that order too. The cost: to_spec checks a large
        source's arrays again (a hash, ~1 ms per MB, without the GIL)."""
        from tessel.dataset.spec import inline_streams

        for stream, digest in inline_streams(dataset, REQUEST_CHUNK_BYTES):
            if digest in held:  # inline_streams left out what fits in a request
                continue
            for offset in range(0, len(stream), REQUEST_CHUNK_BYTES):
                piece = stream[offset : offset + REQUEST_CHUNK_BYTES]
                request = daemon_pb2.PutInlineDataRequest(
                    session_id=session_id, digest=digest, total_bytes=len(stream), offset=offset, data=piece
                )
                self.client.PutInlineData(request)
            held.touch(digest, len(stream))  # as the daemon did on the last piece

    def execute(
        self,
        session_id: str,
        program: daemon_pb2.Program,
        repeat: int = 1,
        fetch: Sequence[str] = (),
        timings: bool = False,
        feed: dict[str, np.ndarray] | None = None,
        collect: Sequence[str] = (),
        timeline: bool = False,
        per_repetition: dict[str, np.ndarray] | None = None,
    ) -> Result:
        feed = dict(feed or {})
        large = {k: v for k, v in feed.items() if np.asarray(v).nbytes > REQUEST_CHUNK_BYTES // 4}
        if large:  # sent ahead in bounded requests (see REQUEST_CHUNK_BYTES)
            self.put(session_id, large)
            feed = {k: v for k, v in feed.items() if k not in large}
        request = daemon_pb2.ExecuteRequest(
            session_id=session_id,
            program=program,
            repeat=repeat,
            fetch=list(fetch),
            timings=timings,
            feed=[common_pb2.NamedTensor(name=k, tensor=to_proto(v)) for k, v in (feed or {}).items()],
            collect=list(collect),
            timeline=timeline,
            per_repetition=_named_tensors(per_repetition),
        )
        reply = self.local.execute(request) if self.local is not None else self.client.Execute(request)
        return _result(reply)

    def execute_steps(
        self,
        session_id: str,
        program: daemon_pb2.Program,
        repeat: int,
        feed: dict[str, np.ndarray] | None = None,
        collect: Sequence[str] = (),
        per_repetition: dict[str, np.ndarray] | None = None,
    ) -> Iterator[dict[str, np.ndarray]]:
        feed = dict(feed or {})
        large = {k: v for k, v in feed.items() if np.asarray(v).nbytes > REQUEST_CHUNK_BYTES // 4}
        if large:
            self.put(session_id, large)
            feed = {k: v for k, v in feed.items() if k not in large}
        request = daemon_pb2.ExecuteRequest(
            session_id=session_id,
            program=program,
            repeat=repeat,
            feed=[common_pb2.NamedTensor(name=k, tensor=to_proto(v)) for k, v in feed.items()],
            collect=list(collect),
            per_repetition=_named_tensors(per_repetition),
        )
        for progress in self.client.replies("ExecuteStream", request):
            if not progress.HasField("done"):  # `count` repetitions, each name's values stacked on dim 0
                stacked = {t.name: from_proto(t.tensor, t.name) for t in progress.collected}
                for i in range(progress.count):
                    yield {name: values[i] for name, values in stacked.items()}

    def load(self, session_id: str) -> tuple[float, float]:
        for load in self.client.Status(common_pb2.Empty(), 60.0).loads:
            if load.session_id == session_id:
                return load.run_s, load.blocked_s
        raise ConfigurationError(
            f"daemon at {self.client.address} reports no session {session_id!r}; it may have been closed after its "
            "job ended or failed"
        )

    def _unreachable(self, message: str) -> DaemonUnreachableError:
        return DaemonUnreachableError(f"{message} (the daemon of rank {self.rank})", self.rank)

    def abort(self, error: Exception) -> None:
        self.client.abort(error)
        if self.local is not None:
            self.local.abort(error)

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        self.client.close()


def _result(reply: daemon_pb2.ExecuteReply) -> Result:
    return Result(
        {t.name: from_proto(t.tensor, t.name) for t in reply.fetched},
        {t.name: from_proto(t.tensor, t.name) for t in reply.collected},
        [(t.kind, t.seconds) for t in reply.timings],
        list(reply.timeline),
    )


def _put_to(events: queue.SimpleQueue):
    """A DaemonCore.execute progress callback that queues each repetition's values (the core hands over copies)."""
    return lambda _repetition, collected: events.put(collected)


def _named_tensors(values: dict[str, np.ndarray] | None) -> list[common_pb2.NamedTensor]:
    return [common_pb2.NamedTensor(name=k, tensor=to_proto(np.asarray(v))) for k, v in (values or {}).items()]
