"""The daemon as a library object: sessions, tensor store, programs, stateful segments, bad input."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tessel.compiler import SGD, Adam, TensorSpec, TrainStep, apply, build_train_step, model_bytes, trace
from tessel.core.errors import ConfigurationError, JobFailedError
from tessel.daemon import DaemonCore
from tessel.plugins import load_plugin
from tessel.v1 import collective_pb2, daemon_pb2

IN, HIDDEN, OUT = 6, 8, 3


def mlp(x, y, w1, b1, w2, b2):
    h = apply("ReLU", apply("MatMul", x, w1, transpose_b=True) + b1)
    logits = apply("MatMul", h, w2, transpose_b=True) + b2
    return apply("SparseSoftmaxCrossEntropy", logits, y).mean()


SPECS = [TensorSpec(("N", IN)), TensorSpec(("N",), "int32"), TensorSpec((HIDDEN, IN)), TensorSpec((HIDDEN,)),
         TensorSpec((OUT, HIDDEN)), TensorSpec((OUT,))]  # fmt: skip


@pytest.fixture(scope="module")
def core():
    running = DaemonCore(load_plugin("cpu", threads=1))
    yield running
    running.close()


def _params(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"w1": (HIDDEN, IN), "b1": (HIDDEN,), "w2": (OUT, HIDDEN), "b2": (OUT,)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def _batches(n):
    rng = np.random.default_rng(7)
    for _ in range(n):
        x = rng.standard_normal((16, IN)).astype(np.float32)
        yield x, ((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5).astype(np.int32))


def _program(*instructions):
    return daemon_pb2.Program(instructions=[daemon_pb2.Instruction(**i) for i in instructions])


@pytest.mark.parametrize("optimizer", [SGD(learning_rate=0.1), Adam(learning_rate=0.01)], ids=repr)
def test_stateful_segment_trains_like_the_in_process_train_step(core, optimizer):
    program = build_train_step(trace(mlp, *SPECS).graph, ["w1", "b1", "w2", "b2"], optimizer)
    reference = TrainStep(program, core.plugin.compute, _params())
    sid = core.open_session("seg", 0, 1, [])
    initial = {s.name: reference.state[s.name].copy() for s in program.state}
    initial["learning_rate"] = np.array(program.optimizer.learning_rate, np.float32)
    core.put(sid, initial)
    core.compile_segment(sid, "step", model_bytes(program.graph), [s.name for s in program.state])
    run = _program({"run_segment": daemon_pb2.RunSegment(segment="step", outputs=[program.outputs[0]])})
    for x, y in _batches(5):
        want = reference(x=x, y=y)
        got = core.execute(sid, run, feed={"x": x, "y": y}, fetch=[program.outputs[0]]).fetched[program.outputs[0]]
        np.testing.assert_allclose(got, want, rtol=1e-6)
    for name, value in reference.state.items():
        np.testing.assert_allclose(core.get(sid, [name])[name], value, rtol=1e-6, atol=1e-7)
    # A put replaces the state the segment trains from (e.g. a checkpoint load).
    core.put(sid, {"w1": np.zeros((HIDDEN, IN), np.float32)})
    core.execute(sid, run, feed=dict(zip("xy", next(_batches(1)))))
    assert np.abs(core.get(sid, ["w1"])["w1"]).max() < 1.0
    core.close_session(sid)


def test_repeat_and_collect_return_every_repetition(core):
    sid = core.open_session("rep", 0, 1, [])
    core.put(sid, {"x": np.arange(3, dtype=np.float64)})
    program = _program(
        {"collective": daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_REDUCE, inputs=["x"], outputs=["y"])},
        {"copy": daemon_pb2.CopyOp(source="y", target="x")},
    )
    result = core.execute(sid, program, repeat=4, collect=["y"], fetch=["x"], timings=True)
    assert result.collected["y"].shape == (4, 3)
    assert [label for label, _ in result.timings] == ["all_reduce", "copy"]
    np.testing.assert_array_equal(result.fetched["x"], np.arange(3))  # world of 1: the sum is the value itself
    core.close_session(sid)


def test_per_repetition_rows_are_stored_before_each_repetition_and_checked(core):
    """Sink mode's per-step learning rate: row i of a per_repetition array is stored before repetition i."""
    sid = core.open_session("rows", 0, 1, [])
    program = _program({"copy": daemon_pb2.CopyOp(source="rate", target="seen")})
    rows = np.array([0.1, 0.05, 0.025], np.float32)
    result = core.execute(sid, program, repeat=3, collect=["seen"], per_repetition={"rate": rows})
    np.testing.assert_array_equal(result.collected["seen"], rows)
    assert result.collected["seen"][0].shape == ()  # a row of a 1-D array is 0-d, not a numpy scalar
    with pytest.raises(ConfigurationError, match=r"per_repetition 'rate' has shape \(2,\), not one row for each"):
        core.execute(sid, program, repeat=3, per_repetition={"rate": rows[:2]})
    core.close_session(sid)


