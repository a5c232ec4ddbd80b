"""Liveness on top of the coordinator state: heartbeat streams, missed beats, deaths and the verdicts they lead to
(suspects whose grace ran out, stalls announced and past their timeout).

A mixin of `state.CoordinatorState`: every method runs under the state's condition, except `beat`, which only
stores a time and must be recorded even while a long request holds the lock.
"""

from __future__ import annotations

import logging

from tessel.coordinator import jobs
from tessel.coordinator.jobs import BUSY, DEAD, IDLE, RUNNING, DaemonRecord, Job, Subscriber
from tessel.coordinator.stalls import describe
from tessel.core import errors
from tessel.v1 import coordinator_pb2

log = logging.getLogger("tessel.coordinator")

CLOSE = "close"  # outbox item: end the stream
MAX_LOADS = 64  # ranks' work counters one daemon's beat may carry (more are ignored)
STALLED = "stalled"  # JobEvent.state of a stall warning sent to the job's ranks (the job goes on)


class LivenessMixin:
    """Heartbeats and deaths for `CoordinatorState` (which provides _cond, _clock, _daemons, _jobs, _daemon, _job,
    _fail, _start_waiting_jobs, heartbeat_timeout_s, first_beat_s, limits and stalls)."""

    def subscribe(self, request: coordinator_pb2.HeartbeatRequest, outbox) -> Subscriber:
        """Bind a heartbeat stream to the daemon or client rank its first message names."""
        self.limits.check_id("Heartbeat: the daemon id", request.daemon_id)
        self.limits.check_id("Heartbeat: the job id", request.client.job_id)
        with self._cond:
            sub = Subscriber(outbox=outbox, last_beat=self._clock())
            if request.WhichOneof("who") == "daemon_id":
                sub.daemon = self._daemon(request.daemon_id)
                sub.daemon.streams.add(sub)
                sub.daemon.last_beat = sub.last_beat
                if sub.daemon.restored:  # back after the coordinator's restart: it may take new work again
                    sub.daemon.restored = False
                    self._start_waiting_jobs()
                    self._cond.notify_all()
                if sub.daemon.state == DEAD:
                    log.info("daemon %s is heartbeating again: idle", request.daemon_id)
                    sub.daemon.info.state = IDLE
                    self._save_daemon(sub.daemon)
                    self._start_waiting_jobs()
                    self._cond.notify_all()
            elif request.WhichOneof("who") == "client":
                ref = request.client
                job = self._job(ref.job_id)
                if ref.rank not in job.joiners:
                    raise KeyError(
                        f"rank {ref.rank} has not joined job '{ref.job_id}': call JoinJob before heartbeating"
                    )
                joined = job.joiners[ref.rank].pid
                if ref.pid and joined and ref.pid != joined:  # e.g. a rank of an earlier job of this id, reconnecting
                    raise KeyError(
                        f"rank {ref.rank} of job '{ref.job_id}' is pid {joined}, not {ref.pid}: this process is not "
                        "that rank (of an earlier job of the same id?)"
                    )
                sub.job, sub.rank, sub.pid = job, ref.rank, ref.pid
                job.subscribers.add(sub)
                job.beating.add(ref.rank)
                if job.ended:  # it ended before this member started listening: tell it now
                    outbox.put(job.event())
            else:
                raise errors.ConfigurationError(
                    "Heartbeat: the first message must name a daemon (daemon_id) or a client (job_id, rank, pid)"
                )
            return sub

    def beat(self, sub: Subscriber, request: coordinator_pb2.HeartbeatRequest | None = None) -> None:
        # Without the lock: a beat is a float and a list reference stored (each one assignment), and must be
        # recorded even while a long request holds the lock.
        now = self._clock()
        sub.last_beat = now
        if sub.daemon is not None:
            sub.daemon.last_beat = now
            if request is not None and request.loads:
                sub.daemon.loads = list(request.loads[:MAX_LOADS])  # its ranks' work counters

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
        """Declare dead every daemon and client rank whose last beat is older than the heartbeat timeout; forget
        daemons dead for longer than the limit's forget_dead_daemon_s."""
        asked = self._clock()
        with self._cond:
            late = self._clock() - asked
            if late > self.heartbeat_timeout_s / 2:
                # This thread was starved (the process was stopped, or swapping): so may the beats have been.
                # Judge on the next pass, when the members have had a fair chance to beat again.
                log.warning("the liveness check waited %.1f s for its turn; judging on the next pass", late)
                return
            now = self._clock() if now is None else now
            for record in list(self._daemons.values()):
                age = now - record.last_beat
                if record.state != DEAD and age > self.heartbeat_timeout_s:
                    self._daemon_died(record, f"missed heartbeats for {age:.1f} s")
                    for sub in list(record.streams):
                        self._close(sub)
                elif (
                    record.state == DEAD
                    and now - max(record.died_at, record.last_beat) > self.limits.forget_dead_daemon_s
                ):
                    log.info("%s left the registry: silent since it was declared dead", record.where())
                    for sub in list(record.streams):
                        self._close(sub)
                    del self._daemons[record.daemon_id]
                    self._forget_daemon(record.daemon_id)
            for job in list(self._jobs.values()):
                if job.state == jobs.WAITING and job.form_deadline is not None and now > job.form_deadline:
                    job.timed_out = True
                    self._fail(job, self._join_timeout_message(job, job.form_timeout_s), -1)
                for sub in list(job.subscribers):
                    age = now - sub.last_beat
                    if age > self.heartbeat_timeout_s:
                        self._close(sub)
                        self._client_died(sub, f"missed heartbeats for {age:.1f} s")
                self._check_first_beats(job, now)

    def _check_first_beats(self, job: Job, now: float) -> None:
        """A rank that joined a running job but never heartbeats died before it could (or never meant to): its
        daemon would stay busy for ever."""
        if job.state != RUNNING or job.first_beats_checked or now - job.running_since <= self.first_beat_s:
            return
        job.first_beats_checked = True  # once per job: the scan is O(world size)
        heard = job.beating | job.finished | job.reported
        silent = [r for r in range(job.world_size) if r not in heard][:1]
        if silent:
            rank = silent[0]
            if job.recovered:
                why = f"did not heartbeat again within {self.recovery_grace_s:g} s of the coordinator's restart"
            else:
                why = f"never sent a heartbeat in {self.first_beat_s:g} s"
            self._fail(job, f"{job.describe_rank(rank)} {why}", rank)

    def inspect(self, now: float | None = None) -> None:
        """Blame suspects whose grace ran out, announce new stalls, fail jobs stalled past the stall timeout."""
        with self._cond:
            now = self._clock() if now is None else now
            for job in list(self._jobs.values()):
                if job.suspect is not None and not job.ended and now >= job.suspect[2]:
                    rank, cause, _ = job.suspect
                    self._fail(job, cause, rank)
            self._judge_paces(now)
            for stall in self.stalls.new_warnings(now):
                job = self._jobs.get(stall.job_id)
                if job is None or job.ended:
                    continue
                message = describe(stall)
                log.warning("stalled: %s", message)
                event = coordinator_pb2.JobEvent(job_id=job.job_id, state=STALLED, cause=message, culprit_rank=-1)
                for sub in job.subscribers:  # the ranks log it; daemons need not hear of it
                    sub.outbox.put(event)
            for stall in self.stalls.overdue(now):
                job = self._jobs.get(stall.job_id)
                if job is None or job.ended:
                    continue
                culprit = stall.missing[0]
                self._fail(
                    job,
                    f"{job.describe_rank(culprit)} never entered {stall.collective} #{stall.sequence} of group "
                    f"'{stall.group}', which ranks {jobs.show_ranks(stall.waiting)} waited in for "
                    f"{stall.waited_s:.1f} s (the coordinator's stall timeout is {self.stalls.fail_after_s:g} s)",
                    culprit,
                )

    def _judge_paces(self, now: float) -> None:
        """Stragglers of running jobs from the work counters their daemons' beats carry (coordinator/pace.py)."""
        loads: dict[str, dict[int, coordinator_pb2.RankLoad]] = {}
        for record in self._daemons.values():
            for load in record.loads:
                job = self._jobs.get(load.job_id)
                # only the daemon the rank runs on now: a daemon's last loads stay when its sessions close (an
                # empty list is a bare beat), and a job of the same id may run again on other daemons
                ranks = job.members if job is not None else []
                if 0 <= load.rank < len(ranks) and ranks[load.rank].daemon_id == record.daemon_id:
                    loads.setdefault(load.job_id, {})[load.rank] = load
        for job_id, by_rank in loads.items():
            job = self._jobs.get(job_id)
            if job is None or job.state != RUNNING:
                continue
            for line in self.pace.judge(job_id, job.world_size, by_rank, now):
                log.warning("%s", line)

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
        record.died_at = self._clock()
        with self._batched():  # the job's failure and the daemon's death: one transaction, never one without the other
            if job is not None and not job.ended:
                self._fail(job, f"rank {record.info.rank} ({record.where()}) {why}", record.info.rank)
            record.info.job_id, record.info.rank = "", -1
            self._save_daemon(record)

    def _client_died(self, sub: Subscriber, why: str) -> None:
        job = sub.job
        # A rank that reported its failure (FailJob) exits next: that is no news, and must not take the blame.
        if job is None or job.ended or sub.rank in job.finished or sub.rank in job.reported:
            return
        self._fail(job, f"{job.describe_rank(sub.rank)} {why}", sub.rank)
