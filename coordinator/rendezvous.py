"""Per-job rendezvous on top of the coordinator state: communication groups, reusable barriers, a key-value store.

A mixin of `state.CoordinatorState`: every method runs under the state's condition and waits through its `_wait`,
so a failed job releases these calls at once with JobFailedError.
"""

from __future__ import annotations

import time

from tessel.coordinator import jobs
from tessel.coordinator.jobs import FAILED, RUNNING, Job
from tessel.core import errors
from tessel.v1 import common_pb2


class RendezvousMixin:
    """Groups, barriers and the key-value store of `CoordinatorState` (which provides _cond, _job, _wait and
    limits)."""

    def _running_job(self, job_id: str, what: str) -> Job:
        job = self._job(job_id)
        if job.state == FAILED:
            raise job.failure()
        if job.state != RUNNING:
            raise errors.ConfigurationError(
                f"{what}: job '{job_id}' is {job.state}, not running; call it between JoinJob and FinishRank"
            )
        return job

    # ------------------------------------------------------------------------------------------ groups

    def create_group(
        self, job_id: str, name: str, ranks: list[int], rank: int, timeout_s: float, is_active=None
    ) -> list[common_pb2.Member]:
        """Wait until every rank of the group called this with the same ranks; returns its Members in group order."""
        deadline = time.monotonic() + timeout_s
        self.limits.check_id("CreateGroup: the group name", name)
        what = f"group '{name}'"
        with self._cond:
            job = self._running_job(job_id, "CreateGroup")
            wanted = jobs.check_ranks(job, list(ranks), rank, what)
            group = job.groups.get(name)
            if group is None:
                group = job.groups[name] = jobs.Group(name, wanted, first_rank=rank)
            elif group.ranks != wanted:
                raise errors.ConfigurationError(
                    f"{what} of job '{job_id}': rank {rank} gave ranks {list(wanted)} but rank {group.first_rank} "
                    f"gave {list(group.ranks)}; every member must pass the same ranks in the same order "
                    "(or destroy the group first)"
                )
            group.arrived.add(rank)
            self._save_group(job, group)
            self._cond.notify_all()
            try:
                complete = self._wait(group.complete, deadline, job, is_active)
            except BaseException:  # the call was cancelled or the job failed: this rank is not there any more
                if not group.complete() and rank in group.arrived:
                    group.arrived.discard(rank)
                    if not job.ended:
                        self._save_group(job, group)
                raise
            if not complete:
                missing = [r for r in group.ranks if r not in group.arrived]
                group.arrived.discard(rank)
                raise errors.RendezvousTimeoutError(
                    f"{what} of job '{job_id}' has {len(group.ranks) - len(missing)} of {len(group.ranks)} ranks after "
                    f"{timeout_s:.1f} s; missing ranks {missing}: every rank in {list(group.ranks)} must create it"
                )
            return [job.members[r] for r in group.ranks]

    def destroy_group(self, job_id: str, name: str, rank: int) -> None:
        """Forget the group (idempotent): its name may be created again, with other ranks if wanted."""
        with self._cond:
            job = self._job(job_id)
            if job.groups.pop(name, None) is not None:
                self._forget_group(job_id, name)

    # ------------------------------------------------------------------------------------------ barriers

    def barrier(self, job_id: str, name: str, rank: int, ranks: list[int], timeout_s: float, is_active=None) -> None:
        """Wait until every rank of `ranks` (empty = the whole job) reached the barrier; reusable."""
        deadline = time.monotonic() + timeout_s
        self.limits.check_id("Barrier: the barrier name", name)
        what = f"barrier '{name}'"
        with self._cond:
            job = self._running_job(job_id, "Barrier")
            wanted = jobs.check_ranks(job, list(ranks) or list(range(job.world_size)), rank, what)
            barrier = job.barriers.setdefault(name, jobs.Barrier(wanted))
            if barrier.ranks != wanted:
                raise errors.ConfigurationError(
                    f"{what} of job '{job_id}': rank {rank} gave ranks {list(wanted)} but it is a barrier of "
                    f"{list(barrier.ranks)}; use the same ranks everywhere or another barrier name"
                )
            generation = barrier.generation
            barrier.arrived.add(rank)
            if barrier.arrived.issuperset(barrier.ranks):  # the last one in opens it for everyone
                barrier.generation += 1
                barrier.arrived.clear()
                self._cond.notify_all()
                return
            try:
                passed = self._wait(lambda: barrier.generation != generation, deadline, job, is_active)
            except BaseException:  # the call was cancelled or the job failed: this rank is not at the barrier now
                if barrier.generation == generation:
                    barrier.arrived.discard(rank)
                raise
            if not passed:
                missing = [r for r in barrier.ranks if r not in barrier.arrived]
                barrier.arrived.discard(rank)
                raise errors.RendezvousTimeoutError(
                    f"{what} of job '{job_id}' (pass {generation}) was reached by {len(barrier.ranks) - len(missing)} "
                    f"of {len(barrier.ranks)} ranks after {timeout_s:.1f} s; missing ranks {missing}: "
                    "they are slow, stuck, or skipped this barrier"
                )

    # ------------------------------------------------------------------------------------------ key-value store

    def kv_set(self, job_id: str, key: str, value: bytes) -> None:
        with self._cond:
            job = self._kv_job(job_id, key)
            old = job.kv.get(key)
            size = job.kv_bytes + len(key) + len(value) - (0 if old is None else len(key) + len(old))
            self.limits.check_count(
                f"KeyValueSet: the key-value store of job '{job_id}' in bytes", size, "max_kv_bytes"
            )
            job.kv[key] = bytes(value)
            job.kv_bytes = size
            self._save_kv(job_id, key, job.kv[key])
            self._cond.notify_all()

    def kv_get(self, job_id: str, key: str, timeout_s: float, is_active=None) -> bytes:
        """The value of `key`, waiting up to timeout_s for some rank to set it (0 = do not wait: KeyError)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            job = self._kv_job(job_id, key)
            if timeout_s <= 0 and key not in job.kv:
                raise KeyError(f"key '{key}' of job '{job_id}' is not set")
            if not self._wait(lambda: key in job.kv, deadline, job, is_active):
                raise errors.RendezvousTimeoutError(
                    f"key '{key}' of job '{job_id}' was not set within {timeout_s:.1f} s: "
                    "the rank that sets it is slow or never does"
                )
            return job.kv[key]

    def kv_delete(self, job_id: str, key: str) -> None:
        with self._cond:
            job = self._kv_job(job_id, key)
            old = job.kv.pop(key, None)
            if old is not None:
                job.kv_bytes -= len(key) + len(old)
                self._save_kv(job_id, key, None)

    def _kv_job(self, job_id: str, key: str) -> Job:
        self.limits.check_id("the key-value store's key", key)
        if not key:
            raise errors.ConfigurationError(f"key-value store of job '{job_id}': the key is empty; name it")
        job = self._job(job_id)
        if job.state == FAILED:
            raise job.failure()
        if job.ended:  # its store went with it
            raise errors.ConfigurationError(f"key-value store of job '{job_id}': the job has {job.state}")
        return job
