"""Arriving and waiting on shared counters: spin briefly, yield, then sleep on a futex; every wait has a deadline.

Each rank writes only its own counters and they only grow (mod 2**32), so plain aligned 32-bit loads and stores
suffice on x86-64: its memory model (TSO) keeps a rank's data stores ordered before its counter store, and a
reader's counter load before its data loads. Other architectures would need fences here.

A waiter spins for tens of microseconds (2 us when ranks outnumber cores), then yields its core for up to
YIELD_S (measured on 2 cores with 4 ranks: 4 KiB all_reduce 90 -> 48 us, since the rank it waits for may need
that core), then sleeps on the futex of the counter it waits for, with a short timeout so that a lost wake-up
costs at most FUTEX_TIMEOUT_S. A waker only makes the futex syscall when a sleeper announced itself. Measured
again with 4 ranks on 2 busy cores: sleeping on the futex at once doubled the 4 KiB all_reduce latency, and
yielding for 20 or 100 us instead of 40 changed nothing measurable.

On a communicator's thread (asynchronous collectives, sends and receives) the waiter does not spin: the daemon
computes meanwhile. Except while a program thread is blocked waiting for the very call the waiter runs
(core.plugin.program_waits()) and each of the job's ranks on this host has a core of its own: the program's core is
idle then, and the waiter polls with sched_yield instead of sleeping, so that the data is taken as it lands instead
of after a futex wake (on 2 cores that wake cost the sender ~0.2 ms inside its send; on a 16-core machine a 4-stage
pipeline's activation reached the receiver's wait 0.20 ms median after the send, p90 0.87 ms). The poller holds the
GIL but for a moment each round, so it polls only while no other communicator thread of the process runs Python:
a futex sleep here counts as not running (core.plugin.asleep). Polling with 20 us sleeps instead, which frees the
GIL, measured worse on 2 cores (1F1B bubble 20-23 % against 15 %). A program that starts waiting wakes such a
sleeper (on_program_wait).

While waiting, every few milliseconds the waiter checks its deadline (CollectiveTimeoutError naming the ranks that
did not arrive), the job's abort cause (PeerFailedError) and the peers' states in the segment (a peer that closed
the group or failed); about every 50 ms it checks that the peers' processes are alive (PeerFailedError naming the
dead one), so a killed rank fails the collective everywhere well within a second.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable

from tessel.core.errors import CollectiveTimeoutError, ConfigurationError, PeerFailedError
from tessel.core.plugin import GroupContext, asleep, on_collective_thread, on_program_wait, program_waits
from tessel.plugins.cpu import futex
from tessel.plugins.cpu.shm_segment import CLOSED, FAILED, Segment

_HALF_RANGE = 1 << 31
_MASK = 0xFFFFFFFF
FUTEX_TIMEOUT_S = 0.002
LIVENESS_PERIOD_S = 0.05
SPIN_S = 20e-6
YIELD_S = 40e-6
CHECK_S = 0.002  # how often a waiter that polls checks its deadline, the job's abort and the peers


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _start_time(pid: int) -> str | None:
    """The process's start time from /proc (detects pid reuse); None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    except OSError:
        return "?"  # /proc not readable: fall back to "alive"
    return None if fields[0] in (b"Z", b"X") else fields[19].decode()


class Liveness:
    """Remembers each peer process's identity (start time) and tells which ones have died since.

    A peer whose pid is not visible here (another pid namespace) is not judged until it becomes visible;
    such a peer's death is then caught by the deadline or by the state it leaves in the segment.
    """

    def __init__(self, context: GroupContext):
        self.context = context
        self.started = {g: _start_time(p.pid) for g, p in enumerate(context.peers) if p.pid > 0}
        self.next_check = time.monotonic() + LIVENESS_PERIOD_S

    def dead(self) -> list[int]:
        """Group ranks whose process is gone (or whose pid now belongs to another process)."""
        dead = []
        for member, started in self.started.items():
            if member == self.context.group_rank:
                continue
            now = _start_time(self.context.peers[member].pid)
            if started is None:
                self.started[member] = now
            elif now is None or (now != started and "?" not in (now, started)):
                dead.append(member)
        return dead


