"""Functional collectives run by this rank's daemon (MindSpore's `communication.comm_func`).

Each call is one Execute round trip: the input is fed, the collective runs on the daemon's plugin, the result
comes back as a Tensor. Ranks named in arguments (`src`, `dst`, `send_rank_ids`, …) are world ranks, as in
MindSpore. Inputs are Tensors (numpy arrays are taken too). Returns are MindSpore's: `all_reduce`,
`all_gather_into_tensor` and `reduce_scatter_tensor` return `(Tensor, CommHandle)`, the handle None unless
`async_op=True`; `broadcast` and `recv` a Tensor; `send` and `barrier` None; `isend` a CommHandle, `irecv`
`(Tensor, CommHandle)`. An asynchronous call's Tensor holds the result once `handle.wait()` has returned.

    import tessel as ms
    from tessel.communication import init, comm_func
    init()
    total, _ = comm_func.all_reduce(ms.Tensor(np.ones(4, np.float32)))   # = world size everywhere
    out, handle = comm_func.all_reduce(ms.Tensor(np.ones(4, np.float32)), async_op=True)
    handle.wait()                                                         # out now holds the sum
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tessel.communication import _WORLD_ALIASES, GlobalComm, _ranks
from tessel.communication import runtime as _rt
from tessel.core.errors import ConfigurationError
from tessel.core.options import not_supported_yet
from tessel.core.wire import wire_dtype
from tessel.v1 import collective_pb2, daemon_pb2

if TYPE_CHECKING:  # tessel.common imports tessel.ops, which imports this module's ReduceOp
    from tessel.common.tensor import Tensor


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
    """An asynchronous collective started on the daemon (MindSpore's CommHandle). `wait()` blocks until it is
    done and fills the Tensors the call returned; it returns None, as in MindSpore."""

    def __init__(self, handle: str, outputs: list[str], tensors: list[Tensor]):
        self._handle, self._outputs, self._tensors = handle, outputs, tensors
        self._done = False
        self._then: list = []  # what a composed call does with the results once they are in (a concatenation)

    def wait(self) -> None:
        if self._done:
            return
        program = daemon_pb2.Program(instructions=[daemon_pb2.Instruction(wait=daemon_pb2.WaitOp(handle=self._handle))])
        for tensor, array in zip(self._tensors, _run(program, self._outputs)):
            tensor._set_host(np.asarray(array))
        self._done = True
        for then in self._then:
            then()


def _group_name(group: str | None) -> str:
    return "" if group in _WORLD_ALIASES else group


def _group_rank(world_rank: int, group: str | None, what: str) -> int:
    ranks = _ranks(group)
    if world_rank not in ranks:
        raise ConfigurationError(f"{what}={world_rank} is not a member of group {group!r} (world ranks {list(ranks)})")
    return ranks.index(world_rank)


def _tensor(array: np.ndarray) -> Tensor:
    from tessel.common.tensor import Tensor

    return Tensor._wrap(np.asarray(array))


def _host(x: Any) -> np.ndarray:
    from tessel.common.tensor import Tensor

    return x.asnumpy() if isinstance(x, Tensor) else np.asarray(x)


def _check_int(call: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigurationError(f"{call}: {name} must be an int (MindSpore's rule), got {value!r}; e.g. {name}=0")
    return int(value)


def _check_async(call: str, async_op: Any) -> bool:
    if not isinstance(async_op, (bool, np.bool_)):
        raise ConfigurationError(f"{call}: async_op must be a bool, got {async_op!r}; pass async_op=True or False")
    return bool(async_op)


def _check_op(call: str, op: Any) -> int:
    if op not in _OPS:
        raise ConfigurationError(f"{call}: unknown reduce op {op!r}; use one of {sorted(_OPS)} (e.g. ReduceOp.SUM)")
    return _OPS[op]


def _check_tag(call: str, tag: Any) -> None:
    """MindSpore pairs a send with the receive of the same `tag`; tessel pairs them in call order, which is the
    same thing only when every tag is 0."""
    if _check_int(call, "tag", tag) != 0:
        raise not_supported_yet(
            f"{call}(tag={tag})",
            "tessel matches sends and receives between two ranks in call order, not by tag; pass tag=0 (the "
            "default) on both sides and issue the receives in the order of the sends",
        )


def _run(program: daemon_pb2.Program, outputs: list[str], feed: dict | None = None) -> list[np.ndarray]:
    runtime = _rt.current()
    runtime.check()
    program.instructions.append(daemon_pb2.Instruction(free=daemon_pb2.FreeOp(names=list(feed or ()))))
    fetched = runtime.daemon.execute(runtime.session_id, program, fetch=outputs, feed=feed).fetched
    if outputs:
        runtime.daemon.free(runtime.session_id, outputs)
    return [fetched[n] for n in outputs]


def _collective(
    op: daemon_pb2.CollectiveOp, inputs: list[np.ndarray], results: Sequence[tuple[tuple, Any]], async_op: bool
) -> tuple[list[Tensor], CommHandle | None]:
    """Run `op`; `results` gives each output's (shape, dtype), which an async call's Tensors hold until wait()."""
    tag = next(_names)
    feed = {f"cf{tag}.in{i}": x for i, x in enumerate(inputs)}
    outputs = [f"cf{tag}.out{i}" for i in range(len(results))]
    op.inputs[:] = list(feed)
    op.outputs[:] = outputs
    if not async_op:
        got = _run(daemon_pb2.Program(instructions=[daemon_pb2.Instruction(collective=op)]), outputs, feed)
        return [_tensor(a) for a in got], None
    op.handle = f"cf{tag}"
    _run(daemon_pb2.Program(instructions=[daemon_pb2.Instruction(collective=op)]), [], feed)
    tensors = [_tensor(np.zeros(shape, dtype)) for shape, dtype in results]
    return tensors, CommHandle(op.handle, outputs, tensors)


def _reduced(call: str, spec: daemon_pb2.CollectiveOp, x: np.ndarray, shape: tuple, async_op: bool):
    """A reduction of `x`; float16 runs in float32 under force_fp32_communication, as in compiled graphs."""
    from tessel import context

    if x.dtype != np.float16 or not context.get_auto_parallel_context("force_fp32_communication"):
        (out,), handle = _collective(spec, [x], [(shape, x.dtype)], async_op)
        return out, handle
    if async_op:
        raise not_supported_yet(
            f"{call}(async_op=True) of float16 under force_fp32_communication",
            "only the synchronous call casts to float32 and back; pass async_op=False",
        )
    (out,), _ = _collective(spec, [x.astype(np.float32)], [(shape, np.float32)], False)
    return _tensor(out.asnumpy().astype(np.float16)), None


def _in_graph(call: str, async_op: bool) -> bool:
    """Whether this call is traced into a compiled graph (GRAPH_MODE, jit, value_and_grad): it is then the
    collective primitive's op, differentiable, as MindSpore's comm_func builds its primitives."""
    from tessel.common.tracing import current

    if current() is None:
        return False
    if async_op:
        raise not_supported_yet(
            f"{call}(async_op=True) inside a compiled graph", "a graph waits where the result is read; drop async_op"
        )
    return True


def all_reduce(tensor, op: str = ReduceOp.SUM, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False):
    """Reduce `tensor` over `group`; returns (Tensor, CommHandle), the handle None unless async_op=True."""
    kind = _check_op("all_reduce", op)
    async_op = _check_async("all_reduce", async_op)
    if _in_graph("all_reduce", async_op):
        from tessel.ops.comm import AllReduce

        return AllReduce(op, group)(tensor), None
    x = _host(tensor)
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_REDUCE, op=kind, group=_group_name(group))
    return _reduced("all_reduce", spec, x, x.shape, async_op)


def all_gather_into_tensor(tensor, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False):
    """Concatenate every group rank's `tensor` along dim 0; returns (Tensor, CommHandle)."""
    async_op = _check_async("all_gather_into_tensor", async_op)
    if _in_graph("all_gather_into_tensor", async_op):
        from tessel.ops.comm import AllGather

        return AllGather(group)(tensor), None
    x = _host(tensor)
    shape = (x.shape[0] * len(_ranks(group)), *x.shape[1:]) if x.ndim else x.shape
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_GATHER, group=_group_name(group))
    (out,), handle = _collective(spec, [x], [(shape, x.dtype)], async_op)
    return out, handle


