"""Speed-aware data parallelism on the coordinator: how the global batch is split over a job's ranks, epoch by epoch.

Before each epoch every rank asks (BalanceBatch, a rendezvous with a deadline) and all get one answer, decided once
when the last rank arrives:

- fixed weights (set_auto_parallel_context(batch_split=(w0, w1, ...))): shares proportional to them;
- otherwise by speed: for the first epoch, the flop/s each rank's daemon measured when it started
  (DaemonInfo.measurement, `plugins/cpu/measure.py`); from then on the job's own step times, samples per second of
  each rank's own work (the daemon's program time less the time it sat blocked in collectives, so a fast rank's
  waiting for the slow one does not count against it), over the epochs so far with each older epoch weighing
  DECAY times less (one epoch's figure on a shared machine is noisy). The first epoch at a new split measures
  nothing: it runs the step's programs at new shapes for the first time, which the daemons count as program time
  (measured on the emulated 2:1 cluster of benchmarks/heterogeneous.py: the fast rank's own work per step was 24 %
  above the next epoch's at the job's first split and 8 % at its probe, and a fit through such epochs gave the fast
  rank a fixed cost that grew from 59 to 115 ms as the job went on). So a new split is held for the epoch after its
  first, which is measured (its straggler check still runs); a new global batch is decided at once.

A step has a part that does not depend on the rows (the optimizer's update and other work on whole parameters:
measured ~20 % of the wide MLP's step on the emulated fast device) besides the part per row, so shares proportional
to speeds measured at one share do not make the ranks' steps equal. Once a rank's own work has been measured at two
shares at least SPAN apart, the balancer fits its step time t_r(b) = fixed_r + b * per_row_r (weighted least squares
over the shares measured so far, each epoch's figure weighing DECAY times less with each later epoch) and gives the
shares that make the predicted step times equal (whole rows, at least one each, the slowest rank's time as small as
it can be). Until then, and for a fit that is not physical (a negative cost), the model is a rate through the
origin: shares proportional to the speeds (largest remainder, at least one row each). Predicted step times at the
even split within EQUAL_WITHIN of each other count as equal: the even split, which is MindSpore's shard rule exactly.
A new split replaces the last one only if it shortens the predicted step (the slowest rank's) by KEEP_WITHIN: measured
speeds wobble, and a new split costs a recompile, new shards and a slower first epoch (8-24 % on the emulated 2:1
cluster), which a 5 % gain pays back within a few epochs (at 10 %, a job there whose fit came from 75 and 87 rows kept
87:41 for four epochs against a predicted 9.6 % gain at 95:33). Except while some rank has been measured at one share
only: a rate through the origin cannot see fixed costs, so it underestimates how far the split must move to equalize
(with a fixed cost, a row more or less changes a step by less than its average row), and its small corrections would all
be kept out by KEEP_WITHIN, leaving the job at its first split for good (measured: the emulated 2:1 cluster of
benchmarks/heterogeneous.py held 87:41 of 128 for six epochs; probed, it settles at 94:34 to 102:26, and its speed-aware
job went from 1.19-1.22x to 1.34x the even split in one sitting). So then, once per job, a split that differs from the
last one is taken and moved further the same way (`beyond`) until every rank whose share changes changes by SPAN: a
probe, held until an epoch has measured it (its second), which gives every such rank the second share a fit needs; the
fitted split then replaces the probe (the probe is nobody's best guess) unless the fit predicts the probe's step within
PROBE_KEEP_WITHIN of its own: a few rows apart, which a new split (a recompile, new shards, programs run for the first
time) would not pay back soon (measured on the emulated 2:1 cluster: a wide MLP's job probed 94:34 and then moved to
93:35; on those devices, whose time follows the least CPU time of a program's runs so far, the seeds' MLP's step at a
new split took 21.7, 17.8, 16.6 and 16.2 ms in its first four epochs). Every decision is a function of the reports
alone: every rank gets the same split.

    balancer = BatchBalancer(state)
    split = balancer.balance(request, budget_s=60.0)   # BatchSplit(shares=[21, 43], source="step times of epoch 1")
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tessel.coordinator.cluster_model import job_daemons
from tessel.core import errors
from tessel.v1 import coordinator_pb2

log = logging.getLogger("tessel.coordinator")

EQUAL_WITHIN = 0.10  # speeds this close (max / min - 1) are equal: the even split
KEEP_WITHIN = 0.05  # a new split must shorten the predicted step this much to replace the last one (a recompile)
SPAN = 0.10  # a rank's measured shares must differ this much (relative to the largest) to fit fixed + per-row costs
PROBE_KEEP_WITHIN = 0.03  # a probe whose predicted step is this close to the fitted split's stays
DECAY = 0.5  # an epoch's step times weigh this much less with each later epoch
KEEP_JOBS = 256  # jobs whose splits are remembered (for status), oldest forgotten first
_POLL_S = 0.25  # how often a waiting rank checks its job, its call and the deadline


@dataclass
class _Round:
    """One epoch's rendezvous: what each rank reported, and the split once decided."""

    global_batch: int
    weights: tuple[float, ...]
    reports: dict[int, tuple[float, int]] = field(default_factory=dict)  # rank -> (busy_s, samples)
    split: coordinator_pb2.BatchSplit | None = None


