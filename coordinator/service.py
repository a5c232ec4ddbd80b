"""The coordinator's gRPC service: RPC methods over `CoordinatorState`, heartbeat streams and the liveness reaper."""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator

import grpc

from tessel.coordinator.balance import BatchBalancer
from tessel.coordinator.pace import PaceSettings
from tessel.coordinator.planner import DEFAULT_PLAN_TIMEOUT_S, StrategyPlanner
from tessel.coordinator.state import ACK, CLOSE, CoordinatorState
from tessel.coordinator.store import Store
from tessel.core import errors, rpc, tls
from tessel.core.limits import Limits
from tessel.core.memory import release_free_memory
from tessel.v1 import common_pb2, coordinator_pb2

log = logging.getLogger("tessel.coordinator")

DEFAULT_WAIT_S = 60.0  # a blocking call that gives no timeout_s waits this long at most
# The stall inspector (coordinator/stalls.py): a collective that ranks have waited in this long is announced in
# the log, to the job's ranks and in `tessel status`; past the timeout the job fails, blaming a missing rank.
STALL_WARNING_S = float(os.environ.get("TESSEL_STALL_WARNING", "2"))
STALL_TIMEOUT_S = float(os.environ.get("TESSEL_STALL_TIMEOUT", "300"))
# After a restart from a durable store, daemons and ranks have this long to heartbeat again (durable.py).
RECOVERY_GRACE_S = float(os.environ.get("TESSEL_RECOVERY_GRACE", "10"))
_POLL_S = 0.25  # how often an idle stream sender checks that its call is still alive


def _wait_budget(
    requested_s: float, context: grpc.ServicerContext, default_s: float = DEFAULT_WAIT_S, limits: Limits | None = None
) -> float:
    """The caller's timeout_s (default_s if unset, negative or NaN; at most the limit's max_wait_s), cut short so our
    clear error beats the gRPC deadline."""
    budget = (limits or Limits()).wait_s(requested_s, default_s)
    remaining = context.time_remaining()
    if remaining is not None:
        budget = min(budget, max(remaining - 0.2, 0.0))
    return budget


class CoordinatorServicer:
    """Maps each Coordinator RPC onto the state; `tessel.core.rpc` does auth, parsing and error mapping around it."""

    def __init__(
        self,
        state: CoordinatorState,
        heartbeat_interval_ms: int,
        heartbeat_timeout_ms: int,
        planner: StrategyPlanner | None = None,
    ):
        self.state = state
        self.heartbeat_interval_ms, self.heartbeat_timeout_ms = heartbeat_interval_ms, heartbeat_timeout_ms
        self.planner = planner or StrategyPlanner(state)
        self.balancer = BatchBalancer(state)

    def RegisterDaemon(self, request, context):
        daemon_id = self.state.register_daemon(request.info)
        return coordinator_pb2.RegisterDaemonReply(
            daemon_id=daemon_id,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            heartbeat_timeout_ms=self.heartbeat_timeout_ms,
        )

    def Heartbeat(self, requests: Iterator[coordinator_pb2.HeartbeatRequest], context) -> Iterator:
        stream = _HeartbeatStream(self.state, requests, self.heartbeat_timeout_ms / 1000)
        return stream.replies(context)

    def _budget(self, requested_s: float, context, default_s: float = DEFAULT_WAIT_S) -> float:
        return _wait_budget(requested_s, context, default_s, self.state.limits)

    def JoinJob(self, request, context):
        return self.state.join(request, self._budget(request.timeout_s, context), context.is_active)

    def GetJob(self, request, context):
        return self._with_split(self.state.job_info(request.job_id))

    def _with_split(self, job: coordinator_pb2.JobInfo) -> coordinator_pb2.JobInfo:
        split = self.balancer.latest(job.job_id)
        if split is not None:
            job.batch_split.CopyFrom(split)
        return job

    def FinishRank(self, request, context):
        self.state.finish_rank(request.job_id, request.rank)
        return common_pb2.Empty()

    def FailJob(self, request, context):
        culprit = request.culprit_rank if request.HasField("culprit_rank") else None
        self.state.fail_job(request.job_id, request.rank, request.cause, culprit)
        return common_pb2.Empty()

    def CreateGroup(self, request, context):
        members = self.state.create_group(
            request.job_id,
            request.name,
            list(request.ranks),
            request.rank,
            self._budget(request.timeout_s, context),
            context.is_active,
        )
        return coordinator_pb2.CreateGroupReply(members=members)

    def DestroyGroup(self, request, context):
        self.state.destroy_group(request.job_id, request.name, request.rank)
        return common_pb2.Empty()

    def Barrier(self, request, context):
        budget = self._budget(request.timeout_s, context)
        self.state.barrier(request.job_id, request.name, request.rank, list(request.ranks), budget, context.is_active)
        return common_pb2.Empty()

    def KeyValueSet(self, request, context):
        self.state.kv_set(request.job_id, request.key, request.value)
        return common_pb2.Empty()

    def KeyValueGet(self, request, context):
        budget = self._budget(request.timeout_s, context, default_s=0.0) if request.timeout_s > 0 else 0.0
        value = self.state.kv_get(request.job_id, request.key, budget, context.is_active)
        return coordinator_pb2.KeyValueGetReply(value=value)

    def KeyValueDelete(self, request, context):
        self.state.kv_delete(request.job_id, request.key)
        return common_pb2.Empty()

    def ClusterStatus(self, request, context):
        reply = self.state.cluster_status()
        for job in reply.jobs:
            self._with_split(job)
        return reply

    def GetDaemon(self, request, context):
        return self.state.get_daemon(request.daemon_id)

    def ReportStall(self, request, context):
        self.state.report_stall(request)
        return common_pb2.Empty()

    # Strategy assignment: coordinator/planner.py (searches run in the planner's own threads, off the state lock).
    def PlanStrategies(self, request, context):
        return self.planner.plan(request, _wait_budget(request.timeout_s, context, DEFAULT_PLAN_TIMEOUT_S))

    def GetCostModel(self, request, context):
        return self.planner.cost_model(request.job_id, request.refresh)

    # Speed-aware data parallelism: coordinator/balance.py.
    def BalanceBatch(self, request, context):
        return self.balancer.balance(request, _wait_budget(request.timeout_s, context), context.is_active)