def reduce_scatter_tensor(
    tensor, op: str = ReduceOp.SUM, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False
):
    """Reduce over `group`, then group rank r keeps block r of dim 0; returns (Tensor, CommHandle)."""
    kind = _check_op("reduce_scatter_tensor", op)
    async_op = _check_async("reduce_scatter_tensor", async_op)
    if _in_graph("reduce_scatter_tensor", async_op):
        from tessel.ops.comm import ReduceScatter

        return ReduceScatter(op, group)(tensor), None
    x = _host(tensor)
    shape = (x.shape[0] // len(_ranks(group)), *x.shape[1:]) if x.ndim else x.shape
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.REDUCE_SCATTER, op=kind, group=_group_name(group))
    return _reduced("reduce_scatter_tensor", spec, x, shape, async_op)


def broadcast(tensor, src: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP):
    """Every rank gets world rank `src`'s `tensor`; returns a Tensor (MindSpore's broadcast has no async_op)."""
    root = _group_rank(_check_int("broadcast", "src", src), group, "src")
    if _in_graph("broadcast", False):
        from tessel.ops.comm import Broadcast

        return Broadcast(root, group)((tensor,))[0]
    x = _host(tensor)
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.BROADCAST, root=root, group=_group_name(group))
    (out,), _ = _collective(spec, [x], [(x.shape, x.dtype)], False)
    return out


