"""Collective ops: AllReduce, AllGather, ReduceScatter, Broadcast, AlltoAll, NeighborExchange, Send, Receive,
and Mirror (a tensor replicated over a group: identity forward, AllReduce of its gradient).

`group` is a tuple of global ranks in group-rank order; `root`, `peer`, `send_ranks` and `recv_ranks` are group
ranks (indices into `group`), as on the daemon's wire. Shape inference knows the group size, so AllGather along
`axis` multiplies that dim by it, ReduceScatter divides it. Gradients follow MindSpore's bprops:

    AllReduce(sum)'  = AllReduce(sum)                 AllGather'     = ReduceScatter(sum), same axis
    AllReduce(mean)' = AllReduce(mean)
    AllReduce(max/min)' = AllReduce(sum)(g) * (x == out)   ReduceScatter(sum)' = AllGather, same axis
    AllReduce(prod)' = AllReduce(sum)(g * out) / x    AlltoAll'      = AlltoAll with split/concat dims swapped
    Broadcast'       = g (identity on every rank)     NeighborExchange' = NeighborExchange with send/recv swapped
    Send'            = Receive from the peer          Receive'       = Send to the peer (zeros for its input)

Except Broadcast's, each is the gradient of the sum of every rank's loss. MindSpore's Broadcast' is the
identity (each rank's input gets that rank's own cotangent), not the sum of the cotangents sent to the root;
tessel matches MindSpore. The reduce op attribute is `reduce_op` (MindSpore's `op`), since `apply`'s first
parameter is already called `op`.

Collectives have no ONNX lowering: `lower_rank_program` cuts the graph at them and runs each as a daemon
instruction, described by the `collective` field of its OpDef (registry.Collective). Cost = bytes through this
rank's link (ring algorithms) and the reduction flops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tessel.compiler.builder import apply as op
from tessel.compiler.dtypes import DType, as_dtype
from tessel.compiler.errors import GradientError
from tessel.compiler.ir import TensorType
from tessel.compiler.ops.common import free, infer_same, lower_as, require
from tessel.compiler.registry import REQUIRED, Collective, Cost, register
from tessel.compiler.shapes import format_shape, is_static, normalize_axis, numel
from tessel.compiler.sharding import pointwise
from tessel.core.errors import ConfigurationError
from tessel.core.wire import COLLECTIVE_DTYPES, REDUCE_OPS, wire_dtype
from tessel.v1 import collective_pb2, daemon_pb2

# "mean" (the sum divided by the group size, in the collective's final pass) serves gradients_mean; MindSpore's
# AllReduce does not offer it, so tessel.ops does not either.
# What the daemons' collectives carry.
WIRE_DTYPES = tuple(as_dtype(d) for d in COLLECTIVE_DTYPES)


def group_ranks(attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """The node's group, checked: a non-empty tuple of distinct non-negative global ranks."""
    group = attrs["group"]
    ok = isinstance(group, tuple) and group and all(isinstance(r, int) and r >= 0 for r in group)
    require(
        ok and len(set(group)) == len(group),
        f"group {group!r} must be a non-empty tuple of distinct global ranks, e.g. group=(0, 1); "
        "resolve a group name to its rank ids (communication.create_group) before tracing",
    )
    return group


def _no_onnx(name: str) -> Callable:
    def lower(ctx, node, inputs, outputs):
        raise ConfigurationError(
            f"{name} is a collective and has no ONNX form; lower graphs with collectives through "
            "tessel.compiler.lower_rank_program, which cuts them into ONNX segments and daemon instructions"
        )

    return lower


def _register(name: str, wire: Collective, **fields: Any) -> None:
    register(name, lower=_no_onnx(name), collective=wire, **fields)


# --- checks shared by the inference rules -------------------------------------------------------------------------


