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
from tessel.coordinator.durable import DurableMixin
from tessel.coordinator.jobs import BUSY, FAILED, FINISHED, IDLE, RUNNING, DaemonRecord, Job
from tessel.coordinator.liveness import CLOSE, STALLED, LivenessMixin
from tessel.coordinator.pace import PaceJudge, PaceSettings
from tessel.coordinator.rendezvous import RendezvousMixin
from tessel.coordinator.stalls import StallInspector
from tessel.coordinator.store import MemoryStore, Store
from tessel.core import errors
from tessel.core.limits import Limits
from tessel.v1 import coordinator_pb2

log = logging.getLogger("tessel.coordinator")

ACK = "ack"  # outbox item: answer a beat (so the member can tell the coordinator is alive)
SPARE_THREADS = 64  # server threads kept for unary calls (FinishRank, FailJob, status) beside the blocking ones
__all__ = ["ACK", "CLOSE", "STALLED", "CoordinatorState"]


class CoordinatorState(LivenessMixin, RendezvousMixin, DurableMixin):
    """Registry, jobs, groups, barriers, key-value store and liveness, guarded by one condition.

    Example:
        state = CoordinatorState(heartbeat_timeout_s=3.0)
        daemon_id = state.register_daemon(coordinator_pb2.DaemonInfo(address="h:1", plugin="cpu"))
    """

    def __init__(
        self,
        heartbeat_timeout_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        limits: Limits | None = None,
        stall_warning_s: float = 2.0,
        stall_timeout_s: float = 300.0,
        store: Store | None = None,
        recovery_grace_s: float = 10.0,
        pace: PaceSettings | None = None,
    ):
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.limits = limits or Limits.from_env()
        # A rank blamed by a peer is blamed only after this long without a death being reported (which wins).
        self.suspect_grace_s = min(1.0, heartbeat_timeout_s / 2)
        # A rank of a running job must open its heartbeat stream within this long (it opens its session first).
        self.first_beat_s = max(10.0, 3 * heartbeat_timeout_s)
        self._clock = clock
        self._cond = threading.Condition()
        self._daemons: dict[str, DaemonRecord] = {}
        self._jobs: dict[str, Job] = {}  # in creation order: the oldest waiting job starts first
        self._next_daemon = 0
        self.stalls = StallInspector(stall_warning_s, stall_timeout_s)
        self.pace = PaceJudge(pace or PaceSettings.from_env())  # stragglers by their own work per step (pace.py)
        # Registrations, jobs, history, groups and keys are written through to the store (never heartbeats), and
        # read back here: a restarted coordinator gives every member recovery_grace_s to come back (durable.py).
        self.store = store or MemoryStore()
        self.recovery_grace_s = recovery_grace_s
        self.restored = self._restore()

    # ------------------------------------------------------------------------------------------ registry

    def register_daemon(self, info: coordinator_pb2.DaemonInfo) -> str:
        """Add a daemon (or replace the entry with the same address); returns its daemon id."""
        if not info.address:
            raise errors.ConfigurationError("RegisterDaemon: the daemon's address is empty; send its host:port")
        for name in ("address", "data_address", "host_id", "hostname", "plugin", "device_kind"):
            self.limits.check_id(f"RegisterDaemon: the daemon's {name}", getattr(info, name))
        with self._cond:
            old = next((d for d in self._daemons.values() if d.info.address == info.address), None)
            if old is None:
                self.limits.check_count(
                    "RegisterDaemon: the number of registered daemons", len(self._daemons) + 1, "max_daemons"
                )
                daemon_id = f"d{self._next_daemon}"
                self._next_daemon += 1
                self._save_next_daemon()
            else:
                daemon_id = old.daemon_id
                if old.state == BUSY:
                    self._daemon_died(old, "restarted (it registered again)")
                for sub in list(old.streams):
                    self._close(sub)
            record = DaemonRecord(info=coordinator_pb2.DaemonInfo(), last_beat=self._clock())
            record.info.CopyFrom(info)
            record.info.daemon_id, record.info.state, record.info.job_id, record.info.rank = daemon_id, IDLE, "", -1
            record.info.heartbeat_age_s = 0.0
            self._daemons[daemon_id] = record
            self._save_daemon(record)
            log.info("daemon %s registered: %s %s at %s", daemon_id, info.plugin, info.device_kind, info.address)
            self._start_waiting_jobs()
            self._cond.notify_all()
            return daemon_id

    # ------------------------------------------------------------------------------------------ job lifecycle

    def join(self, request: coordinator_pb2.JoinJobRequest, timeout_s: float, is_active=None):
        """Join the job as `request.rank` (-1 = next free); blocks until the job runs or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        for name in ("job_id", "plugin", "daemon_id", "hostname"):
            self.limits.check_id(f"JoinJob: {name}", getattr(request, name))
        with self._cond:
            job = self._jobs.get(request.job_id)
            again = self._rejoined_rank(job, request) if job is not None and job.state == RUNNING else None
            if again is not None:
                return self._join_reply(job, again)  # its first reply was lost with a restarted coordinator
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
            return self._join_reply(job, rank)

    @staticmethod
    def _rejoined_rank(job: Job, request: coordinator_pb2.JoinJobRequest) -> int | None:
        """The rank the same process holds from before the coordinator restarted, which it now asks for again (its
        retry), or None. A process that asked for any rank (-1) is known by its pid and host."""
        candidates = list(job.joiners.values()) if request.rank == -1 else [job.joiners.get(request.rank)]
        for joiner in candidates:
            if (
                joiner is not None
                and joiner.restored
                and (joiner.pid, joiner.hostname) == (request.pid, request.hostname)
            ):
                return joiner.rank
        return None

    @staticmethod
    def _join_reply(job: Job, rank: int) -> coordinator_pb2.JoinJobReply:
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
                self._check_threads(job_id, world_size)
                if job is not None:
                    self._forget_job(job_id)
                job = Job(job_id=job_id, world_size=world_size, created_at=time.time())
                self._jobs[job_id] = job
                self._forget_old_jobs()
            job.form_deadline, job.form_timeout_s = self._clock() + timeout_s, timeout_s
            job.once = once
            job.how_to_fix = how_to_fix or job.how_to_fix
            self._save_job(job)

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
            with self._batched():  # the last rank's finish and the job's end: one transaction
                self._save_rank(job, rank)
                if len(job.finished) == job.world_size:
                    job.state = FINISHED
                    log.info("job '%s' finished (%d ranks)", job_id, job.world_size)
                    self._publish(job)
                    self._job_ended(job)

    def fail_job(self, job_id: str, rank: int, cause: str, culprit: int | None = None) -> None:
        """A rank reports a failure. Without `culprit`, its own (an exception it raised): the job fails now,
        blaming it. With `culprit`, a claim: the rank failed because of another one (a peer died, closed its links,
        never came) or exited with a non-zero status (culprit = itself, or the rank the error it handled named).
        A claim is decided after `suspect_grace_s` unless harder news (a death, a rank's own exception) comes
        first: the other ranks may be about to report that themselves, and a peer may name the neighbour that
        gave up rather than the one that died. A rank reports once."""
        cause = self.limits.clip_text(cause or "no cause given")
        with self._cond:
            job = self._job(job_id)
            if job.ended or rank in job.reported:
                return  # a rank tells its story once (its launcher may repeat it as an exit status)
            if rank >= 0:
                self._check_rank(job, rank, "FailJob")
            with self._batched():  # the report and the failure it causes: one transaction
                self._report(job, rank, cause, culprit)

    def _report(self, job: Job, rank: int, cause: str, culprit: int | None) -> None:
        """A rank's failure report (fail_job): recorded, then the job fails now or the claim awaits its grace."""
        if rank >= 0:
            job.reported.add(rank)
            if rank in job.joiners:
                self._save_rank(job, rank)
        who = job.describe_rank(rank) if rank >= 0 else "a client"
        if culprit is None:
            self._fail(job, f"{who} reported: {cause}", rank)
        elif job.suspect is None:
            blamed = culprit if 0 <= culprit < job.world_size else rank
            claim = f"{who} reported: {cause}"
            if blamed != rank:
                claim = f"{job.describe_rank(blamed)} failed, as {who} reported: {cause}"
            job.suspect = (blamed, claim, self._clock() + self.suspect_grace_s)

    def cluster_status(self) -> coordinator_pb2.ClusterStatusReply:
        with self._cond:
            now = self._clock()
            reply = coordinator_pb2.ClusterStatusReply()
            for record in sorted(self._daemons.values(), key=lambda d: jobs.daemon_order(d.daemon_id)):
                info = reply.daemons.add()
                info.CopyFrom(record.info)
                info.heartbeat_age_s = max(0.0, now - record.last_beat)
            reply.jobs.extend(job.info() for job in sorted(self._jobs.values(), key=lambda j: j.created_at))
            reply.stalls.extend(self.stalls.stalls(now))
            reply.paces.extend(p for p in self.pace.paces() if self._jobs.get(p.job_id) is not None)
            return reply

    def get_daemon(self, daemon_id: str) -> coordinator_pb2.DaemonInfo:
        with self._cond:
            record = self._daemon(daemon_id)
            info = coordinator_pb2.DaemonInfo()
            info.CopyFrom(record.info)
            info.heartbeat_age_s = max(0.0, self._clock() - record.last_beat)
            return info

    def report_stall(self, report: coordinator_pb2.StallReport) -> None:
        """A daemon's rank waits in a collective (or stopped waiting): see coordinator/stalls.py."""
        self.limits.check_id("ReportStall: the group name", report.group)
        self.limits.check_id("ReportStall: the collective", report.collective)
        with self._cond:
            job = self._job(report.job_id)
            if job.state != RUNNING:
                return  # it ended meanwhile: nothing to inspect
            self._check_rank(job, report.rank, "ReportStall")
            if report.ranks:
                jobs.check_ranks(job, list(report.ranks), report.rank, f"ReportStall of group '{report.group}'")
            self.stalls.report(report, self._clock())

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
            self.limits.check_count(f"JoinJob: job '{job_id}' has a world size that", world, "max_world_size")
            live = sum(1 for j in self._jobs.values() if not j.ended)
            self.limits.check_count("JoinJob: the number of waiting and running jobs", live + 1, "max_jobs")
            self._check_threads(job_id, world)
            self._jobs.pop(job_id, None)  # a new job of an old id goes to the back of the queue
            if job is not None:
                self._forget_job(job_id)
            job = Job(job_id=job_id, world_size=world, created_at=time.time())
            self._jobs[job_id] = job
            self._save_job(job)
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
        again = self._rejoined_rank(job, request)
        if again is not None:
            return again  # the same process, again: its first call was lost with a restarted coordinator
        rank = request.rank
        if rank == -1:
            free = job.first_free_rank()
            if free is None:
                raise errors.ConfigurationError(
                    f"JoinJob: job '{job.job_id}' already has all {job.world_size} ranks; this process is one too "
                    "many: raise the world size (-n, MS_WORKER_NUM) or use a new job id"
                )
            rank = free
        self._check_rank(job, rank, "JoinJob")
        other = job.joiners.get(rank)
        if other is not None:
            raise errors.ConfigurationError(
                f"JoinJob: rank {rank} of job '{job.job_id}' already joined (pid {other.pid} on host "
                f"{other.hostname}); give each process its own rank, or pass -1 to let the coordinator pick"
            )
        job.take_rank(rank, jobs.Joiner(rank, request.plugin, request.daemon_id, request.hostname, request.pid))
        self._save_rank(job, rank)
        return rank

    def _check_threads(self, job_id: str, world: int) -> None:
        """Refuse a new job whose ranks, with the live jobs' and the daemons', would need more of the server's
        threads than it has: each rank holds one in JoinJob or a barrier and one for its heartbeat stream, each
        daemon one. Queued in gRPC instead, the last ranks' calls would never be served: a timeout naming them."""
        ranks = world + sum(j.world_size for j in self._jobs.values() if not j.ended and j.job_id != job_id)
        needed = 2 * ranks + len(self._daemons) + SPARE_THREADS
        if needed > self.limits.server_threads:
            raise errors.LimitExceededError(
                f"JoinJob: job '{job_id}' of {world} ranks would need about {needed} of this coordinator's "
                f"{self.limits.server_threads} server threads (2 per rank of the live jobs: {ranks}, 1 per daemon: "
                f"{len(self._daemons)}, {SPARE_THREADS} spare); start the coordinator with "
                f"TESSEL_LIMIT_SERVER_THREADS={needed} or more"
            )

    def _withdraw(self, job: Job, rank: int) -> None:
        """A joiner went away (its call was cancelled) before the job started: free its rank."""
        if job.state != jobs.WAITING:
            return
        job.free_rank(rank)
        announced = job.form_deadline is not None  # by expect_job: its size, deadline and fix hold for later joiners
        if not job.joiners and not announced and self._jobs.get(job.job_id) is job:
            del self._jobs[job.job_id]
            self._forget_job(job.job_id)
        else:
            self._forget_rank(job, rank)
        self._cond.notify_all()

    def _join_timeout_message(self, job: Job, timeout_s: float) -> str:
        if not job.complete:
            shown, count = job.missing_ranks(), job.world_size - len(job.joiners)
            missing = str(shown) if count == len(shown) else f"{str(shown)[:-1]}, … {count - len(shown)} more]"
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
        with self._batched():  # one store transaction
            for job in [j for j in self._jobs.values() if j.state == jobs.WAITING and j.complete]:
                chosen, job.pending_reasons = jobs.assign_daemons(job, self._daemons)
                if not chosen:
                    continue
                job.members = [jobs.member_of(rank, chosen[rank]) for rank in range(job.world_size)]
                job.daemon_ids = [chosen[rank].daemon_id for rank in range(job.world_size)]
                for rank, record in chosen.items():
                    record.info.state, record.info.job_id, record.info.rank = BUSY, job.job_id, rank
                    self._save_daemon(record)
                job.state, job.started_at, job.running_since = RUNNING, time.time(), self._clock()
                self._save_job(job)
                log.info("job '%s' started: ranks on daemons %s", job.job_id, job.daemon_ids)

    def _fail(self, job: Job, cause: str, culprit_rank: int) -> None:
        job.state, job.cause, job.culprit_rank = FAILED, self.limits.clip_text(cause), culprit_rank
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
        with self._batched():  # one store transaction
            self.stalls.forget_job(job.job_id)
            self.pace.forget_job(job.job_id)
            for daemon_id in job.daemon_ids:
                record = self._daemons.get(daemon_id)
                if record is not None and record.state == BUSY and record.info.job_id == job.job_id:
                    record.info.state, record.info.job_id, record.info.rank = IDLE, "", -1
                    self._save_daemon(record)
            self._start_waiting_jobs()
            self._cond.notify_all()
            job.forget_rendezvous()  # after the waiters woke: they see the job's end, not what it held
            self._save_job(job)
            self._forget_rendezvous(job.job_id)
            self._jobs[job.job_id] = self._jobs.pop(job.job_id)  # the ended jobs in the order they ended
            self._forget_old_jobs()

    def _forget_old_jobs(self) -> None:
        """Forget the ended jobs beyond the history kept, those that ended first first (a long job that has just
        ended stays, whatever ended after it started)."""
        ended = [j for j in self._jobs.values() if j.ended]  # the order they ended (_job_ended moves each last)
        for job in ended[: max(0, len(ended) - self.limits.keep_ended_jobs)]:
            del self._jobs[job.job_id]
            self._forget_job(job.job_id)