def all_to_all(
    tensor, split_dim: int = 0, concat_dim: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP, async_op: bool = False
):
    """tessel's functional form of `ops.AlltoAll` (not a MindSpore comm_func name): split `split_dim` into one
    block per group rank, send block i to group rank i, concatenate along `concat_dim`. Returns
    (Tensor, CommHandle) like MindSpore's all_to_all_single_with_output_shape."""
    async_op = _check_async("all_to_all", async_op)
    x = _host(tensor)
    for name, dim in (("split_dim", split_dim), ("concat_dim", concat_dim)):
        if not -x.ndim <= _check_int("all_to_all", name, dim) < max(x.ndim, 1):
            raise ConfigurationError(
                f"all_to_all: {name}={dim} is not a dim of the {x.ndim}-D input; use one in [{-x.ndim}, {x.ndim})"
            )
    n = len(_ranks(group))
    shape = list(x.shape)
    if x.ndim:
        shape[split_dim] //= n
        shape[concat_dim] *= n
    spec = daemon_pb2.CollectiveOp(
        kind=collective_pb2.ALL_TO_ALL, split_dim=split_dim, concat_dim=concat_dim, group=_group_name(group)
    )
    (out,), handle = _collective(spec, [x], [(tuple(shape), x.dtype)], async_op)
    return out, handle


def _np_dtype(dtype: Any) -> np.dtype:
    from tessel.common.dtype import to_dtype

    try:
        return np.dtype(dtype)
    except TypeError:
        return np.dtype(to_dtype(dtype).numpy)


def neighbor_exchange(
    tensors: Sequence,
    send_rank_ids: Sequence[int],
    recv_rank_ids: Sequence[int],
    recv_shapes: Sequence[Sequence[int]],
    recv_type=np.float32,
    group: str = GlobalComm.WORLD_COMM_GROUP,
    async_op: bool = False,
):
    """tessel's functional form of `ops.NeighborExchange` (not a MindSpore comm_func name): send tensors[i] to
    send_rank_ids[i], receive one tensor of recv_shapes[j] from each recv_rank_ids[j]. Returns
    (tuple of Tensors, CommHandle) like MindSpore's all_to_all_with_output_shape."""
    if len(tensors) != len(send_rank_ids) or len(recv_shapes) != len(recv_rank_ids):
        raise ConfigurationError(
            f"neighbor_exchange: {len(tensors)} tensors for {len(send_rank_ids)} send ranks, "
            f"{len(recv_shapes)} shapes for {len(recv_rank_ids)} recv ranks; the lengths must match"
        )
    async_op = _check_async("neighbor_exchange", async_op)
    outs, handle = _exchange(
        [_host(t) for t in tensors],
        [_group_rank(r, group, "send rank") for r in send_rank_ids],
        [_group_rank(r, group, "recv rank") for r in recv_rank_ids],
        [tuple(s) for s in recv_shapes],
        _np_dtype(recv_type),
        group,
        async_op,
    )
    return tuple(outs), handle


def _send(call: str, tensor, dst, group, tag, async_op: bool) -> CommHandle | None:
    peer = _group_rank(_check_int(call, "dst", dst), group, "dst")
    _check_tag(call, tag)
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.SEND, peer=peer, group=_group_name(group))
    return _collective(spec, [_host(tensor)], [], async_op)[1]


