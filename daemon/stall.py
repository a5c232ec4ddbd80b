"""The daemon's half of the stall inspector: which collective of which group its ranks are waiting in.

Each communicator a session creates is wrapped in a `WatchedCommunicator` that numbers the group collectives the
rank enters (ranks that call the same collectives in the same order give each the same number) and notes when
each one ends. A reporter thread tells the coordinator about every collective that has waited `report_after_s`,
and again once it ends; the coordinator puts the reports of all ranks together (coordinator/stalls.py) to name the
ranks that are waiting and the ones missing. Point-to-point send/recv are not watched: they belong to no group
order.

    watch = CollectiveWatch(report=coordinator.report_stall, report_after_s=1.0)
    comm = watch.wrap(communicator, job_id="j", rank=0)
    watch.start()
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessel.core.coordinator_client import STALL_REFRESH_S
from tessel.core.plugin import Handle
from tessel.v1 import coordinator_pb2

log = logging.getLogger("tessel.daemon")

REPORT_AFTER_S = float(os.environ.get("TESSEL_STALL_REPORT", "1"))
DONE_TRIES = 3  # passes that try to deliver a wait's end before giving up (the coordinator then lets it expire)
WATCHED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "neighbor_exchange", "barrier")


@dataclass
class _Entered:
    job_id: str
    rank: int
    group: str
    ranks: tuple[int, ...]
    sequence: int
    collective: str
    started: float
    reported: bool = False
    sent: float = 0.0  # when it was last reported
    tries: int = 0  # attempts to deliver its `done`


class WatchedCommunicator:
    """A communicator whose group collectives are numbered and timed; everything else passes through."""

    def __init__(self, comm: Any, watch: CollectiveWatch, job_id: str, rank: int):
        self._comm, self._watch = comm, watch
        self._where = (job_id, rank, comm.context.name, tuple(comm.context.ranks))
        self._sequence = itertools.count()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._comm, name)
        if name not in WATCHED:
            return attribute

        def watched(*args: Any, **kwargs: Any) -> Any:
            entered = self._watch.enter(*self._where, next(self._sequence), name)
            try:
                result = attribute(*args, **kwargs)
            except BaseException:
                self._watch.leave(entered)
                raise
            if isinstance(result, Handle):  # asynchronous: it waits on the communicator's worker
                result._future.add_done_callback(lambda _: self._watch.leave(entered))
            else:
                self._watch.leave(entered)
            return result

        return watched


class CollectiveWatch:
    """Collectives in flight on this daemon, and the thread that reports the long ones to the coordinator."""

    def __init__(
        self,
        report: Callable[[coordinator_pb2.StallReport], None],
        report_after_s: float = REPORT_AFTER_S,
        period_s: float = 0.25,
    ):
        self.report, self.report_after_s, self.period_s = report, report_after_s, period_s
        self._lock = threading.Lock()
        self._entered: dict[int, _Entered] = {}
        self._ended: list[_Entered] = []  # reported ones that ended: the coordinator is told
        self._keys = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wrap(self, comm: Any, job_id: str, rank: int) -> WatchedCommunicator:
        return WatchedCommunicator(comm, self, job_id, rank)

    def enter(self, job_id: str, rank: int, group: str, ranks: tuple, sequence: int, collective: str) -> int:
        key = next(self._keys)
        entered = _Entered(job_id, rank, group, ranks, sequence, collective, time.monotonic())
        with self._lock:
            self._entered[key] = entered
        return key

    def leave(self, key: int) -> None:
        with self._lock:
            entered = self._entered.pop(key, None)
            if entered is not None and entered.reported:
                self._ended.append(entered)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tessel-stall-reporter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            now = time.monotonic()
            with self._lock:
                due = [
                    e
                    for e in self._entered.values()
                    if (now - e.sent >= STALL_REFRESH_S if e.reported else now - e.started >= self.report_after_s)
                ]
                for entered in due:
                    entered.reported, entered.sent = True, now
                ended, self._ended = self._ended, []
            for entered in due:  # a new long wait, or one going on (the coordinator drops waits it stops hearing of)
                self._send(entered, now - entered.started, done=False)
            undelivered = [e for e in ended if not self._send(e, now - e.started, done=True)]
            for entered in undelivered:  # told late rather than never (a refresh also stops, so it also expires)
                entered.tries += 1
            with self._lock:
                self._ended.extend(e for e in undelivered if e.tries < DONE_TRIES)

    def _send(self, entered: _Entered, waited_s: float, done: bool) -> bool:
        report = coordinator_pb2.StallReport(
            job_id=entered.job_id,
            rank=entered.rank,
            group=entered.group,
            ranks=entered.ranks,
            sequence=entered.sequence,
            collective=entered.collective,
            waited_s=waited_s,
            done=done,
        )
        try:
            self.report(report)
        except Exception as exc:  # the coordinator may be gone or the job over: reports are advice
            log.debug("stall report for %s not delivered: %s", entered, exc)
            return False
        return True