class _HeartbeatStream:
    """One Heartbeat call: a reader thread takes the beats, the handler's generator sends acks and events.

    Reading on its own thread lets the sender wake for events at once, and lets the first message have a deadline.
    """

    def __init__(self, state: CoordinatorState, requests: Iterator, first_message_timeout_s: float):
        self.state, self.requests = state, requests
        self.first_message_timeout_s = first_message_timeout_s
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.heard = False  # the first message came (binding it may wait for the state's lock: not the member's fault)

    def _read(self) -> None:
        sub, why = None, "closed its heartbeat stream (the process exited or lost its connection)"
        try:
            for request in self.requests:
                if sub is None:
                    self.heard = True
                    sub = self.state.subscribe(request, self.outbox)
                else:
                    self.state.beat(sub, request)
                self.outbox.put(ACK)
        except grpc.RpcError:
            pass  # cancelled: the member's connection broke
        except Exception as exc:  # unknown member or malformed first message: the sender reports it
            self.outbox.put(exc)
        finally:
            if sub is not None:
                self.state.stream_closed(sub, why)
            self.outbox.put(CLOSE)

    def replies(self, context: grpc.ServicerContext) -> Iterator[coordinator_pb2.HeartbeatReply]:
        threading.Thread(target=self._read, name="tessel-heartbeat-reader", daemon=True).start()
        first_deadline = time.monotonic() + self.first_message_timeout_s
        while True:
            try:
                item = self.outbox.get(timeout=_POLL_S)
            except queue.Empty:
                if not context.is_active():
                    return
                if not self.heard and time.monotonic() > first_deadline:
                    context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"Heartbeat: no first message within {self.first_message_timeout_s:.1f} s; "
                        "send the daemon_id or client ref at once",
                    )
                continue
            if item is CLOSE:
                return
            if isinstance(item, Exception):
                raise item
            reply = coordinator_pb2.HeartbeatReply()
            if item is not ACK:
                reply.events.append(item)
            yield reply


