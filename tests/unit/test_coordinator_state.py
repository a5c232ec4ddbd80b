"""The coordinator's state machine without processes or gRPC: registry, jobs, assignment, liveness, rendezvous."""

from __future__ import annotations

import queue
import re
import threading
import time

import pytest

from tessel.coordinator import format_status
from tessel.coordinator.state import ACK, CLOSE, CoordinatorState
from tessel.core import errors
from tessel.v1 import coordinator_pb2

TIMEOUT_S = 1.0  # the longest a call in these tests may wait


def daemon_info(port: int, plugin: str = "cpu", hostname: str = "h0") -> coordinator_pb2.DaemonInfo:
    return coordinator_pb2.DaemonInfo(address=f"{hostname}:{port}", plugin=plugin, hostname=hostname, host_id=hostname)


def join_request(job: str, world: int, rank: int = -1, **fields) -> coordinator_pb2.JoinJobRequest:
    fields.setdefault("hostname", "h0")
    return coordinator_pb2.JoinJobRequest(job_id=job, world_size=world, rank=rank, pid=100 + max(rank, 0), **fields)


class Call:
    """Runs fn on a thread; .result() re-raises its exception. Every join has a deadline."""

    def __init__(self, fn, *args):
        self.value, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self.thread.start()

    def _run(self, fn, *args):
        try:
            self.value = fn(*args)
        except BaseException as exc:
            self.error = exc

    def result(self, timeout_s: float = 5.0):
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "call did not return within its deadline"
        if self.error is not None:
            raise self.error
        return self.value


def start_job(state: CoordinatorState, job: str, world: int, **fields) -> list[coordinator_pb2.JoinJobReply]:
    calls = [Call(state.join, join_request(job, world, r, **fields), TIMEOUT_S) for r in range(world)]
    return [c.result() for c in calls]


def subscribe_client(state: CoordinatorState, job: str, rank: int):
    outbox = queue.SimpleQueue()
    request = coordinator_pb2.HeartbeatRequest(client=coordinator_pb2.ClientRef(job_id=job, rank=rank, pid=100 + rank))
    return state.subscribe(request, outbox), outbox


def test_a_heartbeat_of_another_process_than_the_rank_that_joined_is_refused(state):
    # an old process of an earlier job of the same id reconnecting: bound to this job, its exit would fail it
    state.register_daemon(daemon_info(1))
    start_job(state, "j", 1)
    stranger = coordinator_pb2.HeartbeatRequest(client=coordinator_pb2.ClientRef(job_id="j", rank=0, pid=7))
    with pytest.raises(KeyError, match=r"rank 0 of job 'j' is pid 100, not 7: this process is not that rank"):
        state.subscribe(stranger, queue.SimpleQueue())
    assert state.job_info("j").state == "running"


def events_in(outbox: queue.SimpleQueue) -> list:
    items = []
    while not outbox.empty():
        items.append(outbox.get_nowait())
    return [i for i in items if i not in (ACK, CLOSE)]


@pytest.fixture
def state() -> CoordinatorState:
    return CoordinatorState(heartbeat_timeout_s=3.0)


def test_registration_assigns_ids_and_reregistration_replaces(state):
    assert [state.register_daemon(daemon_info(p)) for p in (1, 2, 3)] == ["d0", "d1", "d2"]
    replaced = daemon_info(2, plugin="gpu")
    assert state.register_daemon(replaced) == "d1"
    daemons = state.cluster_status().daemons
    assert [(d.daemon_id, d.plugin, d.state) for d in daemons] == [
        ("d0", "cpu", "idle"),
        ("d1", "gpu", "idle"),
        ("d2", "cpu", "idle"),
    ]
    with pytest.raises(errors.ConfigurationError, match="address is empty"):
        state.register_daemon(coordinator_pb2.DaemonInfo(plugin="cpu"))