def _two_output_model() -> bytes:
    """x (3, 4) -> a = 2 x (3, 4), b = x summed over rows (4,): two static outputs for one bucket."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "x"], ["a"]),
            helper.make_node("ReduceSum", ["x", "axes"], ["b"], keepdims=0),
        ],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("a", [3, 4]), ("b", [4]))],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [0])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()


def test_a_bucket_is_reduced_in_one_buffer_that_the_segment_writes_into(core):
    sid = core.open_session("bucket", 0, 1, [])
    core.compile_segment(sid, "two", _two_output_model())
    session = core.session(sid)

    def program(names, handle=""):
        bucket = daemon_pb2.CollectiveOp(
            kind=collective_pb2.ALL_REDUCE, op=collective_pb2.MEAN, inputs=names, outputs=["r" + n for n in names],
            handle=handle,
        )  # fmt: skip
        steps = [{"run_segment": daemon_pb2.RunSegment(segment="two", outputs=["a", "b"])}, {"collective": bucket}]
        return _program(*steps, *([{"wait": daemon_pb2.WaitOp(handle=handle)}] if handle else []))

    def address(name):
        return session.tensors[name].__array_interface__["data"][0]

    a_bytes, b_bytes = 3 * 4 * 4, 4 * 4

    def check(which, x):
        got = core.execute(sid, which, feed={"x": x}, fetch=["ra", "rb"]).fetched
        np.testing.assert_array_equal(got["ra"], 2 * x)  # a world of one: the mean is the value itself
        np.testing.assert_array_equal(got["rb"], x.sum(axis=0))

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    in_order, reversed_order = program(["a", "b"]), program(["b", "a"], handle="h")
    check(in_order, x)
    # The segment wrote a and b back to back into the bucket's buffer: nothing was concatenated or copied in.
    assert address("a") + a_bytes == address("b")
    # Another program placing the same outputs in its own bucket (here one run asynchronously) takes them over;
    # the first one then copies them in, and both stay right.
    check(reversed_order, x + 1)
    assert address("b") + b_bytes == address("a")
    for step in range(2, 4):
        check(in_order, x + step)
        check(reversed_order, x - step)
    core.close_session(sid)


def test_bad_input_names_the_thing_and_the_fix(core):
    sid = core.open_session("bad", 0, 1, [])
    with pytest.raises(ConfigurationError, match="tensor 'nope' is not in the store"):
        core.execute(sid, _program({"copy": daemon_pb2.CopyOp(source="nope", target="x")}))
    with pytest.raises(ConfigurationError, match="no session 'missing'"):
        core.put("missing", {})
    with pytest.raises(ConfigurationError, match="rank 3 is outside a world of 2"):
        core.open_session("j", 3, 2, [])
    with pytest.raises(ConfigurationError, match="not compiled"):
        core.execute(sid, _program({"run_segment": daemon_pb2.RunSegment(segment="s")}))
    with pytest.raises(ConfigurationError, match="create_group"):
        core.execute(sid, _program({"collective": daemon_pb2.CollectiveOp(kind=collective_pb2.BARRIER,
                                                                          group="g")}))  # fmt: skip
    with pytest.raises(ConfigurationError, match="empty"):
        core.execute(sid, daemon_pb2.Program(instructions=[daemon_pb2.Instruction()]))
    core.close_session(sid)


def test_a_failed_job_aborts_its_session(core):
    sid = core.open_session("doomed", 0, 1, [])
    core.on_job_event("doomed", "failed", "rank 1 died", 1)
    with pytest.raises(JobFailedError, match="rank 1 died"):
        core.execute(sid, _program())


def test_sink_dataset_on_the_daemon_yields_the_clients_batches_across_epochs(core):
    import tessel.dataset as ds

    def pipeline():
        data = {"x": np.arange(30, dtype=np.float32).reshape(10, 3), "y": np.arange(10, dtype=np.int32)}
        return ds.NumpySlicesDataset(data, shuffle=True, num_shards=3, shard_id=1).batch(2)

    client = pipeline()
    expected = [b for b in client.create_tuple_iterator(output_numpy=True, num_epochs=3)]
    sid = core.open_session("sink", 0, 1, [])
    cursor = core.open_dataset(sid, "train", pipeline().to_spec())
    assert cursor.batches_per_epoch == 2 and cursor.columns == ["x", "y"]
    step = _program({"next_batch": daemon_pb2.NextBatch(dataset="train", outputs=["bx", "by"])})
    result = core.execute(sid, step, repeat=6, collect=["bx", "by"])
    for i, (x, y) in enumerate(expected):
        np.testing.assert_array_equal(result.collected["bx"][i], x)
        np.testing.assert_array_equal(result.collected["by"][i], y)
    with pytest.raises(ConfigurationError, match="not open"):
        core.execute(sid, _program({"next_batch": daemon_pb2.NextBatch(dataset="nope", outputs=["a"])}))
    core.close_session(sid)


def test_large_requests_are_split_so_the_heartbeat_keeps_running():
    from tessel.communication.daemon_handle import REQUEST_CHUNK_BYTES, _batches_of

    big = np.zeros(REQUEST_CHUNK_BYTES // 4 + 1, np.float32)  # one tensor over the limit: alone in its request
    small = {f"s{i}": np.zeros(REQUEST_CHUNK_BYTES // 12, np.uint8) for i in range(5)}
    groups = list(_batches_of({"big": big, **small}))
    assert list(groups[0]) == ["big"]
    assert all(sum(v.nbytes for v in g.values()) <= REQUEST_CHUNK_BYTES for g in groups[1:])
    assert sum(len(g) for g in groups) == 6


def test_thread_budget_runs_a_compute_bound_collective_in_the_program_where_no_core_is_free(core, monkeypatch):
    """A started all-reduce whose communicator keeps a core busy (shared memory) runs on the program's own thread
    when the host has no core left for it beside the compute threads: deferred to its wait, which the timeline
    shows it inside. Where a core is free it runs on the communicator's thread."""
    import tessel.daemon.core as daemon_core

    sid = core.open_session("budget", rank=0, world_size=1, members=[])
    core.put(sid, {"x": np.arange(4, dtype=np.float32)})
    start = {"collective": daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_REDUCE, inputs=["x"], outputs=["y"],
                                                   handle="h")}  # fmt: skip
    program = _program(start, {"wait": daemon_pb2.WaitOp(handle="h")})
    comm = core._group(core.session(sid), "world")
    monkeypatch.setattr(type(comm), "compute_bound", True, raising=False)
    threads = []
    reduce = comm._all_reduce
    monkeypatch.setattr(comm, "_all_reduce", lambda x, op: threads.append(threading.current_thread()) or reduce(x, op))
    for cores, overlapped in ((1, False), (64, True)):
        monkeypatch.setattr(daemon_core, "_usable_cores", lambda cores=cores: cores)
        core.session(sid).bound.clear()
        result = core.execute(sid, program, fetch=["y"], timeline=True)
        np.testing.assert_array_equal(result.fetched["y"], np.arange(4, dtype=np.float32))
        assert (threads[-1] is not threading.current_thread()) == overlapped
        issued, waited = result.timeline[0], result.timeline[1]
        assert issued.start_ns <= issued.comm_start_ns <= issued.comm_end_ns, issued
        if not overlapped:
            assert waited.start_ns <= issued.comm_start_ns <= issued.comm_end_ns <= waited.end_ns, (issued, waited)
    core.close_session(sid)


