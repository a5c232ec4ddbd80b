"""The stall inspector (Horovod's): which ranks have entered which collective of a group, and which are missing.

A daemon reports a collective its rank has waited in for a while (StallReport), and again when the wait ends
(`done`); while it waits, it reports again every STALL_REFRESH_S, and a wait not heard of for STALE_AFTER_S is dropped
(a lost or late `done` must not leave a wait behind that would fail a healthy job at the stall timeout, blaming a
rank that is not missing). For each (job, group) the inspector takes the lowest sequence number a rank waits at:
the ranks waiting there are "waiting", the group's other ranks "missing" (behind, skipped it, or stuck elsewhere:
`detail` says so when they wait in another collective of the group). Plain data under the coordinator state's lock.

    inspector = StallInspector(warn_after_s=2.0, fail_after_s=300.0)
    inspector.report(report, now)
    for stall in inspector.stalls(now): print(describe(stall))
"""

from __future__ import annotations

from dataclasses import dataclass

from tessel.coordinator.jobs import show_ranks
from tessel.core.coordinator_client import STALL_REFRESH_S
from tessel.v1 import coordinator_pb2

MAX_PER_RANK = 64  # collectives in flight one rank may have reported on one group (asynchronous ones queue)
STALE_AFTER_S = 3 * STALL_REFRESH_S  # a wait not reported again for this long ended, its `done` lost


@dataclass
class _Wait:
    collective: str
    since: float
    ranks: tuple[int, ...]
    seen: float  # when it was last reported


class StallInspector:
    """Reports of one coordinator, by job, group, rank and sequence number."""

    def __init__(self, warn_after_s: float = 2.0, fail_after_s: float = 300.0, stale_after_s: float = STALE_AFTER_S):
        self.warn_after_s, self.fail_after_s, self.stale_after_s = warn_after_s, fail_after_s, stale_after_s
        self._waits: dict[str, dict[str, dict[int, dict[int, _Wait]]]] = {}
        self._warned: set[tuple[str, str, int]] = set()

    def report(self, report: coordinator_pb2.StallReport, now: float) -> None:
        groups = self._waits.setdefault(report.job_id, {})
        by_rank = groups.setdefault(report.group, {})
        waits = by_rank.setdefault(report.rank, {})
        if report.done:
            waits.pop(report.sequence, None)
            if not waits:
                del by_rank[report.rank]
            if not by_rank:
                del groups[report.group]
            return
        known = waits.get(report.sequence)
        since = now - max(0.0, report.waited_s)
        if known is None:
            while len(waits) >= MAX_PER_RANK:
                del waits[max(waits)]
            waits[report.sequence] = _Wait(report.collective, since, tuple(report.ranks), now)
        else:
            known.since, known.seen = min(known.since, since), now

    def forget_job(self, job_id: str) -> None:
        self._waits.pop(job_id, None)
        self._warned = {w for w in self._warned if w[0] != job_id}

    def stalls(self, now: float, job_id: str | None = None, at_least_s: float | None = None) -> list:
        """The stalls that have lasted at least `at_least_s` (default: the warning threshold), as Stall messages."""
        at_least_s = self.warn_after_s if at_least_s is None else at_least_s
        found = []
        jobs = [job_id] if job_id is not None else list(self._waits)
        for job in jobs:
            for group, by_rank in self._waits.get(job, {}).items():
                self._drop_stale(by_rank, now)
                stall = _stall_of(job, group, by_rank, now)
                if stall is not None and stall.waited_s >= at_least_s:
                    found.append(stall)
        return found

    def _drop_stale(self, by_rank: dict[int, dict[int, _Wait]], now: float) -> None:
        for rank, waits in list(by_rank.items()):
            for sequence in [q for q, wait in waits.items() if now - wait.seen > self.stale_after_s]:
                del waits[sequence]
            if not waits:
                del by_rank[rank]

    def new_warnings(self, now: float) -> list:
        """Stalls past the warning threshold not announced before (each is announced once; only those still
        stalled are remembered, so a long job's many short stalls leave nothing behind)."""
        stalls = self.stalls(now)
        keys = [(stall.job_id, stall.group, stall.sequence) for stall in stalls]
        fresh = [stall for stall, key in zip(stalls, keys) if key not in self._warned]
        self._warned = set(keys)
        return fresh

    def overdue(self, now: float) -> list:
        """Stalls past the failure timeout with ranks missing (0 = never): their jobs fail, blaming the missing."""
        if self.fail_after_s <= 0:
            return []
        return [s for s in self.stalls(now, at_least_s=self.fail_after_s) if s.missing]


def _stall_of(job: str, group: str, by_rank: dict[int, dict[int, _Wait]], now: float):
    lowest = min((seq for waits in by_rank.values() for seq in waits), default=None)
    if lowest is None:
        return None
    waiting = sorted(rank for rank, waits in by_rank.items() if lowest in waits)
    first = by_rank[waiting[0]][lowest]
    ranks = first.ranks or tuple(waiting)
    missing = [r for r in ranks if r not in waiting]
    elsewhere = [
        f"rank {rank} waits in {waits[min(waits)].collective} #{min(waits)}"
        for rank, waits in sorted(by_rank.items())
        if rank in missing and waits
    ]
    return coordinator_pb2.Stall(
        job_id=job,
        group=group,
        sequence=lowest,
        collective=first.collective,
        waited_s=now - min(by_rank[r][lowest].since for r in waiting),
        waiting=waiting,
        missing=missing,
        detail="; ".join(elsewhere[:5]),
    )


def describe(stall) -> str:
    """One line naming the collective, how long it has waited, the ranks in it and the ranks missing."""
    detail = f" ({stall.detail})" if stall.detail else ""
    missing = (
        f"ranks {show_ranks(stall.missing)} have not entered it{detail}" if stall.missing else "no rank is missing"
    )
    return (
        f"job '{stall.job_id}': {stall.collective} #{stall.sequence} of group '{stall.group}' has waited "
        f"{stall.waited_s:.1f} s: ranks {show_ranks(stall.waiting)} are in it, {missing}"
    )
