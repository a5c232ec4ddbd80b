"""The coordinator's durable store (coordinator/store.py) and recovery from it (coordinator/durable.py): SQLite always,
etcd when its server binary is installed (a real etcd on 127.0.0.1 with a temporary data dir)."""

from __future__ import annotations

import queue
import shutil
import socket
import sqlite3
import subprocess
import time

import pytest

from tessel.coordinator import store as stores
from tessel.coordinator.cli import default_store
from tessel.coordinator.jobs import BUSY, FINISHED, IDLE, RUNNING
from tessel.coordinator.state import CoordinatorState
from tessel.core import errors
from tessel.core.limits import Limits
from tessel.v1 import coordinator_pb2
from tests.unit.test_coordinator_state import Call, daemon_info, join_request, start_job


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """A real etcd on 127.0.0.1 (skipped when the binary is absent): yields its HOST:PORT."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server): the etcd backend is not tested")
    data = tmp_path_factory.mktemp("etcd")
    client, peer = _free_port(), _free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--data-dir",
            str(data / "data"),
            "--listen-client-urls",
            f"http://127.0.0.1:{client}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{client}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"default=http://127.0.0.1:{peer}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(data / "etcd.log", "w"),  # noqa: SIM115 - closed with the process
    )
    endpoint = f"127.0.0.1:{client}"
    deadline = time.monotonic() + 30
    while True:
        try:
            stores.EtcdStore(endpoint, timeout_s=1.0)
            break
        except errors.ConfigurationError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"etcd did not start: {(data / 'etcd.log').read_text()[-2000:]}")
            time.sleep(0.2)
    yield endpoint
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(params=["sqlite", "etcd"])
def store_url(request, tmp_path):
    """A fresh store's URL: one SQLite file per test, one etcd key prefix per test."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'coordinator.db'}"
    endpoint = request.getfixturevalue("etcd")
    return f"etcd://{endpoint}/tessel-test/{tmp_path.name}"


def test_put_delete_prefix_and_load(store_url):
    store = stores.open_store(store_url)
    store.put(stores.JOB, "a", b"1")
    store.put(stores.JOB, "a", b"2")  # replaces
    store.put(stores.KV, '["j",k1', b"x")
    store.put(stores.KV, '["j",k2', b"y")
    store.put(stores.KV, '["jj",k1', b"z")
    store.put(stores.DAEMON, "d0", b"\x00\xff")
    store.delete_prefix(stores.KV, '["j",')
    store.delete(stores.DAEMON, "nope")
    # A batch (one transaction; etcd: transactions of at most 100 operations).
    store.apply([(stores.PUT, stores.RANK, f"r{n:03d}", b"%d" % n) for n in range(150)])
    store.apply([(stores.DELETE_PREFIX, stores.RANK, "r1"), (stores.DELETE, stores.RANK, "r000")])
    store.close()
    found = stores.open_store(store_url).load()
    assert found[stores.JOB] == {"a": b"2"}
    assert found[stores.KV] == {'["jj",k1': b"z"}  # another job's keys stay
    assert found[stores.DAEMON] == {"d0": b"\x00\xff"}
    assert sorted(found[stores.RANK]) == [f"r{n:03d}" for n in range(1, 100)]