def test_join_blocks_until_world_complete_then_daemons_are_busy(state):
    for port, host in [(1, "a"), (2, "b"), (3, "a")]:
        state.register_daemon(daemon_info(port, hostname=host))
    first = Call(state.join, join_request("j", 3, 0, hostname="a"), TIMEOUT_S)
    time.sleep(0.1)
    assert first.thread.is_alive()  # one of three: still waiting
    calls = {"a": first, "b": Call(state.join, join_request("j", 3, -1, hostname="b"), TIMEOUT_S)}
    time.sleep(0.1)
    assert first.thread.is_alive()
    third = Call(state.join, join_request("j", 3, -1, hostname="a"), TIMEOUT_S)
    replies = {host: call.result() for host, call in calls.items()}
    replies["a2"] = third.result()
    assert sorted(r.rank for r in replies.values()) == [0, 1, 2]
    members = list(replies["a"].members)
    for host, reply in replies.items():
        assert list(reply.members) == members  # every rank sees the same list, index = rank
        assert reply.daemon == members[reply.rank] and members[reply.rank].rank == reply.rank
        assert reply.daemon.host_id == host[0]  # each rank runs on a daemon of its own host
        same_host = [m.rank for m in members if m.host_id == host[0]]
        assert (reply.local_rank, reply.local_size) == (same_host.index(reply.rank), len(same_host))
    assert sorted(m.daemon_id for m in members) == ["d0", "d1", "d2"]
    status = state.cluster_status()
    assert {(d.daemon_id, d.state, d.job_id, d.rank) for d in status.daemons} == {
        (m.daemon_id, "busy", "j", m.rank) for m in members
    }
    assert [(j.job_id, j.state) for j in status.jobs] == [("j", "running")]


def test_unpinned_ranks_prefer_their_own_host(state):
    for port, host in [(1, "a"), (2, "b"), (3, "a"), (4, "b")]:
        state.register_daemon(daemon_info(port, hostname=host))
    calls = [Call(state.join, join_request("j", 4, r, hostname="ab"[r % 2]), TIMEOUT_S) for r in range(4)]
    replies = sorted((c.result() for c in calls), key=lambda r: r.rank)
    assert [m.host_id for m in replies[0].members] == ["a", "b", "a", "b"]
    assert [(r.local_rank, r.local_size) for r in replies] == [(0, 2), (0, 2), (1, 2), (1, 2)]


def test_assignment_is_deterministic_whatever_the_join_order(state):
    for port in range(4):
        state.register_daemon(daemon_info(port))
    orders = []
    for job, ranks in [("a", [0, 1, 2]), ("b", [2, 0, 1])]:
        calls = []
        for rank in ranks:
            calls.append(Call(state.join, join_request(job, 3, rank), TIMEOUT_S))
            time.sleep(0.02)
        reply = calls[0].result()
        [c.result() for c in calls]
        orders.append([m.daemon_id for m in reply.members])
        for rank in range(3):
            state.finish_rank(job, rank)
    assert orders[0] == orders[1] == ["d0", "d1", "d2"]


def test_pinned_ranks_get_their_daemons_and_plugins_are_respected(state):
    state.register_daemon(daemon_info(1, plugin="cpu"))  # d0
    state.register_daemon(daemon_info(2, plugin="gpu"))  # d1
    state.register_daemon(daemon_info(3, plugin="cpu"))  # d2
    calls = [
        Call(state.join, join_request("j", 3, 0, daemon_id="d2"), TIMEOUT_S),
        Call(state.join, join_request("j", 3, 1), TIMEOUT_S),
        Call(state.join, join_request("j", 3, 2, plugin="gpu"), TIMEOUT_S),
    ]
    reply = calls[0].result()
    [c.result() for c in calls]
    assert [m.daemon_id for m in reply.members] == ["d2", "d0", "d1"]
    assert [m.plugin for m in reply.members] == ["cpu", "cpu", "gpu"]


def test_a_job_may_span_plugins_named_in_a_list(state):
    for port, plugin in enumerate(["gpu", "cpu", "npu", "cpu"]):
        state.register_daemon(daemon_info(port, plugin=plugin))  # d0 gpu, d1 cpu, d2 npu, d3 cpu
    calls = [Call(state.join, join_request("mixed", 3, r, plugin="cpu,gpu"), TIMEOUT_S) for r in range(3)]
    reply = calls[0].result()
    [c.result() for c in calls]
    assert [(m.daemon_id, m.plugin) for m in reply.members] == [("d0", "gpu"), ("d1", "cpu"), ("d3", "cpu")]


