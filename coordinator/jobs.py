"""The coordinator's records — daemons, jobs, groups, barriers — and the rank → daemon assignment rule.

Plain data plus pure functions; `state.CoordinatorState` owns the lock that guards them.
"""

from __future__ import annotations

import queue
import secrets
from dataclasses import dataclass, field

from tessel.core import errors
from tessel.v1 import common_pb2, coordinator_pb2

WAITING, RUNNING, FAILED, FINISHED = "waiting", "running", "failed", "finished"
IDLE, BUSY, DEAD = "idle", "busy", "dead"


@dataclass(eq=False)
class DaemonRecord:
    """A registered daemon: what it told us (`info`, whose `state`/`job_id`/`rank` we keep current) and liveness."""

    info: coordinator_pb2.DaemonInfo
    last_beat: float
    streams: set[Subscriber] = field(default_factory=set)
    died_at: float = 0.0  # when it was declared dead (it leaves the registry some time later)
    restored: bool = False  # read back by a restarted coordinator and not heard from since: not given new work
    loads: list = field(default_factory=list)  # its ranks' work counters (RankLoad) from its latest beat carrying them

    @property
    def daemon_id(self) -> str:
        return self.info.daemon_id

    @property
    def state(self) -> str:
        return self.info.state

    def where(self) -> str:
        return f"daemon {self.daemon_id} on host {self.info.hostname or self.info.address}"


@dataclass(eq=False)
class Subscriber:
    """One open heartbeat stream: a daemon's (`daemon` set) or a client rank's (`job` set).

    Events and control items for the stream go into `outbox`; the stream's sender drains it.
    """

    outbox: queue.SimpleQueue
    last_beat: float
    daemon: DaemonRecord | None = None
    job: Job | None = None
    rank: int = -1
    pid: int = 0
    closed: bool = False


@dataclass
class Joiner:
    """A client process that joined a job as `rank`."""

    rank: int
    plugin: str
    daemon_id: str  # the pinned daemon, "" = any
    hostname: str
    pid: int
    restored: bool = False  # read back from the store by a restarted coordinator: its process may ask again


@dataclass(eq=False)
class Group:
    name: str
    ranks: tuple[int, ...]
    first_rank: int
    arrived: set[int] = field(default_factory=set)

    def complete(self) -> bool:
        return self.arrived.issuperset(self.ranks)


@dataclass(eq=False)
class Barrier:
    ranks: tuple[int, ...]
    generation: int = 0
    arrived: set[int] = field(default_factory=set)