@dataclass
class _Job:
    world: int
    started_at: float  # the job's start (JobInfo.started_at): a job of the same id started anew starts afresh
    rounds: dict[int, _Round] = field(default_factory=dict)
    latest: coordinator_pb2.BatchSplit | None = None
    work: list[tuple[float, float]] = field(default_factory=list)  # per rank: decayed (busy seconds, samples)
    slow: frozenset[int] = frozenset()  # ranks the last measured epoch found slower than the fastest
    # per rank: share -> decayed (busy seconds, steps) measured at that share (the step-time model's points)
    points: list[dict[int, tuple[float, float]]] = field(default_factory=list)
    probe: str = ""  # "running": the last split went beyond the models' to measure fixed costs; "done": it did
    warming: bool = False  # the latest split is new: the epoch that runs it first warms up and measures nothing


@dataclass(frozen=True)
class StepModel:
    """One rank's step time in seconds at a share of b rows: fixed + b * per_row."""

    fixed: float
    per_row: float

    def at(self, rows: float) -> float:
        return self.fixed + rows * self.per_row


def fit(points: dict[int, tuple[float, float]]) -> StepModel:
    """The step-time model of one rank from {share: (busy seconds, steps)}: an affine fit (weighted by steps) where
    the shares span SPAN and the fit is physical (both costs non-negative, the per-row one positive), else a rate
    through the origin (fixed = 0).

    >>> model = fit({60: (3.0, 10.0), 90: (4.2, 10.0)})   # 0.30 s and 0.42 s per step
    >>> round(model.fixed, 6), round(model.per_row, 6)     # 60 ms fixed, 4 ms per row
    (0.06, 0.004)
    >>> fit({60: (3.0, 10.0)})
    StepModel(fixed=0.0, per_row=0.005)
    """
    rows = [(b, busy / steps, steps) for b, (busy, steps) in sorted(points.items()) if steps > 0 and busy > 0]
    weight = sum(w for _, _, w in rows)
    rate = StepModel(0.0, sum(t * w for _, t, w in rows) / sum(b * w for b, _, w in rows))
    if not spans(points):
        return rate
    mean_b = sum(b * w for b, _, w in rows) / weight
    mean_t = sum(t * w for _, t, w in rows) / weight
    spread = sum(w * (b - mean_b) ** 2 for b, _, w in rows)
    per_row = sum(w * (b - mean_b) * (t - mean_t) for b, t, w in rows) / spread
    fixed = mean_t - per_row * mean_b
    if per_row <= 0 or fixed < 0:
        return rate
    return StepModel(fixed, per_row)


def spans(points: dict[int, tuple[float, float]]) -> bool:
    """Whether a rank's measured shares (as `fit` takes them) lie SPAN apart at least: enough for a fixed cost."""
    shares = [b for b, (busy, steps) in points.items() if steps > 0 and busy > 0]
    return len(shares) > 1 and max(shares) - min(shares) >= SPAN * max(shares)


def beyond(last: Sequence[int], proposed: Sequence[int]) -> tuple[int, ...]:
    """`proposed` moved further from `last` the same way, by the smallest whole multiple of its move (16 at most)
    that changes every rank's share it changes by SPAN of the larger of its two shares, at least one row each;
    `proposed` itself where no multiple does. The sum stays that of `last`.

    >>> beyond((87, 41), (89, 39))       # the rates' correction, too small to fit a fixed cost from
    (97, 31)
    >>> beyond((30, 30), (46, 14)), beyond((3, 3), (5, 1))
    ((46, 14), (5, 1))
    """
    moves = [p - b for p, b in zip(proposed, last)]
    for times in range(1, 17):
        shares = [b + times * m for b, m in zip(last, moves)]
        if min(shares) < 1:
            break
        if all(m == 0 or abs(s - b) >= SPAN * max(s, b) for s, b, m in zip(shares, last, moves)):
            return tuple(shares)
    return tuple(proposed)


