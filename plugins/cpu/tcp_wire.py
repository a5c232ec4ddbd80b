"""Moving bytes over a group's TCP links: one non-blocking progress loop with deadlines.

Every wait of the TCP transport happens in `exchange`. It drives any number of sends and receives on a group's
links at once, so a ring step sends to the next rank while it receives from the previous one (full duplex), and
between poll slices it asks the job's abort flag and the collective's deadline, so no wait outlives a dead peer,
a failed job or the timeout. Payloads are numpy buffers viewed as bytes: `recv_into` and `sendmsg` move them
without per-element Python work.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np

from tessel.core.errors import CollectiveTimeoutError, PeerFailedError

# How often a wait wakes to look at the abort flag and the deadline; also the delay before a failure elsewhere in
# the job (reported through `GroupContext.abort`) ends a wait here.
POLL_SLICE_S = 0.1
# Buffers handed to one sendmsg call (well under the kernel's IOV_MAX of 1024).
_MAX_IOV = 64
_TLS_CHUNK = 256 << 10  # bytes handed to one SSL write (it sends whole records, as many as the socket takes)


def as_bytes(array: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous array (no copy), the unit every send and receive works on."""
    return memoryview(array.reshape(-1).view(np.uint8))


@dataclass(frozen=True)
class Who:
    """A group member as error messages name it."""

    group_rank: int
    global_rank: int

    def __str__(self) -> str:
        return f"group rank {self.group_rank} (global rank {self.global_rank})"


class Link:
    """One TCP connection to one peer of one group, used only by that group's communicator."""

    def __init__(self, sock: socket.socket, who: Who):
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self.tls = isinstance(sock, ssl.SSLSocket)  # no sendmsg; records may wait decrypted in its buffer
        self.who = who
        self.closed_here = False

    def close(self) -> None:
        self.closed_here = True
        # shutdown first: the peer sees end-of-stream at once even if another thread still holds the fd.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class LinkBroken(Exception):
    """Internal: a link ended (peer closed it or reset it); `Clock.peer_failed` turns it into PeerFailedError."""

    def __init__(self, link: Link, cause: BaseException | None):
        super().__init__(str(link.who))
        self.link, self.cause = link, cause


class Clock:
    """The deadline and abort flag of one collective call, and the errors its waits end with."""

    def __init__(self, what: str, group: str, timeout_s: float, abort: Callable[[], str | None]):
        self.what, self.group, self.timeout_s, self._abort = what, group, timeout_s, abort
        self.deadline = time.monotonic() + timeout_s

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, waiting_on: Iterable[Who]) -> None:
        """Raise if the job was aborted or the deadline passed; otherwise return at once."""
        cause = self._abort()
        if cause:
            raise PeerFailedError(f"{self.what} on group {self.group!r} stopped because the job failed: {cause}")
        if self.remaining() <= 0:
            names = sorted(set(waiting_on), key=lambda w: w.group_rank)
            raise CollectiveTimeoutError(
                f"{self.what} on group {self.group!r} timed out after {self.timeout_s:g} s waiting for "
                f"{', '.join(map(str, names)) or 'no peer'}: they are alive but did not take part. Every rank of "
                "the group must call the same collectives in the same order; raise the group's timeout if a rank "
                "is legitimately slower."
            )

    def peer_failed(self, broken: LinkBroken) -> PeerFailedError:
        if broken.link.closed_here:
            return PeerFailedError(
                f"{self.what} on group {self.group!r}: the group was closed on this rank (by close() or after a "
                "failure in another thread) while the call was in flight"
            )
        reason = f"{type(broken.cause).__name__}: {broken.cause}" if broken.cause else "end of stream"
        return PeerFailedError(
            f"{self.what} on group {self.group!r}: the connection to {broken.link.who} closed ({reason}); that "
            "rank died, was killed or gave up on the group after an error of its own (see its log).",
            culprit_rank=broken.link.who.global_rank,
        )


