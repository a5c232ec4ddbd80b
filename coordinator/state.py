"""The coordinator's in-memory state: daemon registry, jobs and their rendezvous, liveness and failure propagation.

Every change happens under one lock; waiters sleep on its condition with a deadline and wake on any change, so a
failed job releases all of its blocked calls at once. Events for heartbeat streams go into per-stream queues and
never wait for anything, so one job's slow member cannot delay another job's events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tessel.coordinator import jobs
from tessel.coordinator.jobs import BUSY, DEAD, FAILED, FINISHED, IDLE, RUNNING, DaemonRecord, Job, Subscriber
from tessel.coordinator.rendezvous import RendezvousMixin
from tessel.core import errors
from tessel.v1 import coordinator_pb2

log = logging.getLogger("tessel.coordinator")

ACK = "ack"  # outbox item: answer a beat (so the member can tell the coordinator is alive)
CLOSE = "close"  # outbox item: end the stream
KEEP_ENDED_JOBS = 256  # ended jobs stay visible in the status table until this many newer ones ended


class CoordinatorState(RendezvousMixin):
    """Registry, jobs, groups, barriers, key-value store and liveness, guarded by one condition.

    Example:
        state = CoordinatorState(heartbeat_timeout_s=3.0)
        daemon_id = state.register_daemon(coordinator_pb2.DaemonInfo(address="h:1", plugin="cpu"))
    """

    def __init__(self, heartbeat_timeout_s: float = 3.0, clock: Callable[[], float] = time.monotonic):
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._clock = clock
        self._cond = threading.Condition()
        self._daemons: dict[str, DaemonRecord] = {}
        self._jobs: dict[str, Job] = {}
        self._next_daemon = 0

    # ------------------------------------------------------------------------------------------ registry

    def register_daemon(self, info: coordinator_pb2.DaemonInfo) -> str:
        """Add a daemon (or replace the entry with the same address); returns its daemon id."""
        if not info.address:
            raise errors.ConfigurationError("RegisterDaemon: the daemon's address is empty; send its host:port")
        with self._cond:
            old = next((d for d in self._daemons.values() if d.info.address == info.address), None)
            if old is None:
                daemon_id = f"d{self._next_daemon}"
                self._next_daemon += 1
            else:
                daemon_id = old.daemon_id
                if old.state == BUSY:
                    self._daemon_died(old, "restarted (it registered again)")
                for sub in list(old.streams):
                    self._close(sub)
            record = DaemonRecord(info=coordinator_pb2.DaemonInfo(), last_beat=self._clock())
            record.info.CopyFrom(info)
            record.info.daemon_id, record.info.state, record.info.job_id, record.info.rank = daemon_id, IDLE, "", -1
            self._daemons[daemon_id] = record
            log.info("daemon %s registered: %s %s at %s", daemon_id, info.plugin, info.device_kind, info.address)
            self._start_waiting_jobs()
            self._cond.notify_all()
            return daemon_id

    # ------------------------------------------------------------------------------------------ liveness

    def subscribe(self, request: coordinator_pb2.HeartbeatRequest, outbox) -> Subscriber:
        """Bind a heartbeat stream to the daemon or client rank its first message names."""
        with self._cond:
            sub = Subscriber(outbox=outbox, last_beat=self._clock())
            if request.WhichOneof("who") == "daemon_id":
                sub.daemon = self._daemon(request.daemon_id)
                sub.daemon.streams.add(sub)
                sub.daemon.last_beat = sub.last_beat
                if sub.daemon.state == DEAD:
                    log.info("daemon %s is heartbeating again: idle", request.daemon_id)
                    sub.daemon.info.state = IDLE
                    self._start_waiting_jobs()
                    self._cond.notify_all()
            elif request.WhichOneof("who") == "client":
                ref = request.client
                job = self._job(ref.job_id)
                if ref.rank not in job.joiners:
                    raise KeyError(
                        f"rank {ref.rank} has not joined job '{ref.job_id}': call JoinJob before heartbeating"
                    )
                sub.job, sub.rank, sub.pid = job, ref.rank, ref.pid
                job.subscribers.add(sub)
                if job.ended:  # it ended before this member started listening: tell it now
                    outbox.put(job.event())
            else:
                raise errors.ConfigurationError(
                    "Heartbeat: the first message must name a daemon (daemon_id) or a client (job_id, rank, pid)"
                )
            return sub

    def beat(self, sub: Subscriber) -> None:
        with self._cond:
            sub.last_beat = self._clock()
            if sub.daemon is not None:
                sub.daemon.last_beat = sub.last_beat

    def stream_closed(self, sub: Subscriber, why: str = "closed its heartbeat stream") -> None:
        """A member's stream ended: that member is dead (unless it already finished its part)."""
        with self._cond:
            if sub.closed:
                return
            self._close(sub)
            record = sub.daemon
            if record is not None:
                if not record.streams and self._daemons.get(record.daemon_id) is record:
                    self._daemon_died(record, why)
            else:
                self._client_died(sub, why)

    def expire(self, now: float | None = None) -> None:
        """Declare dead every daemon and client rank whose last beat is older than the heartbeat timeout."""
        with self._cond:
            now = self._clock() if now is None else now
            for record in list(self._daemons.values()):
                age = now - record.last_beat
                if record.state != DEAD and age > self.heartbeat_timeout_s:
                    self._daemon_died(record, f"missed heartbeats for {age:.1f} s")
                    for sub in list(record.streams):
                        self._close(sub)
            for job in list(self._jobs.values()):
                if job.state == jobs.WAITING and job.form_deadline is not None and now > job.form_deadline:
                    job.timed_out = True
                    self._fail(job, self._join_timeout_message(job, job.form_timeout_s), -1)
                for sub in list(job.subscribers):
                    age = now - sub.last_beat
                    if age > self.heartbeat_timeout_s:
                        self._close(sub)
                        self._client_died(sub, f"missed heartbeats for {age:.1f} s")

    def close_all(self) -> None:
        """End every heartbeat stream (the coordinator is shutting down)."""
        with self._cond:
            subs = [s for d in self._daemons.values() for s in d.streams]
            subs += [s for j in self._jobs.values() for s in j.subscribers]
            for sub in subs:
                self._close(sub)

    def _close(self, sub: Subscriber) -> None:
        """Detach the stream from its member and tell its sender to end it."""
        sub.closed = True
        if sub.daemon is not None:
            sub.daemon.streams.discard(sub)
        if sub.job is not None:
            sub.job.subscribers.discard(sub)
        sub.outbox.put(CLOSE)

    def _daemon_died(self, record: DaemonRecord, why: str) -> None:
        if record.state == DEAD:
            return
        job = self._jobs.get(record.info.job_id) if record.state == BUSY else None
        log.warning("%s is dead: %s", record.where(), why)
        record.info.state = DEAD
        if job is not None and not job.ended:
            self._fail(job, f"rank {record.info.rank} ({record.where()}) {why}", record.info.rank)
        record.info.job_id, record.info.rank = "", -1

    def _client_died(self, sub: Subscriber, why: str) -> None:
        job = sub.job
        if job is None or job.ended or sub.rank in job.finished:
            return
        self._fail(job, f"{job.describe_rank(sub.rank)} {why}", sub.rank)

    # ------------------------------------------------------------------------------------------ job lifecycle

    def join(self, request: coordinator_pb2.JoinJobRequest, timeout_s: float, is_active=None):
        """Join the job as `request.rank` (-1 = next free); blocks until the job runs or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            job = self._job_for_join(request)
            rank = self._take_rank(job, request)
            self._start_waiting_jobs()
            self._cond.notify_all()
            try:
                started = self._wait(lambda: job.state != jobs.WAITING, deadline, job, is_active)
            except BaseException:
                self._withdraw(job, rank)
                raise
            if not started:
                # The whole rendezvous times out at once, so every waiting rank reports the same missing ranks.
                job.timed_out = True
                self._fail(job, self._join_timeout_message(job, timeout_s), -1)
                raise job.failure()
            members = list(job.members)
            local_rank, local_size = jobs.local_rank_and_size(members, rank)
            return coordinator_pb2.JoinJobReply(
                rank=rank,
                world_size=job.world_size,
                daemon=members[rank],
                members=members,
                local_rank=local_rank,
                local_size=local_size,
                job_nonce=job.nonce,
            )

    def expect_job(
        self, job_id: str, world_size: int, timeout_s: float, how_to_fix: str = "", once: bool = False
    ) -> None:
        """Announce a job of `world_size` ranks before any joins: ranks that ask for another size are refused, and
        the job fails naming the missing ranks unless all joined within `timeout_s` (checked by `expire`).
        `once`: the id is not reused once the job ended; a later joiner is told it is one too many."""
        if world_size < 1:
            raise errors.ConfigurationError(f"job '{job_id}': world_size {world_size} must be >= 1")
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None or job.ended:
                job = Job(job_id=job_id, world_size=world_size, created_at=time.time())
                self._jobs[job_id] = job
                self._forget_old_jobs()
            job.form_deadline, job.form_timeout_s = self._clock() + timeout_s, timeout_s
            job.once = once
            job.how_to_fix = how_to_fix or job.how_to_fix

    def job_info(self, job_id: str) -> coordinator_pb2.JobInfo:
        with self._cond:
            return self._job(job_id).info()

    def finish_rank(self, job_id: str, rank: int) -> None:
        """A rank completed its part; the job finishes when every rank did. A no-op on a failed job."""
        with self._cond:
            job = self._job(job_id)
            if job.state == FAILED:
                return
            if job.state != RUNNING:
                raise errors.ConfigurationError(
                    f"FinishRank: job '{job_id}' is {job.state}, not running; only ranks of a running job finish"
                )
            self._check_rank(job, rank, "FinishRank")
            job.finished.add(rank)
            if len(job.finished) == job.world_size:
                job.state = FINISHED
                log.info("job '%s' finished (%d ranks)", job_id, job.world_size)
                self._publish(job)
                self._job_ended(job)

    def fail_job(self, job_id: str, rank: int, cause: str) -> None:
        """A rank reports its own failure: the job fails and every member learns the cause."""
        with self._cond:
            job = self._job(job_id)
            if not job.ended:
                who = job.describe_rank(rank) if rank >= 0 else "a client"
                self._fail(job, f"{who} reported: {cause or 'no cause given'}", rank)

    def cluster_status(self) -> coordinator_pb2.ClusterStatusReply:
        with self._cond:
            now = self._clock()
            reply = coordinator_pb2.ClusterStatusReply()
            for record in sorted(self._daemons.values(), key=lambda d: jobs.daemon_order(d.daemon_id)):
                info = reply.daemons.add()
                info.CopyFrom(record.info)
                info.heartbeat_age_s = now - record.last_beat
            reply.jobs.extend(job.info() for job in sorted(self._jobs.values(), key=lambda j: j.created_at))
            return reply

    # ------------------------------------------------------------------------------------------ internals

    def _job(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise KeyError(f"no job '{job_id}' at this coordinator: its ranks must join it first (JoinJob)")
        return job

    def _daemon(self, daemon_id: str) -> DaemonRecord:
        record = self._daemons.get(daemon_id)
        if record is None:
            raise KeyError(
                f"daemon '{daemon_id}' is not registered at this coordinator (it may have restarted): "
                "register again (RegisterDaemon)"
            )
        return record

    def _check_rank(self, job: Job, rank: int, what: str) -> None:
        if not 0 <= rank < job.world_size:
            raise errors.ConfigurationError(
                f"{what}: rank {rank} is outside job '{job.job_id}' of {job.world_size} ranks "
                f"(valid: 0..{job.world_size - 1})"
            )

    def _wait(self, done: Callable[[], bool], deadline: float, job: Job | None, is_active=None) -> bool:
        """Sleep on the condition until `done()`, the deadline (False) or the job's failure (raises)."""
        while True:
            if job is not None and job.state == FAILED:
                raise job.failure()
            if done():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if is_active is not None and not is_active():
                raise errors.TesselError("the caller went away (its call was cancelled)")
            # Wake now and then even without a notify: a cancelled caller must let go of its rank.
            self._cond.wait(min(remaining, 0.25))

    def _job_for_join(self, request: coordinator_pb2.JoinJobRequest) -> Job:
        job_id, world = request.job_id, request.world_size
        if not job_id:
            raise errors.ConfigurationError("JoinJob: job_id is empty; name the job (e.g. --job-id train1)")
        if world < 1:
            raise errors.ConfigurationError(f"JoinJob: job '{job_id}' has world_size {world}; it must be >= 1")
        job = self._jobs.get(job_id)
        if job is not None and job.ended and job.once:
            raise errors.ConfigurationError(
                f"JoinJob: job '{job_id}' already ran with all its {job.world_size} ranks and {job.state}; this "
                "process is one too many"
            )
        if job is None or job.ended:
            job = Job(job_id=job_id, world_size=world, created_at=time.time())
            self._jobs[job_id] = job
            self._forget_old_jobs()
            return job
        if job.state == RUNNING:
            raise errors.ConfigurationError(
                f"JoinJob: job '{job_id}' is already running with all {job.world_size} ranks; this process is one "
                "too many: wait until the job ends, or choose another job id"
            )
        if job.world_size != world:
            raise errors.ConfigurationError(
                f"JoinJob: job '{job_id}' was started with world_size {job.world_size} but this process asks for "
                f"{world}; start every rank with the same world size (-n, MS_WORKER_NUM, RANK_SIZE)"
            )
        return job

    def _take_rank(self, job: Job, request: coordinator_pb2.JoinJobRequest) -> int:
        rank = request.rank
        if rank == -1:
            free = job.missing_ranks()
            if not free:
                raise errors.ConfigurationError(
                    f"JoinJob: job '{job.job_id}' already has all {job.world_size} ranks; this process is one too "
                    "many: raise the world size (-n, MS_WORKER_NUM) or use a new job id"
                )
            rank = free[0]
        self._check_rank(job, rank, "JoinJob")
        other = job.joiners.get(rank)
        if other is not None:
            raise errors.ConfigurationError(
                f"JoinJob: rank {rank} of job '{job.job_id}' already joined (pid {other.pid} on host "
                f"{other.hostname}); give each process its own rank, or pass -1 to let the coordinator pick"
            )
        job.joiners[rank] = jobs.Joiner(rank, request.plugin, request.daemon_id, request.hostname, request.pid)
        return rank

    def _withdraw(self, job: Job, rank: int) -> None:
        """A joiner went away (its call was cancelled) before the job started: free its rank."""
        if job.state != jobs.WAITING:
            return
        job.joiners.pop(rank, None)
        if not job.joiners and self._jobs.get(job.job_id) is job:
            del self._jobs[job.job_id]
        self._cond.notify_all()

    def _join_timeout_message(self, job: Job, timeout_s: float) -> str:
        missing = job.missing_ranks()
        if missing:
            return (
                f"job '{job.job_id}' has {len(job.joiners)} of {job.world_size} ranks after {timeout_s:.1f} s; "
                f"missing ranks {missing}: {job.how_to_fix}"
            )
        return (
            f"job '{job.job_id}' has all {job.world_size} ranks but no daemons to run them after {timeout_s:.1f} s: "
            f"{'; '.join(job.pending_reasons)}; start more daemons or wait for running jobs to end"
        )

    def _start_waiting_jobs(self) -> None:
        """Start every waiting job whose world is complete and for which daemons are free, oldest first."""
        for job in sorted(self._jobs.values(), key=lambda j: j.created_at):
            if job.state != jobs.WAITING or job.missing_ranks():
                continue
            chosen, job.pending_reasons = jobs.assign_daemons(job, self._daemons)
            if not chosen:
                continue
            job.members = [jobs.member_of(rank, chosen[rank]) for rank in range(job.world_size)]
            job.daemon_ids = [chosen[rank].daemon_id for rank in range(job.world_size)]
            for rank, record in chosen.items():
                record.info.state, record.info.job_id, record.info.rank = BUSY, job.job_id, rank
            job.state, job.started_at = RUNNING, time.time()
            log.info("job '%s' started: ranks on daemons %s", job.job_id, job.daemon_ids)

    def _fail(self, job: Job, cause: str, culprit_rank: int) -> None:
        job.state, job.cause, job.culprit_rank = FAILED, cause, culprit_rank
        log.warning("job '%s' failed: %s", job.job_id, cause)
        self._publish(job)
        self._job_ended(job)

    def _publish(self, job: Job) -> None:
        """Push the job's current state as an event to every member's heartbeat stream (clients and daemons)."""
        event = job.event()
        targets = set(job.subscribers)
        for daemon_id in job.daemon_ids:
            record = self._daemons.get(daemon_id)
            if record is not None and record.info.job_id == job.job_id:
                targets |= record.streams
        for sub in targets:
            sub.outbox.put(event)

    def _job_ended(self, job: Job) -> None:
        for daemon_id in job.daemon_ids:
            record = self._daemons.get(daemon_id)
            if record is not None and record.state == BUSY and record.info.job_id == job.job_id:
                record.info.state, record.info.job_id, record.info.rank = IDLE, "", -1
        self._start_waiting_jobs()
        self._cond.notify_all()

    def _forget_old_jobs(self) -> None:
        ended = sorted((j for j in self._jobs.values() if j.ended), key=lambda j: j.created_at)
        for job in ended[: max(0, len(ended) - KEEP_ENDED_JOBS)]:
            del self._jobs[job.job_id]
