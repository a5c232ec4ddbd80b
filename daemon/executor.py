"""Turns a rank program (typed instructions) into bound steps and runs them against a session.

Binding happens once per Execute, so a program repeated many times pays no per-instruction dispatch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from tessel.core.errors import ConfigurationError
from tessel.core.plugin import Done
from tessel.core.wire import numpy_dtype, reduce_op_name
from tessel.daemon.buckets import FlatBucket
from tessel.daemon.session import WORLD_GROUP, Session
from tessel.v1 import collective_pb2, daemon_pb2


def _test_slowdown_s() -> float:
    value = os.environ.get("TESSEL_TEST_SLOWDOWN_S", "")
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        raise ConfigurationError(f"TESSEL_TEST_SLOWDOWN_S={value!r}: give seconds, e.g. 0.05") from None


# FOR TESTS ONLY: seconds this daemon sleeps after every segment it runs, a rank made slow honestly (the sleep is its
# own work, not time blocked in collectives) for the straggler tests (tests/integration/test_stragglers.py).
TEST_SLOWDOWN_S = _test_slowdown_s()

Step = Callable[[], None]


class Bound(NamedTuple):
    """One instruction bound to a session: `run` executes it; the rest describes it for the timeline."""

    label: str  # "run_segment:<name>", "all_reduce", "wait", ... (the per-instruction timings' kind)
    run: Step
    kind: str = ""  # "run_segment", "all_reduce", ..., "wait"
    name: str = ""  # the segment, dataset or group
    handle: str = ""  # an asynchronous collective's handle, or the one a wait waits for
    nbytes: Callable[[], int] | None = None  # bytes it moves (collective inputs, a batch), read after it ran


def _bytes_of(session: Session, names: list[str]) -> Callable[[], int]:
    return lambda: sum(int(np.asarray(session.tensors[n]).nbytes) for n in names if n in session.tensors)


def _outputs(op: Any, default: list[str]) -> list[str]:
    return list(op.outputs) or default


def _batch_slice(value: np.ndarray, cut: daemon_pb2.BatchSlice, name: str) -> np.ndarray:
    """The block `cut` of a batch column (all of it when `cut` has no dims)."""
    if not cut.start:
        return value
    if len(cut.start) != value.ndim or len(cut.stop) != value.ndim:
        raise ConfigurationError(
            f"next_batch output {name!r}: a slice of {len(cut.start)} dims for a batch column of shape {value.shape}"
        )
    if any(not 0 <= a < b <= n for a, b, n in zip(cut.start, cut.stop, value.shape)):
        raise ConfigurationError(
            f"next_batch output {name!r}: the slice {list(cut.start)}:{list(cut.stop)} is outside the batch column "
            f"of shape {value.shape}; the dataset's batch must have the shape the step was compiled for"
        )
    return np.ascontiguousarray(value[tuple(slice(a, b) for a, b in zip(cut.start, cut.stop))])


def _store(session: Session, names: list[str], values: Any) -> None:
    if isinstance(values, np.ndarray):
        values = [values]
    for name, value in zip(names, values or [], strict=False):
        session.tensors[name] = value


def _collective_call(comm: Any, session: Session, op: daemon_pb2.CollectiveOp) -> tuple[Callable, list[str]]:
    """(a call that starts or runs the collective with async_op as argument, the output names)."""
    inputs = list(op.inputs)
    kind = op.kind
    first = inputs[0] if inputs else ""
    reduce_op = reduce_op_name(op.op)
    if kind == collective_pb2.ALL_REDUCE:
        return (lambda a: comm.all_reduce(session.tensor(first), reduce_op, async_op=a)), _outputs(op, [first])
    if kind == collective_pb2.ALL_GATHER:
        return (lambda a: comm.all_gather(session.tensor(first), async_op=a)), _outputs(op, [first])
    if kind == collective_pb2.REDUCE_SCATTER:
        return (lambda a: comm.reduce_scatter(session.tensor(first), reduce_op, async_op=a)), _outputs(op, [first])
    if kind == collective_pb2.BROADCAST:
        return (lambda a: comm.broadcast(session.tensor(first), op.root, async_op=a)), _outputs(op, [first])
    if kind == collective_pb2.ALL_TO_ALL:
        call = lambda a: comm.all_to_all(session.tensor(first), op.split_dim, op.concat_dim, async_op=a)  # noqa: E731
        return call, _outputs(op, [first])
    if kind == collective_pb2.NEIGHBOR_EXCHANGE:
        shapes = [tuple(s.dims) for s in op.recv_shapes]
        # A rank that receives nothing still describes the call's dtype when the caller gave it (comm_func does):
        # a group-wide agreement then compares like with like.
        dtype = numpy_dtype(op.recv_dtype) if op.recv_ranks or op.recv_dtype else np.dtype("float32")

        def exchange(a: bool) -> Any:
            sends = [session.tensor(n) for n in inputs]
            return comm.neighbor_exchange(sends, list(op.send_ranks), list(op.recv_ranks), shapes, dtype, async_op=a)

        return exchange, list(op.outputs)
    if kind == collective_pb2.SEND:
        return (lambda a: comm.send(session.tensor(first), op.peer, async_op=a)), []
    if kind == collective_pb2.RECV:
        if len(op.recv_shapes) != 1:
            raise ConfigurationError("RECV needs exactly one recv_shapes entry (the shape to receive)")
        shape, dtype = tuple(op.recv_shapes[0].dims), numpy_dtype(op.recv_dtype)
        return (lambda a: comm.recv(shape, dtype, op.peer, async_op=a)), list(op.outputs)
    if kind == collective_pb2.BARRIER:
        return (lambda a: comm.barrier(async_op=a)), []
    raise ConfigurationError(f"unknown collective kind {kind} in a program instruction")


def _blocking(session: Session, run: Step) -> Step:
    """`run`, its time counted as blocked in collectives (Session.blocked_s)."""
    clock = time.perf_counter

    def timed() -> None:
        start = clock()
        try:
            run()
        finally:
            session.blocked_s += clock() - start

    return timed


def _run_now(session: Session, handle: str, outputs: list[str], call: Callable) -> None:
    """Run an asynchronously started collective to completion now; its wait will find the result."""
    run_deferred(session)
    started = time.time_ns()
    value = call(False)
    session.handles[handle] = (Done(value, started, time.time_ns()), outputs)


def _then(first: Step, second: Step) -> Step:
    def both() -> None:
        first()
        second()

    return both


def _started(session: Session, handle: str, outputs: list[str], call: Callable) -> None:
    run_deferred(session)
    session.handles[handle] = (call(True), outputs)


def _call_after_deferred(session: Session, call: Callable) -> Any:
    run_deferred(session)
    return call(False)


class Deferred:
    """An all-reduce the program started asynchronously where it cannot overlap the segments (the thread budget,
    DaemonCore._may_overlap): it runs on the program's thread when its result is first waited for, when the
    program reaches any other collective, or at the program's end, whichever comes first, together with every
    all-reduce deferred before and after it (`run_deferred`), in the order the program started them. Run at once,
    each would make the rank wait for its slowest peer, k times per layer with k copies (MicroBatchInterleaved);
    deferred, the all-reduces a program starts between two waits run back to back, and only the first of them
    waits for the peers to arrive. The collectives a rank takes part in keep the program's order (any other
    collective runs after the deferred ones), so a peer that runs them at once or on its communicator's thread
    pairs with them alike; each keeps its own size (no fusion that a peer deciding otherwise would not match)."""

    def __init__(self, session: Session, comm: Any, op: str, arrays: list[np.ndarray], bucket: FlatBucket | None):
        self.session, self.comm, self.op, self.arrays, self.bucket = session, comm, op, arrays, bucket
        self.value: Any = None
        self.started = self.finished = 0
        self.ran = False

    def wait(self, timeout: float | None = None) -> Any:
        if not self.ran:
            run_deferred(self.session)
        return self.value

    def done(self) -> bool:
        return self.ran

    def run(self) -> None:
        started = time.time_ns()
        if self.bucket is not None:
            self.value = self.bucket(self.arrays, self.op, False)
        else:
            self.value = self.comm.all_reduce(self.arrays[0], self.op)
        self.started, self.finished, self.ran = started, time.time_ns(), True


def _defer(
    session: Session, comm: Any, op: str, names: list[str], outputs: list[str], handle: str, bucket: FlatBucket | None
) -> None:
    entry = Deferred(session, comm, op, [session.tensor(n) for n in names], bucket)
    session.deferred.append(entry)
    session.handles[handle] = (entry, outputs)


def run_deferred(session: Session) -> None:
    """Run the session's deferred all-reduces, in the order the program started them."""
    pending = session.deferred
    if pending:
        session.deferred = []
        for entry in pending:
            entry.run()