def reading(*views: memoryview) -> Iterator[memoryview]:
    """A receive of known sizes: fill these views in order."""
    return iter(views)


class _Writer:
    EVENT = select.POLLOUT

    def __init__(self, link: Link, views: Iterable[memoryview]):
        self.link = link
        self.views = deque(v for v in views if v.nbytes)

    def pump(self) -> bool:
        """Send what the socket takes now; True once everything is sent."""
        views = self.views
        while views:
            try:
                if self.link.tls:
                    sent = self.link.sock.send(views[0][:_TLS_CHUNK])
                else:
                    sent = self.link.sock.sendmsg(list(islice(views, _MAX_IOV)))
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return False
            except OSError as exc:
                raise LinkBroken(self.link, exc) from exc
            while sent:
                head = views[0]
                if sent >= head.nbytes:
                    sent -= head.nbytes
                    views.popleft()
                else:
                    views[0], sent = head[sent:], 0
        return True


class _Reader:
    """Fills the views that receive iterators yield, one after another; an iterator may choose its next view
    from the bytes already received (a header, then the body it announces)."""

    EVENT = select.POLLIN

    def __init__(self, link: Link, receives: Iterable[Iterator[memoryview]]):
        self.link = link
        self.receives = deque(receives)
        self.view = self._next_view()

    def _next_view(self) -> memoryview | None:
        while self.receives:
            view = next(self.receives[0], None)
            if view is None:
                self.receives.popleft()
            elif view.nbytes:
                return view
        return None

    def pump(self) -> bool:
        """Receive what has arrived; True once every view is full."""
        while self.view is not None:
            try:
                got = self.link.sock.recv_into(self.view)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return False
            except OSError as exc:
                raise LinkBroken(self.link, exc) from exc
            if got == 0:
                raise LinkBroken(self.link, None)
            self.view = self.view[got:] if got < self.view.nbytes else self._next_view()
        return True


def _by_link(pairs: Iterable[tuple[Link, object]]) -> dict[Link, list]:
    grouped: dict[Link, list] = {}
    for link, item in pairs:
        grouped.setdefault(link, []).append(item)
    return grouped


def exchange(
    clock: Clock,
    sends: Sequence[tuple[Link, Sequence[memoryview]]] = (),
    receives: Sequence[tuple[Link, Iterator[memoryview]]] = (),
) -> None:
    """Send and receive everything listed, concurrently, and return when all of it is done.

    Several sends (or receives) on one link happen in list order. Raises PeerFailedError when a link breaks or
    the job is aborted, CollectiveTimeoutError at the clock's deadline.
    """
    pending: list[_Writer | _Reader] = [
        _Writer(link, [v for vs in views for v in vs]) for link, views in _by_link(sends).items()
    ]
    pending += [_Reader(link, items) for link, items in _by_link(receives).items()]
    try:
        pending = [p for p in pending if not p.pump()]
        next_check = time.monotonic() + POLL_SLICE_S
        while pending:
            poller = select.poll()
            masks: dict[int, int] = {}
            for p in pending:
                masks[p.link.fd] = masks.get(p.link.fd, 0) | p.EVENT
            for fd, mask in masks.items():
                poller.register(fd, mask)
            wait_ms = max(1, int(min(POLL_SLICE_S, clock.remaining()) * 1000))
            ready = {fd for fd, _ in poller.poll(wait_ms)}
            pending = [p for p in pending if p.link.fd not in ready or not p.pump()]
            now = time.monotonic()
            if pending and (not ready or now >= next_check):
                for p in pending:
                    if p.link.closed_here:  # the group was closed (or failed) in another thread of this rank
                        raise LinkBroken(p.link, None)
                clock.check(p.link.who for p in pending)
                next_check = now + POLL_SLICE_S
    except LinkBroken as broken:
        raise clock.peer_failed(broken) from broken.cause


def process_alive(pid: int) -> bool:
    """Whether a process of this host exists (a peer on the same host that died needs no timeout)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