def test_sqlite_is_in_wal_mode(tmp_path):
    stores.open_store(f"sqlite:{tmp_path / 'c.db'}").close()
    with sqlite3.connect(tmp_path / "c.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_bad_store_urls_say_what_to_pass(tmp_path):
    with pytest.raises(errors.ConfigurationError, match="unknown kind of store; use memory, sqlite:PATH or etcd"):
        stores.open_store("redis://x:1")
    with pytest.raises(errors.ConfigurationError, match="cannot open it"):
        stores.open_store(f"sqlite:{tmp_path}")  # a directory
    with pytest.raises(errors.ConfigurationError, match=r"etcd://127.0.0.1:1/tessel: .*start etcd there"):
        stores.open_store("etcd://127.0.0.1:1")
    assert isinstance(stores.open_store("memory"), stores.MemoryStore)
    assert default_store(0) == "memory" and default_store(7070).endswith("coordinator-7070.db")


def _state(url: str, grace_s: float = 5.0, keep: int = 100) -> CoordinatorState:
    return CoordinatorState(
        heartbeat_timeout_s=1.0,
        store=stores.open_store(url),
        recovery_grace_s=grace_s,
        limits=Limits(keep_ended_jobs=keep),
    )


def test_a_restarted_coordinator_keeps_daemon_ids_jobs_history_groups_and_keys(store_url):
    before = _state(store_url)
    ids = [before.register_daemon(daemon_info(p)) for p in (1, 2, 3)]
    start_job(before, "done", 1)
    before.finish_rank("done", 0)
    replies = start_job(before, "live", 2)
    Call(before.create_group, "live", "g", [0, 1], 0, 1.0)
    before.create_group("live", "g", [0, 1], 1, 1.0)
    before.kv_set("live", "key", b"value")
    before.finish_rank("live", 1)
    written = before.store.load()
    assert len(written[stores.RANK]) == 3  # one record per rank: a join or a finish writes O(1), not the world
    assert b"joiners" not in written[stores.JOB]["live"]
    before.store.close()  # the process dies: nothing else is written

    after = _state(store_url)
    assert "restored from" in after.restored and "3 daemons, 2 jobs (1 running)" in after.restored
    status = after.cluster_status()
    assert [(d.daemon_id, d.address, d.state) for d in status.daemons] == [
        (ids[0], "h0:1", BUSY),
        (ids[1], "h0:2", BUSY),
        (ids[2], "h0:3", IDLE),
    ]
    assert [(j.job_id, j.state, list(j.finished_ranks)) for j in status.jobs] == [
        ("done", FINISHED, [0]),
        ("live", RUNNING, [1]),
    ]
    # A daemon that registers again (same address) keeps its id; a new one gets the next id, not a reused one.
    assert after.register_daemon(daemon_info(3)) == ids[2]
    assert after.register_daemon(daemon_info(4)) == "d3"
    # Groups and keys are there; a rank whose JoinJob reply was lost asks again and gets the same answer.
    members = after.create_group("live", "g", [0, 1], 0, 1.0)
    assert [m.daemon_id for m in members] == [m.daemon_id for m in replies[0].members]
    assert after.kv_get("live", "key", 0.0) == b"value"
    again = after.join(join_request("live", 2, 0), 1.0)
    assert (again.rank, again.job_nonce, again.daemon.daemon_id) == (0, replies[0].job_nonce, ids[0])
    after.finish_rank("live", 0)
    assert after.job_info("live").state == FINISHED
    after.store.close()
    # The job's end, its daemons freed and its rendezvous forgotten are durable too.
    third = _state(store_url)
    assert third.job_info("live").state == FINISHED
    assert {d.daemon_id: d.state for d in third.cluster_status().daemons} == {
        "d0": IDLE,
        "d1": IDLE,
        "d2": IDLE,
        "d3": IDLE,
    }
    assert not third.store.load()[stores.GROUP] and not third.store.load()[stores.KV]
    third.store.close()


def test_members_that_do_not_come_back_within_the_grace_fail_the_job(store_url):
    before = _state(store_url)
    before.register_daemon(daemon_info(1))
    before.register_daemon(daemon_info(2))
    start_job(before, "j", 2)
    before.store.close()
    after = _state(store_url, grace_s=0.3)
    # Daemon d0 comes back in time; d1 and both ranks do not.
    outbox = queue.SimpleQueue()
    sub = after.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id="d0"), outbox)
    after.expire()
    assert after.job_info("j").state == RUNNING  # within the grace nobody is judged
    deadline = time.monotonic() + 5
    while after.job_info("j").state == RUNNING and time.monotonic() < deadline:
        after.beat(sub)
        time.sleep(0.1)
        after.expire()
    info = after.job_info("j")
    assert info.state == "failed", info
    assert "rank 0 (pid 100 on host h0, daemon d0) did not heartbeat again within 0.3 s" in info.cause
    after.store.close()


def test_ended_jobs_beyond_the_history_limit_leave_the_store(tmp_path):
    url = f"sqlite:{tmp_path / 'c.db'}"
    state = _state(url, keep=2)
    state.register_daemon(daemon_info(1))
    for n in range(5):
        start_job(state, f"j{n}", 1)
        state.finish_rank(f"j{n}", 0)
    assert sorted(state.store.load()[stores.JOB]) == ["j3", "j4"]
    state.store.close()


def test_heartbeats_are_not_written(tmp_path):
    url = f"sqlite:{tmp_path / 'c.db'}"
    state = _state(url)
    state.register_daemon(daemon_info(1))
    sub = state.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id="d0"), queue.SimpleQueue())
    writes = []
    state.store.put = lambda *args: writes.append(args)
    for _ in range(100):
        state.beat(sub)
    state.expire()
    assert writes == []
    state.store.close()


def test_heartbeats_and_calls_wait_out_a_restart_on_the_same_port_and_store(tmp_path):
    """In one process over gRPC: the server stops and comes back on its port with its store; a daemon's heartbeat
    stream and a blocked call's retries find it again, and the daemon keeps its id."""
    from tessel.coordinator import CoordinatorClient, serve

    url = f"sqlite:{tmp_path / 'c.db'}"
    first = serve(port=0, token="t", store=stores.open_store(url), recovery_grace_s=5.0)
    port = first.port
    with CoordinatorClient(first.address, token="t", timeout_s=5.0, grace_s=10.0) as client:
        daemon_id = client.register_daemon(daemon_info(1)).daemon_id
        events = queue.SimpleQueue()
        handle = client.heartbeat(daemon_id, events.put, interval_s=0.1, timeout_s=1.0)
        time.sleep(0.3)
        first.stop(grace_s=0.1)
        status = Call(client.cluster_status)  # retried until the coordinator is back
        time.sleep(0.5)
        second = serve(port=port, token="t", store=stores.open_store(url), recovery_grace_s=5.0)
        try:
            assert [d.daemon_id for d in status.result(10.0).daemons] == [daemon_id]
            deadline = time.monotonic() + 10
            while not second.state._daemons[daemon_id].streams:  # its stream is open at the new coordinator
                assert time.monotonic() < deadline, "the heartbeat stream did not come back"
                time.sleep(0.1)
            assert handle.alive and events.empty()  # nothing was lost, nobody was told so
            assert second.state.get_daemon(daemon_id).state == IDLE
        finally:
            handle.stop()
            second.stop(grace_s=0.1)