class Executor:
    """Binds instructions to a session. `group_of(session, name)` returns (creating if needed) a communicator;
    `may_overlap(session, comm)` says whether its collectives may run while segments compute (see DaemonCore):
    where not, an all-reduce the program starts asynchronously is deferred (see Deferred: run on the program's
    thread where first needed, back to back with the others started since), any other collective runs right there,
    and its wait returns at once. Sends and receives started asynchronously always run beside the program."""

    def __init__(
        self,
        group_of: Callable[[Session, str], Any],
        may_overlap: Callable[[Session, Any], bool] = lambda session, comm: True,
    ):
        self.group_of, self.may_overlap = group_of, may_overlap

    def bind(self, session: Session, program: daemon_pb2.Program) -> list[Bound]:
        buckets: dict[int, FlatBucket] = {}
        steps = [self._bind_one(session, i, ins, buckets) for i, ins in enumerate(program.instructions)]
        if buckets:
            _place_buckets(session, program, buckets)
        if steps:  # all-reduces still deferred when the program ends run then (see Deferred)
            steps[-1] = steps[-1]._replace(run=_then(steps[-1].run, _blocking(session, lambda: run_deferred(session))))
        return steps

    def _bind_one(
        self, session: Session, index: int, ins: daemon_pb2.Instruction, buckets: dict[int, FlatBucket]
    ) -> Bound:
        which = ins.WhichOneof("op")
        if which is None:
            raise ConfigurationError(f"instruction {index} is empty (no op set)")
        op = getattr(ins, which)
        if which == "collective":
            comm = self.group_of(session, op.group or WORLD_GROUP)
            if op.kind == collective_pb2.ALL_REDUCE and len(op.inputs) > 1:  # a bucket: see daemon/buckets.py
                bucket = buckets[index] = FlatBucket(comm, op.inputs)
                reduce_op = reduce_op_name(op.op)
                call, outputs = (
                    (lambda a: bucket([session.tensor(n) for n in bucket.names], reduce_op, a)),
                    list(op.outputs),
                )
            else:
                call, outputs = _collective_call(comm, session, op)
            label = collective_pb2.CollectiveKind.Name(op.kind).lower()
            sizes = _bytes_of(session, list(op.inputs))
            # A send or receive always runs beside the program: it mostly waits for its peer, and a receive posted
            # early and run at once would block this rank until the sender gets there (a pipeline would deadlock).
            point_to_point = op.kind in (collective_pb2.SEND, collective_pb2.RECV)
            if op.handle and (point_to_point or self.may_overlap(session, comm)):
                start = lambda: _started(session, op.handle, outputs, call)  # noqa: E731
                return Bound(label, start, label, op.group, op.handle, sizes)
            if op.handle and op.kind == collective_pb2.ALL_REDUCE:
                names, reduce_op, bucket = list(op.inputs), reduce_op_name(op.op), buckets.get(index)
                defer = lambda: _defer(session, comm, reduce_op, names, outputs, op.handle, bucket)  # noqa: E731
                return Bound(label, defer, label, op.group, op.handle, sizes)
            if op.handle:
                run_now = _blocking(session, lambda: _run_now(session, op.handle, outputs, call))
                return Bound(label, run_now, label, op.group, op.handle, sizes)
            run = _blocking(session, lambda: _store(session, outputs, _call_after_deferred(session, call)))
            return Bound(label, run, label, op.group, "", sizes)
        if which == "wait":
            return Bound("wait", _blocking(session, lambda: self._wait(session, op.handle)), "wait", "", op.handle)
        if which == "free":
            return Bound("free", lambda: [session.tensors.pop(n, None) for n in op.names] and None, "free")
        if which == "copy":
            copy = lambda: session.tensors.__setitem__(op.target, session.tensor(op.source).copy())  # noqa: E731
            return Bound("copy", copy, "copy", op.target)
        if which == "next_batch":
            run = lambda: self._next_batch(session, op)  # noqa: E731
            sizes = _bytes_of(session, list(op.outputs))
            return Bound(f"next_batch:{op.dataset}", run, "next_batch", op.dataset, "", sizes)
        if which == "run_segment":
            run = lambda: self._run_segment(session, op)  # noqa: E731
            return Bound(f"run_segment:{op.segment}", run, "run_segment", op.segment)
        raise ConfigurationError(f"instruction {index}: unsupported op {which!r}")

    def _wait(self, session: Session, handle: str) -> None:
        if handle not in session.handles:
            raise ConfigurationError(f"wait on unknown handle {handle!r}; start a collective with that handle first")
        started, outputs = session.handles.pop(handle)
        _store(session, outputs, started.wait())
        # when the communicator's thread ran it, for the timeline (plugins whose handles do not say: 0, 0)
        session.waited[handle] = (getattr(started, "started", 0), getattr(started, "finished", 0))

    def _run_segment(self, session: Session, op: daemon_pb2.RunSegment) -> None:
        if op.segment not in session.segments:
            raise ConfigurationError(f"segment {op.segment!r} is not compiled in {session.describe()}")
        session.segments[op.segment].run(session.tensors, op.inputs, op.outputs)
        if TEST_SLOWDOWN_S > 0:
            time.sleep(TEST_SLOWDOWN_S)

    def _next_batch(self, session: Session, op: daemon_pb2.NextBatch) -> None:
        if op.dataset not in session.datasets:
            raise ConfigurationError(f"dataset {op.dataset!r} is not open in {session.describe()}; OpenDataset first")
        cursor = session.datasets[op.dataset]
        row = cursor.next()
        if len(op.outputs) != len(row):
            raise ConfigurationError(
                f"next_batch of {op.dataset!r}: {len(op.outputs)} output names for columns {cursor.columns}"
            )
        if op.slices:
            row = [_batch_slice(value, cut, name) for value, cut, name in zip(row, op.slices, op.outputs, strict=True)]
        _store(session, list(op.outputs), row)


def _place_buckets(session: Session, program: daemon_pb2.Program, buckets: dict[int, FlatBucket]) -> None:
    """Lay out each bucket whose tensors all come from segments with static shapes, and bind those segment
    outputs onto the bucket's views, so that the segments write the gradients where the all-reduce reads them."""
    producers: dict[str, Any] = {}
    for index, ins in enumerate(program.instructions):
        if ins.WhichOneof("op") == "run_segment":
            segment = session.segments.get(ins.run_segment.segment)
            for name in ins.run_segment.outputs:
                producers[name] = segment
        elif index in buckets:
            bucket = buckets[index]
            sources = [producers.get(name) for name in bucket.names]
            ports = [s.output_port(n) if s is not None else None for s, n in zip(sources, bucket.names)]
            static = all(p is not None and all(isinstance(d, int) for d in p.shape) for p in ports)
            if not static or len({p.dtype for p in ports}) != 1:
                continue  # laid out on the first run instead, and filled by copies
            bucket.plan([(p.shape, p.dtype) for p in ports])
            for segment, name, view in zip(sources, bucket.names, bucket.views):
                segment.place(name, view)
