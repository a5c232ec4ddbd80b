"""Communication primitives (`ops.AllReduce`, `ops.AllGather`, …) for networks written against MindSpore.

Inside a compiled graph (a cell's construct in GRAPH_MODE, a train step, value_and_grad) each primitive records
the compiler's collective op over the group's global ranks, so it is differentiable with MindSpore's semantics
(AllReduce(sum)' = AllReduce(sum), AllGather' = ReduceScatter, AlltoAll' = AlltoAll with the dims swapped,
NeighborExchange' = the reverse exchange, Broadcast' = identity; see tessel.compiler.ops.collective), and the
engine runs the graph as a rank program split at the collectives. Called eagerly (PYNATIVE_MODE, or on host
values) the collective runs on the daemon at once (`communication.comm_func`). On a group of one device every
collective is the identity, so manual-parallel scripts run unchanged on a single device.

    >>> class ReduceLoss(nn.Cell):                     # the manual-parallel seed's loss
    ...     def construct(self, data, label):
    ...         return ops.AllReduce()(nn.CrossEntropyLoss()(data, label)) / get_group_size()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel.common.tensor import Tensor
from tessel.common.tracing import apply_op, current
from tessel.communication import GlobalComm
from tessel.communication.comm_func import ReduceOp
from tessel.core.errors import ConfigurationError
from tessel.ops.primitive import Primitive

_REDUCE_OPS = (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PROD)


def group_ranks(group: str) -> tuple[int, ...]:
    """The global ranks of `group` in group-rank order (the world's for the default group)."""
    from tessel import communication
    from tessel.common.engine import engine

    engine()  # makes sure the runtime is up (a world of 1 when nothing was launched)
    return communication._ranks(group)


def _group_rank(ranks: tuple[int, ...], rank: int, what: str, name: str) -> int:
    """A rank id of a primitive's attributes: a rank of its group, as MindSpore's kernels read it (0..size-1)."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < len(ranks):
        raise ConfigurationError(
            f"{name}: {what} {rank!r} is not a rank of its group of {len(ranks)} (global ranks {list(ranks)}); "
            f"rank ids of this primitive are group ranks, 0..{len(ranks) - 1} (get_group_rank_from_world_rank)"
        )
    return int(rank)


def _host(x: Any) -> np.ndarray:
    return x.asnumpy() if isinstance(x, Tensor) else np.asarray(x)


class _Collective(Primitive):
    """One input, one output: traced as compiler op `_op` with `_traced_attrs()`, eager through `_eager`."""

    _op = ""

    def __init__(self, group: str = GlobalComm.WORLD_COMM_GROUP, **attrs: Any):
        super().__init__()
        self.group = group
        self.attrs.update(group=group, **attrs)

    def __call__(self, x: Any) -> Any:
        ranks = group_ranks(self.group)
        self._check(ranks)  # on one device too, as MindSpore checks the primitive's arguments against the group
        if len(ranks) == 1:
            return x
        if current() is not None:
            return apply_op(self._op, x, group=ranks, **self._traced_attrs(ranks))
        return Tensor._wrap(np.asarray(self._eager(_host(x))))

    def _check(self, ranks: tuple[int, ...]) -> None:
        return None

    def _traced_attrs(self, ranks: tuple[int, ...]) -> dict[str, Any]:
        return {}

    def _eager(self, array: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class AllReduce(_Collective):
    """Reduce `x` over the group (op: ReduceOp.SUM, MAX, MIN, PROD); every rank gets the result."""

    _op = "AllReduce"

    def __init__(self, op: str = ReduceOp.SUM, group: str = GlobalComm.WORLD_COMM_GROUP):
        if op not in _REDUCE_OPS:
            raise ConfigurationError(f"AllReduce: op must be one of {_REDUCE_OPS}, got {op!r}")
        super().__init__(group, op=op)

    def _traced_attrs(self, ranks):
        return {"reduce_op": self.attrs["op"]}

    def _eager(self, array):
        from tessel.communication import comm_func

        return comm_func.all_reduce(array, self.attrs["op"], self.group)[0].asnumpy()


class AllGather(_Collective):
    """Concatenate every rank's `x` along dim 0, in group-rank order."""

    _op = "AllGather"

    def _traced_attrs(self, ranks):
        return {"axis": 0}

    def _eager(self, array):
        from tessel.communication import comm_func

        return comm_func.all_gather_into_tensor(array, self.group)[0].asnumpy()


class ReduceScatter(_Collective):
    """Reduce over the group, then group rank r keeps block r of dim 0."""

    _op = "ReduceScatter"

    def __init__(self, op: str = ReduceOp.SUM, group: str = GlobalComm.WORLD_COMM_GROUP):
        if op not in _REDUCE_OPS:
            raise ConfigurationError(f"ReduceScatter: op must be one of {_REDUCE_OPS}, got {op!r}")
        super().__init__(group, op=op)

    def _traced_attrs(self, ranks):
        return {"reduce_op": self.attrs["op"], "axis": 0}

    def _eager(self, array):
        from tessel.communication import comm_func

        return comm_func.reduce_scatter_tensor(array, self.attrs["op"], self.group)[0].asnumpy()


class Broadcast(_Collective):
    """Every rank gets root_rank's tensors; takes and returns a tuple (MindSpore). root_rank is a rank of the group
    (MindSpore's kernels read it so, and comm_func.broadcast converts its global src to it); in the world group
    the two are the same."""

    _op = "Broadcast"

    def __init__(self, root_rank: int, group: str = GlobalComm.WORLD_COMM_GROUP):
        super().__init__(group, root_rank=root_rank)

    def __call__(self, x: Any) -> Any:
        if not isinstance(x, (tuple, list)):
            raise ConfigurationError("Broadcast takes a tuple of tensors, e.g. ops.Broadcast(0)((x,))")
        return tuple(super(Broadcast, self).__call__(t) for t in x)

    def _check(self, ranks):
        _group_rank(ranks, self.attrs["root_rank"], "root_rank", "Broadcast")

    def _traced_attrs(self, ranks):
        return {"root": _group_rank(ranks, self.attrs["root_rank"], "root_rank", "Broadcast")}

    def _eager(self, array):
        from tessel.communication import comm_func

        ranks = group_ranks(self.group)
        root = ranks[_group_rank(ranks, self.attrs["root_rank"], "root_rank", "Broadcast")]
        return comm_func.broadcast(array, root, self.group).asnumpy()


class AlltoAll(_Collective):
    """Split dim `split_dim` into split_count blocks, send block i to group rank i, concatenate along concat_dim."""

    _op = "AlltoAll"

    def __init__(self, split_count: int, split_dim: int, concat_dim: int, group: str = GlobalComm.WORLD_COMM_GROUP):
        super().__init__(group, split_count=split_count, split_dim=split_dim, concat_dim=concat_dim)

    def _check(self, ranks):
        if self.attrs["split_count"] != len(ranks):
            raise ConfigurationError(
                f"AlltoAll: split_count={self.attrs['split_count']} must equal the group size {len(ranks)}"
            )

    def _traced_attrs(self, ranks):
        self._check(ranks)
        return {"split_dim": self.attrs["split_dim"], "concat_dim": self.attrs["concat_dim"]}

    def _eager(self, array):
        from tessel.communication import comm_func

        self._check(group_ranks(self.group))
        return comm_func.all_to_all(array, self.attrs["split_dim"], self.attrs["concat_dim"], self.group)[0].asnumpy()


class NeighborExchange(Primitive):
    """Send inputs[i] to group rank send_rank_ids[i]; receive recv_shapes[j] from group rank recv_rank_ids[j]
    (MindSpore's signature: a tuple in, a tuple out; its kernels read the ids as ranks of the group). A rank may
    only send (no recv_rank_ids). Differentiable: the gradient runs the reverse exchange."""

    def __init__(
        self,
        send_rank_ids: Sequence[int],
        recv_rank_ids: Sequence[int],
        recv_shapes: Sequence[Sequence[int]],
        send_shapes: Sequence[Sequence[int]],
        recv_type: Any,
        group: str = GlobalComm.WORLD_COMM_GROUP,
    ):
        super().__init__()
        if len(send_rank_ids) != len(send_shapes) or len(recv_rank_ids) != len(recv_shapes):
            raise ConfigurationError(
                f"NeighborExchange: {len(send_shapes)} send_shapes for {len(send_rank_ids)} send ranks and "
                f"{len(recv_shapes)} recv_shapes for {len(recv_rank_ids)} recv ranks; give one shape per rank"
            )
        self.group = group
        self.attrs.update(
            send_rank_ids=tuple(send_rank_ids),
            recv_rank_ids=tuple(recv_rank_ids),
            recv_shapes=tuple(tuple(s) for s in recv_shapes),
            send_shapes=tuple(tuple(s) for s in send_shapes),
            recv_type=recv_type,
            group=group,
        )

    def __call__(self, inputs: Any) -> tuple:
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        for x, shape in zip(inputs, self.attrs["send_shapes"]):
            if tuple(x.shape) != shape:
                raise ConfigurationError(f"NeighborExchange: input shape {tuple(x.shape)} != send_shapes {shape}")
        return exchange(
            inputs, self.attrs["send_rank_ids"], self.attrs["recv_rank_ids"], self.attrs["recv_shapes"],
            self.attrs["recv_type"], self.group,
        )  # fmt: skip


def exchange(inputs, send_ids, recv_ids, recv_shapes, recv_type, group: str, name: str = "NeighborExchange") -> tuple:
    """NeighborExchange over group rank ids: traced in a graph, run on the daemon otherwise."""
    from tessel.common.dtype import to_dtype

    ranks = group_ranks(group)
    dtype = np.dtype(to_dtype(recv_type).numpy)
    send_ranks = tuple(_group_rank(ranks, r, "send rank", name) for r in send_ids)
    recv_ranks = tuple(_group_rank(ranks, r, "recv rank", name) for r in recv_ids)
    if not send_ranks and not recv_ranks:
        return ()
    if current() is not None:
        if not recv_ranks:
            from tessel.common.support import not_supported_yet

            raise not_supported_yet(
                f"{name} that only sends inside a compiled graph (its result, empty, would drop it from the graph)",
                "call it in PYNATIVE_MODE, or pair it with ops.Send / ops.Receive",
            )
        out = apply_op(
            "NeighborExchange", *inputs, send_ranks=send_ranks, recv_ranks=recv_ranks,
            recv_shapes=tuple(recv_shapes), recv_dtype=str(dtype), group=ranks,
        )  # fmt: skip
        return out if isinstance(out, tuple) else (out,)
    from tessel.communication import comm_func

    got, _ = comm_func.neighbor_exchange(
        [_host(x) for x in inputs], [ranks[r] for r in send_ranks], [ranks[r] for r in recv_ranks], recv_shapes,
        dtype, group,
    )  # fmt: skip
    return got
