"""`ops.NeighborExchangeV2`: MindSpore's 2-D halo exchange for NCHW tensors, built on `NeighborExchange`.

A rank of a 2-D grid of ranks holds one spatial block of an image batch. It sends the borders of its block to
its up to 8 neighbours and receives theirs, and the output is its block padded with what arrived: `recv_top`
rows above, `recv_bottom` below, `recv_left` columns on the left, `recv_right` on the right, corners from the
diagonal neighbours. One NeighborExchange carries all the pieces, so the whole halo is one collective, and its
gradient (the reverse exchange, see tessel.compiler.ops.collective) sends each halo's gradient back to the rank
whose border it came from.

The 8 directions, in the order of `send_rank_ids` / `recv_rank_ids` (MindSpore's):
    0 top, 1 top_right, 2 right, 3 bottom_right, 4 bottom, 5 bottom_left, 6 left, 7 top_left.
`send_lens` / `recv_lens` are [top, bottom, left, right]: the rows / columns of each border. A rank id of -1
means no neighbour in that direction: nothing is sent there, and where `recv_lens` still asks for a border from
that side the output holds zeros (the shape is always MindSpore's documented (N, C, H + recv_top + recv_bottom,
W + recv_left + recv_right); Ascend's lowering requires such lens to be 0, so portable scripts keep them 0).

    >>> # 2 ranks stacked vertically: rank 0 is on top, rank 1 below it; one row of halo each way.
    >>> halo = ops.NeighborExchangeV2(send_rank_ids=[-1, -1, -1, -1, 1, -1, -1, -1],
    ...                               recv_rank_ids=[-1, -1, -1, -1, 1, -1, -1, -1],
    ...                               send_lens=[0, 1, 0, 0], recv_lens=[0, 1, 0, 0])   # on rank 0
    >>> halo(x)                                        # x: (N, C, H, W) -> (N, C, H + 1, W)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessel.communication import GlobalComm
from tessel.core.errors import ConfigurationError
from tessel.ops import functional as F
from tessel.ops.comm import exchange
from tessel.ops.primitive import Primitive

DIRECTIONS = ("top", "top_right", "right", "bottom_right", "bottom", "bottom_left", "left", "top_left")
# Which [top, bottom, left, right] length bounds each direction's rows and columns (None: the whole H or W).
_ROWS = (0, 0, None, 1, 1, 1, None, 0)
_COLS = (None, 3, 3, 3, None, 2, 2, 2)
_FIRST = {0: True, 1: False, 2: True, 3: False}  # top and left borders start at 0; bottom and right end at H / W


def _check_ids(value: Any, what: str) -> tuple[int, ...]:
    ok = isinstance(value, (list, tuple)) and len(value) == 8
    ids = tuple(value) if ok else ()
    if not ok or not all(isinstance(r, int) and not isinstance(r, bool) and r >= -1 for r in ids):
        raise ConfigurationError(
            f"NeighborExchangeV2: {what}={value!r} must be a list of 8 rank ids (-1 = no neighbour) in the order "
            f"{list(DIRECTIONS)}"
        )
    real = [r for r in ids if r != -1]
    if len(set(real)) != len(real):
        raise ConfigurationError(
            f"NeighborExchangeV2: {what}={list(ids)} names a rank twice; MindSpore requires distinct neighbours "
            "(use ops.NeighborExchange for a periodic grid this small)"
        )
    return ids


def _check_lens(value: Any, what: str) -> tuple[int, ...]:
    ok = isinstance(value, (list, tuple)) and len(value) == 4
    lens = tuple(value) if ok else ()
    if not ok or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lens):
        raise ConfigurationError(
            f"NeighborExchangeV2: {what}={value!r} must be 4 non-negative lengths [top, bottom, left, right]"
        )
    return lens


def _span(length_index: int | None, lens: tuple[int, ...], size: int) -> slice:
    """The rows (or columns) of a border: the first `n` for top/left, the last `n` for bottom/right."""
    if length_index is None:
        return slice(0, size)
    n = lens[length_index]
    return slice(0, n) if _FIRST[length_index] else slice(size - n, size)


def _extent(length_index: int | None, lens: tuple[int, ...], size: int) -> int:
    return size if length_index is None else lens[length_index]


class NeighborExchangeV2(Primitive):
    """Exchange the borders of an NCHW block with up to 8 neighbours; returns the block padded with their halos.

    Args (MindSpore's order): send_rank_ids, recv_rank_ids (8 group rank ids, -1 = none, see `DIRECTIONS`),
    send_lens, recv_lens ([top, bottom, left, right]), data_format ("NCHW" only), group.
    """

    def __init__(
        self,
        send_rank_ids: Sequence[int],
        recv_rank_ids: Sequence[int],
        send_lens: Sequence[int],
        recv_lens: Sequence[int],
        data_format: str = "NCHW",
        group: str = GlobalComm.WORLD_COMM_GROUP,
    ):
        super().__init__()
        if data_format != "NCHW":
            raise ConfigurationError(f"NeighborExchangeV2: data_format={data_format!r}; only 'NCHW' is supported")
        if not isinstance(group, str):
            raise ConfigurationError(f"NeighborExchangeV2: group must be a group name (str), got {group!r}")
        self.group = group
        self.attrs.update(
            send_rank_ids=_check_ids(send_rank_ids, "send_rank_ids"),
            recv_rank_ids=_check_ids(recv_rank_ids, "recv_rank_ids"),
            send_lens=_check_lens(send_lens, "send_lens"),
            recv_lens=_check_lens(recv_lens, "recv_lens"),
            data_format=data_format,
            group=group,
        )

    def __call__(self, x: Any) -> Any:
        shape = tuple(x.shape)
        if len(shape) != 4:
            raise ConfigurationError(f"NeighborExchangeV2: input shape {shape} is not NCHW (4 dims)")
        self._check_fits(shape)
        sends, recvs = self.attrs["send_rank_ids"], self.attrs["recv_rank_ids"]
        send_to = [d for d in range(8) if sends[d] != -1]
        recv_from = [d for d in range(8) if recvs[d] != -1]
        if not recv_from:
            if send_to:
                raise ConfigurationError(
                    f"NeighborExchangeV2: this rank sends to {[sends[d] for d in send_to]} but receives from no one; "
                    "a halo exchange is mutual: give the matching recv_rank_ids (or use ops.Send for one-way data)"
                )
            return x
        pieces = [self._border(x, d) for d in send_to]
        got = exchange(
            pieces, [sends[d] for d in send_to], [recvs[d] for d in recv_from],
            [self._halo_shape(shape, d) for d in recv_from], x.dtype, self.group, "NeighborExchangeV2",
        )  # fmt: skip
        halos = dict(zip(recv_from, got))
        return self._assemble(x, halos)

    def _check_fits(self, shape: tuple[int, ...]) -> None:
        top, bottom, left, right = self.attrs["send_lens"]
        height, width = shape[2], shape[3]
        if max(top, bottom) > height or max(left, right) > width:
            raise ConfigurationError(
                f"NeighborExchangeV2: send_lens {list(self.attrs['send_lens'])} exceed the input's H={height} / "
                f"W={width}; a border cannot be larger than the block"
            )

    def _border(self, x: Any, direction: int) -> Any:
        lens, height, width = self.attrs["send_lens"], x.shape[2], x.shape[3]
        rows, cols = _span(_ROWS[direction], lens, height), _span(_COLS[direction], lens, width)
        return x[:, :, rows, cols]

    def _halo_shape(self, shape: tuple[int, ...], direction: int) -> tuple[int, ...]:
        lens = self.attrs["recv_lens"]
        rows, cols = _extent(_ROWS[direction], lens, shape[2]), _extent(_COLS[direction], lens, shape[3])
        return (shape[0], shape[1], rows, cols)

    def _assemble(self, x: Any, halos: dict) -> Any:
        """Three bands (top halo, middle, bottom halo), each left | centre | right, joined along H."""
        shape, dtype = tuple(x.shape), x.dtype

        def piece(direction: int) -> Any:
            if direction in halos:
                return halos[direction]
            return F.zeros(self._halo_shape(shape, direction), dtype)

        bands = []
        for row, (left, centre, right) in enumerate(((7, 0, 1), (6, None, 2), (5, 4, 3))):
            if row != 1 and self.attrs["recv_lens"][row // 2] == 0:
                continue  # no halo rows above / below
            parts = [x if centre is None else piece(centre)]
            if self.attrs["recv_lens"][2]:
                parts.insert(0, piece(left))
            if self.attrs["recv_lens"][3]:
                parts.append(piece(right))
            bands.append(F.concat(parts, 3) if len(parts) > 1 else parts[0])
        return F.concat(bands, 2) if len(bands) > 1 else bands[0]