def equalizing(models: Sequence[StepModel], total: int) -> tuple[int, ...]:
    """`total` whole rows, at least one per rank, that make the predicted step times t_r(b_r) as equal as whole rows
    allow: the slowest rank's time as small as it can be (ties to the lower rank). With no fixed costs, this is
    `proportional` to the speeds 1 / per_row.

    >>> equalizing([StepModel(0.03, 0.0014), StepModel(0.056, 0.00286)], 128)
    (92, 36)
    """
    count = len(models)
    if total < count:
        raise errors.ConfigurationError(f"a global batch of {total} rows cannot give each of {count} ranks a row")
    if all(m.fixed == 0 for m in models):
        return proportional([1 / m.per_row for m in models], total)
    level = (total + sum(m.fixed / m.per_row for m in models)) / sum(1 / m.per_row for m in models)
    shares = [max(1, int((level - m.fixed) / m.per_row)) for m in models]
    while sum(shares) > total:  # a rank held at one row took rows from others: take back from the slowest
        rank = max((r for r in range(count) if shares[r] > 1), key=lambda r: (models[r].at(shares[r]), -r))
        shares[rank] -= 1
    while sum(shares) < total:  # the rest, one row at a time, to the rank that stays fastest with it
        rank = min(range(count), key=lambda r: (models[r].at(shares[r] + 1), r))
        shares[rank] += 1
    return tuple(shares)


def proportional(weights: Sequence[float], total: int) -> tuple[int, ...]:
    """`total` whole rows split in proportion to `weights` (largest remainder, ties to the lower rank), at least one
    row each (so `total` must be at least len(weights)).

    >>> proportional([1, 2], 64), proportional([1, 1, 3], 60), proportional([5, 1, 1], 3)
    ((21, 43), (12, 12, 36), (1, 1, 1))
    """
    count = len(weights)
    if total < count:
        raise errors.ConfigurationError(f"a global batch of {total} rows cannot give each of {count} ranks a row")
    scale = total / sum(weights)
    exact = [w * scale for w in weights]
    shares = [max(1, int(x)) for x in exact]
    while sum(shares) > total:  # the minimum of one row took rows from others: give back where least is owed
        rank = max((r for r in range(count) if shares[r] > 1), key=lambda r: (shares[r] - exact[r], -r))
        shares[rank] -= 1
    while sum(shares) < total:
        rank = max(range(count), key=lambda r: (exact[r] - shares[r], -r))
        shares[rank] += 1
    return tuple(shares)


def predicted_step(shares: Sequence[int], models: Sequence[StepModel]) -> float:
    """The step's predicted time: the slowest rank's."""
    return max(model.at(share) for share, model in zip(shares, models))


def _gains_under(share: float, shares: Sequence[int], last: Sequence[int], models: Sequence[StepModel]) -> bool:
    """Whether `shares` shorten the predicted step of `last` by less than `share` of it."""
    return predicted_step(shares, models) > (1 - share) * predicted_step(last, models)


