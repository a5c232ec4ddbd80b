"""Communication primitives (`ops.AllReduce`, `ops.AllGather`, …) for networks written against MindSpore.

On a group of one device every collective is the identity (a sum, gather or broadcast over one rank), so
manual-parallel scripts run unchanged on a single device, in graphs and eagerly, with identity gradients
(AllReduce' = AllReduce over one rank). Over several ranks an eager call runs the collective on the daemon
(`communication.comm_func`); inside compiled graphs collectives are lowered by the parallel pass.
"""

from __future__ import annotations

from typing import Any

from tessel.common.tensor import Tensor
from tessel.common.tracing import current
from tessel.communication import GlobalComm
from tessel.communication.comm_func import ReduceOp
from tessel.errors import ConfigurationError
from tessel.ops.primitive import Primitive

_REDUCE_OPS = (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PROD)


def _group_size(group: str) -> int:
    from tessel import communication
    from tessel.common.engine import engine

    engine()  # makes sure the runtime is up (a world of 1 when nothing was launched)
    return communication.get_group_size(group)


class _Collective(Primitive):
    def __init__(self, group: str = GlobalComm.WORLD_COMM_GROUP, **attrs: Any):
        super().__init__()
        self.group = group
        self.attrs.update(group=group, **attrs)

    def __call__(self, x: Any) -> Any:
        if _group_size(self.group) == 1:
            return x
        if current() is not None:
            raise ConfigurationError(
                f"{self.name} over {_group_size(self.group)} ranks inside a compiled graph needs the parallel pass; "
                "set_auto_parallel_context(parallel_mode=...) or call it eagerly (PYNATIVE_MODE)"
            )
        array = x.asnumpy() if isinstance(x, Tensor) else x
        return Tensor._wrap(self._eager(array))

    def _eager(self, array):
        raise NotImplementedError


class AllReduce(_Collective):
    """Reduce `x` over the group (op: ReduceOp.SUM, MAX, MIN, PROD); every rank gets the result."""

    def __init__(self, op: str = ReduceOp.SUM, group: str = GlobalComm.WORLD_COMM_GROUP):
        if op not in _REDUCE_OPS:
            raise ConfigurationError(f"AllReduce: op must be one of {_REDUCE_OPS}, got {op!r}")
        super().__init__(group, op=op)

    def _eager(self, array):
        from tessel.communication import comm_func

        return comm_func.all_reduce(array, self.attrs["op"], self.group)


class AllGather(_Collective):
    """Concatenate every rank's `x` along dim 0."""

    def _eager(self, array):
        from tessel.communication import comm_func

        return comm_func.all_gather_into_tensor(array, self.group)


class ReduceScatter(_Collective):
    """Reduce over the group, then rank r keeps block r of dim 0."""

    def __init__(self, op: str = ReduceOp.SUM, group: str = GlobalComm.WORLD_COMM_GROUP):
        super().__init__(group, op=op)

    def _eager(self, array):
        from tessel.communication import comm_func

        return comm_func.reduce_scatter_tensor(array, self.attrs["op"], self.group)


class Broadcast(_Collective):
    """Every rank gets root_rank's tensors; takes and returns a tuple (MindSpore's signature)."""

    def __init__(self, root_rank: int, group: str = GlobalComm.WORLD_COMM_GROUP):
        super().__init__(group, root_rank=root_rank)

    def __call__(self, x: Any) -> Any:
        return tuple(super(Broadcast, self).__call__(t) for t in x)

    def _eager(self, array):
        from tessel.communication import comm_func

        return comm_func.broadcast(array, self.attrs["root_rank"], self.group)


class AlltoAll(_Collective):
    """Split dim `split_dim` into split_count blocks, exchange them, concatenate along `concat_dim`."""

    def __init__(self, split_count: int, split_dim: int, concat_dim: int, group: str = GlobalComm.WORLD_COMM_GROUP):
        super().__init__(group, split_count=split_count, split_dim=split_dim, concat_dim=concat_dim)

    def _eager(self, array):
        from tessel.communication import comm_func

        return comm_func.all_to_all(array, self.attrs["split_dim"], self.attrs["concat_dim"], self.group)
