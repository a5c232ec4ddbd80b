"""The daemon as a library object: the SDK hosts it in-process (world of 1) or reaches it over gRPC.

It owns one device through its plugin, and per-(job, rank) sessions holding tensors, communicators and
compiled segments. The gRPC service (`tessel.daemon.service`) is a thin translation of these methods.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from tessel.core.errors import ConfigurationError, JobFailedError, PeerFailedError, TesselError
from tessel.core.limits import Limits, clip
from tessel.core.plugin import CollectivePlugin, GroupContext, LinkMeasurement, Peer, Plugin
from tessel.daemon import hierarchy, memtrace
from tessel.daemon.executor import Executor
from tessel.daemon.results import Result, host_id
from tessel.daemon.segments import Segment
from tessel.daemon.session import WORLD_GROUP, Session
from tessel.v1 import common_pb2, coordinator_pb2, daemon_pb2

if TYPE_CHECKING:
    from tessel.dataset.reader import ShardReader

log = logging.getLogger("tessel.daemon")

BOUND_PROGRAMS = 64  # bound programs cached per session
PROBE_GROUP_TIMEOUT_S = 10.0  # a member of a group probe that never comes fails the probe after this long
TRIM_AFTER_BYTES = 8 << 20  # a put this large is followed by a malloc_trim


def release_freed_memory() -> None:
    """Give the memory the request buffers of a large put were freed into back to the system (glibc keeps the
    per-thread heaps of gRPC's threads otherwise: measured, 192 MiB put in 16 MiB tensors left ~230 MiB of freed
    heap resident in the daemon; after malloc_trim, ~100 MiB)."""
    global _trim
    if _trim is None:
        import ctypes
        import ctypes.util

        try:
            _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False  # not glibc
    if _trim:
        _trim(0)


_trim = None


# How long a collective that failed because a peer left waits for the coordinator's verdict on the job (the
# daemons of a job hear of its failure within a heartbeat of each other).
VERDICT_WAIT_S = 1.0


# Longest a collective waits for a live peer that never arrives; dead peers are detected much sooner.
DEFAULT_COLLECTIVE_TIMEOUT_S = float(os.environ.get("TESSEL_COLLECTIVE_TIMEOUT", "300"))


class DaemonCore:
    """Sessions, tensors and programs on one device.

    Example (in-process, world of 1)::

        core = DaemonCore(load_plugin("cpu"))
        sid = core.open_session("job", rank=0, world_size=1, members=[])
        core.put(sid, {"x": np.ones(3, np.float32)})
    """

    def __init__(
        self,
        plugin: Plugin,
        coordinator=None,
        daemon_id: str = "local",
        data_address: str = "",
        host_transport: CollectivePlugin | None = None,
        limits: Limits | None = None,
        watch=None,
    ):
        self.plugin = plugin
        # What joins this daemon's groups to other hosts and plugins (daemon/hierarchy.py).
        self.host_transport = host_transport if host_transport is not None else plugin.host_transport
        self.coordinator = coordinator  # tessel.coordinator.CoordinatorClient or None (embedded, world of 1)
        self.daemon_id = daemon_id
        self.data_address = data_address
        self.host_id = host_id()
        self.collective_timeout_s = DEFAULT_COLLECTIVE_TIMEOUT_S
        self.limits = limits or Limits.from_env()
        self.watch = watch  # daemon/stall.py's CollectiveWatch: the stall inspector's reports, or None
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._probing = threading.Lock()
        self._executor = Executor(self._group, self._may_overlap)
        self._beat_loads: tuple = ()  # the work counters the last heartbeat carried (heartbeat())
        memtrace.trace()  # with TESSEL_MEMORY_TRACE set, the idle baseline is taken now

    # ------------------------------------------------------------------------------------------ sessions

    def open_session(
        self, job_id: str, rank: int, world_size: int, members: Iterable, job_nonce: str = "", collectives: str = ""
    ) -> str:
        """A session for `rank` of the job; `job_nonce` (the coordinator's JoinJobReply.job_nonce, the same on every
        rank) keeps this job's shared-memory names apart from another job's of the same id; `collectives` ("auto"
        or "", "flat") says how its groups that span hosts or plugins run (daemon/hierarchy.py)."""
        self.limits.check_id("OpenSession: the job id", job_id)
        self.limits.check_id("OpenSession: the job nonce", job_nonce)
        self.limits.check_count("OpenSession: the world size", world_size, "max_world_size")
        if (collectives or "auto") not in hierarchy.MODES:
            raise ConfigurationError(
                f"job {job_id!r}: collectives={collectives!r} is not one of {list(hierarchy.MODES)} "
                "(TESSEL_COLLECTIVES on the rank)"
            )
        members = list(members)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigurationError(f"rank {rank} is outside a world of {world_size}; ranks are 0..world_size-1")
        if members and len(members) != world_size:
            raise ConfigurationError(f"job {job_id!r}: {len(members)} members for a world of {world_size}")
        if not members:
            if world_size != 1:
                raise ConfigurationError(
                    f"job {job_id!r}: a world of {world_size} needs the members from the coordinator's JoinJob"
                )
            members = [self.member(0)]
        if not job_nonce and world_size == 1:
            job_nonce = uuid.uuid4().hex[:16]  # nobody to agree with
        session_id = f"{job_id}/{rank}/{uuid.uuid4().hex[:8]}"
        session = Session(session_id, job_id, rank, world_size, members, job_nonce=job_nonce, collectives=collectives)
        with self._lock:
            self.limits.check_count("OpenSession: the number of open sessions", len(self._sessions) + 1, "max_sessions")
            self._sessions[session.session_id] = session
        log.info("opened %s", session.describe())
        return session.session_id

    def member(self, rank: int) -> common_pb2.Member:
        """This daemon as a job member (used for the embedded world of 1)."""
        return common_pb2.Member(
            rank=rank,
            daemon_id=self.daemon_id,
            data_address=self.data_address,
            host_id=self.host_id,
            pid=os.getpid(),
            plugin=self.plugin.name,
            device_id=self.plugin.device.device_id,
        )

    def session(self, session_id: str) -> Session:
        with self._lock:
            if session_id not in self._sessions:
                raise ConfigurationError(
                    f"no session {clip(session_id, 100)!r} on daemon {self.daemon_id}; open one with OpenSession "
                    "(it may have been closed after its job ended or failed)"
                )
            return self._sessions[session_id]

    def close_session(self, session_id: str) -> None:
        with self._lock:
            session = self._sessions.pop(session_id, None)
            last = not self._sessions
        if session is not None:
            with session.lock:
                session.close()
            log.info("closed %s", session.describe())
            if last:  # what the device kept for the next run (the CPU plugin's shared arena) goes back
                try:
                    self.plugin.compute.release_memory()
                except Exception as err:  # the job is over either way; the memory stays until the next release
                    log.warning("the %s plugin could not release its cached memory: %s", self.plugin.name, err)

    def sessions(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def heartbeat(self) -> coordinator_pb2.HeartbeatRequest:
        """A heartbeat carrying its ranks' work counters if any moved since the last one (coordinator/pace.py
        judges stragglers from them); a bare beat otherwise."""
        loads = [
            coordinator_pb2.RankLoad(job_id=s.job_id, rank=s.rank, run_s=s.run_s, blocked_s=s.blocked_s, steps=s.steps)
            for s in self.sessions()
        ]
        key = tuple((load.job_id, load.rank, load.steps) for load in loads)
        if key == self._beat_loads:
            return coordinator_pb2.HeartbeatRequest()
        self._beat_loads = key
        return coordinator_pb2.HeartbeatRequest(loads=loads)

    def on_job_event(self, job_id: str, state: str, cause: str, culprit_rank: int = -1) -> None:
        """The coordinator says a job ended: abort its waits now, free its sessions once they are idle."""
        if state not in ("failed", "finished"):
            return  # news about a job that goes on
        for session in self.sessions():
            if session.job_id != job_id:
                continue
            if state == "failed" and session.abort_cause is None:
                session.culprit_rank = culprit_rank
                session.abort_cause = cause or "failed"
            threading.Thread(target=self._reap, args=(session.session_id,), daemon=True).start()

    def close_orphans(self) -> None:
        """Close the sessions whose job the coordinator has not run on this daemon for `limits.orphan_session_s`:
        sessions opened without a job, or left open after it ended (their clients died or never closed them).
        The coordinator knows which (job, rank) this daemon serves; one GetDaemon call checks every session."""
        sessions = self.sessions()
        if self.coordinator is None or not sessions:
            return
        try:
            info = self.coordinator.get_daemon(self.daemon_id, timeout_s=5.0)
            serving = (info.job_id, info.rank) if info.state == "busy" else None
        except KeyError:
            serving = None  # not registered (any more): no job runs here
        except TesselError:
            return  # the coordinator is unreachable: the daemon's lost-coordinator path fails its sessions
        now = time.monotonic()
        for session in sessions:
            if (session.job_id, session.rank) == serving:
                session.orphan_since = None
            elif session.orphan_since is None:
                session.orphan_since = now
            elif now - session.orphan_since >= self.limits.orphan_session_s and not session.reaping:
                idle = now - session.orphan_since
                log.info("closing %s: its job has not run on this daemon for %.0f s", session.describe(), idle)
                if session.abort_cause is None:
                    session.abort_cause = f"its job has not run on daemon {self.daemon_id} for a while"
                session.reaping = True
                threading.Thread(target=self._reap, args=(session.session_id, 5.0), daemon=True).start()

    def _reap(self, session_id: str, grace_s: float = 30.0) -> None:
        # The client closes its own session when it can; this frees what a dead client left behind.
        time.sleep(0 if self._sessions.get(session_id) is None else 2.0)
        deadline = time.monotonic() + grace_s
        session = self._sessions.get(session_id)
        if session is None:
            return
        while time.monotonic() < deadline:
            if session.lock.acquire(timeout=0.5):
                session.lock.release()
                break
        self.close_session(session_id)

    # ------------------------------------------------------------------------------------------ groups

    def create_group(self, session_id: str, name: str, ranks: Iterable[int], timeout_s: float = 60.0) -> None:
        """Create a communicator over `ranks` (a rendezvous at the coordinator: waits up to timeout_s for them)."""
        session = self.session(session_id)
        self.limits.check_id("CreateGroup: the group name", name)
        ranks = list(ranks)
        self.limits.check_count("CreateGroup: the number of ranks", len(ranks), "max_world_size")
        ranks = [int(r) for r in ranks]
        if not name or name == WORLD_GROUP:
            raise ConfigurationError(f"group name {name!r} is reserved or empty; pick another name")
        if name in session.groups:
            raise ConfigurationError(f"group {name!r} already exists in job {session.job_id!r}; destroy it first")
        if len(set(ranks)) != len(ranks) or not ranks:
            raise ConfigurationError(f"group {name!r}: rank list {ranks} is empty or has duplicates")
        outside = [r for r in ranks if not 0 <= r < session.world_size]
        if outside:
            raise ConfigurationError(f"group {name!r}: ranks {outside} are outside the world of {session.world_size}")
        if session.rank not in ranks:
            raise ConfigurationError(
                f"group {name!r}: rank {session.rank} is not in {ranks}; only members call create_group"
            )
        members = session.members
        if self.coordinator is not None and session.world_size > 1:
            found = self.coordinator.create_group(session.job_id, name, ranks, session.rank, timeout_s=timeout_s)
            by_rank = {m.rank: m for m in found}
            members = [by_rank.get(i, m) for i, m in enumerate(session.members)]
        comm = self._new_communicator(session, name, ranks, members)
        with session.lock:  # the session may have closed, or another call made the group, during the rendezvous
            try:
                session.check_alive()
                if name in session.groups:
                    raise ConfigurationError(f"group {name!r} already exists in job {session.job_id!r}")
            except BaseException:
                comm.close()
                raise
            session.groups[name] = comm
            session.bound.clear()

    def destroy_group(self, session_id: str, name: str) -> None:
        session = self.session(session_id)
        with session.lock:  # not under a program that may be in one of its collectives
            comm = session.groups.pop(name, None)
            if comm is None:
                raise ConfigurationError(f"no group {name!r} in job {session.job_id!r}")
            comm.close()
            session.bound.clear()
        if self.coordinator is not None and session.world_size > 1:
            self.coordinator.destroy_group(session.job_id, name, session.rank)

    def _group(self, session: Session, name: str):
        if name not in session.groups:
            if name != WORLD_GROUP:
                raise ConfigurationError(
                    f"no group {name!r} in job {session.job_id!r}; call create_group({name!r}, ranks) first"
                )
            ranks = list(range(session.world_size))
            session.groups[name] = self._new_communicator(session, name, ranks, session.members)
        return session.groups[name]

    def _may_overlap(self, session: Session, comm) -> bool:
        """The thread budget: a collective whose thread keeps a core busy (shared memory) runs beside the segments
        only if this host's cores cover every local rank's compute threads plus one such thread each; otherwise it
        would take its core from the computation it is meant to hide behind. Collectives that wait on a link (TCP)
        mostly sleep, and always may. Sends and receives (each peer and direction a thread of its own) are not
        counted: they mostly wait for their peer, and the executor always runs them beside the program."""
        if not getattr(comm, "compute_bound", False):
            return True
        local = sum(1 for m in session.members if m.host_id == self.host_id) or 1
        return local * (self.plugin.device.cores + 1) <= _usable_cores()

    def _new_communicator(self, session: Session, name: str, ranks: list[int], members: list):
        peers = tuple(
            Peer(r, members[r].host_id, members[r].data_address, members[r].pid, members[r].plugin) for r in ranks
        )
        context = GroupContext(
            job_id=session.job_id,
            job_nonce=session.job_nonce,
            name=name,
            ranks=tuple(ranks),
            rank=session.rank,
            peers=peers,
            timeout_s=self.collective_timeout_s,
            abort=lambda: session.abort_cause,
            local_ranks=sum(1 for m in session.members if m.host_id == self.host_id),
        )
        communicator = hierarchy.communicator(context, self.plugin.collective, self.host_transport, session.collectives)
        return communicator if self.watch is None else self.watch.wrap(communicator, session.job_id, session.rank)

    # ------------------------------------------------------------------------------------------ tensors

    def put(self, session_id: str, tensors: dict[str, np.ndarray]) -> None:
        session = self.session(session_id)
        session.check_alive()
        with session.tensors.lock:  # a recorded step may be metering the store on the program's thread
            session.tensors.update(tensors)
        if sum(getattr(t, "nbytes", 0) for t in tensors.values()) >= TRIM_AFTER_BYTES:
            release_freed_memory()

    def get(self, session_id: str, names: Iterable[str]) -> dict[str, np.ndarray]:
        session = self.session(session_id)
        return {n: session.tensor(n) for n in names}

    def free(self, session_id: str, names: Iterable[str]) -> None:
        session = self.session(session_id)
        with session.tensors.lock:
            for n in names:
                session.tensors.pop(n, None)

    def compile_segment(self, session_id: str, name: str, onnx_model: bytes, state: Iterable[str] = ()) -> None:
        session = self.session(session_id)
        session.segments[name] = Segment(name, self.plugin.compute, onnx_model, list(state))

    def open_dataset(self, session_id: str, name: str, spec, columns: Iterable[str] = ()) -> ShardReader:
        """Sink mode: read this rank's shard of the pipeline `spec` here; NextBatch instructions step it."""
        from tessel.dataset.reader import ShardReader  # pyarrow loads with the first sink-mode dataset, not before
        from tessel.dataset.spec import InlineCache

        session = self.session(session_id)
        if session.inline is None:
            session.inline = InlineCache()
        session.datasets[name] = ShardReader(name, spec, list(columns), session.inline)
        return session.datasets[name]

    def put_inline_data(self, session_id: str, digest: bytes, total_bytes: int, offset: int, data: bytes) -> None:
        """One piece of an inline source's stream, in order from offset 0; the last piece checks the whole against
        `digest` and keeps its columns in the session's InlineCache, so that an OpenDataset may name it by digest.
        A piece at offset 0 starts over (a client whose earlier upload failed half way sends it all again)."""
        from tessel.dataset.spec import InlineCache, decode_inline

        session = self.session(session_id)
        if offset == 0:
            session.upload = (digest, total_bytes, bytearray())
        upload = session.upload
        if upload is None or upload[0] != digest or upload[1] != total_bytes or len(upload[2]) != offset:
            expected = "offset 0 (no upload in progress)" if upload is None else f"offset {len(upload[2])}"
            session.upload = None
            raise ConfigurationError(
                f"PutInlineData in {session.describe()}: a piece of data {digest.hex()} at offset {offset} of "
                f"{total_bytes} bytes, where {expected} of the upload in progress was due; send the pieces in order "
                "from offset 0 (an upload is dropped at the first piece out of order)"
            )
        received = upload[2]
        received += data
        if len(received) > total_bytes:
            session.upload = None
            raise ConfigurationError(
                f"PutInlineData in {session.describe()}: data {digest.hex()} passed its total of {total_bytes} bytes "
                f"({len(received)} received); send total_bytes as the whole stream's length"
            )
        if len(received) == total_bytes:
            session.upload = None
            columns = decode_inline(received, digest, f"PutInlineData in {session.describe()}")
            if session.inline is None:
                session.inline = InlineCache()
            session.inline.touch(digest, total_bytes, columns)

    # ------------------------------------------------------------------------------------------ programs

    def execute(
        self,
        session_id: str,
        program: daemon_pb2.Program,
        repeat: int = 1,
        fetch: Iterable[str] = (),
        timings: bool = False,
        feed: dict[str, np.ndarray] | None = None,
        collect: Iterable[str] = (),
        timeline: bool = False,
        progress: Callable[[int, dict[str, np.ndarray]], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        per_repetition: dict[str, np.ndarray] | None = None,
    ) -> Result:
        """Store `feed`, run `program` `repeat` times; return fetched tensors, per-repetition collected values
        (stacked on dim 0), per-instruction timings and (with `timeline`) every instruction's wall-clock span.
        `progress(repetition, collected)` is called as each repetition ends, with that repetition's values.
        Before repetition i, row i of each `per_repetition` array is stored under its name.
        Between repetitions it stops when the job has failed, or when `cancelled()` (the caller went away) is true."""
        session = self.session(session_id)
        collect = list(collect)
        per_repetition = per_repetition or {}
        for name, rows in per_repetition.items():
            if rows.ndim == 0 or len(rows) != max(1, repeat):
                raise ConfigurationError(
                    f"Execute: per_repetition {name!r} has shape {rows.shape}, not one row for each of the "
                    f"{max(1, repeat)} repetitions"
                )
        events: list[daemon_pb2.TimelineEvent] = []
        with session.lock:
            session.check_alive()
            if feed:
                session.tensors.update(feed)
            steps = self._bound(session, program)
            elapsed = [0.0] * len(steps)
            history: dict[str, list[np.ndarray]] = {n: [] for n in collect}
            began, repetitions = time.perf_counter(), 0
            try:
                for repetition in range(max(1, repeat)):
                    session.check_alive()
                    if cancelled is not None and cancelled():
                        raise TesselError(f"Execute on {session.describe()} was cancelled by its caller")
                    for name, rows in per_repetition.items():  # an array, 0-d ones too (rows[i] would be a scalar)
                        session.tensors[name] = rows[repetition : repetition + 1].reshape(rows.shape[1:])
                    if timeline:
                        _record(session, steps, repetition, events, elapsed)
                    elif timings:
                        clock = time.perf_counter
                        for i, step in enumerate(steps):
                            start = clock()
                            step.run()
                            elapsed[i] += clock() - start
                    elif memtrace.trace() is not None:
                        for step in steps:
                            memtrace.trace().run(session, step)
                    else:
                        for step in steps:
                            step.run()
                    repetitions += 1
                    for name in collect:
                        history[name].append(np.array(session.tensor(name)))
                    if progress is not None:
                        progress(repetition, {name: history[name][-1] for name in collect})
            except JobFailedError as exc:
                if self._verdict(session, exc):  # the job failed: say why, and who, as the coordinator does
                    raise JobFailedError(
                        f"job {session.job_id!r} failed: {session.abort_cause}", session.culprit_rank
                    ) from exc
                raise
            finally:
                session.deferred.clear()  # what a failed run deferred never runs (executor.Deferred)
                session.run_s += time.perf_counter() - began
                session.steps += repetitions  # with run_s: the counters a heartbeat carries move together
            fetched = {n: session.tensor(n) for n in fetch}
            if memtrace.trace() is not None:
                memtrace.trace().write()
        collected = {n: np.stack(v) for n, v in history.items()}
        spent = [(step.label, elapsed[i]) for i, step in enumerate(steps)] if timings else []
        return Result(fetched, collected, spent, events)

    def _verdict(self, session: Session, exc: JobFailedError) -> bool:
        """Whether the coordinator failed the job, waiting a moment for its word when a peer left the group: a
        peer whose daemon heard first gives up before this one hears, and would be blamed for the job's end."""
        if session.abort_cause is None and isinstance(exc, PeerFailedError) and self.coordinator is not None:
            deadline = time.monotonic() + VERDICT_WAIT_S
            while session.abort_cause is None and time.monotonic() < deadline:
                time.sleep(0.01)
        return session.abort_cause is not None

    def _bound(self, session: Session, program: daemon_pb2.Program) -> list:
        """The program's bound steps, cached per session by the program's bytes: a training loop sends the same
        program every step, and binding it again would cost more than running a small step."""
        key = program.SerializeToString(deterministic=True)
        steps = session.bound.get(key)
        if steps is None:
            # Bind a copy parsed from the key: the bound steps keep the instructions they read, and a message keeps
            # the whole request it came in alive (one upb arena per request), the tensors it fed included: measured,
            # the first step's 128 MiB feed stayed resident for as long as its program was cached.
            program = daemon_pb2.Program.FromString(key)
            self._check_shapes(program)
            steps = self._executor.bind(session, program)
            if len(session.bound) >= BOUND_PROGRAMS:
                session.bound.pop(next(iter(session.bound)))
            session.bound[key] = steps
        return steps

    def _check_shapes(self, program: daemon_pb2.Program) -> None:
        """Shapes a program asks this daemon to allocate (what it receives) must be real: no negative dimension,
        at most `limits.max_tensor_bytes` (checked before binding, so an absurd request costs nothing)."""
        for index, instruction in enumerate(program.instructions):
            if instruction.WhichOneof("op") != "collective":
                continue
            for shape in instruction.collective.recv_shapes:
                dims = list(shape.dims)
                if any(d < 0 for d in dims):
                    raise ConfigurationError(f"instruction {index}: recv shape {clip(str(dims), 200)} is negative")
                size = 8 * math.prod(d for d in dims if d)  # at most 8 bytes an element; numpy needs this with 0s too
                self.limits.check_count(f"instruction {index}: a recv shape's byte size", size, "max_tensor_bytes")

    # ------------------------------------------------------------------------------------------ link probes

    def probe_link(self, data_address: str) -> LinkMeasurement:
        """Latency and bandwidth of the data plane from here to the daemon at `data_address` (the coordinator asks,
        to price collectives between hosts). One probe at a time: a second one meanwhile is refused."""
        if not data_address or ":" not in data_address:
            raise ConfigurationError(f"ProbeLink: {data_address!r} is not a data-plane address host:port")
        if not self._probing.acquire(blocking=False):
            raise ConfigurationError("ProbeLink: this daemon is probing a link already; ask again when it is done")
        try:
            link = self.plugin.collective.probe_link(data_address)
        except OSError as exc:  # a host name that does not resolve, a route that does not exist
            raise ConfigurationError(
                f"ProbeLink: cannot reach the data plane at {data_address!r} ({exc}); give the address a daemon "
                "advertises (host:port from `tessel status`)"
            ) from exc
        finally:
            self._probing.release()
        if link is None:
            raise ConfigurationError(f"ProbeLink: the {self.plugin.name} plugin cannot probe links")
        return link

    def probe_group(self, probe_id: str, rank: int, members: list, collectives: int) -> float:
        """Seconds one small all_reduce takes over a temporary group of daemons (`members`, index = rank; this one
        is `rank`), the mean over `collectives` of them after one that forms the group: what a collective among a
        job's ranks costs where they are placed, waiting for every member to arrive included (the coordinator asks
        every member at once). One probe at a time, like probe_link."""
        if len(members) < 2 or not 0 <= rank < len(members) or not probe_id or not 1 <= collectives <= 1000:
            raise ConfigurationError(
                f"ProbeGroup: needs a probe id, 2 or more members, this daemon's rank among them and 1 to 1000 "
                f"collectives; got id {probe_id!r}, rank {rank} of {len(members)}, {collectives} collectives"
            )
        if not self._probing.acquire(blocking=False):
            raise ConfigurationError("ProbeGroup: this daemon is probing already; ask again when it is done")
        try:
            peers = tuple(Peer(i, m.host_id, m.data_address, m.pid) for i, m in enumerate(members))
            context = GroupContext(
                job_id=f"probe-{probe_id}",
                name="probe",
                ranks=tuple(range(len(members))),
                rank=rank,
                peers=peers,
                timeout_s=PROBE_GROUP_TIMEOUT_S,
                job_nonce=probe_id,
            )
            comm = self.plugin.collective.new_group(context)
            try:
                value = np.zeros(1, np.float32)
                comm.all_reduce(value)
                started = time.perf_counter()
                for _ in range(collectives):
                    comm.all_reduce(value)
                return (time.perf_counter() - started) / collectives
            finally:
                comm.close()
        finally:
            self._probing.release()

    def close(self) -> None:
        """Shut down: runs in flight stop between repetitions (their waits end), then every session closes."""
        for session in self.sessions():
            if session.abort_cause is None:
                session.abort_cause = f"daemon {self.daemon_id} is shutting down"
        for session in self.sessions():
            self.close_session(session.session_id)
        self.plugin.close()


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _record(session: Session, steps: list, repetition: int, events: list, elapsed: list[float]) -> None:
    """Run the bound steps once, appending a TimelineEvent per instruction (and summing `elapsed`) with what the
    store holds after it (the live memory of the step). An asynchronous collective's event gets its
    communicator's start and end once its wait has run. Between instructions the step only reads clocks and
    counters, on a store that keeps its own size (TensorStore.metered); the events are built once the step has run, so
    that recording a step does not stretch the gaps it records (it had cost ~40 us an instruction on 2 cores)."""
    clock = time.time_ns
    spans = []
    with session.tensors.metered() as store:
        for step in steps:
            start = clock()
            step.run()
            end = clock()
            nbytes = step.nbytes() if step.nbytes is not None else None
            waited = session.waited.get(step.handle) if step.kind == "wait" else None
            spans.append((start, end, store.nbytes, nbytes, waited))
    started: dict[str, daemon_pb2.TimelineEvent] = {}
    for index, (step, (start, end, store_bytes, nbytes, waited)) in enumerate(zip(steps, spans, strict=True)):
        elapsed[index] += (end - start) / 1e9
        event = daemon_pb2.TimelineEvent(
            index=index, repetition=repetition, kind=step.kind, name=step.name, start_ns=start, end_ns=end,
            handle=step.handle, store_bytes=store_bytes,
        )  # fmt: skip
        if nbytes is not None:
            event.bytes = nbytes
        if step.kind not in ("wait", "run_segment", "next_batch", "free", "copy"):  # a collective
            if step.handle:
                started[step.handle] = event
            else:
                event.comm_start_ns, event.comm_end_ns = start, end
        elif step.kind == "wait" and step.handle in started:
            issued = started.pop(step.handle)
            issued.comm_start_ns, issued.comm_end_ns = waited or (0, 0)
        events.append(event)
