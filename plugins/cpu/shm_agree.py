"""Agreeing on a collective before data moves: every member publishes a descriptor, every member checks them all.

A descriptor is what a member is about to do (sequence number, kind, dtype, shape, reduce op, root, split/concat
dims) packed into a fixed struct, so the common case is one byte comparison per member. On a difference every
member decodes all descriptors and raises the same `CollectiveMismatchError`, naming the culprit (the first rank
whose value differs from the value most members hold), the field and both values. Neighbor exchanges and
send/recv pairs carry peer lists and shapes that differ by design; those are checked pair by pair (what src sends
to dst must be what dst expects from src; the sender is named as the culprit).
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from dataclasses import dataclass

import numpy as np

from tessel.core.errors import CollectiveMismatchError, ConfigurationError
from tessel.core.wire import COLLECTIVE_KIND_CODES, COLLECTIVE_KINDS

MAX_DIMS = 32
# seq kind ndim failed dtype op root split_dim concat_dim shape[MAX_DIMS] | per member: input and output offsets,
# extra length (the per-member part is not compared)
_FIXED = struct.Struct(f"<QBBB5x8s8siii4x{MAX_DIMS}q")
_PER_MEMBER = struct.Struct("<qqI4x")
_SEQ = struct.Struct("<Q")
COMPARED_BYTES = _FIXED.size
_TEMPLATES: dict[tuple, bytes] = {}

_FIELDS = ("seq", "kind", "dtype", "shape", "op", "root", "split_dim", "concat_dim")


@dataclass
class Descriptor:
    """What one member is about to do. Fields that do not apply to `kind` keep their defaults."""

    seq: int
    kind: str
    dtype: str = ""
    shape: tuple[int, ...] = ()
    op: str = ""
    root: int = 0
    split_dim: int = 0
    concat_dim: int = 0
    offset: int = -1  # where this member's input already lies in the segment (zero-copy), else -1
    output: int = -1  # where this member's output lies in the segment (peers may write it), else -1
    extra: dict | None = None  # neighbor exchange: peer lists and shapes
    # A local check failed (bad argument): published instead of data so that every member raises the same error.
    error: str = ""

    def pack_into(self, buffer: memoryview, offset: int, capacity: int) -> None:
        """Write the descriptor at `offset`; never raises, so a member cannot fail before publishing."""
        if self.extra is None and not self.error and len(self.shape) <= MAX_DIMS:
            # The common case repeats (a training step issues the same collectives every step): reuse the bytes.
            key = (self.kind, self.dtype, self.shape, self.op, self.root, self.split_dim, self.concat_dim)
            template = _TEMPLATES.get(key)
            if template is None:
                if len(_TEMPLATES) > 4096:
                    _TEMPLATES.clear()
                scratch = bytearray(_FIXED.size)
                self._pack_slowly(memoryview(scratch), 0, capacity, fixed_only=True)
                template = _TEMPLATES[key] = bytes(scratch)
            buffer[offset : offset + len(template)] = template
            _SEQ.pack_into(buffer, offset, self.seq)
            _PER_MEMBER.pack_into(buffer, offset + _FIXED.size, self.offset, self.output, 0)
            return
        self._pack_slowly(buffer, offset, capacity)

    def _pack_slowly(self, buffer: memoryview, offset: int, capacity: int, fixed_only: bool = False) -> None:
        if len(self.shape) > MAX_DIMS and not self.error:
            self.error = f"tensors with more than {MAX_DIMS} dims are not supported (shape {self.shape})"
        shape = self.shape if len(self.shape) <= MAX_DIMS else ()
        room = capacity - _FIXED.size - _PER_MEMBER.size
        extra = _encode({"error": self.error} if self.error else self.extra)
        if len(extra) > room and not self.error:
            self.error = f"too many peers or tensors to describe ({len(extra)} bytes; at most {room})"
        while self.error and len(extra := _encode({"error": self.error})) > room:
            self.error = self.error[: len(self.error) // 2]
        dims = (*shape, *([0] * (MAX_DIMS - len(shape))))
        kind, dtype, op = COLLECTIVE_KIND_CODES[self.kind], self.dtype.encode()[:8], self.op.encode()[:8]
        fields = (self.seq, kind, len(shape), bool(self.error), dtype, op, self.root, self.split_dim, self.concat_dim)
        _FIXED.pack_into(buffer, offset, *fields, *dims)
        if fixed_only:
            return
        _PER_MEMBER.pack_into(buffer, offset + _FIXED.size, self.offset, self.output, len(extra))
        start = offset + _FIXED.size + _PER_MEMBER.size
        buffer[start : start + len(extra)] = extra

    @classmethod
    def unpack_from(cls, buffer: memoryview, offset: int) -> Descriptor:
        seq, kind, ndim, failed, dtype, op, root, split_dim, concat_dim, *dims = _FIXED.unpack_from(buffer, offset)
        zero_copy, output, extra_length = _PER_MEMBER.unpack_from(buffer, offset + _FIXED.size)
        start = offset + _FIXED.size + _PER_MEMBER.size
        extra = json.loads(bytes(buffer[start : start + extra_length])) if extra_length else None
        error = extra.pop("error", "") if failed and extra else ""
        name = COLLECTIVE_KINDS.get(kind, f"kind {kind}")
        described = cls(seq, name, _text(dtype), tuple(dims[:ndim]), _text(op), root, split_dim, concat_dim)
        described.offset, described.output = zero_copy, output
        described.extra, described.error = None if failed else extra, error
        return described


def member_offsets(buffer: memoryview, offset: int) -> tuple[int, int]:
    """(input, output) offsets in the segment of the descriptor at `offset`; -1 where that array is private."""
    return _PER_MEMBER.unpack_from(buffer, offset + _FIXED.size)[:2]


def _encode(extra: dict | None) -> bytes:
    return json.dumps(extra, separators=(",", ":")).encode() if extra is not None else b""


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode()


def _show(field: str, value: object) -> str:
    if field == "kind":
        return f"calls {value}"
    if field == "dtype":
        return f"has dtype {np.dtype(value) if value else 'none'}"
    if field == "op":
        return f"has reduce op {value!r}"
    return f"has {field} {value}"


def check_group(descriptors: list[Descriptor], ranks: tuple[int, ...], group: str) -> None:
    """Raise CollectiveMismatchError if the members' descriptors disagree (same verdict on every member)."""
    for field in _FIELDS:
        values = [getattr(d, field) for d in descriptors]
        if len(set(values)) == 1:
            continue
        counts = Counter(values)
        # The value most members hold is the reference; ties go to the value of the lowest rank.
        reference = max(values, key=lambda v: (counts[v], -values.index(v)))
        culprit = next(i for i, v in enumerate(values) if v != reference)
        holder = values.index(reference)
        title = descriptors[holder].kind if field != "kind" else "collective"
        message = (
            f"{title} #{descriptors[holder].seq} on group '{group}': rank {ranks[culprit]} "
            f"{_show(field, values[culprit])} but rank {ranks[holder]} {_show(field, reference)}"
        )
        if field == "kind":
            message += "; every rank must call the same collectives in the same order"
        raise CollectiveMismatchError(message, ranks[culprit], field)
    for member, described in enumerate(descriptors):
        if described.error:
            raise ConfigurationError(
                f"{described.kind} #{described.seq} on group '{group}': rank {ranks[member]}: {described.error}"
            )
    if descriptors[0].kind == "neighbor_exchange":
        _check_exchange(descriptors, ranks, group)


