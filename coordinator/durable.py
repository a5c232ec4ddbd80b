"""The coordinator state's records in its store (coordinator/store.py), and their recovery after a restart.

A mixin of `state.CoordinatorState`: the `_save_*` methods run under the state's condition, at each change worth
keeping — never on a heartbeat. `_restore` runs once, before the server takes calls.

After a restart every restored member gets `recovery_grace_s` to come back: a daemon whose heartbeat stream does
not return within the grace plus the heartbeat timeout is dead (its job fails, blaming its rank); a rank of a
running job that does not heartbeat again within the grace fails its job. In-flight barriers are not kept (a
barrier interrupted by the restart may have to be passed again); groups, keys and finished ranks are.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging

from tessel.coordinator import jobs, store
from tessel.coordinator.jobs import DEAD, RUNNING, DaemonRecord, Job
from tessel.v1 import common_pb2, coordinator_pb2

log = logging.getLogger("tessel.coordinator")


def _group_key(job_id: str, name: str) -> str:
    return json.dumps([job_id, name])


def _job_prefix(job_id: str) -> str:
    """The start of every group or KV key of this job (`["job",` — unambiguous whatever the id holds)."""
    return json.dumps([job_id])[:-1] + ","


def job_record(job: Job) -> bytes:
    """What changes with the job's state (its ranks are records of their own: a join or a finish writes O(1))."""
    return json.dumps(
        {
            "job_id": job.job_id,
            "world_size": job.world_size,
            "created_at": job.created_at,
            "state": job.state,
            "members": [base64.b64encode(m.SerializeToString()).decode() for m in job.members],
            "daemon_ids": job.daemon_ids,
            "cause": job.cause,
            "culprit_rank": job.culprit_rank,
            "timed_out": job.timed_out,
            "started_at": job.started_at,
            "nonce": job.nonce,
            "once": job.once,
            "how_to_fix": job.how_to_fix,
            "form_timeout_s": job.form_timeout_s if job.form_deadline is not None else None,
        }
    ).encode()


def job_from_record(raw: bytes) -> Job:
    data = json.loads(raw)
    job = Job(job_id=data["job_id"], world_size=int(data["world_size"]), created_at=float(data["created_at"]))
    job.state, job.cause, job.culprit_rank = data["state"], data["cause"], int(data["culprit_rank"])
    job.timed_out, job.started_at, job.nonce = bool(data["timed_out"]), float(data["started_at"]), data["nonce"]
    job.members = [common_pb2.Member.FromString(base64.b64decode(m)) for m in data["members"]]
    job.daemon_ids = list(data["daemon_ids"])
    job.once, job.how_to_fix = bool(data.get("once", False)), data.get("how_to_fix") or job.how_to_fix
    if data.get("form_timeout_s") is not None:  # announced by expect_job: it has a deadline to form by
        job.form_timeout_s = float(data["form_timeout_s"])
    return job


def rank_record(job: Job, rank: int) -> bytes:
    joiner = job.joiners[rank]
    return json.dumps(
        {
            "joiner": [joiner.plugin, joiner.daemon_id, joiner.hostname, joiner.pid],
            "finished": rank in job.finished,
            "reported": rank in job.reported,
        }
    ).encode()


def restore_rank(job: Job, rank: int, raw: bytes) -> None:
    data = json.loads(raw)
    plugin, daemon_id, hostname, pid = data["joiner"]
    job.take_rank(rank, jobs.Joiner(rank, plugin, daemon_id, hostname, int(pid), restored=True))
    if data["finished"]:
        job.finished.add(rank)
    if data["reported"]:
        job.reported.add(rank)


