"""Functional collectives on host arrays, run by this rank's daemon (MindSpore's `communication.comm_func`).

Each call is one Execute round trip: the input is fed, the collective runs on the daemon's plugin, the result
comes back. Ranks named in arguments (`src`, `dst`, `send_rank_ids`, …) are world ranks, as in MindSpore.
With `async_op=True` a `CommHandle` is returned; `handle.wait()` gives the result.

    from tessel.communication import init, comm_func
    init()
    total = comm_func.all_reduce(np.ones(4, np.float32))   # = world size everywhere
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel.communication import _WORLD_ALIASES, GlobalComm, _ranks
from tessel.communication import runtime as _rt
from tessel.core.errors import ConfigurationError
from tessel.core.wire import wire_dtype
from tessel.v1 import collective_pb2, daemon_pb2


class ReduceOp:
    """MindSpore's reduce op names."""

    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"


_OPS = {
    "sum": collective_pb2.SUM,
    "prod": collective_pb2.PROD,
    "max": collective_pb2.MAX,
    "min": collective_pb2.MIN,
    "mean": collective_pb2.MEAN,
}
_names = itertools.count()


class CommHandle:
    """An asynchronous collective started on the daemon; `wait()` completes it and returns its result."""

    def __init__(self, handle: str, outputs: list[str], single: bool):
        self._handle, self._outputs, self._single, self._result = handle, outputs, single, None
        self._done = False

    def wait(self) -> Any:
        if not self._done:
            program = daemon_pb2.Program(
                instructions=[daemon_pb2.Instruction(wait=daemon_pb2.WaitOp(handle=self._handle))]
            )
            self._result = _run(program, self._outputs)
            self._done = True
        if not self._outputs:
            return None
        return self._result[0] if self._single else self._result


def _group_name(group: str | None) -> str:
    return "" if group in _WORLD_ALIASES else group


def _group_rank(world_rank: int, group: str | None, what: str) -> int:
    ranks = _ranks(group)
    if world_rank not in ranks:
        raise ConfigurationError(f"{what}={world_rank} is not a member of group {group!r} (world ranks {list(ranks)})")
    return ranks.index(world_rank)


def _run(program: daemon_pb2.Program, outputs: list[str], feed: dict | None = None) -> list[np.ndarray]:
    runtime = _rt.current()
    runtime.check()
    program.instructions.append(daemon_pb2.Instruction(free=daemon_pb2.FreeOp(names=list(feed or ()))))
    fetched = runtime.daemon.execute(runtime.session_id, program, fetch=outputs, feed=feed).fetched
    if outputs:
        runtime.daemon.free(runtime.session_id, outputs)
    return [fetched[n] for n in outputs]


def _collective(op: daemon_pb2.CollectiveOp, inputs: list[np.ndarray], n_out: int, async_op: bool) -> Any:
    tag = next(_names)
    feed = {f"cf{tag}.in{i}": np.asarray(x) for i, x in enumerate(inputs)}
    outputs = [f"cf{tag}.out{i}" for i in range(n_out)]
    op.inputs[:] = list(feed)
    op.outputs[:] = outputs
    if async_op:
        op.handle = f"cf{tag}"
        _run(daemon_pb2.Program(instructions=[daemon_pb2.Instruction(collective=op)]), [], feed)
        return CommHandle(op.handle, outputs, n_out == 1)
    result = _run(daemon_pb2.Program(instructions=[daemon_pb2.Instruction(collective=op)]), outputs, feed)
    return result[0] if n_out == 1 else (result if n_out else None)


def all_reduce(tensor, op: str = ReduceOp.SUM, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False):
    if op not in _OPS:
        raise ConfigurationError(f"unknown reduce op {op!r}; use one of {sorted(_OPS)}")
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_REDUCE, op=_OPS[op], group=_group_name(group))
    return _collective(spec, [tensor], 1, async_op)


def all_gather_into_tensor(tensor, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False):
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_GATHER, group=_group_name(group))
    return _collective(spec, [tensor], 1, async_op)


def reduce_scatter_tensor(
    tensor, op: str = ReduceOp.SUM, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False
):
    if op not in _OPS:
        raise ConfigurationError(f"unknown reduce op {op!r}; use one of {sorted(_OPS)}")
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.REDUCE_SCATTER, op=_OPS[op], group=_group_name(group))
    return _collective(spec, [tensor], 1, async_op)


def broadcast(tensor, src: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False):
    root = _group_rank(src, group, "src")
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.BROADCAST, root=root, group=_group_name(group))
    return _collective(spec, [tensor], 1, async_op)


def all_to_all(
    tensor, split_dim: int = 0, concat_dim: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False
):
    spec = daemon_pb2.CollectiveOp(
        kind=collective_pb2.ALL_TO_ALL, split_dim=split_dim, concat_dim=concat_dim, group=_group_name(group)
    )
    return _collective(spec, [tensor], 1, async_op)


def neighbor_exchange(
    tensors: Sequence,
    send_rank_ids: Sequence[int],
    recv_rank_ids: Sequence[int],
    recv_shapes: Sequence[Sequence[int]],
    recv_type=np.float32,
    group: str = GlobalComm.WORLD_COMM_GROUP,
    async_op: bool = False,
):
    """Send tensors[i] to send_rank_ids[i]; return one tensor of recv_shapes[j] from each recv_rank_ids[j]."""
    if len(tensors) != len(send_rank_ids) or len(recv_shapes) != len(recv_rank_ids):
        raise ConfigurationError(
            f"neighbor_exchange: {len(tensors)} tensors for {len(send_rank_ids)} send ranks, "
            f"{len(recv_shapes)} shapes for {len(recv_rank_ids)} recv ranks; the lengths must match"
        )
    spec = daemon_pb2.CollectiveOp(
        kind=collective_pb2.NEIGHBOR_EXCHANGE,
        group=_group_name(group),
        send_ranks=[_group_rank(r, group, "send rank") for r in send_rank_ids],
        recv_ranks=[_group_rank(r, group, "recv rank") for r in recv_rank_ids],
        recv_shapes=[daemon_pb2.TensorShape(dims=list(s)) for s in recv_shapes],
        recv_dtype=wire_dtype(np.dtype(recv_type)),
    )
    result = _collective(spec, list(tensors), len(recv_rank_ids), async_op)
    return [result] if len(recv_rank_ids) == 1 and not async_op else result


def send(tensor, dst: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False):
    spec = daemon_pb2.CollectiveOp(
        kind=collective_pb2.SEND, peer=_group_rank(dst, group, "dst"), group=_group_name(group)
    )
    return _collective(spec, [tensor], 0, async_op)


def recv(tensor, src: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False):
    """Receive into a new array shaped and typed like `tensor` (MindSpore passes a template tensor)."""
    template = np.asarray(tensor)
    spec = daemon_pb2.CollectiveOp(
        kind=collective_pb2.RECV,
        peer=_group_rank(src, group, "src"),
        group=_group_name(group),
        recv_shapes=[daemon_pb2.TensorShape(dims=list(template.shape))],
        recv_dtype=wire_dtype(template.dtype),
    )
    return _collective(spec, [], 1, async_op)


def barrier(group: str = GlobalComm.WORLD_COMM_GROUP) -> None:
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.BARRIER, group=_group_name(group))
    _collective(spec, [], 0, False)
