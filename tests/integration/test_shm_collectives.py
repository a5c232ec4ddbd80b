"""The shared-memory transport in real worker processes: every collective against numpy, and its failure modes."""

from __future__ import annotations

import functools
import gc
import json
import os
import threading
import time
import weakref

import numpy as np
import pytest
from collective_harness import leaked_segments, make_input, run_collectives

from tessel.core import collectives
from tessel.core.errors import CollectiveMismatchError, ConfigurationError, PeerFailedError
from tessel.core.plugin import GroupContext, Peer, program_waits
from tessel.plugins.cpu.shm import ShmCommunicator
from tessel.plugins.cpu.shm_segment import Layout, Segment, segment_path

DTYPES = ("float16", "float32", "float64", "int32", "int64", "bool")
LARGE = 1_100_000  # float32 elements: 4.4 MB, several pipelined segments
TOLERANCE = {"float16": 2e-3, "float32": 1e-6, "float64": 1e-12}


# ---------------------------------------------------------------------------------------------- references


def _inputs(step: dict, ranks: list[int]) -> list[np.ndarray]:
    return list(_inputs_of(step["name"], tuple(step.get("shape", [4])), step.get("dtype", "float32"), tuple(ranks)))


@functools.lru_cache(maxsize=4)
def _inputs_of(name: str, shape: tuple[int, ...], dtype: str, ranks: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    return tuple(make_input(0, name, r, shape, dtype) for r in ranks)


def reference(step: dict, members: list[int], rank: int) -> np.ndarray | list[np.ndarray]:
    """What group member `rank` must get from `step`: tessel.core.collectives (reductions in float64, exact for
    these inputs) over every member's input."""
    op, xs, me = step["op"], _inputs(step, members), members.index(rank)
    reduce_op = step.get("reduce", "sum")
    if op == "all_reduce":
        return collectives.all_reduce(xs, reduce_op, accumulate=np.float64)[me]
    if op == "all_gather":
        return collectives.all_gather(xs)[me]
    if op == "reduce_scatter":
        return collectives.reduce_scatter(xs, reduce_op, accumulate=np.float64)[me]
    if op == "broadcast":
        return collectives.broadcast(xs, step.get("root", 0))[me]
    if op == "all_to_all":
        return collectives.all_to_all(xs, step["split_dim"], step["concat_dim"])[me]
    if op == "neighbor_exchange":
        send_ranks = [step["send_ranks"][str(m)] for m in members]
        sends = [
            [make_input(0, f"{step['name']}.{k}", m, step["shape"], step["dtype"]) for k in range(len(targets))]
            for m, targets in zip(members, send_ranks)
        ]
        recv_ranks = [step["recv_ranks"].get(str(m), []) for m in members]
        return collectives.neighbor_exchange(sends, send_ranks, recv_ranks)[me]
    if op == "recv":  # what the sender (the "peer" of the recv, a group rank) sent
        return make_input(0, step["name"], members[step["peer"]], step["shape"], step["dtype"])
    raise ValueError(op)


def assert_same(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (what, actual.shape, expected.shape)
    tolerance = TOLERANCE.get(str(expected.dtype))
    if tolerance is None:
        np.testing.assert_array_equal(actual, expected, err_msg=what)
    else:
        np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance, err_msg=what)


# ---------------------------------------------------------------------------------------------- the batch


def collective_steps(size: int) -> tuple[list[dict], dict]:
    """Many collectives in one launch: each op, dtype, reduce op, edge sizes, large sizes, async, subgroups."""
    steps: list[dict] = []

    def add(op: str, shape: list[int], dtype: str = "float32", group: str = "world", **more) -> None:
        steps.append({"name": f"s{len(steps)}", "op": op, "shape": shape, "dtype": dtype, "group": group, **more})

    for dtype in DTYPES:
        for op in ("sum", "prod", "max", "min") + (("mean",) if dtype.startswith("float") else ()):
            add("all_reduce", [7], dtype, reduce=op)
        for shape in ([0], [1], [3, 0], [1001], [2, 3, 5], []):
            add("all_reduce", shape, dtype, reduce="max" if dtype == "bool" else "sum")
        add("all_gather", [3, 2], dtype)
        add("reduce_scatter", [size * 2, 3], dtype, reduce="min")
        add("broadcast", [5], dtype, root=size - 1)
        add("all_to_all", [size * 2, 3], dtype, split_dim=0, concat_dim=1)
    _add_large_and_empty(add, size)
    _add_exchanges(add, steps, size)
    for op, shape in (("all_reduce", [1000]), ("all_gather", [2, 2]), ("all_reduce", [LARGE])):
        add(op, shape, "float32", async_op=True)
    steps.append({"name": "wait", "op": "wait"})
    groups = {}
    if size >= 4:  # a subgroup with its own segment, also used while the world group is busy on another thread
        groups["pair"] = {"ranks": [1, 3]}
        add("all_reduce", [9], "float32", group="pair")
        add("all_gather", [2, 2], "int32", group="pair")
        world, pair = ({"name": f"c{g}", "op": "all_reduce", "shape": [50_000], "group": g} for g in ("world", "pair"))
        steps.append({"name": "concurrent", "op": "concurrent", "steps": [world, pair]})
    return steps, groups


def _add_large_and_empty(add, size: int) -> None:
    """Sizes >= 4 MiB (pipelined segments and rounds, zero-copy inputs, also mixed) and 0-element tensors."""
    add("all_reduce", [LARGE], "float32", reduce="sum")
    add("all_reduce", [LARGE + 3], "float32", reduce="mean", zero_copy=True)
    add("all_reduce", [LARGE + 5], "float32", reduce="max", zero_copy=True, per_rank={"0": {"zero_copy": False}})
    add("all_reduce", [LARGE // 2 + 1], "float64", reduce="max")
    add("all_reduce", [LARGE // 2 + 1], "float16", reduce="sum")  # numpy's float16 is slow: 2.2 MB
    add("all_reduce", [LARGE // 2, 2], "int64", reduce="prod")
    add("all_reduce", [20_000], "float32", reduce="sum", zero_copy=True)
    add("all_gather", [LARGE // 4 + 1, 2], "float32")
    add("all_gather", [0, 4], "float32")
    add("reduce_scatter", [size * (1_200_001 // size)], "float32", reduce="mean")
    add("reduce_scatter", [0, 2], "int32")
    add("broadcast", [LARGE + 1], "float32", root=0)
    add("broadcast", [0], "int64", root=0)
    add("all_to_all", [3, size * (370_001 // size)], "float32", split_dim=1, concat_dim=0)
    add("all_to_all", [size, 0], "float32", split_dim=0, concat_dim=-1)


def _add_exchanges(add, steps: list[dict], size: int) -> None:
    """Neighbor exchanges (a ring; both neighbors, pipelined) and send/recv, including both ways at once."""
    ring = {str(r): [(r + 1) % size] for r in range(size)}
    back = {str(r): [(r - 1) % size] for r in range(size)}
    add("neighbor_exchange", [4, 3], "float32", send_ranks=ring, recv_ranks=back)
    both = {str(r): [(r + 1) % size, (r - 1) % size] for r in range(size)}
    add("neighbor_exchange", [300_000], "int32", send_ranks=both, recv_ranks=both)
    if size == 1:
        return
    receiver = size - 1
    as_receiver = {str(receiver): {"op": "recv", "peer": 0}}
    for shape in ([6], [400_000]):  # one round, then pipelined through the pair channel
        add("send", shape, "float64", peer=receiver, ranks=[0, receiver], per_rank=as_receiver)
    # Both directions at once, one thread each: pair channels are independent of each other.
    peers = {"0": {"peer": 1}, "1": {"peer": 0}}
    swap = {"name": "swap", "shape": [70_000], "dtype": "int64", "ranks": [0, 1], "per_rank": peers}
    steps.append({"name": "both", "op": "concurrent", "steps": [{**swap, "op": "send"}, {**swap, "op": "recv"}]})


def _expected_steps(steps: list[dict]) -> list[dict]:
    flat = []
    for step in steps:
        flat.extend(step["steps"] if step["op"] == "concurrent" else [step])
    return [s for s in flat if s["op"] not in ("wait", "barrier")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "size, arena_mib",
    [(1, None), (2, None), (3, None), (4, None), (8, None), (3, "8")],
    ids=["1", "2", "3", "4", "8", "3-small-arena"],
)
def test_every_collective_matches_numpy(tmp_path, monkeypatch, size, arena_mib):
    if arena_mib is not None:  # outputs that no longer fit the arena take the private fallback path, mixed
        monkeypatch.setenv("TESSEL_SHM_ARENA_MIB", arena_mib)
    steps, groups = collective_steps(size)
    run = run_collectives(tmp_path, size, steps, groups=groups, deadline_s=150)
    assert run.returncodes == [0] * size, run.describe()
    all_groups = run.spec["groups"]
    checked = 0
    for step in _expected_steps(steps):
        members = all_groups[step.get("group", "world")]["ranks"]
        same_everywhere = None  # all_reduce, all_gather and broadcast give every rank the same: compute it once
        for rank in step.get("ranks", members):
            resolved = {**step, **step.get("per_rank", {}).get(str(rank), {})}
            assert run.error(rank, step["name"]) is None, run.error(rank, step["name"])["traceback"]
            if resolved["op"] == "send":
                continue
            if same_everywhere is None or resolved["op"] not in ("all_reduce", "all_gather", "broadcast"):
                expected = same_everywhere = reference(resolved, members, rank)
            if isinstance(expected, list):
                for i, value in enumerate(expected):
                    assert_same(run.output(rank, step["name"], i), value, f"{step} rank {rank} output {i}")
            else:
                assert_same(run.output(rank, step["name"]), expected, f"{step} rank {rank}")
            checked += 1
    assert checked > 40 * size
    assert leaked_segments(run) == []


# ---------------------------------------------------------------------------------------------- failures


def _errors(run, name: str, ranks) -> list[dict]:
    errors = [run.error(r, name) for r in ranks]
    assert all(e is not None for e in errors), (name, errors, run.describe())
    return errors


@pytest.mark.slow
def test_mismatches_raise_on_every_rank_naming_the_culprit(tmp_path):
    def all_reduce(name: str, **more) -> dict:
        return {"name": name, "op": "all_reduce", "shape": [4, 4], "dtype": "float32", **more}

    steps = [
        all_reduce("shape", per_rank={"2": {"shape": [4, 3]}}),
        all_reduce("ok1"),
        all_reduce("dtype", per_rank={"1": {"dtype": "float64"}}),
        all_reduce("op", per_rank={"0": {"reduce": "max"}}),
        all_reduce("order", per_rank={"2": {"op": "all_gather"}}),
        {"name": "root", "op": "broadcast", "shape": [3], "root": 0, "per_rank": {"1": {"root": 2}}},
        {"name": "indivisible", "op": "reduce_scatter", "shape": [4]},
        {"name": "bad_root", "op": "broadcast", "shape": [3], "root": 5},
        {"name": "pair", "op": "send", "shape": [4], "peer": 1, "ranks": [0, 1],
         "per_rank": {"1": {"op": "recv", "peer": 0, "shape": [5]}}},
        {"name": "ring", "op": "neighbor_exchange", "shape": [2], "dtype": "float32",
         "send_ranks": {"0": [1], "1": [2], "2": [0]}, "recv_ranks": {"0": [2], "1": [0], "2": [1]},
         "recv_shapes": {"0": [[2]], "1": [[3]], "2": [[2]]}},
        all_reduce("ok2", dtype="int32"),
    ]  # fmt: skip
    run = run_collectives(tmp_path, 3, steps)
    assert run.returncodes == [0, 0, 0], run.describe()
    expectations = {
        "shape": (2, "shape", ["rank 2 has shape (4, 3)", "rank 0 has shape (4, 4)", "all_reduce #0"]),
        "dtype": (1, "dtype", ["rank 1 has dtype float64", "float32"]),
        "op": (0, "op", ["rank 0 has reduce op 'max'", "'sum'"]),
        "order": (2, "kind", ["rank 2 calls all_gather", "calls all_reduce", "same order"]),
        "root": (1, "root", ["rank 1 has root 2", "root 0"]),
    }
    for name, (culprit, field, phrases) in expectations.items():
        messages = set()
        for error in _errors(run, name, range(3)):
            assert error["type"] == "CollectiveMismatchError", error
            assert (error["culprit_rank"], error["field"]) == (culprit, field), error
            assert all(p in error["message"] for p in phrases), error["message"]
            messages.add(error["message"])
        assert len(messages) == 1, messages  # the same verdict everywhere
    for error in _errors(run, "indivisible", range(3)):
        assert error["type"] == "ConfigurationError" and "divisible by the group size 3" in error["message"], error
    for error in _errors(run, "bad_root", range(3)):
        assert error["type"] == "ConfigurationError" and "root 5 is not a group rank" in error["message"], error
    for error in _errors(run, "pair", [0, 1]):
        assert (error["type"], error["culprit_rank"], error["field"]) == ("CollectiveMismatchError", 0, "shape")
        assert "rank 0 sends shape (4,) but rank 1 expects (5,)" in error["message"], error["message"]
    for error in _errors(run, "ring", range(3)):
        assert (error["type"], error["culprit_rank"]) == ("CollectiveMismatchError", 0), error
        assert "rank 0 sends shape (2,) float32 to rank 1 but rank 1 expects shape (3,) float32" in error["message"]
    for name in ("ok1", "ok2"):  # the group stays usable after every mismatch
        step = next(s for s in steps if s["name"] == name)
        for rank in range(3):
            assert_same(run.output(rank, name), reference(step, [0, 1, 2], rank), name)
    assert leaked_segments(run) == []


@pytest.mark.slow
def test_killed_peer_fails_the_others_within_seconds(tmp_path):
    steps = [
        {"name": "warm", "op": "all_reduce", "shape": [1000]},
        {"name": "kill", "op": "kill", "ranks": [0], "seconds": 0.3},  # rank 0 created the segment
        {"name": "loop", "op": "all_reduce", "shape": [LARGE // 4], "repeat": 3000},
    ]
    run = run_collectives(tmp_path, 3, steps)
    assert run.returncodes[0] == -9 and run.returncodes[1:] == [0, 0], run.describe()
    killed = json.loads((run.directory / "killed.0.json").read_text())["time"]
    for error in _errors(run, "loop", [1, 2]):
        assert error["type"] == "PeerFailedError" and error["culprit_rank"] == 0, error
        assert f"rank 0 (group rank 0, pid {run.results[1]['pids'][0]})" in error["message"], error["message"]
        assert "died" in error["message"], error["message"]
        assert error["time"] - killed < 5.0, error["time"] - killed
    assert leaked_segments(run) == []


@pytest.mark.slow
def test_abort_timeout_and_close_end_the_wait_with_the_cause(tmp_path):
    cause = "job failed: rank 1 missed its heartbeats"
    steps = [
        {"name": "nap1", "op": "sleep", "ranks": [1], "seconds": 1.5},
        {"name": "aborted", "op": "all_reduce", "group": "a", "abort": {"0": [0.3, cause]}},
        {"name": "nap2", "op": "sleep", "ranks": [1], "seconds": 2.5},
        {"name": "late", "op": "all_reduce", "group": "t"},
        {"name": "aborted_again", "op": "all_reduce", "group": "a"},
        {"name": "late_again", "op": "all_reduce", "group": "t"},
        {"name": "leave", "op": "close", "group": "c", "ranks": [1]},
        {"name": "orphan", "op": "all_reduce", "group": "c", "ranks": [0]},
        {"name": "after", "op": "all_reduce", "shape": [3]},
    ]
    groups = {"a": {"ranks": [0, 1]}, "t": {"ranks": [0, 1], "timeout_s": 1.0}, "c": {"ranks": [0, 1]}}
    run = run_collectives(tmp_path, 2, steps, groups=groups)
    assert run.returncodes == [0, 0], run.describe()
    # Rank 0 arrived before it gave up, so rank 1 completes that collective; the group is broken from then on.
    (aborted,) = _errors(run, "aborted", [0])
    assert aborted["type"] == "PeerFailedError" and cause in aborted["message"], aborted
    (timed_out,) = _errors(run, "late", [0])
    assert timed_out["type"] == "CollectiveTimeoutError", timed_out
    assert "rank 1 (group rank 1, pid" in timed_out["message"] and "did not arrive within 1 s" in timed_out["message"]
    assert 0.9 < timed_out["time"] - run.time_of(0, "late:start") < 2.5
    assert aborted["time"] - run.time_of(0, "aborted:start") < 1.5  # at the abort (0.3 s), not the timeout (30 s)
    for name in ("aborted", "late"):
        assert run.error(1, name) is None and run.output(1, name).shape == (4,)
        mine, theirs = _errors(run, f"{name}_again", [0, 1])
        assert mine["type"] == "PeerFailedError" and "unusable after an earlier failure" in mine["message"], mine
        assert theirs["type"] == "PeerFailedError" and "rank 0" in theirs["message"], theirs
        assert "left the group after an error" in theirs["message"], theirs
    (orphan,) = _errors(run, "orphan", [0])
    assert orphan["type"] == "PeerFailedError" and "rank 1 (group rank 1, pid" in orphan["message"], orphan
    assert "closed the group" in orphan["message"] and orphan["time"] - run.time_of(1, "leave:start") < 1.0
    step = steps[-1]
    for rank in (0, 1):  # other groups are unaffected
        assert_same(run.output(rank, "after"), reference(step, [0, 1], rank), "after")
    assert leaked_segments(run) == []


# ---------------------------------------------------------------------------------------------- in this process


def _context(name: str, size: int = 1, rank: int = 0, pid: int | None = None, local_ranks: int = 0) -> GroupContext:
    peers = tuple(Peer(r, "here", "", pid or os.getpid()) for r in range(size))
    return GroupContext(
        f"unit-{os.getpid()}", name, tuple(range(size)), rank, peers, timeout_s=5.0, local_ranks=local_ranks
    )


def test_one_rank_group_copies_and_buffers_come_back_to_the_arena():
    comm = ShmCommunicator(_context("solo"))
    try:
        x = np.arange(10, dtype=np.float32)
        out = comm.all_reduce(x, "mean")
        np.testing.assert_array_equal(out, x)
        assert out is not x and not np.shares_memory(out, x)
        free = comm._arena.free_bytes()
        buffer = comm.buffer((1000, 1000), np.float32)
        buffer[:] = 2.0
        view = buffer[10:20]
        np.testing.assert_array_equal(comm.all_reduce(buffer, "sum"), buffer)
        assert comm._arena.free_bytes() < free
        del buffer
        gc.collect()
        assert comm._arena.free_bytes() < free  # the view still holds the space
        del view
        gc.collect()
        assert comm._arena.free_bytes() == free
        with pytest.raises(ConfigurationError, match="TESSEL_SHM_ARENA_MIB"):
            comm.buffer((comm._arena.size + 1,), np.uint8)
        with pytest.raises(ConfigurationError, match="dtype complex64"):
            comm.all_reduce(np.zeros(3, np.complex64))
        with pytest.raises(ConfigurationError, match="'mean' needs a floating dtype"):
            comm.all_reduce(np.zeros(3, np.int32), "mean")
        with pytest.raises(ConfigurationError, match="peer 0 must be another group rank"):
            comm.send(x, 0)
        np.testing.assert_array_equal(comm.all_reduce(x), x)  # still usable after refused calls
    finally:
        comm.close()
    comm.close()  # idempotent
    with pytest.raises(ConfigurationError, match="closed"):
        comm.all_reduce(np.zeros(2))
    assert not os.path.exists(segment_path(_context("solo")))


def test_a_stale_segment_is_never_joined_and_is_replaced():
    context = _context("stale", size=2, rank=1)
    stale_owner = _context("stale", size=2, rank=0, pid=os.getpid() + 1_000_000)
    stale = Segment.create(stale_owner, Layout(2, 4096, 4096, 0))  # same name, another creator pid
    try:
        assert Segment.try_attach(context) is None
        fresh_creator = _context("stale", size=2, rank=0)
        results = {}
        threads = [
            threading.Thread(target=lambda c=c: results.__setitem__(c.rank, ShmCommunicator(c)))
            for c in (fresh_creator, context)
        ]
        [t.start() for t in threads]
        [t.join(timeout=20) for t in threads]
        assert set(results) == {0, 1}
        out = {}
        threads = [
            threading.Thread(target=lambda r=r: out.__setitem__(r, results[r].all_reduce(np.full(3, r + 1.0))))
            for r in (0, 1)
        ]
        [t.start() for t in threads]
        [t.join(timeout=20) for t in threads]
        np.testing.assert_array_equal(out[0], np.full(3, 3.0))
        np.testing.assert_array_equal(out[1], np.full(3, 3.0))
        [c.close() for c in results.values()]
        assert not os.path.exists(segment_path(context))
    finally:
        stale.close()


def test_a_small_chunk_keeps_the_one_round_all_reduce_within_each_ranks_slot(monkeypatch):
    # with a 4 KiB chunk a rank's slot holds 12 KiB at 2 ranks: a 200 KB all_reduce used to take the one-round
    # path, copy past its slot into the others' and return wrong sums
    monkeypatch.setenv("TESSEL_SHM_CHUNK_KIB", "4")
    comms = _pair("small-chunk")
    try:
        assert comms[0].small_bytes == comms[0]._engine.layout.group_half == 3 * 4096
        out: dict[int, list] = {0: [], 1: []}

        def run(rank: int) -> None:
            for step in range(10):
                out[rank].append(comms[rank].all_reduce(np.full(50_000, float(rank + 1 + step), np.float32)))

        threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
        [t.start() for t in threads]
        [t.join(timeout=30) for t in threads]
        for rank in (0, 1):
            assert [float(np.unique(y)[0]) for y in out[rank]] == [3.0 + 2 * step for step in range(10)]
            assert all(np.unique(y).size == 1 for y in out[rank])
    finally:
        [c.close() for c in comms.values()]


def _pair(name: str, local_ranks: int = 0) -> dict[int, ShmCommunicator]:
    made: dict[int, ShmCommunicator] = {}
    threads = [
        threading.Thread(
            target=lambda r=r: made.__setitem__(r, ShmCommunicator(_context(name, 2, r, local_ranks=local_ranks)))
        )
        for r in (0, 1)
    ]
    [t.start() for t in threads]
    [t.join(timeout=20) for t in threads]
    assert set(made) == {0, 1}
    return made


def test_an_asynchronous_send_runs_on_the_calling_thread_only_when_its_receiver_already_waits():
    """A started send whose receiver is already at the meeting costs only its copy, on the caller's thread (the
    handle is done at once); one that would have to wait for its receiver goes to the communicator's thread and the
    caller goes on. Either way the bytes arrive in order."""
    comms = _pair("inline")
    sender, receiver = comms[0], comms[1]
    engine = sender._engine
    try:
        got: list[np.ndarray] = []
        first = threading.Thread(target=lambda: got.append(receiver.recv((1000,), np.float32, 0)))
        first.start()
        deadline = time.monotonic() + 10
        while not engine.waiting(engine.pair(0, 1), 1) and time.monotonic() < deadline:
            time.sleep(0.001)
        handle = sender.send(np.arange(1000, dtype=np.float32), 1, async_op=True)
        assert handle.done() and sender._async_worker is None  # ran here: the communicator's thread not even made
        handle.wait()
        first.join(timeout=10)
        np.testing.assert_array_equal(got[0], np.arange(1000, dtype=np.float32))

        queued = sender.send(np.full(5, 7.0, np.float32), 1, async_op=True)  # nobody receives yet
        after = sender.send(np.full(3, 8.0, np.float32), 1, async_op=True)  # behind it, never ahead
        assert not queued.done() and not sender.idle()
        np.testing.assert_array_equal(receiver.recv((5,), np.float32, 0), np.full(5, 7.0, np.float32))
        np.testing.assert_array_equal(receiver.recv((3,), np.float32, 0), np.full(3, 8.0, np.float32))
        queued.wait(10), after.wait(10)
        deadline = time.monotonic() + 10
        while not sender.idle() and time.monotonic() < deadline:  # its thread's callback runs just after the result
            time.sleep(0.001)
        assert sender.idle()
    finally:
        [c.close() for c in comms.values()]


def test_a_synchronous_send_goes_after_the_asynchronous_sends_issued_before_it_to_that_peer():
    """A send made while earlier asynchronous sends to the same peer still wait for their receiver goes after them,
    as the program issued them (it swapped places with them: the receiver got the wrong message)."""
    comms = _pair("send-order")
    sender, receiver = comms[0], comms[1]
    try:
        queued = [sender.send(np.full(5 + i, i, np.float32), 1, async_op=True) for i in range(3)]  # none received yet
        synchronous = threading.Thread(target=sender.send, args=(np.full(2, 9.0, np.float32), 1))
        synchronous.start()
        time.sleep(0.1)  # the synchronous send is under way, or waits for the queued ones
        for i in range(3):
            np.testing.assert_array_equal(receiver.recv((5 + i,), np.float32, 0), np.full(5 + i, i, np.float32))
        np.testing.assert_array_equal(receiver.recv((2,), np.float32, 0), np.full(2, 9.0, np.float32))
        synchronous.join(timeout=10)
        [handle.wait(10) for handle in queued]
    finally:
        [c.close() for c in comms.values()]


def test_an_asynchronous_receives_mismatch_is_its_own_not_the_next_receives():
    """A mismatch leaves the pair usable: the next receive from that peer runs, whether or not the program has
    read the failed one's handle yet (it got the earlier error instead, and its sender hung)."""
    comms = _pair("stale-error")
    sender, receiver = comms[0], comms[1]
    try:
        failed = receiver.recv((5,), np.float32, 0, async_op=True)
        with pytest.raises(CollectiveMismatchError):
            sender.send(np.ones(4, np.float32), 1)
        deadline = time.monotonic() + 10
        while not failed.done() and time.monotonic() < deadline:
            time.sleep(0.001)
        got: list[np.ndarray] = []
        later = threading.Thread(target=lambda: got.append(receiver.recv((3,), np.float32, 0)))
        later.start()
        sender.send(np.full(3, 2.0, np.float32), 1)
        later.join(timeout=10)
        np.testing.assert_array_equal(got[0], np.full(3, 2.0, np.float32))
        with pytest.raises(CollectiveMismatchError):
            failed.wait(10)
    finally:
        [c.close() for c in comms.values()]


def test_a_send_waiting_for_earlier_sends_that_close_cancels_ends_with_an_error():
    """close() cancels the asynchronous sends still queued; a synchronous send waiting for them must end too
    (concurrent.futures.wait never sees a cancelled future end: the send would wait for ever)."""
    comms = _pair("cancelled-wait")
    sender = comms[0]
    try:
        running = sender.send(np.ones(5, np.float32), 1, async_op=True)  # nobody receives: it waits for its receiver
        queued = sender.send(np.ones(3, np.float32), 1, async_op=True)  # behind it: close() cancels it
        outcome: list[BaseException | None] = []

        def send_after_them() -> None:
            try:
                sender.send(np.ones(2, np.float32), 1)
                outcome.append(None)
            except BaseException as error:  # recorded for the assertion
                outcome.append(error)

        later = threading.Thread(target=send_after_them, daemon=True)
        later.start()
        time.sleep(0.2)  # it waits for the queued sends
        sender.close()
        later.join(timeout=10)
        assert not later.is_alive(), "a send waiting for sends that close() cancelled never ended"
        assert outcome and outcome[0] is not None, outcome
        assert queued.done() and running is not None
    finally:
        [c.close() for c in comms.values()]


def test_a_closed_communicator_refuses_asynchronous_calls_and_keeps_no_thread():
    comms = _pair("closed-async")
    comm = comms[0]
    comm.close()
    with pytest.raises(ConfigurationError, match="the communicator is closed; create the group again"):
        comm.send(np.ones(2, np.float32), 1, async_op=True)
    assert comm._lanes == {} and comm._async_worker is None
    comms[1].close()


@pytest.mark.parametrize("local_ranks", [1, 0])
def test_a_receive_on_the_communicators_thread_polls_while_the_program_waits_for_it(local_ranks):
    """A receive started asynchronously sleeps on its futex while the program computes; once the program blocks in
    the handle's wait (its core idle), the communicator's thread polls instead, where every local rank has a core of
    its own (local_ranks 1): it says it no longer sleeps, so nobody has to wake it when the data lands. Where that
    is not known (0) it sleeps on."""
    comms = _pair(f"poll-{local_ranks}", local_ranks)
    sender, receiver = comms[0], comms[1]
    engine = receiver._engine
    sleep_word = engine.segment.layout.sleep_word(1, engine.pair(0, 1).index)
    asleep = lambda: engine.segment.words[sleep_word] != 0  # noqa: E731
    try:
        handle = receiver.recv((1000,), np.float32, 0, async_op=True)
        deadline = time.monotonic() + 10
        while not asleep() and time.monotonic() < deadline:  # the program computes: the receive sleeps
            time.sleep(0.001)
        assert asleep()
        got: list[np.ndarray] = []
        waiter = threading.Thread(target=lambda: got.append(handle.wait(10)))
        waiter.start()
        deadline = time.monotonic() + 10
        while not handle.awaited and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # well past a futex wake, and past a futex timeout
        assert handle.awaited and not handle.done()
        assert asleep() == (local_ranks == 0)
        sender.send(np.arange(1000, dtype=np.float32), 1)
        waiter.join(timeout=10)
        np.testing.assert_array_equal(got[0], np.arange(1000, dtype=np.float32))
        assert not program_waits()  # on this thread: no call of a communicator runs here
        later = receiver.recv((10,), np.float32, 0, async_op=True)  # nobody waits for this one: it sleeps
        deadline = time.monotonic() + 10
        while not asleep() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert asleep() and not later.awaited
        sender.send(np.ones(10, np.float32), 1)
        np.testing.assert_array_equal(later.wait(10), np.ones(10, np.float32))
    finally:
        [c.close() for c in comms.values()]


def test_a_receive_the_program_waits_for_sleeps_while_another_communicator_thread_runs_python():
    """The poller holds the GIL but for a moment each round, so it polls only while no other communicator thread
    of the process runs a call outside a futex or socket wait: here another group's call is running, and the
    awaited receive sleeps until the data comes."""
    comms = _pair("poll-busy", local_ranks=1)
    sender, receiver = comms[0], comms[1]
    engine = receiver._engine
    sleep_word = engine.segment.layout.sleep_word(1, engine.pair(0, 1).index)
    other = ShmCommunicator(_context("poll-busy-other"))
    release = threading.Event()
    try:
        busy = other._submit(release.wait, 10)  # a call running on the other group's thread, not asleep in a wait
        handle = receiver.recv((100,), np.float32, 0, async_op=True)
        waiter = threading.Thread(target=handle.wait, args=(10,))
        waiter.start()
        deadline = time.monotonic() + 10
        while not handle.awaited and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)
        assert handle.awaited and engine.segment.words[sleep_word] != 0  # asleep, not polling
        sender.send(np.ones(100, np.float32), 1)
        waiter.join(timeout=10)
        np.testing.assert_array_equal(handle.wait(10), np.ones(100, np.float32))
        release.set()
        busy.wait(10)
    finally:
        release.set()
        other.close()
        [c.close() for c in comms.values()]


def test_a_polling_receive_ends_with_the_cause_when_its_sender_closes_the_group():
    """Polling checks the peers as sleeping does: a sender that closes the group ends the awaited receive with a
    PeerFailedError naming it, within a moment, not at the timeout."""
    comms = _pair("poll-close", local_ranks=1)
    sender, receiver = comms[0], comms[1]
    try:
        handle = receiver.recv((10,), np.float32, 0, async_op=True)
        outcome: list[BaseException] = []

        def wait() -> None:
            try:
                handle.wait(10)
            except BaseException as error:  # the test reads it
                outcome.append(error)

        waiter = threading.Thread(target=wait)
        waiter.start()
        deadline = time.monotonic() + 10
        while not handle.awaited and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # polling by now
        closed = time.monotonic()
        sender.close()
        waiter.join(timeout=10)
        assert outcome and isinstance(outcome[0], PeerFailedError), outcome
        assert "closed the group" in str(outcome[0]) and time.monotonic() - closed < 2.0
    finally:
        [c.close() for c in comms.values()]


def test_an_asynchronous_call_that_finished_before_its_handle_was_made_leaves_the_communicator_idle():
    """The in-flight count's callback runs at once for a call already done; it must not wait for the lock the
    call was submitted under (that deadlocked the caller)."""
    from concurrent.futures import Future

    class AtOnce:  # an executor whose calls are done when submit returns
        def submit(self, fn, *args):
            future = Future()
            future.set_result(fn(*args))
            return future

    comm = ShmCommunicator(_context("at-once"))
    try:
        comm._async_worker = AtOnce()
        done = threading.Event()
        submit = lambda: (comm.all_reduce(np.ones(3), async_op=True).wait(), done.set())  # noqa: E731
        threading.Thread(target=submit, daemon=True).start()
        assert done.wait(10), "submitting an asynchronous call that finished at once deadlocked"
        assert comm.idle()
    finally:
        comm._async_worker = None
        comm.close()


def test_an_asynchronous_result_goes_with_its_handle_not_with_the_garbage_collector():
    """A done callback that held the handle made a cycle with its future: the result (an arena block) then went
    only with a garbage collection, whose finalizer could run inside the arena's own allocate (a hang in CI)."""
    comm = ShmCommunicator(_context("goes-with-handle"))
    gc.disable()
    try:
        handle = comm.all_reduce(np.ones(1000, np.float32), async_op=True)
        result = handle.wait(10)
        gone = weakref.ref(result)
        deadline = time.monotonic() + 10
        while not comm.idle() and time.monotonic() < deadline:  # its thread's callback runs just after the result
            time.sleep(0.001)
        del handle, result
        assert gone() is None
    finally:
        gc.enable()
        comm.close()


def test_an_arena_block_freed_while_its_own_thread_holds_the_lock_is_merged_by_the_next_call():
    """A finalizer (an output array gone) may run inside a garbage collection in the middle of the arena's
    allocate on the same thread: its free must not wait for the lock that thread holds."""
    from tessel.plugins.cpu.shm_arena import Arena

    arena = Arena(0, 1 << 20, lambda offset, length: None)
    block = arena.allocate(4096)
    assert arena.free_bytes() == (1 << 20) - 4096

    def free_inside_allocate() -> None:
        with arena._lock:
            arena.free(block, 4096)

    inside = threading.Thread(target=free_inside_allocate, daemon=True)
    inside.start()
    inside.join(timeout=5)
    assert not inside.is_alive(), "a free under the arena's own lock waited for it"
    assert arena.free_bytes() == 1 << 20  # merged by the next call that takes the lock


@pytest.mark.parametrize("where", ["arena", "numpy"])
def test_all_gather_into_fills_the_given_output_around_this_ranks_own_block(where):
    """all_gather_into is all_gather to the other members, its result in the output given: one made by output()
    (in the arena: the peers push into it) or a numpy array (through the halves); where the input is this rank's
    own block of that output it stays as it is and only the peers' blocks arrive."""
    comms = _pair(f"into-{where}")
    results: dict[int, tuple] = {}

    def run(rank: int) -> None:
        comm = comms[rank]
        rows = 70_000  # 280 KiB a block: the large all_gather
        out = comm.output((2 * rows,), np.float32) if where == "arena" else np.empty(2 * rows, np.float32)
        mine = out[rank * rows : (rank + 1) * rows]
        mine[:] = np.arange(rows, dtype=np.float32) + 1000 * rank
        returned = comm.all_gather_into(mine, out)
        copied = np.empty(2 * rows, np.float32)
        comm.all_gather_into(np.arange(rows, dtype=np.float32) + 1000 * rank, copied)  # an input elsewhere
        results[rank] = (returned is out, out.copy(), copied, comm._zero_copy_offset(out) >= 0)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    try:
        [t.start() for t in threads]
        [t.join(timeout=20) for t in threads]
        expected = np.concatenate([np.arange(70_000, dtype=np.float32) + 1000 * r for r in (0, 1)])
        for rank in (0, 1):
            same, into, copied, in_arena = results[rank]
            assert same and in_arena == (where == "arena")
            np.testing.assert_array_equal(into, expected)
            np.testing.assert_array_equal(copied, expected)
        with pytest.raises(ConfigurationError, match="must be C-contiguous of shape"):
            comms[0].all_gather_into(np.ones(3, np.float32), np.ones(5, np.float32))
    finally:
        [c.close() for c in comms.values()]


def test_a_send_run_on_the_calling_thread_reports_a_mismatch_through_its_handle_and_on_the_receiver():
    """The inline send keeps an asynchronous send's contract: its error comes from wait(), and the receiver gets
    the same verdict; the pair stays usable."""
    comms = _pair("inline-mismatch")
    sender, receiver = comms[0], comms[1]
    engine = sender._engine
    try:
        errors: list[BaseException] = []

        def receive(shape):
            try:
                return receiver.recv(shape, np.float32, 0)
            except CollectiveMismatchError as error:
                errors.append(error)

        waiting = threading.Thread(target=receive, args=((5,),))
        waiting.start()
        deadline = time.monotonic() + 10
        while not engine.waiting(engine.pair(0, 1), 1) and time.monotonic() < deadline:
            time.sleep(0.001)
        handle = sender.send(np.ones(4, np.float32), 1, async_op=True)
        assert handle.done() and sender._async_worker is None  # it ran here
        with pytest.raises(CollectiveMismatchError, match=r"sends shape \(4,\) but rank 1 expects \(5,\)"):
            handle.wait()
        waiting.join(timeout=10)
        assert len(errors) == 1 and "expects (5,)" in str(errors[0])
        after = threading.Thread(target=lambda: errors.append(receiver.recv((3,), np.float32, 0)))
        after.start()
        sender.send(np.full(3, 2.0, np.float32), 1)
        after.join(timeout=10)
        np.testing.assert_array_equal(errors[-1], np.full(3, 2.0, np.float32))
    finally:
        [c.close() for c in comms.values()]


def test_a_segment_others_may_write_is_never_joined():
    # the segment's name is derived from the job's nonce: where another user could create or open it, a rank must
    # not attach to what they wrote
    context = _context("exposed", size=2, rank=1)
    owner = Segment.create(_context("exposed", size=2, rank=0), Layout(2, 4096, 4096, 0))
    try:
        os.chmod(segment_path(context), 0o666)
        with pytest.raises(ConfigurationError, match="not to this user alone"):
            Segment.try_attach(context)
    finally:
        owner.close()