def even(global_batch: int, world: int) -> tuple[int, ...]:
    return tuple(global_batch // world + (1 if r < global_batch % world else 0) for r in range(world))


class BatchBalancer:
    """The splits of every job's global batch (see the module docstring). Thread-safe; waits are bounded."""

    def __init__(self, state):
        self.state = state
        self._cond = threading.Condition()
        self._jobs: OrderedDict[str, _Job] = OrderedDict()

    def latest(self, job_id: str) -> coordinator_pb2.BatchSplit | None:
        """The job's latest split (ClusterStatus shows it), or None."""
        with self._cond:
            job = self._jobs.get(job_id)
            return job.latest if job is not None else None

    def balance(
        self, request: coordinator_pb2.BalanceRequest, budget_s: float, is_active: Callable[[], bool] = lambda: True
    ) -> coordinator_pb2.BatchSplit:
        world, daemons = job_daemons(self.state, request.job_id)
        _check(request, world)
        weights = tuple(float(w) for w in request.weights)
        started_at = self.state.job_info(request.job_id).started_at
        with self._cond:
            job = self._job(request.job_id, world, started_at)
            now = job.rounds.setdefault(request.epoch, _Round(request.global_batch, weights))
            if (now.global_batch, now.weights) != (request.global_batch, weights):
                raise errors.ConfigurationError(
                    f"BalanceBatch of job '{request.job_id}', epoch {request.epoch}: rank {request.rank} asks for a "
                    f"global batch of {request.global_batch} with weights {list(weights)}, another rank for "
                    f"{now.global_batch} with {list(now.weights)}; every rank must use the same batch and batch_split"
                )
            now.reports[request.rank] = (max(0.0, request.busy_s), max(0, request.samples))
            if len(now.reports) == world and now.split is None:
                now.split = self._decide(request, job, now, daemons)
                job.latest = now.split
                for old in [e for e in job.rounds if e < request.epoch - 1]:
                    del job.rounds[old]
                self._cond.notify_all()
            deadline = time.monotonic() + budget_s
            while now.split is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(world)) - set(now.reports))
                    raise errors.RendezvousTimeoutError(
                        f"BalanceBatch of job '{request.job_id}', epoch {request.epoch}: ranks {missing} did not ask "
                        f"within {budget_s:.0f} s; every rank asks before each epoch of Model.train"
                    )
                if not is_active():
                    raise errors.TesselError(f"BalanceBatch of job '{request.job_id}': the caller went away")
                self._cond.release()
                try:
                    info = self.state.job_info(request.job_id)
                finally:
                    self._cond.acquire()
                if info.state in ("failed", "finished"):
                    raise errors.JobFailedError(
                        f"job '{request.job_id}' {info.state} while its ranks agreed on the batch split: {info.cause}",
                        info.culprit_rank,
                    )
                self._cond.wait(min(_POLL_S, remaining))
            return now.split

    def _job(self, job_id: str, world: int, started_at: float) -> _Job:
        job = self._jobs.get(job_id)
        if job is None or (job.world, job.started_at) != (world, started_at):
            job = self._jobs[job_id] = _Job(world, started_at)
        self._jobs.move_to_end(job_id)
        while len(self._jobs) > KEEP_JOBS:
            self._jobs.popitem(last=False)
        return job

    def _decide(self, request, job: _Job, now: _Round, daemons) -> coordinator_pb2.BatchSplit:
        world, total = job.world, now.global_batch
        split = coordinator_pb2.BatchSplit(job_id=request.job_id, epoch=request.epoch, global_batch=total)
        if now.weights:
            split.shares.extend(proportional(now.weights, total))
            split.speeds.extend(now.weights)
            split.source = "weights"
            return split
        reports = [now.reports[r] for r in range(world)]
        last = job.latest
        same_batch = last is not None and last.global_batch == total and len(last.shares) == world
        warm = job.warming and same_batch  # the epoch just ended was the first to run the last split
        models = None
        measured = False  # the epoch just ended ran the last split, and its step times are in job.points
        if all(busy > 0 and samples > 0 for busy, samples in reports):
            old = job.work or [(0.0, 0.0)] * world
            job.work = [(DECAY * b + busy, DECAY * n + samples) for (b, n), (busy, samples) in zip(old, reports)]
            speeds = [samples / busy for busy, samples in job.work]
            _stragglers(request.job_id, request.epoch - 1, job, speeds)
            source = f"step times of epoch {request.epoch - 1}" + (" and before" if old[0][1] else "")
            if warm:
                return _held(split, job, last, speeds)
            if last is not None and len(last.shares) == world:  # the epoch measured ran with the last split
                job.points = _decayed(job.points or [{} for _ in range(world)], reports, last.shares)
                measured = True
                models = [fit(p) for p in job.points]
                if any(m.fixed > 0 for m in models):
                    source += "; ms/step " + " : ".join(f"{m.fixed * 1e3:.3g}+{m.per_row * 1e3:.3g}b" for m in models)
        elif warm:
            return _held(split, job, last, list(last.speeds))
        elif last is not None and all(s > 0 for s in last.speeds):
            speeds, source = list(last.speeds), f"speeds of epoch {last.epoch}"
            models = [fit(p) for p in job.points] if job.points else None
        else:
            speeds = [d.measurement.matmul_flops for d in daemons]
            source = "device measurements"
        if models is None and min(speeds) > 0:
            models = [StepModel(0.0, 1.0 / s) for s in speeds]
        times = [m.at(total / world) for m in models] if models else [0.0]  # each rank's step at the same rows
        if min(times) <= 0 or max(times) <= min(times) * (1 + EQUAL_WITHIN):
            shares = even(total, world)
            source += " (equal: even split)" if min(times) > 0 else " (unmeasured: even split)"
        else:
            shares = equalizing(models, total)
        changes = same_batch and models and tuple(last.shares) != shares
        if job.probe == "running" and same_batch and not measured:  # an epoch that compiled the probe: held
            source = f"kept from epoch {last.epoch} (to measure it)"
            shares = tuple(last.shares)
        elif job.probe == "running":  # measured (or the batch changed): the fitted split, unless about the same
            job.probe = "done"
            if changes and measured and _gains_under(PROBE_KEEP_WITHIN, shares, last.shares, models):
                source = f"kept from epoch {last.epoch} ({source}: the probe within {PROBE_KEEP_WITHIN:.0%} of the fit)"
                shares = tuple(last.shares)
        elif changes and measured and not job.probe and not all(spans(p) for p in job.points):
            further = beyond(last.shares, shares)
            if further != shares:
                source += f"; moved on to {':'.join(map(str, further))}, {SPAN:.0%} at least, to fit fixed costs"
                shares, job.probe = further, "running"
        elif changes and _gains_under(KEEP_WITHIN, shares, last.shares, models):
            source = f"kept from epoch {last.epoch} ({source}: gain under {KEEP_WITHIN:.0%})"
            shares = tuple(last.shares)
        job.warming = not same_batch or tuple(last.shares) != tuple(shares)
        split.shares.extend(shares)
        split.speeds.extend(speeds)
        split.source = source
        return split