def test_join_deadline_names_the_missing_ranks_and_frees_the_job_id(state):
    state.register_daemon(daemon_info(1))
    calls = [Call(state.join, join_request("j1", 4, r), 0.3) for r in (0, 2)]
    for call in calls:
        with pytest.raises(errors.RendezvousTimeoutError, match=r"missing ranks \[1, 3\]: start them or lower -n"):
            call.result()
    [job] = state.cluster_status().jobs  # the status table shows why it never ran
    assert job.state == "failed" and "missing ranks [1, 3]" in job.cause
    with pytest.raises(errors.RendezvousTimeoutError, match=r"has 1 of 2 ranks"):
        state.join(join_request("j1", 2, 0), 0.1)


def test_join_deadline_without_daemons_says_why(state):
    state.register_daemon(daemon_info(1))
    state.register_daemon(daemon_info(2))
    start_job(state, "busy", 1)  # takes d0
    calls = [
        Call(state.join, join_request("j", 2, 0, daemon_id="d0"), 0.3),
        Call(state.join, join_request("j", 2, 1, plugin="gpu"), 0.3),
    ]
    with pytest.raises(errors.RendezvousTimeoutError) as info:
        calls[0].result()
    message = str(info.value)
    assert "has all 2 ranks but no daemons" in message
    assert "pinned to daemon d0, which is busy with job 'busy'" in message
    assert "rank 1 needs an idle 'gpu' daemon" in message
    with pytest.raises(errors.RendezvousTimeoutError):
        calls[1].result()


def test_pinned_join_waits_for_its_daemon_to_become_idle(state):
    state.register_daemon(daemon_info(1))
    start_job(state, "first", 1)
    waiting = Call(state.join, join_request("second", 1, 0, daemon_id="d0"), TIMEOUT_S)
    time.sleep(0.1)
    assert waiting.thread.is_alive()
    state.finish_rank("first", 0)
    assert waiting.result().daemon.daemon_id == "d0"


def test_join_errors(state):
    state.register_daemon(daemon_info(1))
    waiting = Call(state.join, join_request("j", 2, 0), TIMEOUT_S)
    time.sleep(0.05)
    with pytest.raises(errors.ConfigurationError, match="rank 0 of job 'j' already joined"):
        state.join(join_request("j", 2, 0), TIMEOUT_S)
    with pytest.raises(errors.ConfigurationError, match="world_size 2 but this process asks for 3"):
        state.join(join_request("j", 3, 1), TIMEOUT_S)
    with pytest.raises(errors.ConfigurationError, match=r"rank 5 is outside job 'j' of 2 ranks"):
        state.join(join_request("j", 2, 5), TIMEOUT_S)
    with pytest.raises(errors.ConfigurationError, match="world_size 0"):
        state.join(join_request("k", 0, 0), TIMEOUT_S)
    with pytest.raises(errors.RendezvousTimeoutError):
        waiting.result()


def test_finish_frees_daemons_and_the_job_id_can_be_reused(state):
    state.register_daemon(daemon_info(1))
    state.register_daemon(daemon_info(2))
    start_job(state, "j", 2)
    sub, outbox = subscribe_client(state, "j", 0)
    state.finish_rank("j", 0)
    state.stream_closed(sub)  # a finished rank leaving is not a failure
    assert state.job_info("j").state == "running"
    state.finish_rank("j", 1)
    assert state.job_info("j").state == "finished"
    assert events_in(outbox) == []  # the stream was closed before the job finished
    assert {d.state for d in state.cluster_status().daemons} == {"idle"}
    again = start_job(state, "j", 1)
    assert again[0].world_size == 1 and state.job_info("j").state == "running"