def test_deferred_all_reduces_run_back_to_back_in_program_order_where_no_core_is_free(core, monkeypatch):
    """All-reduces started where none may overlap the segments run when one's result is first needed: all those
    started since, back to back in the order started, each at its own size; any other collective runs only after
    them, and the program's end runs what no wait asked for."""
    import tessel.daemon.core as daemon_core

    sid = core.open_session("fuse", rank=0, world_size=1, members=[])
    values = {"a": np.arange(4, dtype=np.float32), "b": np.ones((2, 3), np.float32), "c": np.arange(3.0),
              "d": np.full(5, 2, np.float32), "e": np.ones(7, np.float32)}  # fmt: skip
    core.put(sid, values)
    comm = core._group(core.session(sid), "world")
    monkeypatch.setattr(type(comm), "compute_bound", True, raising=False)
    monkeypatch.setattr(daemon_core, "_usable_cores", lambda: 1)
    sizes = []
    reduce = comm._all_reduce
    monkeypatch.setattr(comm, "_all_reduce", lambda x, op: sizes.append(x.size) or reduce(x, op))

    def start(name, handle=""):
        op = daemon_pb2.CollectiveOp(
            kind=collective_pb2.ALL_REDUCE, inputs=[name], outputs=[name + "/r"], handle=handle
        )
        return {"collective": op}

    def wait(handle):
        return {"wait": daemon_pb2.WaitOp(handle=handle)}

    program = _program(start("a", "ha"), start("b", "hb"), start("c", "hc"), start("d", "hd"), wait("hb"),
                       start("e"), wait("ha"), wait("hc"), wait("hd"))  # fmt: skip
    result = core.execute(sid, program, fetch=[n + "/r" for n in values])
    assert sizes == [4, 6, 3, 5, 7]  # at the wait for b: a, b, c, d; then the blocking e
    for name, value in values.items():
        np.testing.assert_array_equal(result.fetched[name + "/r"], value)
        assert result.fetched[name + "/r"].dtype == value.dtype
    sizes.clear()
    core.execute(sid, _program(start("a", "ha"), start("d", "hd")))  # never waited: run at the program's end
    assert sizes == [4, 5] and not core.session(sid).deferred
    core.execute(sid, _program(wait("hd"), wait("ha")), fetch=["d/r"])
    assert sizes == [4, 5]
    core.close_session(sid)