_SYNCS: weakref.WeakSet = weakref.WeakSet()  # every Sync of this process, for _wake_for_program


def _wake_for_program() -> None:
    """A program thread starts waiting: wake the communicator threads asleep on a counter; the one running the call
    it waits for turns to polling, the others sleep again."""
    for sync in list(_SYNCS):
        for address in list(sync.asleep_at.values()):
            futex.wake(address)


on_program_wait(_wake_for_program)


class Sync:
    """Counters of one segment: `arrive` bumps this rank's counter on a channel, `wait` waits for the others."""

    def __init__(self, segment: Segment, context: GroupContext):
        self.segment, self.context = segment, context
        self.layout = segment.layout
        self.me = context.group_rank
        self.liveness = Liveness(context)
        # Spinning only pays when every member can own a core; otherwise it steals the core a peer needs.
        self.spin_s = SPIN_S if context.size <= _usable_cores() else 2e-6
        # A communicator's thread polls while the program waits only where every local rank has a core of its own.
        self.poll_for_program = 0 < context.local_ranks <= _usable_cores()
        # thread id -> the futex address that thread sleeps on, for _wake_for_program: a group's collectives and
        # each direction and peer of its sends and receives have threads of their own (core.plugin's lanes)
        self.asleep_at: dict[int, int] = {}
        self.closing = False  # set by close() so that a wait on another thread ends
        self._plans: dict[int, tuple] = {}
        _SYNCS.add(self)

    def _plan(self, channel: int, members: tuple[int, ...]) -> tuple:
        """(my counter word, the others' sleep words, the others' (member, counter word), my counter's address)."""
        plan = self._plans.get(channel)
        if plan is None:
            layout, others = self.layout, [m for m in members if m != self.me]
            mine = layout.counter_word(self.me, channel)
            sleepers = tuple(layout.sleep_word(m, channel) for m in others)
            counters = tuple((m, layout.counter_word(m, channel)) for m in others)
            plan = self._plans[channel] = (mine, sleepers, counters, self.segment.address + 4 * mine)
        return plan

    def arrive(self, channel: int, members: tuple[int, ...], value: int) -> None:
        """Publish `value` as this rank's counter on `channel` and wake members sleeping on it."""
        mine, sleepers, _, address = self._plan(channel, members)
        words = self.segment.words
        words[mine] = value & _MASK
        tag = self.me + 1
        for sleeper in sleepers:
            if words[sleeper] == tag:  # that member sleeps on this rank's counter
                futex.wake(address)
                return

    def wait(self, channel: int, members: tuple[int, ...], target: int, what: str | Callable[[], str]) -> None:
        """Return once every member's counter on `channel` reached `target`; raise on deadline/abort/death."""
        words, counters = self.segment.words, self._plan(channel, members)[2]
        target &= _MASK
        deadline = None
        for member, index in counters:
            if (words[index] - target) & _MASK < _HALF_RANGE:
                continue
            if deadline is None:
                deadline = time.monotonic() + self.context.timeout_s
            if not self._spin(index, target):
                self._sleep(channel, member, index, target, members, deadline, what)

    def _spin(self, index: int, target: int) -> bool:
        words, clock = self.segment.words, time.perf_counter
        # On a collective's background thread the daemon computes meanwhile: spinning would take its core.
        end = clock() + (0.0 if on_collective_thread() else self.spin_s)
        while True:
            for _ in range(32):
                if (words[index] - target) & _MASK < _HALF_RANGE:
                    return True
            if clock() > end:
                break
        # Then yield the core for a while: when ranks outnumber cores, the rank we wait for may need this one.
        end = clock() + YIELD_S
        while clock() < end:
            os.sched_yield()
            if (words[index] - target) & _MASK < _HALF_RANGE:
                return True
        return False

    def _sleep(
        self, channel: int, member: int, index: int, target: int, members: tuple, deadline: float, what: Callable | str
    ) -> None:
        words, layout = self.segment.words, self.layout
        sleep_index = layout.sleep_word(self.me, channel)
        address = self.segment.address + 4 * index
        polls = self.poll_for_program and on_collective_thread()
        try:
            while True:
                if polls and program_waits():
                    words[sleep_index] = 0  # not asleep: the arriving rank need not wake us
                    if self._poll(channel, index, target, members, deadline, what):
                        return
                # Announce the sleep before re-reading the counter, so the waker sees it (or we see its value).
                words[sleep_index] = member + 1
                value = words[index]
                if (value - target) & _MASK < _HALF_RANGE:
                    return
                if polls:
                    self.asleep_at[threading.get_ident()] = address
                with asleep():
                    futex.wait(address, value, FUTEX_TIMEOUT_S)
                self.asleep_at.pop(threading.get_ident(), None)
                if (words[index] - target) & _MASK < _HALF_RANGE:
                    return
                self.check(channel, members, target, deadline, what)
        finally:
            words[sleep_index] = 0
            self.asleep_at.pop(threading.get_ident(), None)

    def _poll(
        self, channel: int, index: int, target: int, members: tuple, deadline: float, what: Callable | str
    ) -> bool:
        """Poll the counter while a program thread waits for this call (its core is idle); True once reached."""
        words, clock = self.segment.words, time.monotonic
        next_check = clock() + CHECK_S
        while program_waits():
            os.sched_yield()  # releases the GIL too: the daemon's other threads may need it
            if (words[index] - target) & _MASK < _HALF_RANGE:
                return True
            if clock() >= next_check:
                self.check(channel, members, target, deadline, what)
                next_check = clock() + CHECK_S
        return (words[index] - target) & _MASK < _HALF_RANGE

    def late(self, channel: int, members: tuple, target: int) -> list[int]:
        """Members whose counter on `channel` has not reached `target`."""
        words, layout = self.segment.words, self.layout
        return [m for m in members if (words[layout.counter_word(m, channel)] - target) & _MASK >= _HALF_RANGE]

    def check(self, channel: int, members: tuple, target: int, deadline: float | None, what: Callable | str) -> None:
        """Raise if the job aborted, a peer still awaited left or died, or the deadline passed."""
        context = self.context
        where = f"{what() if callable(what) else what} on group '{context.name}'"
        if self.closing:
            raise ConfigurationError(f"{where}: the communicator was closed on rank {context.rank} while it waited")
        cause = context.abort()
        if cause:
            raise PeerFailedError(f"{where} stopped at rank {context.rank}: {cause}")
        late = self.late(channel, members, target)
        if not late:
            return
        for member in late:
            state = self.segment.words[self.layout.state_word(member)]
            if state in (CLOSED, FAILED):
                how = "closed the group" if state == CLOSED else "left the group after an error"
                raise PeerFailedError(
                    f"{where}: {self.describe(member)} {how} while rank {context.rank} waited for it; "
                    "recreate the group on every rank",
                    context.ranks[member],
                )
        now = time.monotonic()
        if now >= self.liveness.next_check:
            self.liveness.next_check = now + LIVENESS_PERIOD_S
            dead = [m for m in self.liveness.dead() if m in late]
            if dead:
                raise PeerFailedError(
                    f"{where}: {self.describe(dead[0])} died while rank {context.rank} waited for it; "
                    "the job has failed, see that rank's log for the cause",
                    context.ranks[dead[0]],
                )
        if deadline is not None and now > deadline:
            names = ", ".join(self.describe(m) for m in late)
            raise CollectiveTimeoutError(
                f"{where}: {names} did not arrive within {context.timeout_s:g} s (rank {context.rank} waited); "
                "are all ranks calling the same collectives in the same order?"
            )

    def describe(self, member: int) -> str:
        """'rank 3 (group rank 1, pid 1234)': how errors name a peer."""
        return f"rank {self.context.ranks[member]} (group rank {member}, pid {self.context.peers[member].pid})"