def _recv(call: str, tensor, src, group, tag, async_op: bool) -> tuple[Tensor, CommHandle | None]:
    peer = _group_rank(_check_int(call, "src", src), group, "src")
    _check_tag(call, tag)
    template = _host(tensor)
    spec = daemon_pb2.CollectiveOp(
        kind=collective_pb2.RECV,
        peer=peer,
        group=_group_name(group),
        recv_shapes=[daemon_pb2.TensorShape(dims=list(template.shape))],
        recv_dtype=wire_dtype(template.dtype),
    )
    (out,), handle = _collective(spec, [], [(template.shape, template.dtype)], async_op)
    return out, handle


def send(tensor, dst: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP, tag: int = 0) -> None:
    """Send `tensor` to world rank `dst` and wait until it is sent (MindSpore returns nothing)."""
    _send("send", tensor, dst, group, tag, False)


def recv(tensor, src: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP, tag: int = 0) -> Tensor:
    """Receive from world rank `src` a new Tensor shaped and typed like `tensor` (its values are not used)."""
    return _recv("recv", tensor, src, group, tag, False)[0]


def isend(tensor, dst: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP, tag: int = 0) -> CommHandle:
    """Start sending `tensor` to world rank `dst`; returns the CommHandle to wait on. A rank's isends to one
    peer run in issue order, and so do its irecvs from one peer; different peers and directions progress together
    (a ring of isend then irecv on every rank works)."""
    return _send("isend", tensor, dst, group, tag, True)


def irecv(tensor, src: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP, tag: int = 0):
    """Start receiving from world rank `src`; returns (Tensor, CommHandle): the Tensor, shaped and typed like
    `tensor`, holds the data once handle.wait() has returned."""
    return _recv("irecv", tensor, src, group, tag, True)


def _exchange(
    sends: list[np.ndarray],
    send_ranks: list[int],
    recv_ranks: list[int],
    recv_shapes: list[tuple],
    dtype: np.dtype,
    group: str | None,
    async_op: bool,
) -> tuple[list[Tensor], CommHandle | None]:
    """One neighbor exchange over `group` (ranks are group ranks; every group rank takes part, each with its own
    lists); the received Tensors in `recv_ranks` order."""
    spec = daemon_pb2.CollectiveOp(
        kind=collective_pb2.NEIGHBOR_EXCHANGE,
        group=_group_name(group),
        send_ranks=send_ranks,
        recv_ranks=recv_ranks,
        recv_shapes=[daemon_pb2.TensorShape(dims=list(shape)) for shape in recv_shapes],
        recv_dtype=wire_dtype(dtype),
    )
    return _collective(spec, sends, [(tuple(shape), dtype) for shape in recv_shapes], async_op)


def _meaningless(dtype: np.dtype) -> Tensor:
    """What MindSpore gives the ranks a rooted collective does not deliver to: a tensor of shape [1]."""
    return _tensor(np.zeros(1, dtype))


def gather_into_tensor(tensor, dst: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP) -> Tensor:
    """World rank `dst` gets every group rank's `tensor` concatenated along dim 0 (group-rank order); the other ranks
    get a tensor of shape [1] with no meaning, as in MindSpore. Every rank's tensor has the same shape."""
    root = _group_rank(_check_int("gather_into_tensor", "dst", dst), group, "dst")
    x = _host(tensor)
    if x.ndim == 0:
        raise ConfigurationError("gather_into_tensor: the tensor is a scalar; pass one with a dim 0 to gather along")
    n, me = len(_ranks(group)), _group_rank(_rt.current().rank, group, "this rank")
    receives = list(range(n)) if me == root else []
    parts, _ = _exchange([x], [root], receives, [x.shape] * len(receives), x.dtype, group, False)
    return _tensor(np.concatenate([p.asnumpy() for p in parts])) if me == root else _meaningless(x.dtype)


