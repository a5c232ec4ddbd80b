"""The stall inspector without processes: the daemon's watch numbers and times collectives (daemon/stall.py), the
coordinator puts the reports together and names the waiting and the missing ranks (coordinator/stalls.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest
from test_coordinator_state import daemon_info, events_in, start_job, subscribe_client

from tessel.coordinator.stalls import StallInspector, describe
from tessel.coordinator.state import STALLED, CoordinatorState
from tessel.core import errors
from tessel.core.plugin import GroupContext, Handle, Peer
from tessel.daemon.stall import CollectiveWatch
from tessel.v1 import coordinator_pb2


def report(rank: int, sequence: int, waited_s: float, ranks=(0, 1, 2, 3), done=False, collective="all_reduce"):
    return coordinator_pb2.StallReport(
        job_id="j", rank=rank, group="world", ranks=ranks, sequence=sequence, collective=collective,
        waited_s=waited_s, done=done,
    )  # fmt: skip


def test_the_inspector_names_the_waiting_and_the_missing_ranks():
    inspector = StallInspector(warn_after_s=2.0, fail_after_s=10.0)
    for rank in (0, 2, 3):
        inspector.report(report(rank, 7, 1.0), now=100.0)
    assert inspector.stalls(now=100.5) == []  # not yet past the warning threshold
    [stall] = inspector.new_warnings(now=101.5)
    assert (list(stall.waiting), list(stall.missing), stall.sequence) == ([0, 2, 3], [1], 7)
    assert describe(stall) == (
        "job 'j': all_reduce #7 of group 'world' has waited 2.5 s: ranks [0, 2, 3] are in it, "
        "ranks [1] have not entered it"
    )
    assert inspector.new_warnings(now=102.0) == []  # announced once
    assert inspector.overdue(now=105.0) == []
    [overdue] = inspector.overdue(now=110.0)
    assert list(overdue.missing) == [1]
    for rank in (0, 2, 3):  # it completed after all (rank 1 came late): nothing is stalled any more
        inspector.report(report(rank, 7, 0, done=True), now=110.0)
    assert inspector.stalls(now=120.0) == [] == inspector.new_warnings(now=120.0)
    assert inspector._warned == set()  # what was announced is forgotten once it ended


def test_a_wait_no_longer_reported_expires_and_a_reported_one_fails_its_job_in_time():
    # the daemons report a wait again every STALL_REFRESH_S: one not heard of for stale_after_s ended with its
    # `done` lost (it must not fail a healthy job at the stall timeout, blaming a rank that is not missing)
    inspector = StallInspector(warn_after_s=2.0, fail_after_s=100.0, stale_after_s=30.0)
    for rank in (0, 2, 3):
        inspector.report(report(rank, 7, 1.0), now=0.0)
    for now in range(20, 120, 20):  # ranks 0 and 2 keep waiting (and saying so); rank 3's `done` was lost
        for rank in (0, 2):
            inspector.report(report(rank, 7, now + 1.0), now=float(now))
    [overdue] = inspector.overdue(now=101.0)
    assert list(overdue.waiting) == [0, 2] and list(overdue.missing) == [1, 3]
    assert inspector.overdue(now=131.0) == [] == inspector.stalls(now=131.0)  # every report stopped: all expired


def test_a_missing_rank_waiting_in_another_collective_is_named_there():
    inspector = StallInspector(warn_after_s=1.0)
    inspector.report(report(0, 4, 1.0, ranks=(0, 1)), now=10.0)
    inspector.report(report(1, 5, 1.0, ranks=(0, 1), collective="all_gather"), now=10.0)
    [stall] = inspector.stalls(now=11.0)
    assert list(stall.missing) == [1] and stall.detail == "rank 1 waits in all_gather #5"


def test_the_coordinator_warns_the_ranks_and_fails_the_job_blaming_the_missing_rank():
    state = CoordinatorState(stall_warning_s=2.0, stall_timeout_s=6.0)
    for port in range(3):
        state.register_daemon(daemon_info(port))
    start_job(state, "j", 3)
    subs = [subscribe_client(state, "j", r) for r in range(3)]
    with pytest.raises(errors.ConfigurationError, match="outside"):
        state.report_stall(report(9, 0, 1.0))
    now = time.monotonic()
    for rank in (0, 2):
        state.report_stall(report(rank, 0, 2.5, ranks=(0, 1, 2)))
    state.inspect(now=now)
    [warning] = events_in(subs[0][1])
    assert warning.state == STALLED and "ranks [1] have not entered it" in warning.cause
    [stall] = state.cluster_status().stalls  # what `tessel status` shows
    assert (list(stall.waiting), list(stall.missing)) == ([0, 2], [1])
    state.inspect(now=now + 4.0)
    info = state.job_info("j")
    assert info.state == "failed" and info.culprit_rank == 1
    assert "rank 1 (" in info.cause and "never entered all_reduce #0 of group 'world'" in info.cause, info.cause
    assert state.cluster_status().stalls == []  # forgotten with the job


class _FakeComm:
    def __init__(self):
        self.context = GroupContext("j", "world", (0, 1), 0, (Peer(0, "h", "", 1), Peer(1, "h", "", 2)))
        self.gate = threading.Event()
        self.transport = "fake"

    def all_reduce(self, x, op="sum", async_op=False):
        if async_op:
            future = Future()
            threading.Thread(target=lambda: (self.gate.wait(5), future.set_result(x))).start()
            return Handle(future)
        self.gate.wait(5)
        return x


def test_the_daemon_watch_numbers_collectives_and_reports_the_stuck_one():
    sent: list = []
    watch = CollectiveWatch(sent.append, report_after_s=0.2, period_s=0.05)
    fake = _FakeComm()
    comm = watch.wrap(fake, "j", 0)
    watch.start()
    try:
        fake.gate.set()
        comm.all_reduce(1)  # #0: quick, never reported
        fake.gate.clear()
        handle = comm.all_reduce(2, async_op=True)  # #1: stuck on the worker until the gate opens
        time.sleep(0.5)
        assert [(r.sequence, r.done, r.group, list(r.ranks)) for r in sent] == [(1, False, "world", [0, 1])]
        fake.gate.set()
        assert handle.wait(5) == 2
        time.sleep(0.3)
        assert [(r.sequence, r.done) for r in sent] == [(1, False), (1, True)]
    finally:
        fake.gate.set()
        watch.stop()


def test_the_watch_reports_a_long_wait_again_and_retries_the_end_it_could_not_deliver(monkeypatch):
    monkeypatch.setattr("tessel.daemon.stall.STALL_REFRESH_S", 0.3)
    sent, refuse = [], [True]

    def report_to(report):
        if report.done and refuse[0]:
            refuse[0] = False
            raise ConnectionError("the coordinator is busy")
        sent.append((report.sequence, report.done))

    watch = CollectiveWatch(report_to, report_after_s=0.1, period_s=0.05)
    fake = _FakeComm()
    comm = watch.wrap(fake, "j", 0)
    watch.start()
    try:
        handle = comm.all_reduce(2, async_op=True)  # #0: stuck until the gate opens
        time.sleep(1.0)
        assert sent[0] == (0, False) and 2 <= len(sent) <= 6 and set(sent) == {(0, False)}, sent  # then refreshed
        fake.gate.set()
        assert handle.wait(5) == 2
        time.sleep(0.3)
        assert sent[-1] == (0, True) and sent.count((0, True)) == 1, sent  # the first try failed, the next told it
    finally:
        fake.gate.set()
        watch.stop()
