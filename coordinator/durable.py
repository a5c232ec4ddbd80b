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
    return json.dumps(
        {
            "job_id": job.job_id,
            "world_size": job.world_size,
            "created_at": job.created_at,
            "state": job.state,
            "joiners": [[j.rank, j.plugin, j.daemon_id, j.hostname, j.pid] for j in job.joiners.values()],
            "members": [base64.b64encode(m.SerializeToString()).decode() for m in job.members],
            "daemon_ids": job.daemon_ids,
            "finished": sorted(job.finished),
            "reported": sorted(job.reported),
            "cause": job.cause,
            "culprit_rank": job.culprit_rank,
            "timed_out": job.timed_out,
            "started_at": job.started_at,
            "nonce": job.nonce,
        }
    ).encode()


def job_from_record(raw: bytes) -> Job:
    data = json.loads(raw)
    job = Job(job_id=data["job_id"], world_size=int(data["world_size"]), created_at=float(data["created_at"]))
    job.state, job.cause, job.culprit_rank = data["state"], data["cause"], int(data["culprit_rank"])
    job.timed_out, job.started_at, job.nonce = bool(data["timed_out"]), float(data["started_at"]), data["nonce"]
    for rank, plugin, daemon_id, hostname, pid in data["joiners"]:
        job.take_rank(int(rank), jobs.Joiner(int(rank), plugin, daemon_id, hostname, int(pid), restored=True))
    job.members = [common_pb2.Member.FromString(base64.b64decode(m)) for m in data["members"]]
    job.daemon_ids = list(data["daemon_ids"])
    job.finished, job.reported = set(data["finished"]), set(data["reported"])
    return job


class DurableMixin:
    """Persistence for `CoordinatorState` (which provides store, recovery_grace_s, first_beat_s, _clock, _daemons,
    _jobs, _next_daemon)."""

    def _write(self, action: str, *args) -> None:
        """One store write; a failing store is logged loudly and the coordinator goes on (in memory)."""
        try:
            getattr(self.store, action)(*args)
        except Exception as exc:
            log.error(
                "the coordinator's store %s failed to %s %s: %s (this change is not durable)",
                self.store.url,
                action,
                args[:2],
                exc,
            )

    def _save_daemon(self, record: DaemonRecord) -> None:
        self._write("put", store.DAEMON, record.daemon_id, record.info.SerializeToString())

    def _save_next_daemon(self) -> None:
        self._write("put", store.META, "next_daemon", str(self._next_daemon).encode())

    def _forget_daemon(self, daemon_id: str) -> None:
        self._write("delete", store.DAEMON, daemon_id)

    def _save_job(self, job: Job) -> None:
        self._write("put", store.JOB, job.job_id, job_record(job))

    def _forget_job(self, job_id: str) -> None:
        self._write("delete", store.JOB, job_id)
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
            record = DaemonRecord(info=info, last_beat=now + self.recovery_grace_s)
            if info.state == DEAD:
                record.died_at = now
            self._daemons[daemon_id] = record
        restored = [job_from_record(raw) for raw in found[store.JOB].values()]
        for job in sorted(restored, key=lambda j: j.created_at):
            if job.state == RUNNING:
                # Every rank must heartbeat again within the grace (liveness.py: _check_first_beats).
                job.running_since = now + self.recovery_grace_s - self.first_beat_s
                job.recovered = True
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