def scatter_tensor(tensor, src: int = 0, group: str = GlobalComm.WORLD_COMM_GROUP) -> Tensor:
    """World rank `src` cuts its `tensor` along dim 0 into one block per group rank and sends block i to group rank
    i; every rank returns its block, of shape (x_1 / group size, x_2, ...). Every rank passes a tensor of the same
    shape and dtype (only `src`'s values are read)."""
    root = _group_rank(_check_int("scatter_tensor", "src", src), group, "src")
    x = _host(tensor)
    n, me = len(_ranks(group)), _group_rank(_rt.current().rank, group, "this rank")
    if x.ndim == 0 or x.shape[0] % n:
        raise ConfigurationError(
            f"scatter_tensor: dim 0 of the {x.shape} tensor must divide into the group's {n} ranks; pad or cut it"
        )
    block = (x.shape[0] // n, *x.shape[1:])
    sends = list(np.split(x, n)) if me == root else []
    (out,), _ = _exchange(sends, list(range(n)) if me == root else [], [root], [block], x.dtype, group, False)
    return out


def reduce(tensor, dst: int, op: str = ReduceOp.SUM, group: str = GlobalComm.WORLD_COMM_GROUP) -> Tensor:
    """World rank `dst` gets the reduction of every group rank's `tensor`; the other ranks get a tensor of shape [1]
    with no meaning, as in MindSpore."""
    root = _check_int("reduce", "dst", dst)
    _group_rank(root, group, "dst")
    reduced, _ = all_reduce(tensor, op, group)
    return reduced if _rt.current().rank == root else _meaningless(reduced.asnumpy().dtype)


def _shape_of(call: str, what: str, value: Any) -> tuple[int, ...]:
    from tessel.common.tensor import Tensor

    if isinstance(value, Tensor):
        return tuple(value.shape)
    if isinstance(value, (tuple, list)) and all(isinstance(d, (int, np.integer)) and d >= 0 for d in value):
        return tuple(int(d) for d in value)
    raise ConfigurationError(f"{call}: {what} must be a Tensor or a tuple of non-negative ints, got {value!r}")


def all_to_all_with_output_shape(
    output_shape_list, tensor_list, group: str | None = None, async_op: bool = False
) -> tuple[tuple[Tensor, ...], CommHandle | None]:
    """Send tensor_list[i] to group rank i and receive from group rank i a tensor of output_shape_list[i] (a shape
    or a Tensor giving it); returns (tuple of Tensors, CommHandle), the handle None unless async_op=True. The
    tensors share one dtype."""
    call = "all_to_all_with_output_shape"
    async_op = _check_async(call, async_op)
    n = len(_ranks(group))
    if len(tensor_list) != n or len(output_shape_list) != n:
        raise ConfigurationError(
            f"{call}: {len(tensor_list)} tensors and {len(output_shape_list)} output shapes for a group of {n} "
            "ranks; pass one of each per group rank"
        )
    sends = [_host(t) for t in tensor_list]
    dtypes = {x.dtype for x in sends}
    if len(dtypes) != 1:
        raise ConfigurationError(f"{call}: the tensors have dtypes {sorted(map(str, dtypes))}; cast them to one")
    shapes = [_shape_of(call, "each output shape", s) for s in output_shape_list]
    outs, handle = _exchange(sends, list(range(n)), list(range(n)), shapes, sends[0].dtype, group, async_op)
    return tuple(outs), handle


def _split_sizes(call: str, what: str, sizes: Any, total: int, n: int) -> list[int]:
    if sizes is None:
        if total % n:
            raise ConfigurationError(
                f"{call}: dim 0 ({total}) does not divide into the group's {n} ranks; give {what} explicitly"
            )
        return [total // n] * n
    sizes = [_check_int(call, what, s) for s in sizes]
    if len(sizes) != n or min(sizes) < 0 or sum(sizes) != total:
        raise ConfigurationError(
            f"{call}: {what}={sizes} must be {n} non-negative sizes (one per group rank) summing to dim 0, {total}"
        )
    return sizes


def all_to_all_single_with_output_shape(
    output_shape,
    tensor,
    output_split_sizes=None,
    input_split_sizes=None,
    group: str | None = None,
    async_op: bool = False,
) -> tuple[Tensor, CommHandle | None]:
    """Cut `tensor` along dim 0 by input_split_sizes (equal blocks if None), send block i to group rank i, and
    concatenate the blocks received, output_split_sizes rows from each group rank, into one tensor of
    `output_shape` (a shape or a Tensor giving it). Returns (Tensor, CommHandle), the handle None unless
    async_op=True; an empty result is a 0 scalar, as in MindSpore."""
    call = "all_to_all_single_with_output_shape"
    async_op = _check_async(call, async_op)
    x, shape, n = _host(tensor), _shape_of(call, "output_shape", output_shape), len(_ranks(group))
    if x.ndim == 0 or not shape:
        raise ConfigurationError(f"{call}: the tensor and output_shape need a dim 0 to split along")
    if tuple(x.shape[1:]) != shape[1:]:
        raise ConfigurationError(f"{call}: output_shape {shape} and the tensor's {x.shape} differ after dim 0")
    sent = _split_sizes(call, "input_split_sizes", input_split_sizes, x.shape[0], n)
    got = _split_sizes(call, "output_split_sizes", output_split_sizes, shape[0], n)
    sends = np.split(x, np.cumsum(sent)[:-1])
    blocks, handle = _exchange(
        sends, list(range(n)), list(range(n)), [(g, *shape[1:]) for g in got], x.dtype, group, async_op
    )
    empty = not int(np.prod(shape))
    result = _tensor(np.zeros((), x.dtype) if empty else np.zeros(shape, x.dtype))

    def join() -> None:
        if not empty:
            result._set_host(np.concatenate([b.asnumpy() for b in blocks]))

    if handle is None:
        join()
    else:
        handle._then.append(join)
    return result, handle


class P2POp:
    """One isend or irecv of a `batch_isend_irecv` (MindSpore's P2POp). `op` is "isend" / "irecv" or the function
    itself; `tensor` the Tensor to send or one shaped and typed like the one to receive (for irecv also a shape
    tuple, with `recv_dtype`); `peer` a world rank; `tag` must be 0."""

    def __init__(self, op, tensor, peer: int, group: str | None = None, tag: int = 0, *, recv_dtype=None):
        name = op if isinstance(op, str) else getattr(op, "__name__", repr(op))
        if name not in ("isend", "irecv"):
            raise ConfigurationError(f"P2POp: op must be 'isend' or 'irecv' (or those functions), got {op!r}")
        from tessel.common.tensor import Tensor

        if not isinstance(tensor, (Tensor, np.ndarray, tuple)) or (isinstance(tensor, tuple) and name == "isend"):
            raise ConfigurationError(
                f"P2POp: {name} takes a Tensor{' or a shape tuple' if name == 'irecv' else ''}, got {type(tensor)}"
            )
        if isinstance(tensor, tuple) and recv_dtype is None:
            raise ConfigurationError("P2POp: an irecv given a shape needs recv_dtype, e.g. recv_dtype=ms.float32")
        _check_tag("P2POp", tag)
        self.op, self.tensor, self.peer = name, tensor, _check_int("P2POp", "peer", peer)
        self.group, self.tag, self.recv_dtype = group, tag, recv_dtype


def batch_isend_irecv(p2p_op_list) -> tuple[Tensor, ...]:
    """Start every P2POp of the list, then wait for all of them; returns one Tensor per op: what an irecv received,
    a 0 scalar of no meaning for an isend (MindSpore's). The ops share one group; sends to a peer, and receives from
    one, pair up in list order with the peer's."""
    ops = list(p2p_op_list)
    if not ops or not all(isinstance(op, P2POp) for op in ops):
        raise ConfigurationError("batch_isend_irecv: p2p_op_list must be a non-empty list of P2POp")
    groups = {_group_name(op.group) for op in ops}  # None and the world's names are one group
    if len(groups) != 1:
        raise ConfigurationError(f"batch_isend_irecv: the P2POps name groups {sorted(map(str, groups))}; use one")
    group = ops[0].group if ops[0].group is not None else GlobalComm.WORLD_COMM_GROUP
    started = []
    for op in ops:
        if op.op == "isend":
            started.append((_tensor(np.zeros((), _host(op.tensor).dtype)), isend(op.tensor, op.peer, group)))
        else:
            like = np.zeros(op.tensor, _np_dtype(op.recv_dtype)) if isinstance(op.tensor, tuple) else op.tensor
            started.append(irecv(like, op.peer, group))
    failure = None
    for _, handle in started:  # every handle is waited on, also after a failure
        try:
            handle.wait()
        except Exception as exc:  # the first failure is raised once all ended
            failure = failure or exc
    if failure is not None:
        raise failure
    return tuple(result for result, _ in started)


def barrier(group: str = GlobalComm.WORLD_COMM_GROUP) -> None:
    spec = daemon_pb2.CollectiveOp(kind=collective_pb2.BARRIER, group=_group_name(group))
    _collective(spec, [], [], False)


__all__ = [
    "CommHandle",
    "P2POp",
    "ReduceOp",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all",
    "all_to_all_single_with_output_shape",
    "all_to_all_with_output_shape",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "gather_into_tensor",
    "irecv",
    "isend",
    "neighbor_exchange",
    "recv",
    "reduce",
    "reduce_scatter_tensor",
    "scatter_tensor",
    "send",
]
