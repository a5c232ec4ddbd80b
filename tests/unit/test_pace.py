"""Straggler judgement without processes (coordinator/pace.py): each rank's own work per step over windows of the
work counters its daemon's heartbeats carry, a rank at >= ratio x the other ranks' median for N windows named once
with its pace, and once again when it catches up; the coordinator state feeds it from beats and shows it in status."""

from __future__ import annotations

import logging
import queue
import time

import numpy as np
import pytest
from test_coordinator_state import daemon_info, start_job

from tessel.coordinator.pace import PaceJudge, PaceSettings
from tessel.coordinator.state import CoordinatorState
from tessel.coordinator.status import format_status
from tessel.core import errors
from tessel.daemon import DaemonCore
from tessel.plugins import load_plugin
from tessel.v1 import collective_pb2, coordinator_pb2, daemon_pb2


class Ranks:
    """Cumulative counters of a job's ranks, advanced by per-step own work and blocked time."""

    def __init__(self, world: int):
        self.counters = [[0.0, 0.0, 0] for _ in range(world)]

    def advance(self, steps: int, own_s: list[float], blocked_s: list[float]) -> dict[int, coordinator_pb2.RankLoad]:
        for rank, c in enumerate(self.counters):
            c[0] += steps * (own_s[rank] + blocked_s[rank])
            c[1] += steps * blocked_s[rank]
            c[2] += steps if steps else 0
        return self.loads()

    def loads(self) -> dict[int, coordinator_pb2.RankLoad]:
        return {
            r: coordinator_pb2.RankLoad(job_id="j", rank=r, run_s=c[0], blocked_s=c[1], steps=c[2])
            for r, c in enumerate(self.counters)
        }


def test_a_rank_four_times_slower_for_three_windows_is_named_once_with_its_pace_then_when_it_catches_up():
    judge = PaceJudge(PaceSettings(ratio=1.5, windows=3, window_s=1.0))
    ranks = Ranks(2)
    assert judge.judge("j", 2, ranks.loads(), now=0.0) == []  # the first look opens the window
    slow = ([0.010, 0.040], [0.032, 0.002])  # rank 0 waits for rank 1 in the collectives
    assert judge.judge("j", 2, ranks.advance(20, *slow), now=1.0) == []
    assert judge.judge("j", 2, ranks.advance(20, *slow), now=2.0) == []
    [line] = judge.judge("j", 2, ranks.advance(20, *slow), now=3.0)
    assert line.startswith("job j: rank 1 is a straggler: 40 ms (25 steps/s) of its own work per step over the "
                           "last 3 windows, 4x the median of the other ranks (10 ms (100 steps/s))"), line  # fmt: skip
    fast, slow_pace = judge.paces("j")
    assert (fast.rank, fast.straggler, round(fast.ratio, 3), fast.slow_windows) == (0, False, 0.25, 0)
    assert (slow_pace.rank, slow_pace.straggler, round(slow_pace.ratio, 3)) == (1, True, 4.0)
    assert slow_pace.own_s_per_step == pytest.approx(0.040) and fast.blocked_s_per_step == pytest.approx(0.032)
    assert judge.judge("j", 2, ranks.advance(20, *slow), now=4.0) == []  # named once, not every window
    [line] = judge.judge("j", 2, ranks.advance(20, [0.010, 0.011], [0.002, 0.001]), now=5.0)
    assert line.startswith("job j: rank 1 caught up: 11 ms"), line
    assert not any(p.straggler for p in judge.paces("j"))


def test_one_slow_window_or_a_small_difference_names_nobody():
    judge = PaceJudge(PaceSettings(ratio=1.5, windows=2, window_s=1.0))
    ranks = Ranks(3)
    judge.judge("j", 3, ranks.loads(), now=0.0)
    lines = []
    for now, own in enumerate([[0.01, 0.01, 0.03], [0.01, 0.01, 0.01], [0.01, 0.01, 0.03], [0.01, 0.014, 0.01]], 1):
        lines += judge.judge("j", 3, ranks.advance(10, own, [0.0, 0.0, 0.0]), now=float(now))
    assert lines == []  # rank 2 was slow in windows 1 and 3, never two running; rank 1 at 1.4x is under 1.5x
    assert [p.slow_windows for p in judge.paces("j")] == [0, 0, 0]


def test_a_window_closes_only_after_its_shortest_length_and_once_every_rank_stepped():
    judge = PaceJudge(PaceSettings(ratio=1.5, windows=1, window_s=2.0))
    ranks = Ranks(2)
    judge.judge("j", 2, ranks.loads(), now=0.0)
    assert judge.judge("j", 2, ranks.advance(10, [0.01, 0.05], [0.04, 0.0]), now=1.0) == []  # under 2 s
    assert judge.paces("j") == []
    ranks.counters[1][0] += 0.05
    ranks.counters[1][2] += 1
    loads = ranks.loads()
    loads[0] = coordinator_pb2.RankLoad(job_id="j", rank=0, steps=0)  # as if rank 0 were still at its first look
    assert judge.judge("j", 2, loads, now=3.0) == []
    assert judge.judge("j", 2, {1: loads[1]}, now=3.0) == []  # a rank not heard from: no verdict
    [line] = judge.judge("j", 2, ranks.loads(), now=3.0)  # 2 s passed and both stepped: judged over both windows
    assert "rank 1 is a straggler" in line
    assert judge.judge("k", 1, {0: ranks.loads()[0]}, now=9.0) == []  # a lone rank is slower than nobody


