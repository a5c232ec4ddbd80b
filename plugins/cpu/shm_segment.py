"""The shared-memory segment of one group: its name, its layout, and creating or attaching it safely.

One file in /dev/shm per group, named from (user, job id, job nonce, group name, global ranks) so different jobs and
groups never collide (job ids alone repeat: every embedded `tessel run` has its own coordinator). Group rank 0
creates it (removing a stale file of the same name first) and writes the header last; the others attach and validate
the header (magic, identity, ranks, creator pid) so a stale segment is never joined. Once every member has attached,
the creator unlinks the name: from then on the memory lives exactly as long as some member maps it, so nothing leaks
even if every process is killed.

Layout (offsets from the start of the file):

    header                      magic, version, state, identity, sizes, creator pid, global ranks
    control blocks, per rank    pid, state, one counter and one sleep word per channel (written by that rank only)
    descriptors                 per channel member, two parity slots (what the member is about to do)
    group data, per rank        two halves of (size + 1) * chunk bytes (double-buffered by round parity)
    pair data, per (src, dst)   two halves of pair_half bytes (send/recv between two ranks)
    arena, per rank             where `buffer()` arrays (zero-copy inputs) and large collective outputs live

Channel 0 is the whole group; channel 1 + src * size + dst carries send/recv from src to dst.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tessel.core.errors import CollectiveTimeoutError, ConfigurationError
from tessel.core.plugin import GroupContext

SHM_DIR = "/dev/shm"
MAGIC = b"TESSHM01"
VERSION = 2  # 2: descriptors carry output offsets
HEADER_BYTES = 4096
MAX_RANKS = (HEADER_BYTES - 128) // 8
GROUP_DESC_BYTES = 4096  # room for a neighbor exchange's peer lists
PAIR_DESC_BYTES = 1024

# Member states in the control block.
ATTACHED, CLOSED, FAILED = 1, 2, 3
_READY = 1

_HEADER = struct.Struct("<8sIII20sQQQQQ")  # magic version state size identity chunk pair_half arena total creator


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


@dataclass(frozen=True)
class Layout:
    """Where everything lives in a segment for `size` members; a pure function of the four sizes (offsets are
    computed once: they are read on every collective)."""

    size: int
    chunk: int  # bytes per rank per pipelined segment of a large all-reduce
    pair_half: int  # bytes per half of a send/recv channel
    arena: int  # bytes per rank for zero-copy buffers

    @cached_property
    def channels(self) -> int:
        return 1 + self.size * self.size

    @cached_property
    def control_block(self) -> int:
        return _align(4 * (2 + 2 * self.channels), 64)

    @cached_property
    def control(self) -> int:
        return HEADER_BYTES

    @cached_property
    def descriptors(self) -> int:
        return _align(self.control + self.size * self.control_block, 4096)

    @cached_property
    def group_half(self) -> int:
        return (self.size + 1) * self.chunk

    @cached_property
    def group_data(self) -> int:
        return _align(self.descriptors + 2 * self.size * GROUP_DESC_BYTES + 4 * self.size**2 * PAIR_DESC_BYTES, 4096)

    @cached_property
    def pair_data(self) -> int:
        return self.group_data + 2 * self.size * self.group_half

    @cached_property
    def arenas(self) -> int:
        return _align(self.pair_data + 2 * self.size * self.size * self.pair_half, 4096)

    @cached_property
    def total(self) -> int:
        return self.arenas + self.size * self.arena

    # Word indices (4-byte units) into the control blocks.
    def pid_word(self, rank: int) -> int:
        return (self.control + rank * self.control_block) // 4

    def state_word(self, rank: int) -> int:
        return self.pid_word(rank) + 1

    def counter_word(self, rank: int, channel: int) -> int:
        return self.pid_word(rank) + 2 + channel

    def sleep_word(self, rank: int, channel: int) -> int:
        return self.pid_word(rank) + 2 + self.channels + channel

    # Byte offsets of descriptor slots and data halves. `member` is 0/1 (sender/receiver) on pair channels.
    def descriptor(self, channel: int, member: int, parity: int) -> tuple[int, int]:
        if channel == 0:
            return self.descriptors + (2 * member + parity) * GROUP_DESC_BYTES, GROUP_DESC_BYTES
        pairs = self.descriptors + 2 * self.size * GROUP_DESC_BYTES
        return pairs + (4 * (channel - 1) + 2 * member + parity) * PAIR_DESC_BYTES, PAIR_DESC_BYTES

    def half(self, channel: int, member: int, parity: int) -> int:
        if channel == 0:
            return self.group_data + (2 * member + parity) * self.group_half
        return self.pair_data + (2 * (channel - 1) + parity) * self.pair_half

    def arena_start(self, rank: int) -> int:
        return self.arenas + rank * self.arena


def _identity(context: GroupContext) -> bytes:
    ranks = ",".join(map(str, context.ranks))
    key = f"{os.getuid()}\0{context.job_id}\0{context.job_nonce}\0{context.name}\0{ranks}"
    return hashlib.sha1(key.encode()).digest()


def segment_path(context: GroupContext) -> str:
    """The /dev/shm file of this group (the same on every member, different for every job/group/ranks)."""
    return os.path.join(SHM_DIR, f"tessel-{_identity(context).hex()[:32]}")


def default_layout(size: int) -> Layout:
    """Sizes from the environment (read by the creator only; attachers take them from the header)."""
    chunk_kib = int(os.environ.get("TESSEL_SHM_CHUNK_KIB", "512"))
    arena_mib = int(os.environ.get("TESSEL_SHM_ARENA_MIB", "256"))
    if chunk_kib < 4 or arena_mib < 0:
        raise ConfigurationError(
            f"TESSEL_SHM_CHUNK_KIB={chunk_kib} / TESSEL_SHM_ARENA_MIB={arena_mib} are invalid; "
            "the chunk needs at least 4 KiB and the arena cannot be negative"
        )
    return Layout(size, chunk_kib * 1024, pair_half_bytes(size), arena_mib * 1024 * 1024)


def pair_half_bytes(size: int) -> int:
    """Bytes per half of a send/recv channel in a group of `size`: a send of up to this many bytes takes one
    round, a single meeting of sender and receiver. Each meeting wakes the other process's thread, which then waits
    for its interpreter lock, so a pipeline stage's activation (hundreds of KiB) sent in 128 KiB rounds cost 3-4x
    the copies' time on a loaded host: 1 MiB in small groups. The segment maps 2 x size^2 halves (backed only as
    used, Engine._reserve), so large groups get smaller ones, down to 128 KiB."""
    return max(128, min(1024, 16384 // max(1, size))) * 1024


class Segment:
    """A mapped group segment. `words` reads/writes 32-bit control words; `bytes` views the whole file."""

    def __init__(self, path: str, fd: int, layout: Layout, creator: bool):
        self.path, self.fd, self.layout, self.creator = path, fd, layout, creator
        self.map = mmap.mmap(fd, layout.total)
        self.words = memoryview(self.map).cast("I")
        self.raw = memoryview(self.map)
        self.bytes = np.frombuffer(self.map, np.uint8)
        self.address = self.bytes.ctypes.data
        self.unlinked = False

    @classmethod
    def create(cls, context: GroupContext, layout: Layout) -> Segment:
        """Create the segment (group rank 0). A leftover file of the same name is removed first."""
        path = segment_path(context)
        if len(context.ranks) > MAX_RANKS:
            raise ConfigurationError(f"a shared-memory group holds at most {MAX_RANKS} ranks, got {context.size}")
        if not os.path.isdir(SHM_DIR):
            raise ConfigurationError(f"{SHM_DIR} does not exist here; set TESSEL_TRANSPORT=tcp")
        _unlink_quietly(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, layout.total)
            # Reserve the small control part now so a full /dev/shm is an error here, not a SIGBUS later.
            os.posix_fallocate(fd, 0, layout.group_data)
            segment = cls(path, fd, layout, creator=True)
        except BaseException:
            os.close(fd)
            _unlink_quietly(path)
            raise
        ranks = struct.pack(f"<{context.size}q", *context.ranks)
        segment.map[_HEADER.size : _HEADER.size + len(ranks)] = ranks
        fields = (MAGIC, VERSION, 0, context.size, _identity(context), layout.chunk, layout.pair_half)
        _HEADER.pack_into(segment.map, 0, *fields, layout.arena, layout.total, context.peers[0].pid)
        # The state word goes last: an attacher that sees READY sees a complete header (x86 stores are ordered).
        struct.pack_into("<I", segment.map, 12, _READY)
        return segment

    @classmethod
    def try_attach(cls, context: GroupContext) -> Segment | None:
        """Attach if a valid segment of this group exists now; None if not (yet), so the caller retries."""
        path = segment_path(context)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            owner = os.fstat(fd)
            if owner.st_uid != os.getuid() or owner.st_mode & 0o077:  # not the job's own: another user's file
                raise ConfigurationError(
                    f"shared-memory segment {path} belongs to uid {owner.st_uid} with mode "
                    f"{oct(owner.st_mode & 0o777)}, not to this user alone; remove it (another user may have made "
                    "it to read or change this group's data) or use TESSEL_TRANSPORT=tcp"
                )
            layout = _read_valid_header(fd, context)
            if layout is None:
                os.close(fd)
                return None
            return cls(path, fd, layout, creator=False)
        except BaseException:
            os.close(fd)
            raise

    def array(self, offset: int, count: int, dtype: np.dtype) -> np.ndarray:
        """`count` items of `dtype` at byte `offset`, as a view into the segment."""
        return self.bytes[offset : offset + count * dtype.itemsize].view(dtype)

    def strided(self, offset: int, rows: int, count: int, dtype: np.dtype, row_stride: int) -> np.ndarray:
        """rows x count items, row i at offset + i * row_stride: one view over the same place in every rank's half."""
        return np.ndarray((rows, count), dtype, buffer=self.map, offset=offset, strides=(row_stride, dtype.itemsize))

    def reserve(self, offset: int, length: int) -> None:
        """Back [offset, offset + length) with memory now; raises a clear error when /dev/shm is full."""
        try:
            os.posix_fallocate(self.fd, offset, length)
        except OSError as error:
            raise ConfigurationError(
                f"cannot reserve {length} bytes of shared memory in {SHM_DIR} ({error.strerror}); "
                "free space there, make the collective buffers smaller, or set TESSEL_TRANSPORT=tcp"
            ) from error

    def unlink(self) -> None:
        """Remove the name (the memory stays while mapped). Only when it is still our file, never a newer one."""
        if self.unlinked:
            return
        self.unlinked = True
        try:
            mine, there = os.fstat(self.fd), os.stat(self.path)
        except OSError:
            return
        if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
            _unlink_quietly(self.path)

    def close(self) -> None:
        """Close the file (the creator also unlinks the name). The mapping itself goes with the last reference
        to it, so a collective still running on another thread, or an array from buffer(), never sees it vanish."""
        if self.creator:
            self.unlink()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _read_valid_header(fd: int, context: GroupContext) -> Layout | None:
    """The layout from the header if the file is this group's live segment; None if stale or not ready."""
    size = os.fstat(fd).st_size
    if size < HEADER_BYTES:
        return None
    header = os.pread(fd, HEADER_BYTES, 0)
    magic, version, state, members, identity, chunk, pair_half, arena, total, creator = _HEADER.unpack_from(header)
    if (magic, version, state, members, identity) != (MAGIC, VERSION, _READY, context.size, _identity(context)):
        return None
    ranks = struct.unpack_from(f"<{members}q", header, _HEADER.size)
    expected_pid = context.peers[0].pid
    if ranks != tuple(context.ranks) or (expected_pid > 0 and creator != expected_pid):
        return None  # a stale segment of an earlier incarnation; the creator replaces it
    layout = Layout(members, chunk, pair_half, arena)
    return layout if layout.total == total == size else None


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def open_segment(context: GroupContext, deadline: float, check: Callable[[], None]) -> Segment:
    """Create (group rank 0) or attach with retry until `deadline`; `check()` raises if a peer died/aborted."""
    if context.group_rank == 0:
        return Segment.create(context, default_layout(context.size))
    delay = 0.0005
    while True:
        segment = Segment.try_attach(context)
        if segment is not None:
            return segment
        check()
        if time.monotonic() > deadline:
            raise CollectiveTimeoutError(
                f"group '{context.name}' of job '{context.job_id}': rank {context.rank} found no shared-memory "
                f"segment from group rank 0 (global rank {context.ranks[0]}, pid {context.peers[0].pid}) within "
                f"{context.timeout_s:g} s; check that every member creates the group"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