def test_every_job_gets_its_own_nonce_even_under_a_reused_id(state):
    # Shared-memory names include it: ids repeat across coordinators and over time, the nonce must not.
    state.register_daemon(daemon_info(1))
    state.register_daemon(daemon_info(2))
    first = start_job(state, "j", 2)
    assert first[0].job_nonce and first[0].job_nonce == first[1].job_nonce  # the same on every rank
    for rank in (0, 1):
        state.finish_rank("j", rank)
    again = start_job(state, "j", 2)
    other = CoordinatorState(heartbeat_timeout_s=3.0)
    other.register_daemon(daemon_info(1))
    elsewhere = start_job(other, "j", 1)
    assert len({first[0].job_nonce, again[0].job_nonce, elsewhere[0].job_nonce}) == 3


def test_missed_daemon_heartbeats_fail_its_job_and_release_blocked_calls(state):
    for port in (1, 2):
        state.register_daemon(daemon_info(port, hostname="node7"))
    start_job(state, "j", 2, hostname="node7")
    sub, outbox = subscribe_client(state, "j", 0)
    blocked = [
        Call(state.barrier, "j", "b", 0, [], 30.0),
        Call(state.kv_get, "j", "never", 30.0),
        Call(state.create_group, "j", "g", [0, 1], 0, 30.0),
    ]
    time.sleep(0.1)
    state.beat(sub)
    state.expire(now=time.monotonic() + 3.5)  # the daemons are silent past the timeout; the client also is
    for call in blocked:
        with pytest.raises(errors.JobFailedError) as info:
            call.result(timeout_s=1.0)
    info_ = state.job_info("j")
    assert info_.state == "failed"
    assert re.fullmatch(r"rank 0 \(daemon d0 on host node7\) missed heartbeats for 3\.[56] s", info_.cause)
    assert info.value.culprit_rank == 0 and info_.cause in str(info.value)
    events = events_in(outbox)
    assert len(events) == 1 and events[0].state == "failed" and events[0].cause == info_.cause
    assert {d.state for d in state.cluster_status().daemons} == {"dead"}


def test_closed_client_stream_fails_the_job_and_tells_every_member(state):
    for port in (1, 2, 3):
        state.register_daemon(daemon_info(port))
    start_job(state, "j", 3, hostname="box")
    subs = [subscribe_client(state, "j", r) for r in range(3)]
    daemon_out = queue.SimpleQueue()
    state.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id="d0"), daemon_out)
    state.stream_closed(subs[2][0], "closed its heartbeat stream")
    cause = state.job_info("j").cause
    assert cause.startswith("rank 2 (pid 102 on host box, daemon d2) closed its heartbeat stream")
    for outbox in (subs[0][1], subs[1][1], daemon_out):
        [event] = events_in(outbox)
        assert (event.job_id, event.state, event.cause, event.culprit_rank) == ("j", "failed", cause, 2)
    with pytest.raises(errors.JobFailedError, match="rank 2"):
        state.barrier("j", "b", 0, [], TIMEOUT_S)
    assert {d.state for d in state.cluster_status().daemons} == {"idle"}  # live daemons go back to work
    _, late_outbox = subscribe_client(state, "j", 1)  # a member that listens after the fact still learns
    assert events_in(late_outbox)[0].cause == cause


def test_fail_job_reports_the_culprit(state):
    state.register_daemon(daemon_info(1))
    state.register_daemon(daemon_info(2))
    start_job(state, "j", 2)
    getter = Call(state.kv_get, "j", "k", 30.0)
    time.sleep(0.05)
    state.fail_job("j", 1, "loss is NaN at step 7")
    with pytest.raises(errors.JobFailedError, match=r"rank 1 .* reported: loss is NaN at step 7") as info:
        getter.result(timeout_s=1.0)
    assert info.value.culprit_rank == 1
    state.finish_rank("j", 0)  # finishing a failed job is a no-op
    assert state.job_info("j").state == "failed"


def test_unknown_members_are_refused(state):
    with pytest.raises(KeyError, match="daemon 'd9' is not registered"):
        state.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id="d9"), queue.SimpleQueue())
    with pytest.raises(KeyError, match="no job 'nope'"):
        subscribe_client(state, "nope", 0)
    with pytest.raises(errors.ConfigurationError, match="first message must name"):
        state.subscribe(coordinator_pb2.HeartbeatRequest(), queue.SimpleQueue())