def _held(split, job: _Job, last, speeds: Sequence[float]) -> coordinator_pb2.BatchSplit:
    """The last split again, for the epoch after its first: the first epoch at a split compiles its step and runs
    programs at new shapes for the first time, so its step times measure the warm-up, not the split."""
    job.warming = False
    split.shares.extend(last.shares)
    split.speeds.extend(speeds)
    split.source = f"kept from epoch {last.epoch} (its first epoch warmed up; the next one measures it)"
    return split


def _decayed(points, reports, shares) -> list[dict[int, tuple[float, float]]]:
    """Each rank's model points, older epochs weighing DECAY times less, with the epoch just measured added at the
    share it ran with (steps = samples / share)."""
    out = []
    for rank, (busy, samples) in enumerate(reports):
        aged = {b: (DECAY * s, DECAY * n) for b, (s, n) in points[rank].items()}
        share = shares[rank]
        s, n = aged.get(share, (0.0, 0.0))
        aged[share] = (s + busy, n + samples / share)
        out.append(aged)
    return out


def _stragglers(job_id: str, epoch: int, job: _Job, speeds: list[float]) -> None:
    """Name the ranks slower than the fastest (beyond EQUAL_WITHIN) in two measured epochs running, with their
    speeds: a sustained straggler (a slow device, a loaded host), not one noisy epoch."""
    fastest = max(speeds)
    slow = frozenset(r for r, speed in enumerate(speeds) if speed * (1 + EQUAL_WITHIN) < fastest)
    for rank in sorted(slow & job.slow):
        log.warning(
            "job %s: rank %d is slower than the others through epoch %d: %.3g samples/s of its own work, the fastest "
            "rank %.3g (speed-aware data parallelism gives it a smaller share)",
            job_id,
            rank,
            epoch,
            speeds[rank],
            fastest,
        )
    job.slow = slow


def _check(request: coordinator_pb2.BalanceRequest, world: int) -> None:
    where = f"BalanceBatch of job '{request.job_id}'"
    if not 0 <= request.rank < world:
        raise errors.ConfigurationError(f"{where}: rank {request.rank} is outside the world of {world}")
    if request.epoch < 0:
        raise errors.ConfigurationError(f"{where}: epoch {request.epoch} is negative")
    if request.global_batch < world:
        raise errors.ConfigurationError(
            f"{where}: a global batch of {request.global_batch} rows cannot give each of {world} ranks a row"
        )
    if request.weights and (len(request.weights) != world or min(request.weights) <= 0):
        raise errors.ConfigurationError(
            f"{where}: batch_split weights {list(request.weights)} must be {world} positive numbers, one per rank"
        )