def _wire_dtype(t: TensorType, what: str = "input") -> None:
    require(
        t.dtype in WIRE_DTYPES,
        f"{what} dtype {t.dtype.value} cannot travel in a collective; supported: "
        f"{[d.value for d in WIRE_DTYPES]}. Fix: Cast it first (e.g. to float32 or int32)",
    )


def _reduce_op(attrs: Mapping[str, Any]) -> str:
    name = attrs["reduce_op"]
    require(name in REDUCE_OPS, f"reduce_op={name!r} is not a reduce op; use one of {sorted(REDUCE_OPS)}")
    return name


def _static_dim(x: TensorType, axis: int, rule: str) -> int:
    dim = x.shape[axis]
    require(
        isinstance(dim, int),
        f"dim {axis} of {format_shape(x.shape)} is the symbol {dim!r}; {rule}, so it must be static. "
        "Fix: collect along a dim of fixed size, or trace with a fixed batch size",
    )
    return dim


def _divisible(x: TensorType, axis: int, n: int, rule: str) -> int:
    dim = _static_dim(x, axis, rule)
    require(
        dim % n == 0,
        f"dim {axis} of {format_shape(x.shape)} has size {dim}, which does not divide by the group size {n}; "
        f"{rule}. Fix: pad dim {axis} to a multiple of {n} or use a group whose size divides it",
    )
    return dim // n


def _group_index(value: Any, n: int, what: str) -> int:
    require(
        isinstance(value, int) and 0 <= value < n,
        f"{what}={value!r} must be a group rank in 0..{n - 1} (an index into group, not a global rank)",
    )
    return value


def _resized(x: TensorType, axis: int, size: int) -> TensorType:
    return TensorType((*x.shape[:axis], size, *x.shape[axis + 1 :]), x.dtype)


def _nbytes(t, sizes) -> int:
    return numel(t.shape, sizes) * t.dtype.itemsize


# --- AllReduce ----------------------------------------------------------------------------------------------------


def _infer_all_reduce(types, attrs):
    (x,) = types
    group_ranks(attrs)
    _reduce_op(attrs)
    _wire_dtype(x)
    return (x,)


def _all_reduce_grad(c):
    reduce, group = c.attrs["reduce_op"], c.attrs["group"]
    if c.attrs["uniform_cotangent"] and reduce in ("sum", "mean"):
        # Every rank of the group gets the same cotangent (a replicated output's, seeded alike everywhere, or one
        # the parallel pass proved alike on the dataflow: ParallelPlan.uniform_cotangent): their sum is the group
        # size times it, computed here without a collective.
        return (c.g * float(len(group)) if reduce == "sum" else c.g,)
    if reduce == "prod":
        return (op("AllReduce", c.g * c.out, reduce_op="sum", group=group) / c.x,)
    dx = op("AllReduce", c.g, reduce_op="mean" if reduce == "mean" else "sum", group=group)
    if reduce in ("max", "min"):
        dx = dx * op("Equal", c.x, c.out).astype(dx.dtype)  # the cotangent goes where x was the extremum
    return (dx,)