def _check_exchange(descriptors: list[Descriptor], ranks: tuple[int, ...], group: str) -> None:
    """What every member sends to every other must be what that one expects to receive, in order."""
    size = len(descriptors)
    seq = descriptors[0].seq
    for src, described in enumerate(descriptors):
        for to in described.extra["send_ranks"] + described.extra["recv_ranks"]:
            if not 0 <= to < size:
                raise ConfigurationError(
                    f"neighbor_exchange #{seq} on group '{group}': rank {ranks[src]} names group rank {to}, "
                    f"outside 0..{size - 1}; send/recv ranks are group ranks"
                )
    for src in range(size):
        for dst in range(size):
            sent = [tuple(x) for x in outgoing(descriptors[src].extra, dst)]
            wanted = [tuple(x) for x in incoming(descriptors[dst].extra, src)]
            if sent == wanted:
                continue
            if len(sent) != len(wanted):
                field = "send_ranks"
            else:
                field = "shape" if _shapes(sent) != _shapes(wanted) else "dtype"
            raise CollectiveMismatchError(
                f"neighbor_exchange #{seq} on group '{group}': rank {ranks[src]} sends {_list(sent)} to rank "
                f"{ranks[dst]} but rank {ranks[dst]} expects {_list(wanted)} from rank {ranks[src]}",
                ranks[src],
                field,
            )


def outgoing(extra: dict, dst: int) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each tensor a member sends to `dst`, in its send order."""
    return [(tuple(s), d) for r, (s, d) in zip(extra["send_ranks"], extra["sends"]) if r == dst]


def incoming(extra: dict, src: int) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each tensor a member expects from `src`, in its receive order."""
    return [(tuple(s), extra["recv_dtype"]) for r, s in zip(extra["recv_ranks"], extra["recv_shapes"]) if r == src]


def _shapes(items: list) -> list:
    return [shape for shape, _ in items]


def _list(items: list) -> str:
    if not items:
        return "nothing"
    return ", ".join(f"shape {shape} {np.dtype(dtype)}" for shape, dtype in items)


def check_pair(sender: Descriptor, receiver: Descriptor, src: int, dst: int, group: str) -> None:
    """A send and the matching recv must agree on dtype and shape; the sender is named as the culprit."""
    for rank, described in ((src, sender), (dst, receiver)):
        if described.error:
            raise ConfigurationError(f"send/recv #{described.seq} on group '{group}': rank {rank}: {described.error}")
    for field in ("seq", "dtype", "shape"):
        sent, wanted = getattr(sender, field), getattr(receiver, field)
        if sent != wanted:
            raise CollectiveMismatchError(
                f"send/recv #{sender.seq} from rank {src} to rank {dst} on group '{group}': rank {src} sends "
                f"{field} {_value(field, sent)} but rank {dst} expects {_value(field, wanted)}",
                src,
                field,
            )


def _value(field: str, value: object) -> str:
    return str(np.dtype(value)) if field == "dtype" and value else str(value)