class DurableMixin:
    """Persistence for `CoordinatorState` (which provides store, recovery_grace_s, first_beat_s, _clock, _daemons,
    _jobs, _next_daemon)."""

    _batch: list | None = None

    def _write(self, action: str, *args) -> None:
        """One store write (or one more in the open batch); a failing store is logged loudly and the coordinator goes
        on, in memory."""
        if self._batch is not None:
            self._batch.append((action, *args))
            return
        self._apply([(action, *args)])

    def _apply(self, ops: list[tuple]) -> None:
        try:
            self.store.apply(ops)
        except Exception as exc:
            log.error(
                "the coordinator's store %s failed to write %d changes (%s %s …): %s; they are not durable",
                self.store.url,
                len(ops),
                ops[0][0],
                ops[0][1:3],
                exc,
            )

    @contextlib.contextmanager
    def _batched(self):
        """Writes inside go to the store together at the end, in one transaction (a job start takes many daemons)."""
        if self._batch is not None:
            yield
            return
        self._batch = []
        try:
            yield
        finally:
            ops, self._batch = self._batch, None
            if ops:
                self._apply(ops)

    def _save_rank(self, job: Job, rank: int) -> None:
        self._write(store.PUT, store.RANK, _group_key(job.job_id, rank), rank_record(job, rank))

    def _forget_rank(self, job: Job, rank: int) -> None:
        self._write(store.DELETE, store.RANK, _group_key(job.job_id, rank))

    def _save_daemon(self, record: DaemonRecord) -> None:
        self._write("put", store.DAEMON, record.daemon_id, record.info.SerializeToString())

    def _save_next_daemon(self) -> None:
        self._write("put", store.META, "next_daemon", str(self._next_daemon).encode())

    def _forget_daemon(self, daemon_id: str) -> None:
        self._write("delete", store.DAEMON, daemon_id)

    def _save_job(self, job: Job) -> None:
        self._write("put", store.JOB, job.job_id, job_record(job))

    def _forget_job(self, job_id: str) -> None:
        with self._batched():  # one transaction: no rank record outlives its job (a job id is used again)
            self._write("delete", store.JOB, job_id)
            self._write("delete_prefix", store.RANK, _job_prefix(job_id))
            self._forget_rendezvous(job_id)

    def _forget_rendezvous(self, job_id: str) -> None:
        self._write("delete_prefix", store.GROUP, _job_prefix(job_id))
        self._write("delete_prefix", store.KV, _job_prefix(job_id))

    def _save_group(self, job: Job, group: jobs.Group) -> None:
        value = {"ranks": list(group.ranks), "first_rank": group.first_rank, "arrived": sorted(group.arrived)}
        self._write("put", store.GROUP, _group_key(job.job_id, group.name), json.dumps(value).encode())

    def _forget_group(self, job_id: str, name: str) -> None:
        self._write("delete", store.GROUP, _group_key(job_id, name))

    def _save_kv(self, job_id: str, key: str, value: bytes | None) -> None:
        if value is None:
            self._write("delete", store.KV, _group_key(job_id, key))
        else:
            self._write("put", store.KV, _group_key(job_id, key), value)

    def _restore(self) -> str:
        """Read the store back; returns a one-line summary (empty when it held nothing)."""
        found = self.store.load()
        if not any(found.values()):
            return ""
        now = self._clock()
        self._next_daemon = int(found[store.META].get("next_daemon", b"0"))
        for daemon_id, raw in found[store.DAEMON].items():
            info = coordinator_pb2.DaemonInfo.FromString(raw)
            # It has the grace to beat again before it counts as silent.
            record = DaemonRecord(info=info, last_beat=now + self.recovery_grace_s, restored=True)
            if info.state == DEAD:
                record.died_at = now
            self._daemons[daemon_id] = record
        restored = [job_from_record(raw) for raw in found[store.JOB].values()]
        by_id = {job.job_id: job for job in restored}
        for key, raw in found[store.RANK].items():
            job_id, rank = json.loads(key)
            if job_id in by_id:
                restore_rank(by_id[job_id], int(rank), raw)
        for job in sorted(restored, key=lambda j: j.created_at):
            if job.state == RUNNING:
                # Every rank must heartbeat again within the grace (liveness.py: _check_first_beats).
                job.running_since = now + self.recovery_grace_s - self.first_beat_s
                job.recovered = True
            elif job.state == jobs.WAITING and job.form_timeout_s:
                # Announced jobs form within their timeout again, from the restart (the clock before it is gone).
                job.form_deadline = now + self.recovery_grace_s + job.form_timeout_s
            self._jobs[job.job_id] = job
        for key, raw in found[store.GROUP].items():
            job_id, name = json.loads(key)
            job = self._jobs.get(job_id)
            if job is None or job.ended:
                continue
            value = json.loads(raw)
            group = jobs.Group(name, tuple(value["ranks"]), int(value["first_rank"]), set(value["arrived"]))
            job.groups[name] = group
        for key, value in found[store.KV].items():
            job_id, name = json.loads(key)
            job = self._jobs.get(job_id)
            if job is not None and not job.ended:
                job.kv[name] = value
                job.kv_bytes += len(name) + len(value)
        running = sum(1 for j in self._jobs.values() if j.state == RUNNING)
        return (
            f"restored from {self.store.url}: {len(self._daemons)} daemons, {len(self._jobs)} jobs ({running} "
            f"running), {len(found[store.GROUP])} groups, {len(found[store.KV])} keys; members have "
            f"{self.recovery_grace_s:g} s to come back"
        )