@dataclass(eq=False)
class Job:
    """One job: its rendezvous, its assignment once running, and its per-job groups, barriers and KV store."""

    job_id: str
    world_size: int
    created_at: float
    state: str = WAITING
    joiners: dict[int, Joiner] = field(default_factory=dict)
    members: list[common_pb2.Member] = field(default_factory=list)
    daemon_ids: list[str] = field(default_factory=list)
    finished: set[int] = field(default_factory=set)
    cause: str = ""
    culprit_rank: int = -1
    timed_out: bool = False  # failed because the rendezvous passed its deadline
    started_at: float = 0.0
    pending_reasons: list[str] = field(default_factory=list)  # why a complete world has no daemons yet
    # A job announced before its ranks join (a dynamic cluster's scheduler does): it must form by this time
    # (the state's clock), and a timeout says how to fix it in the launcher's own terms.
    form_deadline: float | None = None
    form_timeout_s: float = 0.0
    once: bool = False  # the job of a dynamic cluster's scheduler: it runs once, later joiners are extra
    how_to_fix: str = "start them or lower -n"
    subscribers: set[Subscriber] = field(default_factory=set)
    reported: set[int] = field(default_factory=set)  # ranks that reported their failure (FailJob): they exit next
    beating: set[int] = field(default_factory=set)  # ranks that opened a heartbeat stream
    running_since: float = 0.0  # on the state's clock
    first_beats_checked: bool = False  # every rank was checked for a first heartbeat (liveness.py)
    recovered: bool = False  # read back by a restarted coordinator: its ranks must heartbeat again
    suspect: tuple[int, str, float] | None = None  # (rank, cause, deadline): blamed by a peer, not yet proven
    next_free: int = 0  # every rank below this one has joined, except those in `freed`
    freed: set[int] = field(default_factory=set)  # ranks below next_free whose joiner withdrew
    groups: dict[str, Group] = field(default_factory=dict)
    barriers: dict[str, Barrier] = field(default_factory=dict)
    kv: dict[str, bytes] = field(default_factory=dict)
    kv_bytes: int = 0
    # Job ids repeat (each embedded `tessel run` numbers from 1 at its own coordinator; a finished id may be
    # reused): names that must differ between jobs on a host, like shared-memory segments, include this.
    nonce: str = field(default_factory=lambda: secrets.token_hex(8))

    @property
    def ended(self) -> bool:
        return self.state in (FAILED, FINISHED)

    @property
    def complete(self) -> bool:
        return len(self.joiners) == self.world_size

    def missing_ranks(self, limit: int = 20) -> list[int]:
        """The first `limit` ranks that have not joined: O(joined + limit), whatever the world size."""
        missing = sorted(self.freed)[:limit]
        rank = self.next_free
        while len(missing) < limit and rank < self.world_size:
            if rank not in self.joiners:
                missing.append(rank)
            rank += 1
        return sorted(missing)[:limit]

    def take_rank(self, rank: int, joiner: Joiner) -> None:
        self.joiners[rank] = joiner
        self.freed.discard(rank)
        while self.next_free in self.joiners:
            self.next_free += 1

    def free_rank(self, rank: int) -> None:
        if self.joiners.pop(rank, None) is not None and rank < self.next_free:
            self.freed.add(rank)

    def first_free_rank(self) -> int | None:
        if self.freed:
            return min(self.freed)
        return self.next_free if self.next_free < self.world_size else None

    def forget_rendezvous(self) -> None:
        """An ended job keeps what the status table and late members need, not its groups, barriers and KV."""
        self.groups, self.barriers, self.kv, self.kv_bytes = {}, {}, {}, 0
        self.members, self.pending_reasons, self.suspect = [], [], None

    def failure(self) -> errors.TesselError:
        """The exception every blocked call of this failed job raises."""
        if self.timed_out:
            return errors.RendezvousTimeoutError(self.cause)
        return errors.JobFailedError(f"job '{self.job_id}' failed: {self.cause}", self.culprit_rank)

    def event(self) -> coordinator_pb2.JobEvent:
        return coordinator_pb2.JobEvent(
            job_id=self.job_id, state=self.state, cause=self.cause, culprit_rank=self.culprit_rank
        )

    def describe_rank(self, rank: int) -> str:
        """'rank 2 (pid 41 on host x, daemon d3)': who a rank is, for failure causes."""
        joiner = self.joiners.get(rank)
        parts = [f"pid {joiner.pid} on host {joiner.hostname}"] if joiner else []
        if rank < len(self.daemon_ids):
            parts.append(f"daemon {self.daemon_ids[rank]}")
        return f"rank {rank} ({', '.join(parts)})" if parts else f"rank {rank}"

    def info(self) -> coordinator_pb2.JobInfo:
        return coordinator_pb2.JobInfo(
            job_id=self.job_id,
            world_size=self.world_size,
            state=self.state,
            cause=self.cause,
            members=self.members,
            finished_ranks=sorted(self.finished),
            started_at=self.started_at,
            culprit_rank=self.culprit_rank,
        )


def daemon_order(daemon_id: str) -> tuple[int, str]:
    """Sort key putting d2 before d10."""
    digits = daemon_id.lstrip("d")
    return (int(digits), daemon_id) if digits.isdigit() else (1 << 62, daemon_id)


