"""Straggler detection for every job, whatever its parallel mode or batch split: each rank's own work per step.

Each daemon counts, per rank it serves, the seconds it spent running programs, the part of them blocked in
collectives (waiting for peers, moving data) and the program repetitions (steps) it completed
(daemon/session.py). Its heartbeat carries these counters when they changed (RankLoad; no extra call). Every
`window_s` the coordinator takes, per running job, the change since its last look: a rank's own work per step is
(run - blocked) / steps. In a job whose ranks do the same work (data parallel with the even split, and the other
modes' symmetric ranks) a slow rank does its own work slowly and the others wait for it in the collectives, so its
own work per step stands out. A rank whose own work per step is at least `ratio` times the median of the other
ranks' for `windows` windows running is a straggler: the coordinator logs it once with its measured pace (and
once when it catches up), and `tessel status` shows every rank's pace of the last window.
A window closes only once every rank of the job completed a step in it (an epoch's end, a checkpoint, a rank
compiling: the window grows until all ranks ran again).

    judge = PaceJudge(PaceSettings(ratio=1.5, windows=3, window_s=2.0))
    for line in judge.judge("j", 2, {0: load0, 1: load1}, now): log.warning("%s", line)
    judge.paces("j")   # [RankPace(job_id="j", rank=0, own_s_per_step=..., ratio=..., straggler=False), ...]
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

from tessel.core import errors
from tessel.v1 import coordinator_pb2


@dataclass(frozen=True)
class PaceSettings:
    """ratio: own work per step over the other ranks' median that counts as slow (> 1); windows: how many windows
    running make a straggler (>= 1); window_s: the shortest window, in seconds (> 0)."""

    ratio: float = 1.5
    windows: int = 3
    window_s: float = 2.0

    def __post_init__(self):
        if not self.ratio > 1.0:
            raise errors.ConfigurationError(
                f"the straggler ratio is {self.ratio}; it must be > 1 (a rank this many times slower than the median "
                "of the others is slow), e.g. 1.5"
            )
        if self.windows < 1:
            raise errors.ConfigurationError(f"straggler windows is {self.windows}; it must be >= 1, e.g. 3")
        if not self.window_s > 0:
            raise errors.ConfigurationError(f"the straggler window is {self.window_s} s; it must be > 0, e.g. 2")

    @classmethod
    def from_env(cls) -> PaceSettings:
        """$TESSEL_STRAGGLER_RATIO, $TESSEL_STRAGGLER_WINDOWS, $TESSEL_STRAGGLER_WINDOW_S over the defaults."""
        env = os.environ
        try:
            return cls(
                ratio=float(env.get("TESSEL_STRAGGLER_RATIO", cls.ratio)),
                windows=int(env.get("TESSEL_STRAGGLER_WINDOWS", cls.windows)),
                window_s=float(env.get("TESSEL_STRAGGLER_WINDOW_S", cls.window_s)),
            )
        except ValueError as exc:
            raise errors.ConfigurationError(
                f"TESSEL_STRAGGLER_RATIO / _WINDOWS / _WINDOW_S must be numbers (e.g. 1.5, 3, 2): {exc}"
            ) from None


@dataclass
class _Job:
    since: float  # when the open window began
    start: dict[int, tuple[float, float, int]]  # rank -> (run_s, blocked_s, steps) when it began
    paces: dict[int, coordinator_pb2.RankPace] = field(default_factory=dict)
    stragglers: set[int] = field(default_factory=set)


class PaceJudge:
    """Windows of every running job's rank counters and the verdicts on them. Plain data: the caller locks."""

    def __init__(self, settings: PaceSettings | None = None):
        self.settings = settings or PaceSettings()
        self._jobs: dict[str, _Job] = {}

    def judge(self, job_id: str, world: int, loads: dict[int, coordinator_pb2.RankLoad], now: float) -> list[str]:
        """Close the job's window if it is due and every rank stepped in it; the lines to log (new stragglers, ranks
        that caught up)."""
        if world < 2 or len(loads) < world:
            return []  # a lone rank has no others to be slower than; a rank not heard from yet: wait
        counters = {r: (load.run_s, load.blocked_s, load.steps) for r, load in loads.items()}
        job = self._jobs.get(job_id)
        if job is None or any(counters[r][2] < job.start[r][2] for r in counters):  # new, or a daemon's new session
            self._jobs[job_id] = _Job(now, counters, job.paces if job else {}, job.stragglers if job else set())
            return []
        if now - job.since < self.settings.window_s or any(counters[r][2] == job.start[r][2] for r in counters):
            return []
        own, blocked = {}, {}
        for rank, (run_s, blocked_s, steps) in counters.items():
            run0, blocked0, steps0 = job.start[rank]
            ran, waited, stepped = run_s - run0, blocked_s - blocked0, steps - steps0
            own[rank], blocked[rank] = max(0.0, ran - waited) / stepped, max(0.0, waited) / stepped
        job.since, job.start = now, counters
        return self._verdicts(job_id, job, own, blocked)

    def _verdicts(self, job_id: str, job: _Job, own: dict[int, float], blocked: dict[int, float]) -> list[str]:
        lines = []
        for rank in sorted(own):
            others = statistics.median(v for r, v in own.items() if r != rank)
            ratio = own[rank] / others if others > 0 else 0.0
            last = job.paces.get(rank)
            slow = ratio >= self.settings.ratio
            streak = (last.slow_windows + 1 if last is not None else 1) if slow else 0
            was = rank in job.stragglers
            if streak >= self.settings.windows and not was:
                job.stragglers.add(rank)
                lines.append(
                    f"job {job_id}: rank {rank} is a straggler: {_pace(own[rank])} of its own work per step over the "
                    f"last {streak} windows, {ratio:.2g}x the median of the other ranks ({_pace(others)}); the others "
                    f"wait for it in every collective (threshold {self.settings.ratio:g}x for "
                    f"{self.settings.windows} windows of >= {self.settings.window_s:g} s)"
                )
            elif was and not slow:
                job.stragglers.discard(rank)
                lines.append(
                    f"job {job_id}: rank {rank} caught up: {_pace(own[rank])} of its own work per step, {ratio:.2g}x "
                    f"the median of the other ranks ({_pace(others)})"
                )
            job.paces[rank] = coordinator_pb2.RankPace(
                job_id=job_id,
                rank=rank,
                own_s_per_step=own[rank],
                blocked_s_per_step=blocked[rank],
                ratio=ratio,
                slow_windows=streak,
                straggler=rank in job.stragglers,
            )
        return lines

    def forget_job(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def paces(self, job_id: str | None = None) -> list[coordinator_pb2.RankPace]:
        """The last window's pace of every rank (of one job, or of all), by job then rank."""
        jobs = [job_id] if job_id is not None else list(self._jobs)
        return [p for j in jobs if j in self._jobs for _, p in sorted(self._jobs[j].paces.items())]


def steps_per_s(seconds: float) -> str:
    """Steps per second at `seconds` per step (> 0): '81.3', '1412'."""
    rate = 1 / seconds
    return f"{rate:.3g}" if rate < 1000 else f"{rate:.0f}"


def _pace(seconds: float) -> str:
    """'12.3 ms (81.3 steps/s)'"""
    rate = f"{steps_per_s(seconds)} steps/s" if seconds > 0 else "no own work"
    return f"{seconds * 1e3:.3g} ms ({rate})"