def test_execute_given_bytes_that_are_not_an_execute_request_says_so_and_keeps_the_daemon_serving(core):
    """Execute parses its request itself (daemon/service.py _unpack, so that it can let go of it before the program
    runs): bytes that do not parse are a clear error naming the message and its size, and the next call works."""
    from tessel.daemon.service import DaemonServicer

    servicer = DaemonServicer(core)
    frame = bytearray(b"\xff\xff\xff\xff")
    with pytest.raises(ConfigurationError, match=r"malformed ExecuteRequest \(4 bytes\)"):
        servicer.Execute(frame, None)
    with pytest.raises(ConfigurationError, match=r"malformed ExecuteRequest"):
        servicer.Execute(b"\x0a\xff", None)
    sid = core.open_session("malformed-after", 0, 1, [])
    assert core.session(sid) is not None


def test_a_recorded_step_reports_what_the_store_holds_after_each_instruction(core):
    """The timeline's memory counter: after every instruction, the bytes the store holds, each buffer once however
    many names or views it has; starting an asynchronous collective leaves it as it was, and its wait adds the
    result."""
    from tessel.daemon.session import MeteredStore, TensorStore

    sid = core.open_session("store", rank=0, world_size=1, members=[])
    flat = np.zeros(100, np.float32)
    core.put(sid, {"x": np.ones(10, np.float32), "v1": flat[:40], "v2": flat[40:], "s": np.float32(2.0)})
    # the two views of one buffer: its largest, once
    assert MeteredStore(core.session(sid).tensors).nbytes == 40 + 240 + 4
    start = {"collective": daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_REDUCE, inputs=["x"], outputs=["y"],
                                                   handle="h")}  # fmt: skip
    program = _program(start, {"wait": daemon_pb2.WaitOp(handle="h")}, {"free": daemon_pb2.FreeOp(names=["v2"])})
    issued, waited, freed = core.execute(sid, program, fetch=["y"], timeline=True).timeline
    assert issued.store_bytes == 284
    assert waited.store_bytes == 284 + 40
    assert freed.store_bytes == 40 + 160 + 4 + 40
    assert type(core.session(sid).tensors) is TensorStore  # metered for the recorded step only
    core.close_session(sid)


