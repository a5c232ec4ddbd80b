"""The round engine under every shared-memory collective: publish, write, meet, agree, read.

A collective is a number of rounds on a channel (channel 0: the whole group; a pair channel: one sender and one
receiver). In each round every member writes what it contributes into its own half of the channel's data area,
arrives (bumps its counter), waits for the others, then reads whatever it needs from any member's half. Halves
alternate by round parity, so a half is rewritten only two rounds later, when every member has passed the barrier
in between and therefore finished reading it: one barrier per round, none extra.

Round 0 also carries the descriptors: each member publishes one before arriving and checks all of them after, so
a disagreement raises the same error on every member before any data is read, and the group stays usable.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable

from tessel.core.errors import CollectiveMismatchError, ConfigurationError, PeerFailedError
from tessel.core.plugin import GroupContext
from tessel.plugins.cpu.shm_agree import COMPARED_BYTES, Descriptor, check_group, check_pair, member_offsets
from tessel.plugins.cpu.shm_segment import ATTACHED, CLOSED, FAILED, Segment, open_segment
from tessel.plugins.cpu.shm_sync import Liveness, Sync

Writer = Callable[[int, int], None]  # (round, parity) -> None
Reader = Callable[[int, int], None]


class Channel:
    """This rank's view of one channel: members (group ranks), its own sequence and round counts, a lock."""

    __slots__ = ("index", "lock", "members", "round", "seq")

    def __init__(self, index: int, members: tuple[int, ...]):
        self.index, self.members = index, members
        self.lock = threading.Lock()
        self.seq = 0  # collectives started on this channel
        self.round = 0  # barriers this rank arrived at on this channel


