"""Agreeing on a collective before its data moves (the TCP transport's "what are we about to do" step).

Every member describes its call in a `Descriptor` (sequence number, kind, reduce op, dtype, shape, root, dims,
peer). The descriptors are all-gathered with Bruck's algorithm (ceil(log2 n) rounds, any n); every member then
holds all of them and runs the same deterministic comparison, so a disagreement raises CollectiveMismatchError on
every member naming the same culprit. Small collectives ride along: their data travels in the same rounds
(`gather_blocks(..., data)`), so agreement costs no extra round trip. Framing is self-describing (a fixed head
announces the body's size), so the streams stay in step even when members disagree, and the group stays usable.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tessel.core.errors import CollectiveMismatchError, ConfigurationError, PeerFailedError
from tessel.core.plugin import GroupContext
from tessel.core.wire import COLLECTIVE_KIND_CODES, COLLECTIVE_KINDS, REDUCE_OP_NAMES, REDUCE_OPS
from tessel.plugins.cpu.tcp_wire import Clock, Link, Who, exchange

_NO_OP = -1  # the reduce-op code of collectives that reduce nothing
_MAGIC = 0x3143534544534C54  # b"TSLDESC1"
# magic, seq, kind, op, dtype (numpy dtype.str), root, split_dim, concat_dim, peer, meta count, data bytes
_HEAD = struct.Struct("<Qqqq8sqqqqqq")
_MAX_META = 1 << 16


def _pad8(n: int) -> int:
    return (n + 7) & ~7


@dataclass(frozen=True)
class Descriptor:
    """One member's view of a collective call. `meta` is the shape (neighbor_exchange: its send/recv lists)."""

    seq: int
    kind: str
    op: str | None = None
    dtype: str = ""
    root: int = -1
    split_dim: int = 0
    concat_dim: int = 0
    peer: int = -1
    meta: tuple[int, ...] = ()

    def head(self, data_nbytes: int) -> bytes:
        dtype = self.dtype.encode()[:8]
        kind, op = COLLECTIVE_KIND_CODES[self.kind], _NO_OP if self.op is None else REDUCE_OPS[self.op]
        return _HEAD.pack(
            _MAGIC, self.seq, kind, op, dtype, self.root, self.split_dim,
            self.concat_dim, self.peer, len(self.meta), data_nbytes,
        )  # fmt: skip


def dtype_code(dtype: np.dtype) -> str:
    """The dtype as descriptors carry it; dtypes no collective supports still compare (and fail) cleanly."""
    return np.dtype(dtype).str if len(np.dtype(dtype).str) <= 8 else "?"


def dtype_name(code: str) -> str:
    try:
        return np.dtype(code).name
    except TypeError:
        return code


@dataclass(frozen=True)
class Block:
    """A member's descriptor plus the data it sent with it (empty unless the collective rode along)."""

    descriptor: Descriptor
    data: memoryview


def _encode(descriptor: Descriptor, data: memoryview | None) -> tuple[bytes, list[memoryview]]:
    data = data if data is not None else memoryview(b"")
    meta = np.asarray(descriptor.meta, dtype="<i8").tobytes()
    pad = b"\0" * (_pad8(data.nbytes) - data.nbytes)
    return descriptor.head(data.nbytes), [memoryview(meta), data, memoryview(pad)]


def _decode(head: bytes, body: memoryview) -> Block:
    _, seq, kind, op, dtype, root, split_dim, concat_dim, peer, meta_count, data_nbytes = _HEAD.unpack(head)
    meta = tuple(int(v) for v in np.frombuffer(body, dtype="<i8", count=meta_count))
    descriptor = Descriptor(
        seq,
        COLLECTIVE_KINDS[kind],
        REDUCE_OP_NAMES.get(op),
        dtype.rstrip(b"\0").decode(),
        root,
        split_dim,
        concat_dim,
        peer,
        meta,
    )
    return Block(descriptor, body[8 * meta_count : 8 * meta_count + data_nbytes])


