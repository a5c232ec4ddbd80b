"""compiler/memory.py: state written in place where every reader runs before the element-wise op writing it,
double-buffered otherwise; tensors freed right after their last reader; and the daemon's segments honouring both,
with results equal to the double-buffered ones."""

from __future__ import annotations

import numpy as np
import onnx

from tessel.compiler import (
    Adam,
    GraphBuilder,
    Momentum,
    apply,
    bucket_allreduce,
    build_train_step,
    lower_rank_program,
    mirror_parameters,
    model_bytes,
)
from tessel.compiler.memory import free_early, inplace_safe, mark_inplace, mark_program_inplace
from tessel.compiler.tracer import TensorSpec, trace
from tessel.daemon.segments import Segment
from tessel.plugins.cpu.compute import CpuCompute


def _mlp_loss(x, y, w, b):
    return apply("SparseSoftmaxCrossEntropy", apply("MatMul", x, w) + b, y).mean()


def _train(optimizer):
    specs = (TensorSpec((4, 3)), TensorSpec((4,), "int32"), TensorSpec((3, 2)), TensorSpec((2,)))
    return build_train_step(trace(_mlp_loss, *specs).graph, ["w", "b"], optimizer)


def test_optimizer_state_is_written_in_place_and_weights_read_by_a_matmul_are_not():
    train = _train(Adam(0.1))
    state = [s.name for s in train.state]
    safe = set(inplace_safe(onnx.load_from_string(model_bytes(train.graph)), state))
    # the fused one-device step reads w in the forward MatMul and in the backward: w keeps two buffers
    assert {"w/moment1", "w/moment2", "b/moment1", "b/moment2"} <= safe
    assert "w" not in safe
    # a value written to a parameter carries the "<param>/new" name itself: no Identity copies it out
    model = onnx.load_from_string(model_bytes(train.graph))
    assert not any(n.op_type == "Identity" and n.output[0].endswith("moment1/new") for n in model.graph.node)


def test_a_collective_reading_state_keeps_it_double_buffered():
    b = GraphBuilder("g")
    w = b.add_input("w", (4,), "float32")
    apply("Assign", w, w * 0.5)
    graph = b.build([])
    onnx_bytes = model_bytes(graph)
    assert mark_inplace(onnx_bytes, ["w"], forbidden=["w"]) is onnx_bytes
    marked = onnx.load_from_string(mark_inplace(onnx_bytes, ["w"]))
    assert [(p.key, p.value) for p in marked.metadata_props] == [("tessel.inplace", "w")]


def test_segments_update_in_place_exactly_as_double_buffered():
    compute = CpuCompute(1)
    train = _train(Momentum(0.1, 0.9))
    state = [s.name for s in train.state]
    plain = model_bytes(train.graph)
    marked = mark_inplace(plain, state)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 3)).astype(np.float32), "y": np.array([0, 1, 1, 0], np.int32)}
    results = []
    for onnx_bytes in (plain, marked):
        segment = Segment("train", compute, onnx_bytes, state)
        tensors = {"learning_rate": np.array(0.1, np.float32), **feeds}
        tensors |= {"w": np.ones((3, 2), np.float32), "b": np.zeros(2, np.float32)}
        tensors |= {"w/moments": np.zeros((3, 2), np.float32), "b/moments": np.zeros(2, np.float32)}
        before = tensors["w/moments"]
        for _ in range(3):
            segment.run(tensors, [], [])
        results.append({k: np.array(tensors[k]) for k in ("w", "b", "w/moments")})
        assert (tensors["w/moments"] is before) == (onnx_bytes is marked)  # one buffer, updated where it lies
    assert segment.inplace == {"w/moments", "b/moments", "b"}  # b: read by the forward Add, an ancestor
    for key in results[0]:
        np.testing.assert_array_equal(results[0][key], results[1][key])


def test_temporaries_are_freed_after_their_last_reader():
    specs = (TensorSpec((4, 3)), TensorSpec((4,), "int32"), TensorSpec((3, 2)), TensorSpec((2,)))
    forward = mirror_parameters(trace(_mlp_loss, *specs).graph, ["w", "b"], (0, 1))
    train = build_train_step(forward, ["w", "b"], Adam(0.1))
    lowered = lower_rank_program(bucket_allreduce(train.graph), state=[s.name for s in train.state], world_size=2)
    early = free_early(mark_program_inplace(lowered))
    freed_at_end = set(lowered.program.instructions[-1].free.names)
    ops = [i.WhichOneof("op") for i in early.program.instructions]
    freed = [n for i in early.program.instructions if i.WhichOneof("op") == "free" for n in i.free.names]
    assert sorted(freed) == sorted(freed_at_end)  # the same tensors, freed earlier
    assert (ops.count("free") > 1 and ops[-1] != "free") or ops.count("free") > 1
    seen_free: set[str] = set()
    for ins in early.program.instructions:  # nothing is read after it was freed
        kind = ins.WhichOneof("op")
        if kind == "free":
            seen_free.update(ins.free.names)
        elif kind == "run_segment":
            reads = {v.name for v in early.segments[ins.run_segment.segment].graph.inputs}
            assert not reads & seen_free
        elif kind == "collective":
            assert not set(ins.collective.inputs) & seen_free


def test_state_a_collective_reads_is_updated_in_place_once_the_collective_was_waited_for():
    from tessel.compiler.memory import read_in_flight
    from tessel.compiler.rank_program import RankProgram, RankSegment
    from tessel.v1 import collective_pb2, daemon_pb2

    def collective(handle=""):
        op = daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_GATHER, inputs=["w"], outputs=["g"], handle=handle)
        return daemon_pb2.Instruction(collective=op)

    def wait(handle):
        return daemon_pb2.Instruction(wait=daemon_pb2.WaitOp(handle=handle))

    update = daemon_pb2.Instruction(run_segment=daemon_pb2.RunSegment(segment="update"))
    segments = {"update": RankSegment("update", None, b"", ("w",), ())}

    def forbidden(*instructions):
        program = daemon_pb2.Program(instructions=list(instructions))
        return read_in_flight(RankProgram("p", segments, program, {}, (), ("w",), ()))

    assert forbidden(collective("h"), wait("h"), update) == set()  # a level3 block: gathered, then updated
    assert forbidden(collective(), update) == set()  # synchronous: done before the update
    assert forbidden(collective("h"), update, wait("h")) == {"w"}  # may still be reading during the update
    assert forbidden(collective("h"), update) == {"w"}  # never waited for in the program


def test_state_read_through_a_view_by_a_later_product_is_not_written_in_place():
    # An Identity (a whole-tensor slice lowers to one) makes ONNX Runtime hand its readers the state's own buffer:
    # the product below would read w after the element-wise update wrote over it.
    from onnx import TensorProto, helper

    port = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 2])  # noqa: E731
    nodes = [
        helper.make_node("Identity", ["w"], ["view"]),
        helper.make_node("Mul", ["view", "half"], ["w/new"]),
        helper.make_node("MatMul", ["r", "view"], ["y"]),
    ]
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    graph = helper.make_graph(nodes, "g", [port("w"), port("r")], [port("w/new"), port("y")], [half])
    model = helper.make_model(graph)
    assert inplace_safe(model, ["w"]) == []
    nodes[2] = helper.make_node("Add", ["r", "r"], ["y"])  # the view read by the update only: in place is safe
    graph = helper.make_graph(nodes, "g", [port("w"), port("r")], [port("w/new"), port("y")], [half])
    assert inplace_safe(helper.make_model(graph), ["w"]) == ["w"]
