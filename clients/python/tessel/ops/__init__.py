"""`tessel.ops` — MindSpore's operators: Primitive classes (`ops.MatMul()`), functional forms (`ops.matmul`),
communication primitives (`ops.AllReduce`) and `ops.ReduceOp`.

    >>> from tessel import ops
    >>> matmul = ops.MatMul().shard(((1, 1), (1, 2)))     # the strategy is kept for the parallel pass
"""

from tessel.common.mindspore_names import OPS
from tessel.common.support import unsupported_names
from tessel.communication.comm_func import ReduceOp
from tessel.ops import functional
from tessel.ops.adaptive import adaptive_avg_pool2d, adaptive_max_pool2d
from tessel.ops.comm import AllGather, AllReduce, AlltoAll, Broadcast, NeighborExchange, ReduceScatter
from tessel.ops.composed import *  # noqa: F403 - composed functional forms are ops.<name> too
from tessel.ops.composed import max, min  # shadow builtins: named explicitly
from tessel.ops.functional import *  # noqa: F403 - the functional forms are ops.<name>
from tessel.ops.functional import (  # explicit names that star-import would skip or that shadow builtins
    abs,
    all,
    any,
    pow,
    round,
    sum,
)
from tessel.ops.halo import NeighborExchangeV2
from tessel.ops.primitive import *  # noqa: F403
from tessel.ops.primitive import Primitive

_missing = unsupported_names(
    "mindspore.ops", OPS, "tessel does not implement it yet (README: the API table lists the ops that run)"
)


def __getattr__(name: str):
    # Autodiff lives in tessel.autograd, which imports nn-level code; load it on first use.
    if name in ("GradOperation", "grad", "value_and_grad"):
        from tessel import autograd as _grad

        return getattr(_grad, name)
    return _missing(name)


__all__ = ["AllGather", "AllReduce", "AlltoAll", "Broadcast", "NeighborExchange", "NeighborExchangeV2", "Primitive"]
__all__ += ["adaptive_avg_pool2d", "adaptive_max_pool2d"]
__all__ += ["ReduceOp", "ReduceScatter", "functional"]
__all__ += ["abs", "all", "any", "max", "min", "pow", "round", "sum"]