def test_settings_are_checked_and_read_from_the_environment(monkeypatch):
    with pytest.raises(errors.ConfigurationError, match=r"straggler ratio is 1\.0; it must be > 1"):
        PaceSettings(ratio=1.0)
    with pytest.raises(errors.ConfigurationError, match="windows is 0"):
        PaceSettings(windows=0)
    monkeypatch.setenv("TESSEL_STRAGGLER_RATIO", "2.5")
    monkeypatch.setenv("TESSEL_STRAGGLER_WINDOWS", "4")
    assert PaceSettings.from_env() == PaceSettings(2.5, 4, 2.0)
    monkeypatch.setenv("TESSEL_STRAGGLER_WINDOW_S", "soon")
    with pytest.raises(errors.ConfigurationError, match=r"TESSEL_STRAGGLER_RATIO / _WINDOWS / _WINDOW_S"):
        PaceSettings.from_env()


def test_the_coordinator_judges_the_counters_daemon_beats_carry_and_shows_the_paces_in_status(caplog):
    state = CoordinatorState(pace=PaceSettings(ratio=1.5, windows=2, window_s=1.0))
    ids = [state.register_daemon(daemon_info(port)) for port in range(2)]
    start_job(state, "j", 2)
    subs = [state.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id=d), queue.SimpleQueue()) for d in ids]
    ranks = Ranks(2)
    now = time.monotonic()
    caplog.set_level(logging.WARNING, logger="tessel.coordinator")
    for window in range(3):
        loads = ranks.advance(10, [0.005, 0.020], [0.015, 0.0]) if window else ranks.loads()
        for rank, sub in enumerate(subs):  # each daemon's beat carries its own rank's counters
            state.beat(sub, coordinator_pb2.HeartbeatRequest(loads=[loads[rank]]))
        state.beat(subs[0], coordinator_pb2.HeartbeatRequest())  # a bare beat keeps the last counters
        state.inspect(now=now + window)
    assert "job j: rank 1 is a straggler: 20 ms (50 steps/s) of its own work per step" in caplog.text, caplog.text
    status = format_status(state.cluster_status())
    assert "rank pace (own work per step" in status
    row = next(line for line in status.splitlines() if line.startswith("j ") and " 1 " in line[:8])
    assert "20 ms" in row and "50" in row and "4.00x" in row and row.endswith("yes"), status
    state.fail_job("j", 0, "done with it")
    assert state.cluster_status().paces == []  # forgotten with the job


def test_counters_from_a_daemon_the_rank_does_not_run_on_are_ignored(caplog):
    # a daemon keeps its last counters once its sessions close (an empty list is a bare beat): those of rank 1 of an
    # earlier job of the same id must not stand for rank 1 of this one, which runs on another daemon
    state = CoordinatorState(pace=PaceSettings(ratio=1.5, windows=2, window_s=1.0))
    ids = [state.register_daemon(daemon_info(port)) for port in range(2)]
    start_job(state, "j", 2)
    ids.append(state.register_daemon(daemon_info(2)))  # not in the job
    subs = [state.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id=d), queue.SimpleQueue()) for d in ids]
    ranks, stale = Ranks(2), Ranks(2)
    now = time.monotonic()
    caplog.set_level(logging.WARNING, logger="tessel.coordinator")
    for window in range(3):
        loads = ranks.advance(10, [0.005, 0.005], [0.0, 0.0]) if window else ranks.loads()
        old = stale.advance(10, [0.005, 0.040], [0.035, 0.0]) if window else stale.loads()
        for rank in range(2):
            state.beat(subs[rank], coordinator_pb2.HeartbeatRequest(loads=[loads[rank]]))
        state.beat(subs[2], coordinator_pb2.HeartbeatRequest(loads=[old[1]]))
        state.inspect(now=now + window)
    assert "straggler" not in caplog.text, caplog.text


def test_a_daemon_beat_carries_its_ranks_counters_only_when_they_moved():
    core = DaemonCore(load_plugin("cpu", threads=1))
    try:
        assert not core.heartbeat().loads  # no session: a bare beat
        sid = core.open_session("beat", 0, 1, [])
        [load] = core.heartbeat().loads  # a new session: its counters at zero
        assert (load.job_id, load.rank, load.steps) == ("beat", 0, 0)
        assert not core.heartbeat().loads  # nothing moved since
        core.put(sid, {"x": np.ones(4, np.float32)})
        all_reduce = daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_REDUCE, inputs=["x"], outputs=["x"])
        program = daemon_pb2.Program(instructions=[daemon_pb2.Instruction(collective=all_reduce)])
        core.execute(sid, program, repeat=3)
        [load] = core.heartbeat().loads
        assert load.steps == 3 and load.run_s >= load.blocked_s > 0  # the all_reduce counts as blocked
    finally:
        core.close()