def _all_reduce_cost(node, sizes):
    n, size = len(node.attrs["group"]), node.inputs[0]
    return Cost(numel(size.shape, sizes) * (n - 1) // n, 2 * (n - 1) * _nbytes(size, sizes) // n)


_register(
    "AllReduce",
    Collective(collective_pb2.ALL_REDUCE, fields=lambda node: {"op": REDUCE_OPS[node.attrs["reduce_op"]]}),
    infer=_infer_all_reduce,
    grad=_all_reduce_grad,
    cost=_all_reduce_cost,
    attrs={"reduce_op": "sum", "group": REQUIRED, "fusion": 0, "uniform_cotangent": 0},
    num_inputs=1,
    doc="AllReduce(x, reduce_op='sum'|'max'|'min'|'prod', group=ranks): every rank gets the reduction over the group. "
    "`fusion` > 0 marks gradient reductions that bucket_allreduce may fuse (MindSpore's fusion attribute). "
    "`uniform_cotangent` = 1 (the parallel pass: on a graph output it sums, and where every value between the result "
    "and the loss is held alike on the group's ranks, as after a row-parallel MatMul before a replicated loss): the "
    "cotangent is the same on every rank of the group, so the gradient (sum or mean) is computed locally, without a "
    "second collective.",
)


# --- AllReduceBucket ----------------------------------------------------------------------------------------------


def _infer_bucket(types, attrs):
    group_ranks(attrs)
    _reduce_op(attrs)
    require(len(types) >= 2, f"AllReduceBucket fuses several tensors, got {len(types)}; use AllReduce for one")
    for t in types:
        _wire_dtype(t)
        require(is_static(t.shape), f"AllReduceBucket needs static shapes, got {format_shape(t.shape)}")
    dtypes = sorted({t.dtype.value for t in types})
    require(len(dtypes) == 1, f"AllReduceBucket tensors must share one dtype, got {dtypes}; bucket each dtype apart")
    return tuple(types)


def _bucket_cost(node, sizes):
    n = len(node.attrs["group"])
    elements = sum(numel(v.shape, sizes) for v in node.inputs)
    nbytes = sum(_nbytes(v, sizes) for v in node.inputs)
    return Cost(elements * (n - 1) // n, 2 * (n - 1) * nbytes // n)


_register(
    "AllReduceBucket",
    Collective(collective_pb2.ALL_REDUCE, fields=lambda node: {"op": REDUCE_OPS[node.attrs["reduce_op"]]}),
    infer=_infer_bucket,
    grad=None,
    cost=_bucket_cost,
    attrs={"reduce_op": "sum", "group": REQUIRED},
    doc="AllReduceBucket(*xs, reduce_op, group): AllReduce of each x, run as one flat reduction (a gradient bucket; "
    "bucket_allreduce emits it after autodiff, so it has no gradient). On the wire: one ALL_REDUCE with several "
    "inputs, which the daemon reduces in one buffer that the producing segment writes into directly.",
)


# --- AllGather ----------------------------------------------------------------------------------------------------

_GATHER_RULE = "AllGather makes that dim group-size times larger"
_SCATTER_RULE = "ReduceScatter gives each rank 1/group-size of that dim"


def _infer_all_gather(types, attrs):
    (x,) = types
    n = len(group_ranks(attrs))
    _wire_dtype(x)
    require(x.ndim >= 1, "AllGather needs a tensor of rank >= 1; ExpandDims a scalar first")
    axis = normalize_axis(attrs["axis"], x.ndim)
    return (_resized(x, axis, n * _static_dim(x, axis, _GATHER_RULE)),)


def _expand_all_gather(rewriter, node):
    """Gather along axis a != 0: each rank's block gets a leading dim of 1, the daemon gathers on dim 0 (giving
    (n, ...)), and a transpose moves that dim in front of a, where a reshape merges them."""
    x, out = node.inputs[0], node.outputs[0]
    axis = normalize_axis(node.attrs["axis"], x.ndim)
    lifted = op("ExpandDims", rewriter.tensor(x), axis=0)
    gathered = op("AllGather", lifted, group=node.attrs["group"], axis=0)
    perm = (*range(1, axis + 1), 0, *range(axis + 1, x.ndim + 1))
    rewriter.alias(out, op("Reshape", op("Transpose", gathered, perm=perm), shape=out.shape).value)


def _gather_cost(node, sizes):
    n = len(node.attrs["group"])
    return Cost(0, (n - 1) * _nbytes(node.inputs[0], sizes))


_register(
    "AllGather",
    Collective(
        collective_pb2.ALL_GATHER,
        needs_expand=lambda node: normalize_axis(node.attrs["axis"], node.inputs[0].ndim) != 0,
        expand=_expand_all_gather,
    ),
    infer=_infer_all_gather,
    grad=lambda c: (op("ReduceScatter", c.g, reduce_op="sum", group=c.attrs["group"], axis=c.attrs["axis"]),),
    cost=_gather_cost,
    attrs={"group": REQUIRED, "axis": 0},
    num_inputs=1,
    doc="AllGather(x, group=ranks, axis=0): every rank's x concatenated along `axis`, in group-rank order.",
)


# --- ReduceScatter ------------------------------------------------------------------------------------------------


def _infer_reduce_scatter(types, attrs):
    (x,) = types
    n = len(group_ranks(attrs))
    _reduce_op(attrs)
    _wire_dtype(x)
    require(x.ndim >= 1, "ReduceScatter needs a tensor of rank >= 1")
    axis = normalize_axis(attrs["axis"], x.ndim)
    return (_resized(x, axis, _divisible(x, axis, n, _SCATTER_RULE)),)


def _reduce_scatter_grad(c):
    if c.attrs["reduce_op"] != "sum":
        raise GradientError(
            f"ReduceScatter(reduce_op={c.attrs['reduce_op']!r}) has no gradient (MindSpore defines it for 'sum' only); "
            "use reduce_op='sum' on differentiable paths"
        )
    return (op("AllGather", c.g, group=c.attrs["group"], axis=c.attrs["axis"]),)


def _expand_reduce_scatter(rewriter, node):
    """Scatter along axis a != 0: split dim a into (n, a/n), move the n to the front, reduce-scatter on dim 0
    (each rank keeps (1, ...)), then drop that dim."""
    x = node.inputs[0]
    n = len(node.attrs["group"])
    axis = normalize_axis(node.attrs["axis"], x.ndim)
    split = (*x.shape[:axis], n, x.shape[axis] // n, *x.shape[axis + 1 :])
    blocks = op("Reshape", rewriter.tensor(x), shape=split)
    front = op("Transpose", blocks, perm=(axis, *range(axis), *range(axis + 1, x.ndim + 1)))
    mine = op("ReduceScatter", front, reduce_op=node.attrs["reduce_op"], group=node.attrs["group"], axis=0)
    rewriter.alias(node.outputs[0], op("Squeeze", mine, axis=0).value)


def _share_cost(reduces: bool) -> Callable:
    """Each rank sends all blocks but its own: (n-1)/n of its input (ReduceScatter also reduces them)."""

    def cost(node, sizes):
        n, x = len(node.attrs["group"]), node.inputs[0]
        return Cost(numel(x.shape, sizes) * (n - 1) // n if reduces else 0, (n - 1) * _nbytes(x, sizes) // n)

    return cost


_register(
    "ReduceScatter",
    Collective(
        collective_pb2.REDUCE_SCATTER,
        fields=lambda node: {"op": REDUCE_OPS[node.attrs["reduce_op"]]},
        needs_expand=lambda node: normalize_axis(node.attrs["axis"], node.inputs[0].ndim) != 0,
        expand=_expand_reduce_scatter,
    ),
    infer=_infer_reduce_scatter,
    grad=_reduce_scatter_grad,
    cost=_share_cost(reduces=True),
    attrs={"reduce_op": "sum", "group": REQUIRED, "axis": 0},
    num_inputs=1,
    doc="ReduceScatter(x, reduce_op='sum', group=ranks, axis=0): reduce over the group; group rank i keeps "
    "block i of `axis`.",
)


# --- Broadcast ----------------------------------------------------------------------------------------------------


def _infer_broadcast(types, attrs):
    (x,) = types
    _group_index(attrs["root"], len(group_ranks(attrs)), "root")
    _wire_dtype(x)
    return (x,)


_register(
    "Broadcast",
    Collective(collective_pb2.BROADCAST, fields=lambda node: {"root": node.attrs["root"]}),
    infer=_infer_broadcast,
    grad=lambda c: (c.g,),  # MindSpore's bprop: the identity (see the module docstring)
    cost=lambda node, sizes: Cost(0, _nbytes(node.inputs[0], sizes)),
    attrs={"root": 0, "group": REQUIRED},
    num_inputs=1,
    doc="Broadcast(x, root=0, group=ranks): every rank gets the root's x (root is a group rank).",
)


# --- AlltoAll -----------------------------------------------------------------------------------------------------


def _infer_all_to_all(types, attrs):
    (x,) = types
    n = len(group_ranks(attrs))
    _wire_dtype(x)
    require(x.ndim >= 1, "AlltoAll needs a tensor of rank >= 1")
    split = normalize_axis(attrs["split_dim"], x.ndim, "split_dim")
    concat = normalize_axis(attrs["concat_dim"], x.ndim, "concat_dim")
    out = _resized(x, split, _divisible(x, split, n, "AlltoAll sends 1/group-size of split_dim to each rank"))
    rule = "AlltoAll makes concat_dim group-size times larger"
    return (_resized(out, concat, n * _static_dim(out, concat, rule)),)


def _all_to_all_fields(node):
    rank = node.inputs[0].ndim
    split, concat = (normalize_axis(node.attrs[k], rank) for k in ("split_dim", "concat_dim"))
    return {"split_dim": split, "concat_dim": concat}


_register(
    "AlltoAll",
    Collective(collective_pb2.ALL_TO_ALL, fields=_all_to_all_fields),
    infer=_infer_all_to_all,
    grad=lambda c: (
        op("AlltoAll", c.g, group=c.attrs["group"], split_dim=c.attrs["concat_dim"], concat_dim=c.attrs["split_dim"]),
    ),
    cost=_share_cost(reduces=False),
    attrs={"group": REQUIRED, "split_dim": 0, "concat_dim": 0},
    num_inputs=1,
    doc="AlltoAll(x, group=ranks, split_dim=0, concat_dim=0): split x into group-size blocks along split_dim, "
    "send block i to group rank i, concatenate what arrives along concat_dim in group-rank order.",
)


# --- NeighborExchange ---------------------------------------------------------------------------------------------


def _shape(value: Any, what: str) -> tuple[int, ...]:
    ok = isinstance(value, tuple) and all(isinstance(d, int) and d >= 0 for d in value)
    require(ok, f"{what}={value!r} must be a static shape (a tuple of ints), e.g. (2, 3)")
    return value


def _shapes(value: Any, what: str) -> tuple[tuple[int, ...], ...]:
    ok = isinstance(value, tuple) and all(isinstance(s, tuple) for s in value)
    require(ok, f"{what}={value!r} must be a tuple of static shapes, e.g. ((2, 3), (4,))")
    return tuple(_shape(s, f"{what} entry") for s in value)


def _infer_neighbor_exchange(types, attrs):
    n = len(group_ranks(attrs))
    sends, recvs = attrs["send_ranks"], attrs["recv_ranks"]
    require(
        isinstance(sends, tuple) and len(types) == len(sends),
        f"{len(types)} input(s) for send_ranks={sends!r}; the rule: one input per send rank",
    )
    require(
        isinstance(recvs, tuple) and len(recvs) > 0,
        "recv_ranks is empty, so the exchange has no output and would be dropped from the graph; "
        "a rank that only sends uses Send",
    )
    for rank in (*sends, *recvs):
        _group_index(rank, n, "send_ranks/recv_ranks entry")
    shapes = _shapes(attrs["recv_shapes"], "recv_shapes")
    require(len(shapes) == len(recvs), f"{len(shapes)} recv_shapes for {len(recvs)} recv_ranks; give one each")
    for t in types:
        _wire_dtype(t)
    dtype = as_dtype(attrs["recv_dtype"])
    _wire_dtype(TensorType((), dtype), "recv_dtype")
    return tuple(TensorType(s, dtype) for s in shapes)


def _neighbor_exchange_grad(c):
    if len({x.dtype for x in c.inputs}) > 1:
        raise GradientError(
            "NeighborExchange sends tensors of several dtypes, but its gradient exchange carries one dtype; "
            "Cast the sent tensors to one dtype"
        )
    grads = [g if g is not None else op("ZerosLike", out) for g, out in zip(c.grads, c.outputs)]
    back = op(
        "NeighborExchange",
        *grads,
        send_ranks=c.attrs["recv_ranks"],
        recv_ranks=c.attrs["send_ranks"],
        recv_shapes=tuple(x.shape for x in c.inputs),
        recv_dtype=c.inputs[0].dtype,
        group=c.attrs["group"],
    )
    return back if isinstance(back, tuple) else (back,)


def _neighbor_exchange_fields(node):
    return {
        "send_ranks": list(node.attrs["send_ranks"]),
        "recv_ranks": list(node.attrs["recv_ranks"]),
        "recv_shapes": [daemon_pb2.TensorShape(dims=list(s)) for s in node.attrs["recv_shapes"]],
        "recv_dtype": wire_dtype(as_dtype(node.attrs["recv_dtype"]).numpy),
    }


def _neighbor_exchange_cost(node, sizes):
    sent = sum(_nbytes(x, sizes) for x in node.inputs)
    return Cost(0, max(sent, sum(_nbytes(y, sizes) for y in node.outputs)))


_register(
    "NeighborExchange",
    Collective(collective_pb2.NEIGHBOR_EXCHANGE, fields=_neighbor_exchange_fields),
    infer=_infer_neighbor_exchange,
    grad=_neighbor_exchange_grad,
    cost=_neighbor_exchange_cost,
    attrs=dict.fromkeys(("send_ranks", "recv_ranks", "recv_shapes", "recv_dtype", "group"), REQUIRED),
    doc="NeighborExchange(*xs, send_ranks, recv_ranks, recv_shapes, recv_dtype, group): send xs[i] to group rank "
    "send_ranks[i]; receive one tensor of recv_shapes[j] from each recv_ranks[j] (one output each).",
)


# --- Send / Receive -----------------------------------------------------------------------------------------------


def _infer_send(types, attrs):
    (x,) = types
    _group_index(attrs["peer"], len(group_ranks(attrs)), "peer")
    _wire_dtype(x)
    return (x,)


def _infer_receive(types, attrs):
    _group_index(attrs["peer"], len(group_ranks(attrs)), "peer")
    shape = _shape(attrs["shape"], "shape")
    dtype = as_dtype(attrs["dtype"])
    _wire_dtype(TensorType((), dtype), "dtype")
    return (TensorType(shape, dtype),)


def _send_grad(c):
    received = op("Receive", c.g, peer=c.attrs["peer"], shape=c.x.shape, dtype=c.x.dtype, group=c.attrs["group"])
    return (received,)


def _receive_grad(c):
    sent = op("Send", c.g, peer=c.attrs["peer"], group=c.attrs["group"])
    return (op("Depend", op("ZerosLike", c.x), sent),)


_register(
    "Send",
    Collective(collective_pb2.SEND, fields=lambda node: {"peer": node.attrs["peer"]}, alias=True),
    infer=_infer_send,
    grad=_send_grad,
    cost=lambda node, sizes: Cost(0, _nbytes(node.inputs[0], sizes)),
    attrs={"peer": REQUIRED, "group": REQUIRED},
    num_inputs=1,
    doc="Send(x, peer, group): send x to group rank `peer`; returns x, so that later ops can depend on the "
    "send (a Send whose result nothing uses is dropped from the graph, like any unused op).",
)


def _receive_fields(node):
    dtype = as_dtype(node.attrs["dtype"])
    return {
        "peer": node.attrs["peer"],
        "recv_shapes": [daemon_pb2.TensorShape(dims=list(node.attrs["shape"]))],
        "recv_dtype": wire_dtype(dtype.numpy),
    }


_register(
    "Receive",
    Collective(collective_pb2.RECV, fields=_receive_fields, wire_inputs=False),
    infer=_infer_receive,
    grad=_receive_grad,
    cost=lambda node, sizes: Cost(0, _nbytes(node.outputs[0], sizes)),
    attrs={"peer": REQUIRED, "shape": REQUIRED, "dtype": DType.float32, "group": REQUIRED},
    num_inputs=1,
    doc="Receive(after, peer, shape, dtype, group): a tensor sent by group rank `peer`. `after` only orders the "
    "receive (MindSpore's Receive input); its gradient sends the cotangent back to the peer.",
)


# --- Mirror and VirtualDiv: the virtual ops of the parallel pass -------------------------------------------------
#
# The virtual ops the parallel pass inserts so that plain autodiff of a rank's graph gives the right gradients
# (MindSpore's `_MirrorOperator` and `_VirtualDiv`). Both are the identity forward; they only act backward:
#
# - `Mirror(w, group)` sits on a parameter held
#   whole by several ranks (replicated over some device-matrix axes): each rank's gradient covers only the part of
#   the computation it ran, so the backward all-reduces (sum) the gradient over exactly the ranks holding the same
#   piece;
# - `VirtualDiv(y, divisor)` sits on a graph output held by `divisor` ranks: autodiff of a rank program
#   differentiates the sum of every rank's outputs, where a replicated output counts `divisor` times, so its
#   cotangent is divided by `divisor`.
#
# With these, and collectives whose gradients are their exact adjoints (AllReduce' = AllReduce, AllGather' =
# ReduceScatter, AlltoAll' = the reverse AlltoAll, StridedSlice' = Pad), `grad_graph(rank_graph, params)` on every
# rank equals the single-device gradient of the parameter's piece.


def _infer_mirror(types, attrs):
    group_ranks(attrs)
    return types[:1]


def _mirror_grad(c):
    n = len(c.attrs["group"])
    if n == 1:
        return (c.g,)
    # With mean, the collective divides in its last pass over the data; a Mul after it would be one more pass
    # over every gradient (and, fused into buckets, one per piece after the split).
    reduce = "mean" if c.attrs["mean"] else "sum"
    g = c.g
    if c.attrs["fp32_sync"] and g.dtype == DType.float16:  # MindSpore's gradient_fp32_sync
        summed = op(
            "AllReduce", g.astype(DType.float32), reduce_op=reduce, group=c.attrs["group"], fusion=c.attrs["fusion"]
        )  # fused with the other float32 reductions of its index, as the parameter's comm_fusion says
        return (summed.astype(DType.float16),)
    return (op("AllReduce", g, reduce_op=reduce, group=c.attrs["group"], fusion=c.attrs["fusion"]),)


register(
    "Mirror",
    infer=_infer_mirror,
    sharding=pointwise,
    lower=lambda ctx, node, inputs, outputs: ctx.add("Identity", inputs, outputs),
    identity=True,
    grad=_mirror_grad,
    cost=free,
    attrs={"group": REQUIRED, "mean": False, "fusion": 1, "fp32_sync": False},
    num_inputs=1,
    doc="Mirror(x, group, mean=False, fusion=1, fp32_sync=False): x, marked as replicated over `group`: its gradient "
    "is the AllReduce(sum) of the incoming gradient (times 1/len(group) with mean), like MindSpore's "
    "_MirrorOperator; with fp32_sync a float16 gradient is reduced in float32 (MindSpore's gradient_fp32_sync). "
    "Data parallelism puts one on every parameter; bucket_allreduce fuses their reductions.",
)
register(
    "VirtualDiv",
    infer=infer_same,
    sharding=pointwise,
    lower=lower_as("Identity"),
    identity=True,
    grad=lambda c: (c.g * (1.0 / c.attrs["divisor"]),),
    cost=free,
    attrs={"divisor": REQUIRED},
    num_inputs=1,
    doc="VirtualDiv(y, divisor): identity; its gradient is divided by `divisor` (an output held by that many ranks).",
)
