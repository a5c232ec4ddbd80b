"""`communication.comm_func` returns what MindSpore documents (r2.4+): all_reduce, all_gather_into_tensor and
reduce_scatter_tensor give `(Tensor, CommHandle)`, the handle None unless async_op=True, so MindSpore's
`output, _ = comm_func.all_reduce(x)` unpacks the pair (it must never split a bare array along dim 0); broadcast
and recv give a Tensor; an async call's Tensor is filled by handle.wait(). send/recv have MindSpore's signature
(tag 4th) and refuse a tag they cannot honour; create_group refuses options and repeated ranks.

The embedded daemon is a world of 1 (every collective returns its input); a recording fake daemon plays a world
of 2 whose other rank holds the same tensor, for the reductions, shapes and the async path."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import tessel as ms
import tessel.communication as comm
from tessel.communication import comm_func
from tessel.communication import runtime as rt
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.v1 import collective_pb2

WORLD = comm.GlobalComm.WORLD_COMM_GROUP
X = np.arange(16, dtype=np.float32).reshape(2, 8) - 5


def _tensor(array=X):
    return ms.Tensor(np.array(array))


@pytest.fixture
def world_of_1():
    comm.init()
    return rt.current()


# --- a world of 1 on the embedded daemon ---------------------------------------------------------------------------


def test_all_reduce_unpacks_as_in_mindspores_example(world_of_1):
    input_tensor = ms.Tensor(np.ones([2, 8]).astype(np.float32))
    output, handle = comm.comm_func.all_reduce(input_tensor)
    assert isinstance(output, ms.Tensor) and handle is None
    assert output.shape == (2, 8)  # a bare (2, 8) array would have unpacked into two rows of 8
    np.testing.assert_array_equal(output.asnumpy(), np.ones([2, 8], np.float32))


@pytest.mark.parametrize("op", [comm_func.ReduceOp.SUM, comm_func.ReduceOp.MAX, comm_func.ReduceOp.MIN, "prod"])
def test_all_reduce_of_one_rank_is_its_input(world_of_1, op):
    output, handle = comm_func.all_reduce(_tensor(), op)
    assert handle is None and output.dtype == ms.float32
    np.testing.assert_array_equal(output.asnumpy(), X)


def test_all_gather_and_reduce_scatter_return_a_tensor_and_no_handle(world_of_1):
    gathered, handle = comm_func.all_gather_into_tensor(_tensor())
    assert isinstance(gathered, ms.Tensor) and handle is None and gathered.shape == (2, 8)
    np.testing.assert_array_equal(gathered.asnumpy(), X)
    scattered, handle = comm_func.reduce_scatter_tensor(_tensor())
    assert isinstance(scattered, ms.Tensor) and handle is None and scattered.shape == (2, 8)
    np.testing.assert_array_equal(scattered.asnumpy(), X)


def test_numpy_inputs_still_give_tensors(world_of_1):
    output, _ = comm_func.all_reduce(X)
    assert isinstance(output, ms.Tensor)
    np.testing.assert_array_equal(output.asnumpy(), X)


def test_broadcast_returns_one_tensor_as_in_mindspore(world_of_1):
    out = comm.comm_func.broadcast(tensor=_tensor(), src=0)
    assert isinstance(out, ms.Tensor) and out.shape == (2, 8)
    np.testing.assert_array_equal(out.asnumpy(), X)
    assert list(inspect.signature(comm_func.broadcast).parameters) == ["tensor", "src", "group"]


@pytest.mark.parametrize("call", ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"])
def test_async_call_returns_a_tensor_that_wait_fills(world_of_1, call):
    output, handle = getattr(comm_func, call)(_tensor(), async_op=True)
    assert isinstance(output, ms.Tensor) and isinstance(handle, comm_func.CommHandle)
    assert output.shape == (2, 8)  # the shape is known before the data
    assert handle.wait() is None  # MindSpore's wait() returns nothing: the data is in `output`
    np.testing.assert_array_equal(output.asnumpy(), X)
    handle.wait()  # a second wait is harmless
    np.testing.assert_array_equal(output.asnumpy(), X)


def test_tessel_forms_of_alltoall_and_neighbor_exchange_return_pairs_too(world_of_1):
    out, handle = comm_func.all_to_all(_tensor(), split_dim=1, concat_dim=0)
    assert isinstance(out, ms.Tensor) and handle is None
    np.testing.assert_array_equal(out.asnumpy(), X)
    outs, handle = comm_func.neighbor_exchange([_tensor()], [0], [0], [(2, 8)], ms.float32)
    assert isinstance(outs, tuple) and len(outs) == 1 and handle is None
    np.testing.assert_array_equal(outs[0].asnumpy(), X)
    outs, handle = comm_func.neighbor_exchange([_tensor()], [0], [0], [(2, 8)], np.float32, async_op=True)
    handle.wait()
    np.testing.assert_array_equal(outs[0].asnumpy(), X)


def test_barrier_returns_none(world_of_1):
    assert comm_func.barrier() is None


def test_async_op_must_be_a_bool(world_of_1):
    with pytest.raises(ConfigurationError, match="async_op must be a bool"):
        comm_func.all_reduce(_tensor(), async_op="yes")


def test_p2pops_are_checked_as_mindspore_checks_them():
    with pytest.raises(ConfigurationError, match=r"op must be 'isend' or 'irecv'"):
        comm_func.P2POp("send", _tensor(), 0)
    with pytest.raises(ConfigurationError, match=r"irecv given a shape needs recv_dtype"):
        comm_func.P2POp("irecv", (2, 8), 0)
    with pytest.raises(ConfigurationError, match=r"isend takes a Tensor"):
        comm_func.P2POp(comm_func.isend, (2, 8), 0)
    with pytest.raises(NotSupportedYetError, match=r"P2POp\(tag=1\)"):
        comm_func.P2POp("isend", _tensor(), 0, tag=1)
    with pytest.raises(ConfigurationError, match=r"non-empty list of P2POp"):
        comm_func.batch_isend_irecv([])
    with pytest.raises(AttributeError):
        comm_func.no_such_function  # noqa: B018


def test_rooted_collectives_of_one_rank(world_of_1):
    # MindSpore 2.5's gather_into_tensor, scatter_tensor and reduce: one Tensor, the root's (no handle)
    for out in (comm_func.gather_into_tensor(_tensor(), dst=0), comm_func.reduce(_tensor(), 0)):
        assert isinstance(out, ms.Tensor)
        np.testing.assert_array_equal(out.asnumpy(), X)
    np.testing.assert_array_equal(comm_func.scatter_tensor(_tensor(), src=0).asnumpy(), X)
    with pytest.raises(ConfigurationError, match=r"dst=1 is not a member of group"):
        comm_func.gather_into_tensor(_tensor(), dst=1)
    with pytest.raises(ConfigurationError, match=r"src must be an int"):
        comm_func.scatter_tensor(_tensor(), src="0")


def test_all_to_all_with_output_shapes_of_one_rank(world_of_1):
    (out,), handle = comm_func.all_to_all_with_output_shape([(2, 8)], [_tensor()])
    assert handle is None
    np.testing.assert_array_equal(out.asnumpy(), X)
    single, handle = comm_func.all_to_all_single_with_output_shape(_tensor(), _tensor(), async_op=True)
    handle.wait()  # fills the tensor with the blocks joined
    np.testing.assert_array_equal(single.asnumpy(), X)
    with pytest.raises(ConfigurationError, match=r"1 tensors and 2 output shapes for a group of 1 ranks"):
        comm_func.all_to_all_with_output_shape([(2, 8), (2, 8)], [_tensor()])
    with pytest.raises(ConfigurationError, match=r"input_split_sizes=\[1\] must be 1 non-negative sizes .* 2"):
        comm_func.all_to_all_single_with_output_shape((2, 8), _tensor(), input_split_sizes=[1])
    with pytest.raises(ConfigurationError, match=r"output_shape \(2, 4\) and the tensor's \(2, 8\) differ"):
        comm_func.all_to_all_single_with_output_shape((2, 4), _tensor())


# --- send / recv: MindSpore's signatures -------------------------------------------------------------------------


@pytest.mark.parametrize("name,peer", [("send", "dst"), ("recv", "src"), ("isend", "dst"), ("irecv", "src")])
def test_point_to_point_signatures_are_mindsporess(name, peer):
    params = inspect.signature(getattr(comm_func, name)).parameters
    assert list(params) == ["tensor", peer, "group", "tag"]
    assert [params[p].default for p in (peer, "group", "tag")] == [0, WORLD, 0]


def test_recv_fourth_positional_argument_is_the_tag(world_of_1):
    with pytest.raises(NotSupportedYetError, match=r"recv\(tag=3\).*call order"):
        comm_func.recv(_tensor(), 0, WORLD, 3)
    with pytest.raises(NotSupportedYetError, match=r"send\(tag=3\)"):
        comm_func.send(_tensor(), 0, WORLD, 3)


@pytest.mark.parametrize("tag", ["3", 1.0, True, None])
def test_tag_must_be_an_int(world_of_1, tag):
    with pytest.raises(ConfigurationError, match="tag must be an int"):
        comm_func.recv(_tensor(), 0, WORLD, tag)


def test_async_op_is_not_a_point_to_point_argument(world_of_1):
    with pytest.raises(TypeError):
        comm_func.recv(_tensor(), 0, WORLD, 0, True)
    with pytest.raises(TypeError):
        comm_func.send(_tensor(), async_op=True)


# --- a world of 2 on a recording fake daemon -----------------------------------------------------------------------


class _FakeDaemon:
    """Plays rank 0 of 2; the other rank holds the same tensor (and sends `self.peer_value`)."""

    def __init__(self, peer_value=None):
        self.ops, self.pending, self.store, self.peer_value = [], {}, {}, peer_value

    def _result(self, op, inputs):
        x = inputs[0] if inputs else None
        kind = op.kind
        if kind == collective_pb2.ALL_REDUCE:
            return [x + x]
        if kind == collective_pb2.ALL_GATHER:
            return [np.concatenate([x, x])]
        if kind == collective_pb2.REDUCE_SCATTER:
            return [np.split(x + x, 2)[0]]
        if kind in (collective_pb2.BROADCAST,):
            return [x]
        if kind == collective_pb2.RECV:
            return [np.asarray(self.peer_value)]
        return []

    def execute(self, session_id, program, fetch=(), feed=None):
        feed = dict(feed or {})
        fetched = {}
        for instruction in program.instructions:
            which = instruction.WhichOneof("op")
            if which == "collective":
                op = instruction.collective
                self.ops.append(op)
                results = dict(zip(op.outputs, self._result(op, [feed[n] for n in op.inputs])))
                if op.handle:
                    self.pending[op.handle] = results
                else:
                    self.store.update(results)
            elif which == "wait":
                self.store.update(self.pending.pop(instruction.wait.handle))
        for name in fetch:
            fetched[name] = self.store[name]

        class _Result:
            pass

        result = _Result()
        result.fetched = fetched
        return result

    def free(self, session_id, names):
        for name in names:
            self.store.pop(name, None)

    def create_group(self, session_id, group, ranks):
        self.ops.append(("create_group", group, ranks))


@pytest.fixture
def world_of_2(monkeypatch):
    daemon = _FakeDaemon(peer_value=np.full((2, 8), 7, np.float32))
    fake = rt.Runtime("job", 0, 2, 0, 2, daemon=daemon, session_id="s")
    monkeypatch.setattr(rt, "_runtime", fake)
    return daemon


def test_all_reduce_gives_the_reduction(world_of_2):
    output, handle = comm_func.all_reduce(_tensor())
    assert handle is None and isinstance(output, ms.Tensor)
    np.testing.assert_array_equal(output.asnumpy(), 2 * X)


def test_gather_and_scatter_shapes_over_two_ranks(world_of_2):
    gathered, _ = comm_func.all_gather_into_tensor(_tensor())
    assert gathered.shape == (4, 8)
    np.testing.assert_array_equal(gathered.asnumpy(), np.concatenate([X, X]))
    scattered, _ = comm_func.reduce_scatter_tensor(_tensor())
    assert scattered.shape == (1, 8)
    np.testing.assert_array_equal(scattered.asnumpy(), (2 * X)[:1])


@pytest.mark.parametrize(
    "call,shape,want",
    [
        ("all_reduce", (2, 8), 2 * X),
        ("all_gather_into_tensor", (4, 8), np.concatenate([X, X])),
        ("reduce_scatter_tensor", (1, 8), (2 * X)[:1]),
    ],
)
def test_async_tensor_has_its_shape_at_once_and_its_value_after_wait(world_of_2, call, shape, want):
    output, handle = getattr(comm_func, call)(_tensor(), async_op=True)
    assert output.shape == shape and output.dtype == ms.float32
    assert world_of_2.pending  # started, not finished
    handle.wait()
    assert not world_of_2.pending
    np.testing.assert_array_equal(output.asnumpy(), want)


def test_recv_returns_the_tensor_sent(world_of_2):
    out = comm_func.recv(ms.Tensor(np.zeros([2, 8], np.float32)), 1)
    assert isinstance(out, ms.Tensor)
    np.testing.assert_array_equal(out.asnumpy(), np.full((2, 8), 7, np.float32))
    op = world_of_2.ops[-1]
    assert op.kind == collective_pb2.RECV and op.peer == 1 and not op.handle


def test_recv_with_tag_positional_is_refused_before_anything_runs(world_of_2):
    with pytest.raises(NotSupportedYetError, match="tag"):
        comm_func.recv(ms.Tensor(np.zeros([2, 8], np.float32)), 1, WORLD, 3)
    assert world_of_2.ops == []


def test_send_returns_none_and_isend_irecv_return_handles(world_of_2):
    assert comm_func.send(_tensor(), 1) is None
    assert world_of_2.ops[-1].kind == collective_pb2.SEND and world_of_2.ops[-1].peer == 1
    handle = comm_func.isend(_tensor(), dst=1)
    assert isinstance(handle, comm_func.CommHandle)
    assert handle.wait() is None
    out, handle = comm_func.irecv(ms.Tensor(np.zeros([2, 8], np.float32)), src=1)
    assert out.shape == (2, 8)
    handle.wait()
    np.testing.assert_array_equal(out.asnumpy(), np.full((2, 8), 7, np.float32))


# --- create_group --------------------------------------------------------------------------------------------------


def test_create_group_refuses_options(world_of_2):
    class GroupOptions:  # MindSpore's, as in its create_group example
        def __init__(self):
            self.hccl_config = {"hccl_buffer_size": 400}

    with pytest.raises(NotSupportedYetError, match=r"GroupOptions.*HCCL"):
        comm.create_group("0-1", [0, 1], GroupOptions())
    assert world_of_2.ops == [] and "0-1" not in rt.current().groups


def test_create_group_refuses_repeated_ranks(world_of_2):
    with pytest.raises(ConfigurationError, match=r"rank_ids must not repeat.*\[1\]"):
        comm.create_group("pair", [0, 1, 1])
    assert world_of_2.ops == [] and "pair" not in rt.current().groups


def test_create_group_without_options_still_works(world_of_2):
    comm.create_group("pair", [0, 1], None)
    assert rt.current().groups["pair"] == (0, 1)
    assert world_of_2.ops == [("create_group", "pair", (0, 1))]


def test_primitive_rank_ids_are_group_ranks_as_mindspores_kernels_read_them(world_of_1):
    from tessel.ops import comm as comm_ops

    # MindSpore's Broadcast and NeighborExchange kernels give root_rank / the rank ids to the group's communicator
    # (comm_func.broadcast converts its global src first): in group (2, 3), rank 0 is global rank 2
    assert ms.ops.Broadcast(0, group="sp")._traced_attrs((2, 3)) == {"root": 0}
    with pytest.raises(ConfigurationError, match=r"root_rank 2 is not a rank of its group of 2 .*0\.\.1"):
        ms.ops.Broadcast(2, group="sp")._traced_attrs((2, 3))
    with pytest.raises(ConfigurationError, match="recv rank 1 is not a rank of its group of 1"):
        comm_ops.exchange([_tensor()], [0], [1], [(2, 8)], ms.float32, WORLD)

    class SendOnly(ms.nn.Cell):
        def construct(self, x):
            return comm_ops.exchange([x], [0], [], [], ms.float32, WORLD)

    ms.set_context(mode=ms.GRAPH_MODE)
    with pytest.raises(NotSupportedYetError, match="NeighborExchange that only sends inside a compiled graph"):
        SendOnly()(_tensor())


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_comm_func_collectives_trace_into_graphs_and_gradients(world_of_1, mode):
    # MindSpore's comm_func builds the collective primitives, so they work under jit and value_and_grad
    class Net(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(np.array([1.0, 2.0], np.float32)), name="w")

        def construct(self, x):
            y, handle = comm_func.all_reduce(x * self.w)
            gathered, _ = comm_func.all_gather_into_tensor(y)
            scattered, _ = comm_func.reduce_scatter_tensor(gathered)
            return comm_func.broadcast(scattered, 0).sum() + (0.0 if handle is None else 1.0)

    ms.set_context(mode=mode)
    net, x = Net(), _tensor(np.array([3.0, 4.0], np.float32))
    loss, (dw,) = ms.value_and_grad(net, None, net.trainable_params())(x)
    assert float(loss.asnumpy()) == 11.0 and dw.asnumpy().tolist() == [3.0, 4.0]


def test_collective_primitives_check_their_arguments_on_one_device_too(world_of_1):
    with pytest.raises(ConfigurationError, match="split_count=8 must equal the group size 1"):
        ms.ops.AlltoAll(8, 0, 0)(_tensor())
    with pytest.raises(ConfigurationError, match="root_rank 5 is not a rank of its group of 1"):
        ms.ops.Broadcast(5)((_tensor(),))