def _plugins(joiner: Joiner) -> list[str]:
    """The plugins a rank accepts: JoinJobRequest.plugin is empty (any) or one name or several, comma-separated
    (a job over mixed hardware: tessel run --plugin gpu,cpu)."""
    return [name.strip() for name in joiner.plugin.split(",") if name.strip()]


def _fits(record: DaemonRecord, joiner: Joiner) -> bool:
    wanted = _plugins(joiner)
    return record.state == IDLE and not record.restored and (not wanted or record.info.plugin in wanted)


def _explain_pinned(job: Job, joiner: Joiner, record: DaemonRecord | None, taken_by: int | None) -> str:
    who = f"rank {joiner.rank} of job '{job.job_id}' is pinned to daemon {joiner.daemon_id}"
    if record is None:
        return f"{who}, which is not registered"
    if taken_by is not None:
        return f"{who}, which rank {taken_by} is pinned to as well"
    if _plugins(joiner) and record.info.plugin not in _plugins(joiner):
        return f"{who}, whose plugin is '{record.info.plugin}', not the required '{joiner.plugin}'"
    if record.restored:
        return f"{who}, which has not heartbeat since the coordinator restarted"
    busy = f" with job '{record.info.job_id}'" if record.state == BUSY else ""
    return f"{who}, which is {record.state}{busy}"


def _explain_unpinned(joiner: Joiner, daemons: dict[str, DaemonRecord], shown: int = 20) -> str:
    plugin = f"'{joiner.plugin}' " if joiner.plugin else ""
    ordered = sorted(daemons.values(), key=lambda d: daemon_order(d.daemon_id))
    states = ", ".join(f"{d.daemon_id} {d.info.plugin} {d.state}" for d in ordered[:shown])
    more = f" and {len(ordered) - shown} more" if len(ordered) > shown else ""
    return f"rank {joiner.rank} needs an idle {plugin}daemon (registered: {states or 'none'}{more})"


class _FreeDaemons:
    """Idle daemons, lowest-numbered first, by plugin and by (plugin, host): each pick is O(1) amortized, so
    assigning a world of W ranks among D daemons is O(W + D log D), not O(W·D)."""

    def __init__(self, records: list[DaemonRecord]):
        self.taken: set[str] = set()
        self.lists: dict[tuple, list[DaemonRecord]] = {}
        self.cursors: dict[tuple, int] = {}
        for record in sorted(records, key=lambda d: daemon_order(d.daemon_id)):
            info = record.info
            for key in (
                ("any",),
                ("plugin", info.plugin),
                ("host", info.hostname),
                ("both", info.plugin, info.hostname),
            ):
                self.lists.setdefault(key, []).append(record)

    def _first(self, key: tuple) -> DaemonRecord | None:
        found, at = self.lists.get(key, []), self.cursors.get(key, 0)
        while at < len(found) and found[at].daemon_id in self.taken:
            at += 1
        self.cursors[key] = at
        return found[at] if at < len(found) else None

    def pick(self, joiner: Joiner) -> DaemonRecord | None:
        """The lowest-numbered free daemon of one of the joiner's plugins, on its host if there is one."""
        wanted = _plugins(joiner)
        tiers = (
            [[("both", p, joiner.hostname) for p in wanted], [("plugin", p) for p in wanted]]
            if wanted
            else [[("host", joiner.hostname)], [("any",)]]
        )
        for keys in tiers:
            found = [r for r in (self._first(key) for key in keys) if r is not None]
            if found:
                record = min(found, key=lambda r: daemon_order(r.daemon_id))
                self.taken.add(record.daemon_id)
                return record
        return None