def _read_blocks(count: int, who: Who, what: str, into: list) -> Iterator[memoryview]:
    """Receive `count` blocks: their heads first, then the bodies the heads announce."""
    heads = bytearray(count * _HEAD.size)
    yield memoryview(heads)
    sizes = []
    for i in range(count):
        magic, _, kind, op, *_, meta_count, data_nbytes = _HEAD.unpack_from(heads, i * _HEAD.size)
        valid = magic == _MAGIC and kind in COLLECTIVE_KINDS and (op == _NO_OP or op in REDUCE_OP_NAMES)
        if not (valid and 0 <= meta_count <= _MAX_META and 0 <= data_nbytes < 1 << 48):
            raise PeerFailedError(
                f"{what}: the stream from {who} is out of step (bad descriptor); that rank left the group's "
                "call sequence after an earlier error. Re-create the group.",
                culprit_rank=who.global_rank,
            )
        sizes.append(8 * meta_count + _pad8(data_nbytes))
    body = memoryview(bytearray(sum(sizes)))
    yield body
    offset = 0
    for i, size in enumerate(sizes):
        into.append((bytes(heads[i * _HEAD.size : (i + 1) * _HEAD.size]), [body[offset : offset + size]]))
        offset += size


def gather_blocks(
    clock: Clock,
    context: GroupContext,
    link_to: Callable[[int], Link],
    mine: Descriptor,
    data: memoryview | None = None,
) -> list[Block]:
    """All-gather every member's descriptor (and `data`), indexed by group rank; Bruck's rounds, any group size."""
    size, me = context.size, context.group_rank
    held = [_encode(mine, data)]  # held[j] is the block of group rank (me + j) % size
    distance = 1
    while distance < size:
        count = min(distance, size - distance)
        source = link_to((me + distance) % size)
        views = [memoryview(b"".join(head for head, _ in held[:count]))]
        views += [view for _, body in held[:count] for view in body]
        received: list = []
        reader = _read_blocks(count, source.who, clock.what, received)
        exchange(clock, sends=[(link_to((me - distance) % size), views)], receives=[(source, reader)])
        held += received
        distance *= 2
    blocks: list[Block] = [None] * size  # type: ignore[list-item]
    for j, (head, body) in enumerate(held):
        blocks[(me + j) % size] = _decode(head, memoryview(b"".join(body)) if len(body) > 1 else body[0])
    return blocks


def swap_blocks(clock: Clock, link: Link, mine: Descriptor, data: memoryview | None = None) -> Block:
    """Exchange descriptors (and `data`) with one peer: the agreement step of send and recv."""
    head, body = _encode(mine, data)
    received: list = []
    exchange(clock, [(link, [memoryview(head), *body])], [(link, _read_blocks(1, link.who, clock.what, received))])
    theirs, (body,) = received[0]
    return _decode(theirs, body)


def _show(field: str, value: object) -> str:
    if field == "dtype":
        return dtype_name(str(value))
    return repr(tuple(value) if isinstance(value, tuple) else value)


def _mismatch(context: GroupContext, what: str, field: str, culprit: int, detail: str) -> None:
    who = Who(culprit, context.ranks[culprit])
    raise CollectiveMismatchError(
        f"{what} on group {context.name!r}: ranks disagree on {field}: {detail}. Every rank of the group must "
        f"call the same collectives in the same order with matching arguments; fix the call on {who}.",
        culprit_rank=who.global_rank,
        field=field,
    )


def _differs(context: GroupContext, field: str, culprit: int, theirs: object, holders: list, reference: object) -> str:
    who = Who(culprit, context.ranks[culprit])
    return f"{who} has {_show(field, theirs)} while group ranks {holders} have {_show(field, reference)}"


# Compared in this order (the shared-memory transport's order, so both name the same field).
_FIELDS = (("seq", "seq"), ("kind", "kind"), ("dtype", "dtype"), ("shape", "meta"), ("op", "op"), ("root", "root"))
_FIELDS += (("split_dim", "split_dim"), ("concat_dim", "concat_dim"))


def check_agreement(blocks: Sequence[Block], context: GroupContext, what: str) -> None:
    """Raise CollectiveMismatchError unless every member described the same call.

    The reference value of a field is the most common one (ties: the lowest group rank's); the culprit is the
    lowest group rank that differs. Every member evaluates the same descriptors, so all name the same culprit.
    """
    descriptors = [b.descriptor for b in blocks]
    for field, attribute in _FIELDS:
        if field in ("shape", "dtype") and descriptors[0].kind == "neighbor_exchange":
            continue  # per pair, below: each rank's recv dtype need only match what its senders send
        values = [getattr(d, attribute) for d in descriptors]
        reference = max(values, key=lambda v: (values.count(v), -values.index(v)))
        for rank, value in enumerate(values):
            if value != reference:
                holders = [r for r, v in enumerate(values) if v == reference]
                _mismatch(context, what, field, rank, _differs(context, field, rank, value, holders, reference))
    if descriptors[0].kind == "neighbor_exchange":
        _check_neighbor_plans(descriptors, context, what)