def test_a_restored_daemon_gets_no_new_job_until_it_heartbeats_again(tmp_path):
    url = f"sqlite:{tmp_path / 'c.db'}"
    before = _state(url)
    before.register_daemon(daemon_info(1))
    before.store.close()
    after = _state(url)
    waiting = Call(after.join, join_request("new", 1, 0), 3.0)
    time.sleep(0.3)
    assert after.job_info("new").state == "waiting"  # d0 may be gone for good: it has not been heard from
    after.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id="d0"), queue.SimpleQueue())
    assert waiting.result().daemon.daemon_id == "d0"
    after.store.close()


def test_a_process_that_asked_for_any_rank_gets_its_rank_back_after_a_restart(tmp_path):
    # It joined with rank -1 and was waiting for the others when the coordinator died; its retry must not take a
    # second rank (a ghost rank 0 that never heartbeats, and the real second process refused as one too many).
    url = f"sqlite:{tmp_path / 'c.db'}"
    before = _state(url)
    for port in (1, 2):
        before.register_daemon(daemon_info(port))

    def request(pid: int) -> coordinator_pb2.JoinJobRequest:
        return coordinator_pb2.JoinJobRequest(job_id="j", world_size=2, rank=-1, pid=pid, hostname="h0")

    Call(before.join, request(111), 5.0)  # blocks, waiting for rank 1
    deadline = time.monotonic() + 5
    while not before.store.load()[stores.RANK] and time.monotonic() < deadline:
        time.sleep(0.01)
    before.store.close()  # the coordinator dies while process 111 waits
    after = _state(url)
    for port in (1, 2):
        after.register_daemon(daemon_info(port))  # its daemons come back
    retry, other = Call(after.join, request(111), 5.0), Call(after.join, request(222), 5.0)
    assert (retry.result().rank, other.result().rank) == (0, 1)
    assert {r: j.pid for r, j in after._jobs["j"].joiners.items()} == {0: 111, 1: 222}
    after.store.close()


class _Transactions(stores.SqliteStore):
    """An SQLite store that keeps the operations of each transaction (a kill -9 falls between two of them)."""

    def __init__(self, path):
        super().__init__(path)
        self.transactions: list[list[tuple]] = []

    def apply(self, ops: list[tuple]) -> None:
        self.transactions.append([op[:3] for op in ops])
        super().apply(ops)


def test_one_logical_change_is_one_transaction(tmp_path):
    # Between two transactions a killed coordinator left a finished job running with busy daemons, a failed job's
    # dead daemon busy, or the rank records of a forgotten job that a reused job id then took as its own.
    store = _Transactions(tmp_path / "c.db")
    state = CoordinatorState(heartbeat_timeout_s=1000.0, store=store, limits=Limits(keep_ended_jobs=0))
    for port in (1, 2, 3):
        state.register_daemon(daemon_info(port))
    start_job(state, "done", 2)
    state.finish_rank("done", 0)
    count = len(store.transactions)
    state.finish_rank("done", 1)  # the job ends, its daemons are freed, and (history 0) it is forgotten
    assert len(store.transactions) == count + 1
    kinds = {op[1] for op in store.transactions[-1]}
    assert {stores.RANK, stores.DAEMON, stores.JOB} <= kinds
    start_job(state, "dies", 2)
    count = len(store.transactions)
    with state._cond:
        state._daemon_died(state._daemons["d0"], "test")
    assert len(store.transactions) == count + 1
    start_job(state, "reports", 1)
    count = len(store.transactions)
    state.fail_job("reports", 0, "boom")
    assert len(store.transactions) == count + 1
    store.close()


def test_a_restored_announced_job_still_has_a_deadline_to_form_by(tmp_path):
    url = f"sqlite:{tmp_path / 'c.db'}"
    before = _state(url)
    before.expect_job("sched", 4, timeout_s=5.0, how_to_fix="scale up", once=True)
    Call(before.join, coordinator_pb2.JoinJobRequest(job_id="sched", world_size=4, rank=0, pid=7, hostname="h0"), 9.0)
    deadline = time.monotonic() + 5
    while not before.store.load()[stores.RANK] and time.monotonic() < deadline:
        time.sleep(0.01)
    before.store.close()
    after = _state(url, grace_s=1.0)
    assert after.job_info("sched").state == "waiting"
    after.expire(now=after._clock() + 7.0)  # the grace and the timeout, from the restart
    info = after.job_info("sched")
    assert info.state == "failed" and "has 1 of 4 ranks" in info.cause and "scale up" in info.cause, info
    after.store.close()