def test_a_dead_daemon_that_heartbeats_again_is_idle(state):
    state.register_daemon(daemon_info(1))
    state.expire(now=time.monotonic() + 10)
    assert state.cluster_status().daemons[0].state == "dead"
    state.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id="d0"), queue.SimpleQueue())
    assert state.cluster_status().daemons[0].state == "idle"


def test_groups_return_members_in_group_order_and_check_ranks(state):
    for port in range(4):
        state.register_daemon(daemon_info(port))
    replies = start_job(state, "j", 4)
    members = replies[0].members
    calls = [Call(state.create_group, "j", "g", [3, 1], r, TIMEOUT_S) for r in (1, 3)]
    for call in calls:
        assert list(call.result()) == [members[3], members[1]]
    with pytest.raises(errors.ConfigurationError, match=r"rank 2 gave ranks \[2, 0\] but rank [13] gave \[3, 1\]"):
        state.create_group("j", "g", [2, 0], 2, TIMEOUT_S)
    with pytest.raises(errors.ConfigurationError, match="not one of its ranks"):
        state.create_group("j", "h", [0, 1], 2, TIMEOUT_S)
    with pytest.raises(errors.ConfigurationError, match=r"ranks \[7\] are outside"):
        state.create_group("j", "h", [0, 7], 0, TIMEOUT_S)
    with pytest.raises(errors.RendezvousTimeoutError, match=r"has 1 of 3 ranks .* missing ranks \[2, 3\]"):
        state.create_group("j", "h", [0, 2, 3], 0, 0.2)
    state.destroy_group("j", "g", 1)
    again = [Call(state.create_group, "j", "g", [0, 2], r, TIMEOUT_S) for r in (0, 2)]
    assert [m.rank for m in again[0].result()] == [0, 2]


def test_barrier_is_reusable_and_its_deadline_names_the_missing(state):
    for port in range(3):
        state.register_daemon(daemon_info(port))
    start_job(state, "j", 3)
    order = []
    lock = threading.Lock()

    def rank_loop(rank):
        for step in range(3):
            with lock:
                order.append((step, rank))
            state.barrier("j", "step", rank, [], TIMEOUT_S)

    threads = [Call(rank_loop, r) for r in range(3)]
    [t.result() for t in threads]
    # no rank entered pass k+1 before every rank entered pass k
    steps = [step for step, _ in order]
    assert steps == sorted(steps) and len(order) == 9
    with pytest.raises(errors.RendezvousTimeoutError, match=r"reached by 2 of 3 ranks .* missing ranks \[1\]"):
        Call(state.barrier, "j", "x", 2, [], 0.3)  # keep rank 2 waiting alongside rank 0
        state.barrier("j", "x", 0, [], 0.2)
    with pytest.raises(errors.ConfigurationError, match="it is a barrier of"):
        state.barrier("j", "step", 0, [0, 1], TIMEOUT_S)


def test_key_value_store_waits_for_a_key(state):
    state.register_daemon(daemon_info(1))
    start_job(state, "j", 1)
    getter = Call(state.kv_get, "j", "addr", TIMEOUT_S)
    time.sleep(0.05)
    state.kv_set("j", "addr", b"\x00host:1")
    assert getter.result() == b"\x00host:1"
    assert state.kv_get("j", "addr", 0) == b"\x00host:1"
    state.kv_delete("j", "addr")
    with pytest.raises(KeyError, match="key 'addr' of job 'j' is not set"):
        state.kv_get("j", "addr", 0)
    with pytest.raises(errors.RendezvousTimeoutError, match=r"was not set within 0\.1 s"):
        state.kv_get("j", "addr", 0.1)
    with pytest.raises(KeyError, match="no job 'other'"):
        state.kv_set("other", "k", b"")