def check_pair(mine: Descriptor, theirs: Descriptor, peer: int, context: GroupContext, what: str) -> None:
    """send/recv: the peer must make the matching call (recv for send) with the same seq, dtype and shape.

    The sender is named as the culprit (as over shared memory); two sends or two recvs name the higher rank.
    """
    me = context.group_rank
    expected = {"send": "recv", "recv": "send"}.get(mine.kind)
    if theirs.kind != expected:
        detail = f"this {mine.kind} needs a {expected} on {Who(peer, context.ranks[peer])}, which called {theirs.kind}"
        _mismatch(context, what, "kind", max(me, peer), detail)
    sender, receiver = (me, peer) if mine.kind == "send" else (peer, me)
    for field, attribute in (("seq", "seq"), ("dtype", "dtype"), ("shape", "meta")):
        values = {me: getattr(mine, attribute), peer: getattr(theirs, attribute)}
        if values[me] != values[peer]:
            detail = (
                f"{Who(sender, context.ranks[sender])} sends {field} {_show(field, values[sender])} but "
                f"{Who(receiver, context.ranks[receiver])} expects {_show(field, values[receiver])}"
            )
            _mismatch(context, what, field, sender, detail)


def neighbor_plan(sends: Sequence[tuple[int, str, tuple[int, ...]]], recvs: Sequence[tuple[int, tuple[int, ...]]]):
    """Encode neighbor_exchange's lists as descriptor meta: sends (rank, dtype, shape), recvs (rank, shape)."""
    meta = [len(sends)]
    for rank, dtype, shape in sends:
        meta += [rank, int.from_bytes(dtype.encode()[:8].ljust(8, b"\0"), "little", signed=True), len(shape), *shape]
    meta.append(len(recvs))
    for rank, shape in recvs:
        meta += [rank, len(shape), *shape]
    return tuple(meta)


def _decode_plan(meta: tuple[int, ...]) -> tuple[list, list]:
    sends, recvs, at = [], [], 1
    for _ in range(meta[0]):
        rank, dtype, ndim = meta[at : at + 3]
        code = dtype.to_bytes(8, "little", signed=True).rstrip(b"\0").decode()
        sends.append((rank, code, tuple(meta[at + 3 : at + 3 + ndim])))
        at += 3 + ndim
    count, at = meta[at], at + 1
    for _ in range(count):
        rank, ndim = meta[at : at + 2]
        recvs.append((rank, tuple(meta[at + 2 : at + 2 + ndim])))
        at += 2 + ndim
    return sends, recvs


def _check_neighbor_plans(descriptors: Sequence[Descriptor], context: GroupContext, what: str) -> None:
    """Every message a sends to b must be one b expects from a, in order, with b's shape and recv dtype.

    The sender is named as the culprit (as over shared memory).
    """
    plans = [_decode_plan(d.meta) for d in descriptors]
    for member, (sends, recvs) in enumerate(plans):
        named = [rank for rank, *_ in sends + recvs if not 0 <= rank < len(plans)]
        if named:
            raise ConfigurationError(
                f"{what} on group {context.name!r}: {Who(member, context.ranks[member])} names group rank(s) "
                f"{named}, outside 0..{len(plans) - 1}; send_ranks and recv_ranks are group ranks, not global ranks"
            )
    for sender, (sends, _) in enumerate(plans):
        for receiver, (_, recvs) in enumerate(plans):
            sent = [(shape, dtype) for rank, dtype, shape in sends if rank == receiver]
            wanted = [(shape, descriptors[receiver].dtype) for rank, shape in recvs if rank == sender]
            if sent == wanted:
                continue
            if len(sent) != len(wanted):
                field = "send_ranks"
            else:
                field = "shape" if [s for s, _ in sent] != [s for s, _ in wanted] else "dtype"
            detail = (
                f"group rank {sender} sends {_listing(sent)} to group rank {receiver}, which expects "
                f"{_listing(wanted)} from it"
            )
            _mismatch(context, what, field, sender, detail)


def _listing(items: list) -> str:
    return ", ".join(f"{dtype_name(dtype)}{list(shape)}" for shape, dtype in items) or "nothing"