def assign_daemons(
    job: Job, daemons: dict[str, DaemonRecord], max_reasons: int = 5
) -> tuple[dict[int, DaemonRecord], list[str]]:
    """Choose a daemon for every rank of a complete world: (assignment, []) or ({}, reasons it is impossible now).

    Deterministic for a given registry: pinned ranks first; then ranks that require a plugin, then the rest, each
    in rank order, taking the lowest-numbered idle daemon with the right plugin, preferring the rank's own host.
    At most `max_reasons` reasons are given (the first ones).
    """
    chosen: dict[int, DaemonRecord] = {}
    reasons: list[str] = []
    pinned_by: dict[str, int] = {}
    for rank, joiner in sorted(job.joiners.items()):
        if not joiner.daemon_id:
            continue
        record = daemons.get(joiner.daemon_id)
        taken_by = pinned_by.get(joiner.daemon_id)
        if record is None or taken_by is not None or not _fits(record, joiner):
            if len(reasons) < max_reasons:
                reasons.append(_explain_pinned(job, joiner, record, taken_by))
            continue
        pinned_by[joiner.daemon_id] = rank
        chosen[rank] = record
    free = _FreeDaemons(
        [d for d in daemons.values() if d.state == IDLE and not d.restored and d.daemon_id not in pinned_by]
    )
    unpinned = sorted((j for j in job.joiners.values() if not j.daemon_id), key=lambda j: (not j.plugin, j.rank))
    for joiner in unpinned:
        pick = free.pick(joiner)
        if pick is None:
            if len(reasons) < max_reasons:
                reasons.append(_explain_unpinned(joiner, daemons))
                continue
            break  # enough said: the world does not fit now
        chosen[joiner.rank] = pick
    return ({}, reasons) if reasons else (chosen, [])


def member_of(rank: int, record: DaemonRecord) -> common_pb2.Member:
    info = record.info
    return common_pb2.Member(
        rank=rank,
        daemon_id=info.daemon_id,
        daemon_address=info.address,
        data_address=info.data_address,
        host_id=info.host_id or info.hostname,
        pid=info.pid,
        plugin=info.plugin,
        device_id=info.device_id,
    )


def local_rank_and_size(members: list[common_pb2.Member], rank: int) -> tuple[int, int]:
    """Position of `rank` among the ranks whose daemons share its host, and how many those are."""
    same_host = [m.rank for m in members if m.host_id == members[rank].host_id]
    return same_host.index(rank), len(same_host)


def show_ranks(ranks, shown: int = 20) -> str:
    """'[0, 1, 2]', or the first `shown` of a long list and how many more."""
    ranks = list(ranks)
    if len(ranks) <= shown:
        return str(ranks)
    return f"{str(ranks[:shown])[:-1]}, … {len(ranks) - shown} more]"


def check_ranks(job: Job, ranks: list[int], rank: int, what: str) -> tuple[int, ...]:
    """Validate a group/barrier rank list against the job; returns it as a tuple."""
    if not ranks:
        raise errors.ConfigurationError(f"{what} of job '{job.job_id}': the rank list is empty; name its ranks")
    if len(ranks) > job.world_size:
        raise errors.ConfigurationError(
            f"{what} of job '{job.job_id}': {len(ranks)} ranks in a world of {job.world_size}; list each rank once"
        )
    bad = [r for r in ranks if not 0 <= r < job.world_size]
    if bad:
        raise errors.ConfigurationError(
            f"{what} of job '{job.job_id}': ranks {show_ranks(bad)} are outside the world of {job.world_size} ranks "
            f"(valid: 0..{job.world_size - 1})"
        )
    if len(set(ranks)) != len(ranks):
        raise errors.ConfigurationError(
            f"{what} of job '{job.job_id}': ranks {show_ranks(ranks)} repeat a rank; list each once"
        )
    if rank not in ranks:
        raise errors.ConfigurationError(
            f"{what} of job '{job.job_id}': rank {rank} called it but is not one of its ranks {show_ranks(ranks)}; "
            "only members may join"
        )
    return tuple(ranks)