class CoordinatorServer:
    """A running coordinator (embedded in this process): `.address`, `.port`, `.state`, `.stop()`, `.wait()`."""

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        heartbeat_interval_ms: int,
        heartbeat_timeout_ms: int,
        max_workers: int | None = None,
        limits: Limits | None = None,
        stall_warning_s: float = STALL_WARNING_S,
        stall_timeout_s: float = STALL_TIMEOUT_S,
        store: Store | None = None,
        recovery_grace_s: float = RECOVERY_GRACE_S,
        pace: PaceSettings | None = None,
    ):
        limits = limits or Limits.from_env()
        if max_workers is not None:
            limits = dataclasses.replace(limits, server_threads=max_workers)
        self.state = CoordinatorState(
            heartbeat_timeout_ms / 1000,
            limits=limits,
            stall_warning_s=stall_warning_s,
            stall_timeout_s=stall_timeout_s,
            store=store,
            recovery_grace_s=recovery_grace_s,
            pace=pace,
        )
        if self.state.restored:
            log.warning("coordinator %s", self.state.restored)
        self.planner = StrategyPlanner(self.state, token)
        servicer = CoordinatorServicer(self.state, heartbeat_interval_ms, heartbeat_timeout_ms, self.planner)
        service = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"]
        handler = rpc.generic_handler(servicer, service, token, limits.max_request_bytes)
        # Each heartbeat stream and each blocked rendezvous holds a worker thread, so allow many (created lazily);
        # a job that would need more is refused when it forms (CoordinatorState: server_threads), never left queued.
        self._server, self.port = rpc.start_server(
            [handler], host, port, max_workers=limits.server_threads, max_request_bytes=limits.max_request_bytes
        )
        self.host = host
        self.address = f"{host}:{self.port}"
        self._stopped = threading.Event()
        period = min(heartbeat_interval_ms, heartbeat_timeout_ms) / 1000 / 2
        self._reaper = threading.Thread(target=self._reap, args=(period,), name="tessel-reaper", daemon=True)
        self._reaper.start()
        self.deadlines = (
            f"heartbeat every {heartbeat_interval_ms / 1000:g} s, a member silent {heartbeat_timeout_ms / 1000:g} s "
            f"is dead; a dead daemon leaves the registry after {limits.forget_dead_daemon_s:g} s; stall warning after "
            f"{stall_warning_s:g} s, stall timeout {stall_timeout_s:g} s (0 = none); blocking calls wait "
            f"{DEFAULT_WAIT_S:g} s by default, {limits.max_wait_s:g} s at most; after a restart members have "
            f"{recovery_grace_s:g} s to come back (state in {self.state.store.url}); a straggler is a rank whose own "
            f"work per step is {self.state.pace.settings.ratio:g}x the others' median for "
            f"{self.state.pace.settings.windows} windows of {self.state.pace.settings.window_s:g} s"
        )
        self.tls = tls.wanted(host)
        log.info("coordinator listening on %s (%s)", self.address, "TLS, cluster CA" if self.tls else "plaintext")

    def _reap(self, period_s: float, trim_every_s: float = 10.0) -> None:
        last = trimmed = time.monotonic()
        while not self._stopped.wait(period_s):
            now = time.monotonic()
            gap, last = now - last, now
            try:
                if gap > self.state.heartbeat_timeout_s / 2:  # this thread was stopped or starved: so were the beats
                    log.warning("the liveness check ran %.1f s late; judging heartbeats on the next pass", gap)
                else:
                    self.state.expire()
                self.state.inspect()
            except Exception:  # the reaper must outlive any bug, or deaths would go unnoticed
                log.exception("liveness check failed")
            # After the check: a long trim holds the allocator's locks the beats' threads need, and its time then
            # counts in the next pass's gap (a check right after it would judge beats the trim held up).
            if time.monotonic() - trimmed > trim_every_s:  # a burst of large requests must not keep the RSS at its peak
                release_free_memory()
                trimmed = time.monotonic()

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving: end heartbeat streams, cancel blocked calls after `grace_s`."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.planner.close()
        self.state.close_all()
        self._server.stop(grace_s).wait(grace_s + 5)
        self._reaper.join(timeout=5)
        self.state.store.close()
        log.info("coordinator at %s stopped", self.address)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until stop() was called (True) or timeout_s passed (False)."""
        return self._stopped.wait(timeout_s)

    def __enter__(self) -> CoordinatorServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    heartbeat_interval_ms: int = 500,
    heartbeat_timeout_ms: int = 3000,
    *,
    limits: Limits | None = None,
    stall_warning_s: float = STALL_WARNING_S,
    stall_timeout_s: float = STALL_TIMEOUT_S,
    store: Store | None = None,
    recovery_grace_s: float = RECOVERY_GRACE_S,
    pace: PaceSettings | None = None,
) -> CoordinatorServer:
    """Start a coordinator in this process (port 0 = any free port); the token defaults to the cluster token.

    Example:
        with serve() as server:
            client = CoordinatorClient(server.address)
    """
    if heartbeat_interval_ms <= 0 or heartbeat_timeout_ms <= heartbeat_interval_ms:
        raise errors.ConfigurationError(
            f"heartbeat timeout {heartbeat_timeout_ms} ms must exceed the interval {heartbeat_interval_ms} ms > 0; "
            "use a timeout of several intervals (default 3000 ms over 500 ms)"
        )
    token = token or rpc.cluster_token(create=True)
    tls.cluster_ca(create=True)  # made with the token at the first start: the files other hosts get a copy of
    return CoordinatorServer(
        host,
        port,
        token,
        heartbeat_interval_ms,
        heartbeat_timeout_ms,
        limits=limits,
        stall_warning_s=stall_warning_s,
        stall_timeout_s=stall_timeout_s,
        store=store,
        recovery_grace_s=recovery_grace_s,
        pace=pace,
    )
