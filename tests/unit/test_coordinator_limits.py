"""The coordinator's bounded work per request, liveness judged fairly, and failure claims (coordinator/state.py),
without processes: limits refuse absurd requests with a short message, no request holds the lock for long,
heartbeats are recorded even while it is held, dead daemons leave the registry, ended jobs keep little."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from test_coordinator_state import TIMEOUT_S, Call, daemon_info, events_in, join_request, start_job, subscribe_client

from tessel.coordinator.service import _HeartbeatStream
from tessel.coordinator.state import CoordinatorState
from tessel.core import errors
from tessel.core.limits import Limits
from tessel.v1 import coordinator_pb2


def test_absurd_requests_are_refused_with_short_messages():
    state = CoordinatorState(limits=Limits(max_world_size=1000, max_id_chars=64, max_daemons=2))
    with pytest.raises(errors.LimitExceededError, match="world size that is 20000000, over this server's limit"):
        state.join(join_request("j", 20_000_000, 0), 1.0)
    huge = "x" * 5_000_000
    with pytest.raises(errors.LimitExceededError) as too_long:
        state.join(join_request(huge, 2, 0), 1.0)
    assert len(str(too_long.value)) < 300 and "5000000 characters" in str(too_long.value)
    with pytest.raises(errors.LimitExceededError, match="daemon's hostname"):
        state.register_daemon(coordinator_pb2.DaemonInfo(address="h:1", hostname=huge))
    state.register_daemon(daemon_info(1))
    state.register_daemon(daemon_info(2))
    with pytest.raises(errors.LimitExceededError, match="registered daemons"):
        state.register_daemon(daemon_info(3))
    assert state.register_daemon(daemon_info(2)) == "d1"  # a restart of a known daemon is not a new one


def test_a_world_of_twenty_million_holds_the_lock_for_milliseconds():
    state = CoordinatorState(limits=Limits(max_world_size=1 << 25, server_threads=1 << 26))
    held: list[float] = []

    def probe() -> None:  # how long another request waits for the lock meanwhile
        for _ in range(40):
            start = time.perf_counter()
            with state._cond:
                pass
            held.append(time.perf_counter() - start)
            time.sleep(0.005)

    prober = threading.Thread(target=probe)
    prober.start()
    started = time.perf_counter()
    with pytest.raises(errors.RendezvousTimeoutError, match=r"missing ranks \[1, 2, .*, … 19999979 more\]"):
        state.join(join_request("huge", 20_000_000, 0), 0.2)
    prober.join()
    # Bounds loose enough for a loaded machine; the list of 20 million missing ranks alone took seconds.
    assert time.perf_counter() - started < 5.0
    assert max(held) < 0.5, max(held)


def test_beats_are_recorded_while_the_lock_is_held_and_a_starved_check_judges_later():
    state = CoordinatorState(heartbeat_timeout_s=1.0)
    state.register_daemon(daemon_info(1))
    state.register_daemon(daemon_info(2))
    start_job(state, "j", 2)
    subs = [subscribe_client(state, "j", r)[0] for r in (0, 1)]
    for daemon_id in ("d0", "d1"):
        subs.append(state.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id=daemon_id), queue.SimpleQueue()))
    stop = threading.Event()

    def beat() -> None:  # healthy members: a beat every 0.1 s, whatever else the coordinator does
        while not stop.wait(0.1):
            for sub in subs:
                state.beat(sub)

    beater = threading.Thread(target=beat)
    beater.start()
    try:
        with state._cond:  # a request that holds the lock for 1.5 s (more than the heartbeat timeout)
            checker = Call(state.expire)
            time.sleep(1.5)
        checker.result()
        state.expire()
        assert state.job_info("j").state == "running"
    finally:
        stop.set()
        beater.join()
    state.expire(now=time.monotonic() + 5)  # now they really are silent
    assert state.job_info("j").state == "failed"


def test_a_first_beat_that_waits_for_the_lock_does_not_end_its_stream():
    # the member sent its first message at once; binding it waited for the state's lock longer than the first
    # message's deadline: that is the coordinator's delay, and the stream must live on (it was aborted, and the
    # rank or daemon declared dead)
    state = CoordinatorState(heartbeat_timeout_s=1.0)
    daemon_id = state.register_daemon(daemon_info(1))
    sent = queue.SimpleQueue()
    sent.put(coordinator_pb2.HeartbeatRequest(daemon_id=daemon_id))
    stream = _HeartbeatStream(state, iter(sent.get, None), first_message_timeout_s=0.3)

    class Context:
        def is_active(self) -> bool:
            return True

        def abort(self, code, details):
            raise AssertionError(f"aborted: {code} {details}")

    with state._cond:  # a request that holds the lock for longer than the first message's deadline
        replies = Call(lambda: next(stream.replies(Context())))
        time.sleep(0.9)
    assert replies.result() == coordinator_pb2.HeartbeatReply()  # the first beat's ack
    assert state.cluster_status().daemons[0].state == "idle"
    sent.put(None)  # the member ends its stream


def test_dead_daemons_leave_the_registry():
    state = CoordinatorState(heartbeat_timeout_s=1.0, limits=Limits(forget_dead_daemon_s=10.0))
    state.register_daemon(daemon_info(1))  # registers, never beats
    state.expire(now=time.monotonic() + 2)
    assert [d.state for d in state.cluster_status().daemons] == ["dead"]
    state.expire(now=time.monotonic() + 20)
    assert list(state.cluster_status().daemons) == []
    with pytest.raises(KeyError, match="not registered"):
        state.get_daemon("d0")


def test_ended_jobs_keep_a_bounded_history_and_clipped_causes():
    state = CoordinatorState(limits=Limits(keep_ended_jobs=3, max_text_chars=1000))
    state.register_daemon(daemon_info(1))
    for n in range(6):
        start_job(state, f"j{n}", 1)
        state.kv_set(f"j{n}", "blob", b"x" * 100_000)
        state.fail_job(f"j{n}", 0, "y" * 180_000_000 if n == 5 else "bad")
    jobs = state.cluster_status().jobs
    assert [j.job_id for j in jobs] == ["j3", "j4", "j5"]
    assert len(jobs[-1].cause) <= 1000 and "more characters cut" in jobs[-1].cause
    assert all(not state._jobs[j.job_id].kv for j in jobs)  # the store went with the job


def test_a_long_job_that_ends_after_the_history_of_short_ones_is_kept():
    # forgotten first: those that ended first, not those created first (the launcher asks a job's cause and
    # culprit right after it ended)
    state = CoordinatorState(limits=Limits(keep_ended_jobs=2))
    state.register_daemon(daemon_info(1))
    state.register_daemon(daemon_info(2))
    start_job(state, "long", 1)
    for n in range(3):
        start_job(state, f"short{n}", 1)
        state.fail_job(f"short{n}", 0, "bad")
    state.fail_job("long", 0, "at last")
    assert state.job_info("long").cause.endswith("at last")
    assert sorted(j.job_id for j in state.cluster_status().jobs) == ["long", "short2"]


def test_a_claim_against_a_peer_waits_for_harder_news():
    state = CoordinatorState(heartbeat_timeout_s=3.0)
    for port in range(3):
        state.register_daemon(daemon_info(port))
    start_job(state, "j", 3)
    state.fail_job("j", 2, "PeerFailedError: the connection to rank 1 closed", culprit=1)
    assert state.job_info("j").state == "running"  # a claim, not yet a verdict
    sub, _ = subscribe_client(state, "j", 2)
    state.stream_closed(sub)  # the claimant exits: that is no news
    assert state.job_info("j").state == "running"
    state.stream_closed(state.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id="d0"), queue.SimpleQueue()))
    info = state.job_info("j")  # the daemon of rank 0 died: harder news wins over the claim
    assert info.state == "failed" and info.culprit_rank == 0, info

    start_job(state, "k", 2)
    state.fail_job("k", 1, "rank 1 exited with status 3", culprit=1)
    state.fail_job("k", 1, "rank 1 exited with status 3 (said its launcher)", culprit=1)  # said once
    state.inspect(now=time.monotonic() + 0.5)
    assert state.job_info("k").state == "running"
    state.inspect(now=time.monotonic() + 2)
    info = state.job_info("k")
    assert info.state == "failed" and info.culprit_rank == 1 and "exited with status 3" in info.cause


def test_a_rank_that_raises_decides_at_once():
    state = CoordinatorState()
    state.register_daemon(daemon_info(1))
    state.register_daemon(daemon_info(2))
    start_job(state, "j", 2)
    _, outbox = subscribe_client(state, "j", 0)
    state.fail_job("j", 1, "ValueError: boom")
    [event] = events_in(outbox)
    assert (event.state, event.culprit_rank) == ("failed", 1)


def test_key_value_store_and_waits_are_bounded():
    state = CoordinatorState(limits=Limits(max_kv_bytes=1000))
    state.register_daemon(daemon_info(1))
    start_job(state, "j", 1)
    state.kv_set("j", "a", b"x" * 900)
    with pytest.raises(errors.LimitExceededError, match=r"key-value store of job .j. in bytes is 1102"):
        state.kv_set("j", "b", b"x" * 200)
    state.kv_set("j", "a", b"x" * 10)  # replacing frees the old value's bytes
    state.kv_set("j", "b", b"x" * 900)
    assert Limits(max_wait_s=10).wait_s(float("nan"), 60) == 60
    assert Limits(max_wait_s=10).wait_s(1e300, 60) == 10
    assert Limits(max_wait_s=10).wait_s(-5, 60) == 60


def test_a_job_needing_more_server_threads_than_the_coordinator_has_is_refused_when_it_forms():
    # each rank holds a server thread in JoinJob (or a barrier) and one for its heartbeat stream: queued past the
    # pool instead, the last ranks would never be served and the rendezvous would time out naming them
    state = CoordinatorState(limits=Limits(server_threads=100))
    state.register_daemon(daemon_info(1))
    with pytest.raises(errors.LimitExceededError, match=r"job 'big' of 30 ranks would need about 125 .* "
                       r"TESSEL_LIMIT_SERVER_THREADS=125 or more"):  # fmt: skip
        state.join(join_request("big", 30, 0), TIMEOUT_S)
    with pytest.raises(errors.LimitExceededError, match=r"job 'big' of 30 ranks"):
        state.expect_job("big", 30, timeout_s=5.0)
    start_job(state, "small", 1)  # 2 + 1 + 64 = 67 threads: fine


def test_limits_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("TESSEL_LIMIT_MAX_WORLD_SIZE", "64")
    monkeypatch.setenv("TESSEL_LIMIT_ORPHAN_SESSION_S", "2.5")
    limits = Limits.from_env(max_jobs=7)
    assert (limits.max_world_size, limits.orphan_session_s, limits.max_jobs) == (64, 2.5, 7)
    monkeypatch.setenv("TESSEL_LIMIT_MAX_JOBS", "lots")
    with pytest.raises(errors.ConfigurationError, match="TESSEL_LIMIT_MAX_JOBS"):
        Limits.from_env()


def test_assignment_of_a_large_world_is_linear_and_prefers_each_ranks_host():
    from tessel.coordinator import jobs

    daemons = {}
    for port in range(20_000):  # 20,000 ranks on 20,000 daemons of 100 hosts
        record = jobs.DaemonRecord(info=daemon_info(port, hostname=f"h{port % 100}"), last_beat=0.0)
        record.info.daemon_id, record.info.state = f"d{port}", jobs.IDLE
        daemons[record.info.daemon_id] = record
    job = jobs.Job("big", 20_000, 0.0)
    for rank in range(20_000):
        job.take_rank(rank, jobs.Joiner(rank, "cpu" if rank % 2 else "", "", f"h{rank % 100}", rank))
    started = time.perf_counter()
    chosen, reasons = jobs.assign_daemons(job, daemons)
    assert time.perf_counter() - started < 20.0  # O(ranks x daemons) took minutes
    assert not reasons and len({d.daemon_id for d in chosen.values()}) == 20_000
    assert all(chosen[r].info.hostname == f"h{r % 100}" for r in range(20_000))


def test_a_rank_that_joins_but_never_heartbeats_frees_its_daemon():
    state = CoordinatorState(heartbeat_timeout_s=3.0)
    state.register_daemon(daemon_info(1))
    state.register_daemon(daemon_info(2))
    start_job(state, "k", 2)
    subs = [subscribe_client(state, "k", 0)[0]]
    subs += [state.subscribe(coordinator_pb2.HeartbeatRequest(daemon_id=d), queue.SimpleQueue()) for d in ("d0", "d1")]
    later = time.monotonic() + state.first_beat_s + 1
    state._clock = lambda: later  # rank 0 and the daemons keep beating; rank 1 never started
    for sub in subs:
        state.beat(sub)
    state.expire()
    info = state.job_info("k")
    assert info.state == "failed" and info.culprit_rank == 1 and "never sent a heartbeat" in info.cause, info
    assert {d.state for d in state.cluster_status().daemons} == {"idle"}
