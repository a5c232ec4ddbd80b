"""The typed coordinator client used by daemons, the SDK and the launcher."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import grpc

from tessel.core import errors, rpc
from tessel.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger("tessel.coordinator")

DEFAULT_PORT = 7070
COORDINATOR_LOST = "coordinator_lost"  # JobEvent.state a HeartbeatHandle reports when the coordinator goes away
# A daemon reports a long collective wait (StallReport) again this often while it lasts; the coordinator drops a
# wait not heard of for 3 of these (its end's report was lost): daemon/stall.py, coordinator/stalls.py.
STALL_REFRESH_S = 10.0
_DEADLINE_MARGIN_S = 5.0  # gRPC deadline beyond a blocking call's own timeout, so its clear error arrives first


def default_address() -> str:
    """$TESSEL_COORDINATOR, else 127.0.0.1:7070."""
    return os.environ.get("TESSEL_COORDINATOR") or f"127.0.0.1:{DEFAULT_PORT}"


def reconnect_grace_s() -> float:
    """$TESSEL_COORDINATOR_GRACE (default 10): how long a member keeps trying to reach a coordinator it lost before
    it counts as gone — long enough for a coordinator killed and restarted from its store to come back."""
    try:
        return max(0.0, float(os.environ.get("TESSEL_COORDINATOR_GRACE", "10")))
    except ValueError:
        return 10.0


# Codes after which the coordinator is there but will not take this member back: no point in trying again.
_FINAL_CODES = (
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


class HeartbeatHandle:
    """A background heartbeat stream for one member; events arrive through `on_event` (on the handle's thread).

    If the stream breaks, the handle opens it again (naming the same member) for up to `grace_s`, so a coordinator
    restarted from its store takes its members back; a coordinator that stops answering on an open stream has
    `timeout_s + grace_s` to answer again. If it does not come back in time, or answers that it does not know the
    member, the handle sets `lost` (with `lost_reason`) and calls
    `on_event` once with a JobEvent whose state is COORDINATOR_LOST. `stop()` ends the stream; for a client rank
    that has not finished (FinishRank), that counts as its death and fails its job.
    """

    def __init__(
        self,
        client: rpc.Client,
        first: coordinator_pb2.HeartbeatRequest,
        on_event: Callable[[coordinator_pb2.JobEvent], None],
        interval_s: float,
        timeout_s: float,
        grace_s: float | None = None,
        payload: Callable[[], coordinator_pb2.HeartbeatRequest] | None = None,
    ):
        self._client, self._first, self._on_event = client, first, on_event
        self._payload = payload  # what each beat after the first carries (a daemon's ranks' work counters)
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.grace_s = reconnect_grace_s() if grace_s is None else grace_s
        self.job_id = first.client.job_id if first.WhichOneof("who") == "client" else ""
        self.lost = threading.Event()
        self.lost_reason = ""
        self.reconnects = 0  # streams opened again after a break
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._call = None
        self._last_reply = time.monotonic()
        self._broken_since: float | None = None  # when the link last broke; None while the coordinator answers
        self._receiver = threading.Thread(target=self._receive, name="tessel-heartbeat", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="tessel-heartbeat-watchdog", daemon=True)
        self._receiver.start()
        self._watchdog.start()

    def _beats(self, ended: threading.Event) -> Iterator[coordinator_pb2.HeartbeatRequest]:
        yield self._first
        while not self._done.wait(self.interval_s) and not ended.is_set():
            yield self._beat()

    def _beat(self) -> coordinator_pb2.HeartbeatRequest:
        if self._payload is not None:
            try:
                return self._payload()
            except Exception:  # advice only: a beat must go out whatever its payload does
                log.exception("heartbeat payload failed")
        return coordinator_pb2.HeartbeatRequest()

    def _receive(self) -> None:
        while not self._done.is_set():
            ended = threading.Event()
            call = None
            try:
                call = self._client.stream("Heartbeat", self._beats(ended))
                with self._lock:
                    self._call = call
                    if self._done.is_set():
                        call.cancel()
                for reply in call:
                    if self._broken_since is not None:
                        log.warning("the coordinator at %s answers again", self._client.address)
                    self._last_reply, self._broken_since = time.monotonic(), None
                    for event in reply.events:
                        self._deliver(event)
                reason = f"the coordinator at {self._client.address} ended the heartbeat stream (it stopped)"
            except grpc.RpcError as exc:
                reason = (
                    f"lost the coordinator at {self._client.address}: its heartbeat stream broke "
                    f"({exc.code().name}: {exc.details()})"
                )
                exc.__traceback__ = None  # the error is the call: its frames would hold it in a cycle
                if exc.code() in _FINAL_CODES:
                    self._lose(reason)
                    return
            except errors.TesselError as exc:  # the client was closed or aborted: no stream to open again
                self._lose(f"the heartbeat stream to the coordinator at {self._client.address} ended: {exc}")
                return
            finally:
                ended.set()
                self._forget(call)
            if not self._broken(reason):
                return
            self._done.wait(min(0.2, self.interval_s))
            self.reconnects += 1

    def _forget(self, call) -> None:
        """The stream ended: its call is freed here, while grpc's threads run. Freed by the interpreter's end
        instead, it would wait for a lock that a grpc thread killed by that end may hold: a finished rank that
        never exits."""
        with self._lock:
            if self._call is call:
                self._call = None

    def _broken(self, reason: str) -> bool:
        """The link is down: True to try again, False once the grace ran out (the member is then lost)."""
        now = time.monotonic()
        with self._lock:
            if self._broken_since is None:
                self._broken_since = now
                if self.grace_s > 0 and not self._done.is_set():
                    log.warning("%s; trying again for %g s", reason, self.grace_s)
            since = self._broken_since
        if now - since >= self.grace_s:
            self._lose(reason if self.grace_s <= 0 else f"{reason}; it did not come back within {self.grace_s:g} s")
            return False
        return True

    def _watch(self) -> None:
        """A hung or stopped coordinator keeps the stream open but silent: it is lost once silent for the timeout
        plus the grace. The stream is never cancelled before: a coordinator that resumes (SIGCONT, a pause of its
        host) must find it open, since to the coordinator a rank's closed stream is that rank's death."""
        while not self._done.wait(self.interval_s):
            age = time.monotonic() - self._last_reply
            if age > self.timeout_s + self.grace_s:
                self._lose(f"no reply from the coordinator at {self._client.address} for {age:.1f} s")

    def _deliver(self, event: coordinator_pb2.JobEvent) -> None:
        try:
            self._on_event(event)
        except Exception:  # a faulty callback must not stop liveness
            log.exception("heartbeat on_event callback failed for %s", event)

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._done.set()
            self.lost_reason = reason
            self.lost.set()
            if self._call is not None:
                self._call.cancel()
        log.warning("%s", reason)
        event = coordinator_pb2.JobEvent(job_id=self.job_id, state=COORDINATOR_LOST, cause=reason, culprit_rank=-1)
        self._deliver(event)  # no rank is to blame

    @property
    def alive(self) -> bool:
        return not self._done.is_set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the stream and its threads (waits at most timeout_s)."""
        with self._lock:
            self._done.set()
            if self._call is not None:
                self._call.cancel()
        for thread in (self._receiver, self._watchdog):
            if thread is not threading.current_thread():
                thread.join(timeout_s)


class CoordinatorUnreachableError(errors.JobFailedError):
    """The coordinator's port did not answer (it is down, or restarting)."""


class _RetryingClient(rpc.Client):
    """Unary calls that find the coordinator unreachable try again for up to `grace_s` (a restarted coordinator
    takes them back: it kept its state); an aborted client stops at once."""

    grace_s = 0.0

    def call(self, method: str, request, timeout_s: float | None = None):
        deadline = None
        while True:
            try:
                return super().call(method, request, timeout_s)
            except CoordinatorUnreachableError as exc:
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self.grace_s
                if self._aborted is not None:
                    raise self._aborted from None
                if now >= deadline:
                    raise CoordinatorUnreachableError(
                        f"{exc} (tried again for {self.grace_s:g} s: $TESSEL_COORDINATOR_GRACE)"
                    ) from None
                time.sleep(min(0.2, deadline - now))


class CoordinatorClient:
    """Typed calls to a coordinator; every call has a deadline and raises tessel exceptions.

    Example:
        client = CoordinatorClient("127.0.0.1:7070")
        reply = client.join_job("train1", world_size=2, timeout_s=30)
        print(reply.rank, reply.daemon.daemon_address)
    """

    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        timeout_s: float = 60.0,
        grace_s: float | None = None,
    ):
        """`grace_s` (default $TESSEL_COORDINATOR_GRACE, 10): how long calls and heartbeats keep trying to reach a
        coordinator that went away, so that one restarted from its store takes them back."""
        self.address = address or default_address()
        token = token or rpc.cluster_token()
        self.grace_s = reconnect_grace_s() if grace_s is None else grace_s
        stub = coordinator_pb2_grpc.CoordinatorStub
        self._rpc = _RetryingClient(self.address, stub, token, timeout_s, unreachable=CoordinatorUnreachableError)
        self._rpc.grace_s = self.grace_s
        self._handles: list[HeartbeatHandle] = []

    def _wait_call(self, method: str, request, timeout_s: float):
        return self._rpc.call(method, request, timeout_s=timeout_s + _DEADLINE_MARGIN_S)

    def register_daemon(self, info: coordinator_pb2.DaemonInfo) -> coordinator_pb2.RegisterDaemonReply:
        # Not retried here: the daemon retries registration on its own schedule (--connect-timeout).
        return rpc.Client.call(self._rpc, "RegisterDaemon", coordinator_pb2.RegisterDaemonRequest(info=info))

    def heartbeat(
        self,
        member: str | coordinator_pb2.ClientRef,
        on_event: Callable[[coordinator_pb2.JobEvent], None],
        interval_s: float = 0.5,
        timeout_s: float | None = None,
        payload: Callable[[], coordinator_pb2.HeartbeatRequest] | None = None,
    ) -> HeartbeatHandle:
        """Start beating for a daemon (its id) or a client rank (ClientRef); timeout_s defaults to 6 intervals.
        `payload()`, if given, makes each beat after the first (e.g. carrying the daemon's ranks' work counters)."""
        if isinstance(member, str):
            first = coordinator_pb2.HeartbeatRequest(daemon_id=member)
        else:
            first = coordinator_pb2.HeartbeatRequest(client=member)
        timeout_s = timeout_s if timeout_s is not None else max(3.0, 6 * interval_s)
        handle = HeartbeatHandle(self._rpc, first, on_event, interval_s, timeout_s, self.grace_s, payload)
        self._handles = [h for h in self._handles if h.alive] + [handle]
        return handle

    def join_job(
        self,
        job_id: str,
        world_size: int,
        rank: int = -1,
        *,
        plugin: str = "",
        daemon_id: str = "",
        hostname: str | None = None,
        pid: int | None = None,
        timeout_s: float = 60.0,
    ) -> coordinator_pb2.JoinJobReply:
        """Join and block until all ranks joined and have daemons (RendezvousTimeoutError names the missing)."""
        request = coordinator_pb2.JoinJobRequest(
            job_id=job_id,
            world_size=world_size,
            rank=rank,
            plugin=plugin,
            daemon_id=daemon_id,
            hostname=hostname if hostname is not None else socket.gethostname(),
            pid=pid if pid is not None else os.getpid(),
            timeout_s=timeout_s,
        )
        return self._wait_call("JoinJob", request, timeout_s)

    def get_job(self, job_id: str) -> coordinator_pb2.JobInfo:
        return self._rpc.GetJob(coordinator_pb2.GetJobRequest(job_id=job_id))

    def finish_rank(self, job_id: str, rank: int, timeout_s: float | None = None) -> None:
        self._rpc.FinishRank(coordinator_pb2.FinishRankRequest(job_id=job_id, rank=rank), timeout_s)

    def fail_job(
        self, job_id: str, rank: int, cause: str, culprit_rank: int | None = None, timeout_s: float | None = None
    ) -> None:
        """Report a failure of `rank`: its own, or (culprit_rank) one that another rank caused."""
        request = coordinator_pb2.FailJobRequest(job_id=job_id, rank=rank, cause=cause)
        if culprit_rank is not None:
            request.culprit_rank = culprit_rank
        self._rpc.FailJob(request, timeout_s)

    def abort(self, error: Exception) -> None:
        """The coordinator is lost: end the calls in flight (a stopped coordinator would hold them until their
        deadline) and fail later ones with `error`, heartbeat streams included (they share the channel)."""
        self._rpc.abort(error)

    def get_daemon(self, daemon_id: str, timeout_s: float | None = None) -> coordinator_pb2.DaemonInfo:
        return self._rpc.GetDaemon(coordinator_pb2.GetDaemonRequest(daemon_id=daemon_id), timeout_s)

    def report_stall(self, report: coordinator_pb2.StallReport, timeout_s: float | None = None) -> None:
        self._rpc.ReportStall(report, timeout_s)

    def create_group(
        self, job_id: str, name: str, ranks: Sequence[int], rank: int, timeout_s: float = 60.0
    ) -> list[common_pb2.Member]:
        """Block until every rank of the group called it; returns the group's Members in `ranks` order."""
        request = coordinator_pb2.CreateGroupRequest(
            job_id=job_id, name=name, ranks=list(ranks), rank=rank, timeout_s=timeout_s
        )
        return list(self._wait_call("CreateGroup", request, timeout_s).members)

    def destroy_group(self, job_id: str, name: str, rank: int) -> None:
        self._rpc.DestroyGroup(coordinator_pb2.DestroyGroupRequest(job_id=job_id, name=name, rank=rank))

    def barrier(self, job_id: str, name: str, rank: int, ranks: Sequence[int] = (), timeout_s: float = 60.0) -> None:
        """Block until every rank in `ranks` (default: the whole job) reached the barrier named `name`."""
        request = coordinator_pb2.BarrierRequest(
            job_id=job_id, name=name, rank=rank, ranks=list(ranks), timeout_s=timeout_s
        )
        self._wait_call("Barrier", request, timeout_s)

    def kv_set(self, job_id: str, key: str, value: bytes) -> None:
        self._rpc.KeyValueSet(coordinator_pb2.KeyValueSetRequest(job_id=job_id, key=key, value=value))

    def kv_get(self, job_id: str, key: str, timeout_s: float = 60.0) -> bytes:
        """The key's value, waiting up to timeout_s for it (RendezvousTimeoutError); 0 = no wait (KeyError)."""
        request = coordinator_pb2.KeyValueGetRequest(job_id=job_id, key=key, timeout_s=timeout_s)
        return self._wait_call("KeyValueGet", request, timeout_s).value

    def kv_delete(self, job_id: str, key: str) -> None:
        self._rpc.KeyValueDelete(coordinator_pb2.KeyValueDeleteRequest(job_id=job_id, key=key))

    def cluster_status(self) -> coordinator_pb2.ClusterStatusReply:
        return self._rpc.ClusterStatus(common_pb2.Empty())

    def plan_strategies(
        self,
        job_id: str,
        graph: bytes,
        world_size: int,
        mode: str,
        *,
        fixed: bytes = b"",
        parameters: Sequence[str] = (),
        dataset: bytes = b"",
        memory_budget: float = 0.0,
        timeout_s: float = 120.0,
        alltoall: bool = True,
    ) -> coordinator_pb2.PlanReply:
        """The coordinator's plan (PlanStrategies) for a graph in tessel.compiler.ir_json form; `fixed` and the
        reply's `strategies` are strategy_json documents, `dataset` value_to_json's JSON. Decoding them needs the
        compiler, which this layer does not import: `tessel.coordinator.plan_client.plan_remotely` does both ends
        and returns strategies keyed by the graph's nodes. `alltoall=False`: priced without AlltoAll
        (set_auto_parallel_context(enable_alltoall=False))."""
        request = coordinator_pb2.PlanRequest(
            job_id=job_id,
            graph=graph,
            world_size=world_size,
            mode=mode,
            fixed=fixed,
            parameters=list(parameters),
            dataset=dataset,
            memory_budget=memory_budget,
            timeout_s=timeout_s,
            without_alltoall=not alltoall,
        )
        return self._wait_call("PlanStrategies", request, timeout_s)

    def cost_model(self, job_id: str, refresh: bool = False) -> coordinator_pb2.ClusterModel:
        """The cost model of a job's daemons (GetCostModel): their measurements and the probed links (probing links
        between hosts the first time takes a moment); `refresh`: the daemons measure again first (about a second)."""
        request = coordinator_pb2.GetCostModelRequest(job_id=job_id, refresh=refresh)
        return self._rpc.call("GetCostModel", request, timeout_s=90.0)

    def balance_batch(
        self,
        job_id: str,
        rank: int,
        epoch: int,
        global_batch: int,
        weights: Sequence[float] = (),
        busy_s: float = 0.0,
        samples: int = 0,
        timeout_s: float = 120.0,
    ) -> coordinator_pb2.BatchSplit:
        """The split of the global batch for `epoch`, the same for every rank of the job (a rendezvous: it returns once
        all have asked); this rank's `busy_s` of own work on `samples` samples since it last asked refine the speeds."""
        request = coordinator_pb2.BalanceRequest(
            job_id=job_id,
            rank=rank,
            epoch=epoch,
            global_batch=global_batch,
            weights=list(weights),
            busy_s=busy_s,
            samples=samples,
            timeout_s=timeout_s,
        )
        return self._wait_call("BalanceBatch", request, timeout_s)

    def close(self) -> None:
        """Stop this client's heartbeat streams and close its channel."""
        for handle in self._handles:
            handle.stop()
        self._rpc.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