def _resident_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


def test_closing_the_last_session_gives_back_what_the_device_kept_for_the_next_run():
    # A model of large tensors runs on the CPU plugin's shared arena, which keeps its 8 MiB intermediates between
    # runs; once no job is left on the daemon, they go back to the system.
    large = trace(lambda x: (x * 2.0 + 1.0).sum(), TensorSpec((2048, 1024)))
    x = np.ones((2048, 1024), np.float32)  # held here too: closing the session frees no input
    core = DaemonCore(load_plugin("cpu", threads=1))  # no other test's session open on it
    sid = core.open_session("release", 0, 1, [])
    core.compile_segment(sid, "large", model_bytes(large.graph))
    core.put(sid, {"x": x})
    program = _program({"run_segment": daemon_pb2.RunSegment(segment="large", outputs=["out0"])})
    result = core.execute(sid, program, repeat=3, fetch=["out0"])
    assert float(result.fetched["out0"]) == 3.0 * x.size
    held = _resident_mib()
    core.close_session(sid)
    assert held - _resident_mib() >= 6.0, "the shared arena kept its free blocks after the daemon's last job"
    core.close()


def test_a_device_that_cannot_give_memory_back_still_closes_the_session_and_says_so(monkeypatch, caplog):
    core = DaemonCore(load_plugin("cpu", threads=1))

    def refuse():
        raise RuntimeError("arena busy")

    monkeypatch.setattr(core.plugin.compute, "release_memory", refuse)
    sid = core.open_session("refuse", 0, 1, [])
    with caplog.at_level("WARNING", logger="tessel.daemon"):
        core.close_session(sid)
    assert core.sessions() == []
    assert "could not release its cached memory: arena busy" in caplog.text
    core.close()


def test_a_call_that_found_its_session_before_it_closed_finds_it_closed(core):
    # an Execute (or CreateGroup) looked the session up, then CloseSession (or the reaper) closed it before the
    # call had its lock: it must not run on the closed session, nor leave a communicator there no one closes
    sid = core.open_session("late", 0, 1, [])
    core.put(sid, {"x": np.ones(3, np.float32)})
    session = core.session(sid)
    core.close_session(sid)
    core._sessions[sid] = session  # as if looked up before the close
    try:
        with pytest.raises(ConfigurationError, match=r"session .* is closed"):
            core.execute(sid, _program({"copy": daemon_pb2.CopyOp(source="x", target="y")}), fetch=["y"])
        with pytest.raises(ConfigurationError, match=r"session .* is closed"):
            core.create_group(sid, "pair", [0])
        assert session.tensors == {} and session.groups == {}
    finally:
        core._sessions.pop(sid, None)


def test_a_stream_whose_caller_went_away_stops_its_run_and_frees_its_thread(core):
    from tessel.daemon.service import DaemonServicer

    class Context:  # a gRPC context whose caller cancels after the first progress message
        def __init__(self):
            self.callbacks = []

        def add_callback(self, callback):
            self.callbacks.append(callback)
            return True

    sid = core.open_session("gone", 0, 1, [])
    core.put(sid, {"x": np.arange(3, dtype=np.float32)})
    reduce = daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_REDUCE, inputs=["x"], outputs=["x"])
    program = _program({"collective": reduce})
    request = daemon_pb2.ExecuteRequest(session_id=sid, program=program, repeat=10_000_000, collect=["x"])
    context = Context()
    replies = DaemonServicer(core).ExecuteStream(request.SerializeToString(), context)
    assert next(replies).count >= 1  # the run goes on
    for callback in context.callbacks:  # the caller cancels
        callback()
    drained = threading.Thread(target=lambda: [None for _ in replies], daemon=True)
    drained.start()
    drained.join(timeout=10)
    assert not drained.is_alive(), "the stream went on after its caller went away"
    session = core.session(sid)
    assert session.lock.acquire(timeout=10), "the run went on after its caller went away"
    session.lock.release()
    assert session.steps < 10_000_000
    core.close_session(sid)