class Engine:
    """Owns the segment of one group and runs rounds on its channels."""

    def __init__(self, context: GroupContext):
        self.context = context
        self.me = context.group_rank
        self.group = Channel(0, tuple(range(context.size)))
        self._pairs: dict[tuple[int, int], Channel] = {}
        self._pairs_lock = threading.Lock()
        self.failure: BaseException | None = None
        self.closed = False
        self._slot_cache: dict[tuple[int, int], tuple[int, ...]] = {}
        self._reserved: dict[int, int] = {}  # channel -> bytes of this rank's halves backed by memory
        self.segment, self.sync = self._open()
        self.layout = self.segment.layout

    # ---------------------------------------------------------------------------------------------- lifecycle

    def _open(self) -> tuple[Segment, Sync]:
        """Create or attach the segment, then meet every member once; after that nobody needs the name."""
        context = self.context
        liveness = Liveness(context)
        creator = f"group rank 0 (rank {context.ranks[0]}, pid {context.peers[0].pid})"

        def check() -> None:
            cause = context.abort()
            if cause:
                raise PeerFailedError(f"creating group '{context.name}' stopped at rank {context.rank}: {cause}")
            if 0 in liveness.dead():
                raise PeerFailedError(
                    f"creating group '{context.name}': {creator} died before creating its shared memory",
                    context.ranks[0],
                )

        segment = open_segment(context, time.monotonic() + context.timeout_s, check)
        sync = Sync(segment, context)
        try:
            segment.words[segment.layout.pid_word(self.me)] = os.getpid()
            segment.words[segment.layout.state_word(self.me)] = ATTACHED
            self.segment, self.sync = segment, sync
            self.barrier(self.group, f"creation of group '{context.name}'")
        except BaseException:
            segment.words[segment.layout.state_word(self.me)] = FAILED
            segment.unlink()  # also when the creator died: the name must not outlive the group
            segment.close()
            raise
        segment.unlink()
        return segment, sync

    def pair(self, src: int, dst: int) -> Channel:
        """The channel that carries send/recv from group rank src to group rank dst."""
        with self._pairs_lock:
            channel = self._pairs.get((src, dst))
            if channel is None:
                channel = self._pairs[(src, dst)] = Channel(1 + src * self.context.size + dst, (src, dst))
            return channel

    def usable(self) -> None:
        """Raise if the communicator was closed or broken by an earlier failure."""
        name = self.context.name
        if self.closed:
            raise ConfigurationError(f"the communicator of group '{name}' is closed; create the group again")
        if self.failure is not None:
            culprit = getattr(self.failure, "culprit_rank", -1)
            raise PeerFailedError(
                f"group '{name}' is unusable after an earlier failure ({self.failure}); create the group again",
                culprit,
            )

    def fail(self, error: BaseException) -> None:
        """Mark the group broken here and tell the peers (they stop waiting for this rank)."""
        if self.failure is None:
            self.failure = error
        if not self.closed:
            self.segment.words[self.layout.state_word(self.me)] = FAILED

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.sync.closing = True  # a collective still waiting on another thread stops within a futex timeout
        if self.failure is None:
            self.segment.words[self.layout.state_word(self.me)] = CLOSED
        self.segment.close()

    # ---------------------------------------------------------------------------------------------- rounds

    def waiting(self, channel: Channel, member: int) -> bool:
        """Whether `member` already arrived at this rank's next barrier on `channel` (it waits there for us)."""
        return not self.sync.late(channel.index, (member,), channel.round + 1)

    def barrier(self, channel: Channel, what: str | Callable[[], str]) -> None:
        channel.round += 1
        self.sync.arrive(channel.index, channel.members, channel.round)
        self.sync.wait(channel.index, channel.members, channel.round, what)

    def run(
        self,
        channel: Channel,
        described: Descriptor,
        rounds: int | Callable[[list[Descriptor] | None], int],
        write: Writer | None = None,
        read: Reader | None = None,
        decode: bool = False,
        reserve: int = 0,
    ) -> None:
        """Run one collective: round 0 carries the descriptors, then `rounds` rounds of write/meet/read in all.

        `rounds` may be a function of the decoded descriptors (given when `decode` is set or on a disagreement).
        `reserve`: bytes this rank writes into its half per round (backed with memory before anything is
        published, so that a full /dev/shm is an error on every member rather than a SIGBUS on one).
        """
        with channel.lock:
            self.usable()
            if reserve > self._reserved.get(channel.index, 0) and not described.error:
                described.error = self._reserve(channel, reserve)
            seq = described.seq = channel.seq
            what = functools.partial(self._what, channel, described)  # formatted only for an error message
            slots = self._slots(channel, seq % 2)
            described.pack_into(self.segment.raw, slots[channel.members.index(self.me)], slots[-1])
            channel.seq += 1
            try:
                parity = channel.round % 2
                if write is not None and not described.error:
                    write(0, parity)
                self.barrier(channel, what)
                descriptors = self._agree(channel, seq, described, decode)
                count = rounds(descriptors) if callable(rounds) else rounds
                if read is not None:
                    read(0, parity)
                for index in range(1, count):
                    parity = channel.round % 2
                    if write is not None:
                        write(index, parity)
                    self.barrier(channel, what)
                    if read is not None:
                        read(index, parity)
            except (CollectiveMismatchError, ConfigurationError):
                raise  # raised by every member at the same point: the group stays consistent
            except BaseException as error:
                self.fail(error)
                raise

    def _reserve(self, channel: Channel, nbytes: int) -> str:
        """Back this rank's halves of `channel` with memory for nbytes (rounded up); '' or why it failed."""
        layout = self.layout
        capacity = layout.group_half if channel.index == 0 else layout.pair_half
        want = min(capacity, max(64 << 10, 1 << (nbytes - 1).bit_length()))
        position = channel.members.index(self.me)
        try:
            for parity in (0, 1):
                self.segment.reserve(layout.half(channel.index, position, parity), want)
        except ConfigurationError as error:
            return str(error)
        self._reserved[channel.index] = want
        return ""

    def _what(self, channel: Channel, described: Descriptor) -> str:
        if channel.index == 0:
            return f"{described.kind} #{described.seq}"
        src, dst = (self.context.ranks[m] for m in channel.members)
        return f"send/recv #{described.seq} from rank {src} to rank {dst}"

    def _agree(self, channel: Channel, seq: int, described: Descriptor, decode: bool) -> list[Descriptor] | None:
        """None when every member published the same thing (one byte comparison each); else check and decode."""
        raw, slots = self.segment.raw, self._slots(channel, seq % 2)[:-1]
        start = slots[channel.members.index(self.me)]
        mine = raw[start : start + COMPARED_BYTES]
        agreed = not decode and not described.error
        for slot in slots:
            if not agreed:
                break
            agreed = raw[slot : slot + COMPARED_BYTES] == mine
        if agreed:
            return None
        descriptors = [Descriptor.unpack_from(raw, s) for s in slots]
        ranks = tuple(self.context.ranks[m] for m in channel.members)
        if channel.index == 0:
            check_group(descriptors, ranks, self.context.name)
        else:
            check_pair(descriptors[0], descriptors[1], ranks[0], ranks[1], self.context.name)
        return descriptors

    def _slots(self, channel: Channel, parity: int) -> tuple[int, ...]:
        """Offsets of each member's descriptor slot for this parity, then the slot capacity."""
        key = (channel.index, parity)
        slots = self._slot_cache.get(key)
        if slots is None:
            places = [self.layout.descriptor(channel.index, p, parity) for p in range(len(channel.members))]
            slots = self._slot_cache[key] = (*(offset for offset, _ in places), places[0][1])
        return slots

    def member_offsets(self, channel: Channel) -> list[tuple[int, int]]:
        """Each member's (input, output) offsets in the segment (-1: private) from the descriptors of the
        collective just agreed on; valid from its first read on."""
        slots = self._slots(channel, (channel.seq - 1) % 2)[:-1]
        return [member_offsets(self.segment.raw, s) for s in slots]
