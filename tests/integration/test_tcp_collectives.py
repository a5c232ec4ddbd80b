"""The CPU plugin's TCP transport between real processes on 127.0.0.1, checked against numpy.

The multi-process tests run the shared collective harness (collective_harness.py / collective_worker.py) with
TESSEL_TRANSPORT=tcp: the same batch of collectives as the shared-memory transport's tests, plus cases that only
matter over TCP (the switch from the latency path to the ring at SMALL_BYTES, a subgroup whose group ranks are
not in global order). Failure modes (mismatches, a killed peer) are checked for what they must mean on every
transport: every rank raises, naming the same culprit and field, within seconds. The fast tests at the end run
ranks as threads of this process over real sockets (deadline, abort, token, close, one-rank groups).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import numpy as np
import pytest
from collective_harness import make_input, run_collectives
from test_shm_collectives import assert_same, collective_steps, reference

from tessel.core.errors import CollectiveTimeoutError, ConfigurationError, PeerFailedError, PeerUnreachableError
from tessel.core.plugin import GroupContext, Peer
from tessel.plugins.cpu.tcp import TcpTransport
from tessel.plugins.cpu.tcp_communicator import SMALL_BYTES

EDGE = SMALL_BYTES // 4  # float32 elements at the switch from data-with-agreement to the ring algorithms


def tcp_steps(size: int) -> tuple[list[dict], dict]:
    """Cases specific to TCP: both sides of the small/large switch, 7-element blocks, a permuted subgroup."""
    steps: list[dict] = []

    def add(op: str, shape: list[int], dtype: str = "float32", group: str = "world", **more) -> None:
        steps.append({"name": f"t{len(steps)}", "op": op, "shape": shape, "dtype": dtype, "group": group, **more})

    for n in (EDGE, EDGE + 1):
        add("all_reduce", [n], reduce="sum")
        add("all_gather", [n])
        add("broadcast", [n], root=size // 2)
        add("reduce_scatter", [size, n], "float64", reduce="max")
        add("all_to_all", [size, n], split_dim=0, concat_dim=1)
    add("all_gather", [7, 3], "int64")
    add("reduce_scatter", [size * 7], "float16", reduce="mean")
    add("all_to_all", [7, size * 2], "bool", split_dim=-1, concat_dim=-2)
    add("barrier", [])
    groups = {}
    if size >= 4:  # group rank 0 is global rank 3: roots and blocks follow group ranks
        groups["trio"] = {"ranks": [3, 1, 2]}
        add("broadcast", [1_100_001], group="trio", root=0)
        add("reduce_scatter", [6, 3], group="trio", reduce="sum")
        add("all_to_all", [3, 6], "int32", group="trio", split_dim=0, concat_dim=1)
        add("all_gather", [2, 2], "int32", group="trio", async_op=True)
        steps.append({"name": "wait_trio", "op": "wait"})
    return steps, groups


def _checked_steps(steps: list[dict]) -> list[dict]:
    flat = [sub for step in steps for sub in (step["steps"] if step["op"] == "concurrent" else [step])]
    return [step for step in flat if step["op"] not in ("wait", "barrier")]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_every_collective_matches_numpy(tmp_path, size):
    steps, groups = collective_steps(size)
    extra_steps, extra_groups = tcp_steps(size)
    run = run_collectives(
        tmp_path, size, steps + extra_steps, groups={**groups, **extra_groups}, transport="tcp", deadline_s=200
    )
    assert run.returncodes == [0] * size, run.describe()
    checked = 0
    for step in _checked_steps(steps + extra_steps):
        members = run.spec["groups"][step.get("group", "world")]["ranks"]
        first = None  # the first member's output, for the collectives whose result is the same everywhere
        for rank in step.get("ranks", members):
            resolved = {**step, **step.get("per_rank", {}).get(str(rank), {})}
            error = run.error(rank, step["name"])
            assert error is None, error["traceback"]
            if resolved["op"] == "send":
                continue
            if first is not None:  # the very same bits as the first member (cheaper than numpy again)
                np.testing.assert_array_equal(run.output(rank, step["name"]), first, err_msg=f"{step} rank {rank}")
                continue
            expected = reference(resolved, members, rank)
            for i, value in enumerate(expected) if isinstance(expected, list) else [(None, expected)]:
                assert_same(run.output(rank, step["name"], i), value, f"{step} on rank {rank} output {i}")
            if resolved["op"] in ("all_reduce", "all_gather", "broadcast"):
                first = run.output(rank, step["name"])
            checked += 1
    assert checked > 50


def _errors(run, name: str, ranks) -> list[dict]:
    errors = [run.error(r, name) for r in ranks]
    assert all(e is not None for e in errors), (name, errors, run.describe())
    return errors


MISMATCHES = {  # step -> (culprit global rank, field, phrases in the message)
    "shape": (2, "shape", ["(4, 3)", "(4, 4)"]),
    "shape_big": (2, "shape", ["(4, 4)", "(300000,)"]),
    "dtype": (1, "dtype", ["float64", "float32"]),
    "op": (0, "op", ["'max'", "'sum'"]),
    "order": (2, "kind", ["all_gather", "all_reduce"]),
    "root": (1, "root", ["2", "0"]),
    "ring": (0, "shape", ["[2]", "[3]"]),
}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mismatches_raise_on_every_rank_naming_the_culprit(tmp_path):
    def all_reduce(name: str, **more) -> dict:
        return {"name": name, "op": "all_reduce", "shape": [4, 4], "dtype": "float32", **more}

    steps = [
        all_reduce("shape", per_rank={"2": {"shape": [4, 3]}}),
        all_reduce("shape_big", per_rank={"2": {"shape": [300_000]}}),  # its data would take the ring
        all_reduce("dtype", per_rank={"1": {"dtype": "float64"}}),
        all_reduce("op", per_rank={"0": {"reduce": "max"}}),
        all_reduce("order", per_rank={"2": {"op": "all_gather"}}),
        {"name": "root", "op": "broadcast", "shape": [3], "root": 0, "per_rank": {"1": {"root": 2}}},
        {"name": "indivisible", "op": "reduce_scatter", "shape": [4]},
        {"name": "bad_root", "op": "broadcast", "shape": [3], "root": 5},
        {"name": "int_mean", "op": "all_reduce", "shape": [3], "dtype": "int32", "reduce": "mean"},
        {"name": "pair", "op": "send", "shape": [4], "peer": 1, "ranks": [0, 1],
         "per_rank": {"1": {"op": "recv", "peer": 0, "shape": [5]}}},
        {"name": "ring", "op": "neighbor_exchange", "shape": [2], "dtype": "float32",
         "send_ranks": {"0": [1], "1": [2], "2": [0]}, "recv_ranks": {"0": [2], "1": [0], "2": [1]},
         "recv_shapes": {"0": [[2]], "1": [[3]], "2": [[2]]}},
        all_reduce("after", dtype="int32"),
    ]  # fmt: skip
    run = run_collectives(tmp_path, 3, steps, transport="tcp")
    assert run.returncodes == [0, 0, 0], run.describe()
    for name, (culprit, field, phrases) in MISMATCHES.items():
        errors = _errors(run, name, range(3))
        for error in errors:
            assert error["type"] == "CollectiveMismatchError", error
            assert (error["culprit_rank"], error["field"]) == (culprit, field), error
            assert f"global rank {culprit}" in error["message"], error["message"]
            assert all(p in error["message"] for p in phrases), error["message"]
        assert len({e["message"].split(": ", 1)[1] for e in errors}) == 1, errors  # one verdict everywhere
    for name, phrase in (("indivisible", "divisible by the group size 3"), ("bad_root", "root=5"), ("int_mean", "")):
        for error in _errors(run, name, range(3)):
            assert error["type"] == "ConfigurationError" and phrase in error["message"], error
    for error in _errors(run, "pair", [0, 1]):
        assert (error["type"], error["culprit_rank"], error["field"]) == ("CollectiveMismatchError", 0, "shape")
        assert "sends shape (4,)" in error["message"] and "expects (5,)" in error["message"], error["message"]
    step = steps[-1]
    for rank in range(3):  # the group is still usable
        assert_same(run.output(rank, "after"), reference(step, [0, 1, 2], rank), "after")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 4])  # two members all-reduce in one exchange (pair_all_reduce), more in a ring
def test_killed_peer_fails_every_other_rank_within_five_seconds(tmp_path, size):
    steps = [
        {"name": "warm", "op": "all_reduce", "shape": [1_100_000]},
        {"name": "kill", "op": "kill", "ranks": [1], "seconds": 0.3},
        {"name": "loop", "op": "all_reduce", "shape": [1_100_000], "repeat": 3000},
        {"name": "after", "op": "barrier"},
    ]
    run = run_collectives(tmp_path, size, steps, transport="tcp")
    survivors = [r for r in range(size) if r != 1]
    assert run.returncodes[1] == -9 and [run.returncodes[r] for r in survivors] == [0] * len(survivors), run.describe()
    killed = json.loads((run.directory / "killed.1.json").read_text())["time"]
    errors = _errors(run, "loop", survivors)
    for rank, error in zip(survivors, errors):
        assert error["type"] == "PeerFailedError", error
        assert error["time"] - killed < 5.0, (rank, error["time"] - killed)
        assert f"global rank {error['culprit_rank']}" in error["message"] and "closed" in error["message"], error
        later = run.error(rank, "after")  # the group is retired, with the reason
        assert later["type"] == "PeerFailedError" and "earlier failure" in later["message"], later
    # The first to notice names the dead rank; a rank waiting on a neighbour that gave up may name that one.
    assert 1 in {error["culprit_rank"] for error in errors}, errors


# ---------------------------------------------------------------------------------------------- in this process


def _threads(size: int, body, timeout_s: float = 10.0, aborts=None, tokens=None, tls: bool = False) -> list:
    """Run body(communicator, rank) for each rank in its own thread, each with its own transport."""
    transports = [TcpTransport("127.0.0.1", token=(tokens or [None] * size)[r], tls=tls) for r in range(size)]
    peers = tuple(Peer(r, "localhost", t.address, os.getpid()) for r, t in enumerate(transports))
    results: list = [None] * size

    def run(rank: int) -> None:
        abort = (aborts or {}).get(rank, lambda: None)
        context = GroupContext("job", "world", tuple(range(size)), rank, peers, timeout_s, abort)
        try:
            results[rank] = body(transports[rank].communicator(context), rank)
        except Exception as exc:
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        for transport in transports:
            transport.close()
            transport.close()  # idempotent
    return results


def test_a_rank_that_never_arrives_times_out_naming_it():
    started = time.monotonic()
    results = _threads(3, lambda c, r: c.all_reduce(np.ones(4, np.float32)) if r != 2 else time.sleep(1.0), 0.5)
    for rank in (0, 1):
        assert isinstance(results[rank], CollectiveTimeoutError), results[rank]
        assert "global rank 2" in str(results[rank]) and "0.5 s" in str(results[rank])
    assert time.monotonic() - started < 5


def test_an_unreachable_peer_is_an_error_naming_its_address_within_seconds():
    closed = socket.socket()  # a port nobody listens on: the peer registered an address that does not answer
    closed.bind(("127.0.0.1", 0))
    dead_address = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    transport = TcpTransport("127.0.0.1", connect_timeout_s=1.0)
    peers = (Peer(0, "host-a", transport.address, os.getpid()), Peer(1, "host-b", dead_address, 1))
    context = GroupContext("job", "world", (0, 1), 0, peers, timeout_s=60.0)
    started = time.monotonic()
    try:
        with pytest.raises(PeerUnreachableError) as raised:
            transport.communicator(context).all_reduce(np.ones(4, np.float32))
    finally:
        transport.close()
    assert 1.0 <= time.monotonic() - started < 3.0  # the connect budget, not the collective's 60 s
    assert raised.value.culprit_rank == 1
    assert "global rank 1" in str(raised.value) and dead_address in str(raised.value), raised.value


def test_job_abort_ends_the_wait_with_its_cause():
    fires = time.monotonic() + 0.3
    aborts = {0: lambda: "rank 1 lost its heartbeat" if time.monotonic() > fires else None}
    results = _threads(2, lambda c, r: c.all_reduce(np.ones(4)) if r == 0 else time.sleep(1.0), 20, aborts)
    assert isinstance(results[0], PeerFailedError) and "rank 1 lost its heartbeat" in str(results[0])


def test_wrong_token_is_refused_with_a_clear_error():
    results = _threads(2, lambda c, r: c.barrier(), 1.0, tokens=["secret", "other"])
    assert isinstance(results[0], ConfigurationError) and "TESSEL_TOKEN" in str(results[0]), results
    assert isinstance(results[1], CollectiveTimeoutError), results  # nobody with the right token came


def test_the_token_file_signs_the_data_plane_like_every_rpc(tmp_path, monkeypatch):
    # A daemon started without TESSEL_TOKEN takes the token file, as its RPCs do; connections must be signed too.
    monkeypatch.delenv("TESSEL_TOKEN", raising=False)
    monkeypatch.setenv("TESSEL_HOME", str(tmp_path))
    (tmp_path / "token").write_text("from-the-file\n")
    results = _threads(2, lambda c, r: c.barrier(), 1.0, tokens=[None, "other"])
    assert isinstance(results[0], ConfigurationError) and "TESSEL_TOKEN" in str(results[0]), results
    assert _threads(2, lambda c, r: c.barrier(), 10.0, tokens=[None, "from-the-file"]) == [None, None]


def test_tls_on_the_data_plane_encrypts_every_link_and_results_stay_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSEL_HOME", str(tmp_path))  # the cluster CA the transports share, made by the first
    big = [make_input(0, "tls", r, [1_100_000], "float32") for r in range(3)]  # the ring path, above SMALL_BYTES

    def body(comm, rank: int):
        small = comm.all_reduce(np.array([rank + 1], np.int64))
        large = comm.all_reduce(big[rank])
        return small, large, [link.tls for link in comm._links.values()]

    results = _threads(3, body, 60.0, tls=True)
    for result in results:
        assert not isinstance(result, Exception), results
        small, large, encrypted = result
        assert small[0] == 6 and encrypted and all(encrypted), (small, encrypted)
        np.testing.assert_allclose(large, big[0] + big[1] + big[2], rtol=1e-6)


def test_same_token_connects_and_closed_groups_refuse_work():
    def body(comm, rank: int):
        total = comm.all_reduce(np.array([rank + 1], np.int64))
        comm.close()
        comm.close()
        with pytest.raises(ConfigurationError, match="closed"):
            comm.barrier()
        return total

    assert [r.tolist() for r in _threads(2, body, tokens=["secret", "secret"])] == [[3], [3]]


def test_send_and_recv_between_two_ranks_run_at_the_same_time():
    x = [make_input(0, "swap", r, [70_000], "float32") for r in range(2)]

    def body(comm, rank: int):
        sent = comm.send(x[rank], 1 - rank, async_op=True)
        got = threading.Thread(target=lambda: results.__setitem__(rank, comm.recv(x[0].shape, np.float32, 1 - rank)))
        got.start()
        got.join(20)
        sent.wait(20)
        return results[rank]

    results: dict = {}
    out = _threads(2, body)
    np.testing.assert_array_equal(out[0], x[1])
    np.testing.assert_array_equal(out[1], x[0])


def test_a_neighbor_exchange_checks_dtypes_per_pair_as_over_shared_memory():
    # rank 2 takes no part and passes another recv dtype (comm_func's default float32): that is not a mismatch
    def body(comm, rank: int):
        if rank == 0:
            return comm.neighbor_exchange([np.ones(3, np.float16)], [1], [], [], np.float16)
        if rank == 1:
            return comm.neighbor_exchange([], [], [0], [(3,)], np.float16)
        return comm.neighbor_exchange([], [], [], [], np.float32)

    out = _threads(3, body)
    assert out[0] == [] and out[2] == [] and out[1][0].dtype == np.float16 and out[1][0].tolist() == [1.0] * 3


def test_one_rank_group_works_locally_and_returns_new_arrays():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (values,) = _threads(1, lambda c, r: [c.all_reduce(x, "mean"), c.all_to_all(x, 1, 0), c.broadcast(x)])
    for value in values:
        assert value is not x and not np.shares_memory(value, x)
        np.testing.assert_array_equal(value, x)


def test_closing_a_group_ends_its_call_in_flight():
    def body(comm, rank: int):
        if rank == 1:
            return time.sleep(1.5)  # never joins
        threading.Timer(0.3, comm.close).start()
        started = time.monotonic()
        with pytest.raises(PeerFailedError, match="closed on this rank"):
            comm.all_reduce(np.ones(4))
        return time.monotonic() - started

    elapsed, _ = _threads(2, body, timeout_s=20)
    assert elapsed < 2.0, elapsed


@pytest.mark.parametrize("members", [2, 3])
def test_all_reduce_into_writes_the_result_where_it_is_asked_and_matches_all_reduce(members):
    """all_reduce_into is all_reduce to the other members, its result written into the given array (the ring's
    large path, or two members' one exchange, and the small one that rides with the agreement); an output of
    another shape is refused."""

    def body(comm, rank):
        found = []
        for size in (10, 100_000):  # small: with the descriptors; large: the ring
            x = np.arange(size, dtype=np.float32) * (rank + 1)
            out = np.full(size, np.nan, np.float32)
            returned = comm.all_reduce_into(x, out, "sum")
            found.append((returned is out, out.copy(), comm.all_reduce(x, "sum")))
        with pytest.raises(ConfigurationError, match="C-contiguous with the input's shape"):
            comm.all_reduce_into(np.ones(4, np.float32), np.ones(5, np.float32))
        return found

    results = _threads(members, body)
    total = sum(range(1, members + 1))
    for rank in range(members):
        assert not isinstance(results[rank], Exception), results[rank]
        for same, into, plain in results[rank]:
            assert same
            np.testing.assert_array_equal(into, plain)
            np.testing.assert_array_equal(into, np.arange(into.size, dtype=np.float32) * total)