def test_status_table_lists_daemons_and_jobs(state):
    state.register_daemon(
        coordinator_pb2.DaemonInfo(
            address="n1:7001",
            plugin="gpu",
            device_kind="H200",
            device_id=3,
            cores=16,
            memory_bytes=141 << 30,
            hostname="n1",
        )
    )
    state.register_daemon(daemon_info(2))
    start_job(state, "train", 1, plugin="gpu")
    state.fail_job("train", 0, "out of memory")
    start_job(state, "eval", 1)
    lines = format_status(state.cluster_status()).splitlines()
    assert lines[0] == "daemons (2)"
    assert lines[1].split() == [
        "ID",
        "ADDRESS",
        "PLUGIN",
        "DEVICE",
        "CORES",
        "MEMORY",
        "STATE",
        "JOB/RANK",
        "HEARTBEAT",
    ]
    assert lines[2].split()[:8] == ["d0", "n1:7001", "gpu", "H200:3", "16", "141.0", "GiB", "idle"]
    assert lines[3].split()[:8] == ["d1", "h0:2", "cpu", "cpu:0", "-", "-", "busy", "eval/0"]
    assert lines[4:6] == ["", "jobs (2)"] and lines[6].split() == ["ID", "WORLD", "STATE", "FINISHED", "CAUSE"]
    assert lines[7].split()[:4] == ["train", "1", "failed", "0/1"] and lines[7].endswith("reported: out of memory")
    assert lines[8].split() == ["eval", "1", "running", "0/1"]
    assert format_status(coordinator_pb2.ClusterStatusReply()).splitlines()[1].strip().startswith("none registered")


def test_an_announced_job_refuses_other_sizes_times_out_on_its_own_and_runs_once(state):
    # What a dynamic cluster's scheduler does: announce the job of MS_WORKER_NUM ranks before any worker arrives.
    now = [0.0]
    state._clock = lambda: now[0]
    state.register_daemon(daemon_info(1))
    state.expect_job("ms", 2, timeout_s=5.0, how_to_fix="start them, or lower MS_WORKER_NUM", once=True)
    with pytest.raises(errors.ConfigurationError, match=r"started with world_size 2 but this process asks for 3"):
        state.join(join_request("ms", 3, 0), TIMEOUT_S)
    waiting = Call(state.join, join_request("ms", 2, 0), 10.0)
    time.sleep(0.1)
    now[0] = 6.0  # past the deadline the scheduler set, however long the worker itself would wait
    state.expire()
    with pytest.raises(errors.RendezvousTimeoutError, match=r"missing ranks \[1\]: start them, or lower MS_WORKER"):
        waiting.result()
    with pytest.raises(errors.ConfigurationError, match=r"already ran with all its 2 ranks and failed; this process"):
        state.join(join_request("ms", 2, 1), TIMEOUT_S)


def test_an_announced_job_outlives_a_joiner_that_went_away(state):
    state.expect_job("ms", 2, timeout_s=60.0, how_to_fix="start them")
    with pytest.raises(errors.TesselError):  # the only joiner's call is cancelled
        state.join(join_request("ms", 2, 0), 10.0, is_active=lambda: False)
    with pytest.raises(errors.ConfigurationError, match=r"started with world_size 2 but this process asks for 3"):
        state.join(join_request("ms", 3, 0), TIMEOUT_S)  # still the announced job: its size holds


def test_a_cancelled_barrier_or_group_call_leaves_no_arrival_behind():
    # Rank 0's call was cancelled (its client went away): rank 1 must not pass the barrier alone.
    state = CoordinatorState(heartbeat_timeout_s=1000.0)
    for port in (1, 2):
        state.register_daemon(daemon_info(port))
    start_job(state, "j", 2)
    with pytest.raises(errors.TesselError):
        state.barrier("j", "b", 0, [], 5.0, is_active=lambda: False)
    with pytest.raises(errors.RendezvousTimeoutError, match="missing ranks \\[0\\]"):
        state.barrier("j", "b", 1, [], 0.3)
    with pytest.raises(errors.TesselError):
        state.create_group("j", "g", [0, 1], 0, 5.0, is_active=lambda: False)
    with pytest.raises(errors.RendezvousTimeoutError, match="missing ranks \\[0\\]"):
        state.create_group("j", "g", [0, 1], 1, 0.3)
