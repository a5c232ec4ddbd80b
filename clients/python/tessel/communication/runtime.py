"""The process-wide distributed runtime behind `tessel.communication`: who we are, which daemon we drive.

`init()` resolves the launch environment, first match wins:
* `tessel run` sets TESSEL_COORDINATOR, TESSEL_JOB_ID, TESSEL_RANK, TESSEL_WORLD_SIZE (and pins TESSEL_DAEMON_ID);
* dynamic networking (MS_ROLE, MS_SCHED_HOST/PORT, MS_WORKER_NUM, MS_NODE_ID; `tessel msrun` sets them): the
  MS_SCHED process serves the coordinator and exits at the end of the job, each MS_WORKER starts its own daemon
  (`tessel.communication.dynamic_cluster`);
* TESSEL_COORDINATOR set by the user: a running cluster; rank and size come from the launcher (OMPI_COMM_WORLD_*,
  PMI_*, PMIX_*, RANK_ID/RANK_SIZE), the job id from TESSEL_JOB_ID or the launcher's namespace;
* `mpirun` (OpenMPI) without TESSEL_COORDINATOR: rank 0 serves the job's coordinator, every rank starts its own
  daemon, and they are taken down at the end (`tessel.communication.bootstrap`);
* RANK_TABLE_FILE + RANK_ID (+ RANK_SIZE, DEVICE_ID) without TESSEL_COORDINATOR: the same, ranks and hosts from
  MindSpore's rank table (`tessel.communication.rank_table`);
* nothing set: a world of 1 on a daemon hosted in this process (no coordinator, no sockets).
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tessel.core.errors import ConfigurationError, JobFailedError, TesselError

if TYPE_CHECKING:  # the handle module loads the daemon library, which a remote rank never needs
    from tessel.communication.bootstrap import Bootstrap, Started
    from tessel.communication.daemon_handle import DaemonHandle

_RANK_VARS = ("TESSEL_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK_ID")
_SIZE_VARS = ("TESSEL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "RANK_SIZE")
_JOB_VARS = ("TESSEL_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")
log = logging.getLogger("tessel")


def _first_env(names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return name, value
    return None


def _env_int(names: tuple[str, ...]) -> int | None:
    found = _first_env(names)
    if found is None:
        return None
    try:
        return int(found[1])
    except ValueError:
        raise ConfigurationError(f"environment variable {found[0]}={found[1]!r} must be an integer") from None


def _join_timeout_s() -> float:
    return float(os.environ.get("TESSEL_JOIN_TIMEOUT", "120"))


@dataclass
class LaunchEnv:
    coordinator: str | None
    job_id: str
    rank: int
    world_size: int
    daemon_id: str
    plugin: str
    join_timeout_s: float
    bootstrap: Bootstrap | None = None  # what this rank starts itself before joining (no cluster was running)
    scheduler: object | None = None  # dynamic_cluster.DynamicCluster of an MS_SCHED process: it serves, never joins
    what: str = ""  # how the launcher named this process, for errors ("dynamic networking worker (...)")

    @property
    def own_plugin(self) -> str:
        """The plugin of a daemon this rank starts itself: the first it accepts, else cpu."""
        return next((p.strip() for p in self.plugin.split(",") if p.strip()), "cpu")

    @classmethod
    def from_environ(cls) -> LaunchEnv:
        # The plugin(s) a rank accepts when it joins a running cluster (comma-separated: a job over mixed hardware;
        # unset: any), and the one it starts when it starts its own daemon (cpu unless set).
        plugin = os.environ.get("TESSEL_PLUGIN", "")
        if not os.environ.get("TESSEL_RANK"):  # `tessel run` names its ranks itself; MS_* may be left in a shell
            from tessel.communication.dynamic_cluster import SCHEDULER, DynamicCluster

            cluster = DynamicCluster.from_environ()
            if cluster is not None:
                rank = -1 if cluster.role == SCHEDULER else cluster.rank()
                return cls(
                    coordinator=cluster.address,
                    job_id=cluster.job_id,
                    rank=rank,
                    world_size=cluster.worker_num,
                    daemon_id="",
                    plugin=plugin,
                    join_timeout_s=cluster.timeout_s,
                    bootstrap=None if cluster.role == SCHEDULER else cluster.worker_bootstrap(),
                    scheduler=cluster if cluster.role == SCHEDULER else None,
                    what=cluster.describe(),
                )
        rank, size = _env_int(_RANK_VARS), _env_int(_SIZE_VARS)
        coordinator = os.environ.get("TESSEL_COORDINATOR") or None
        job = _first_env(_JOB_VARS)
        if coordinator is None:
            started = _bootstrap_without_cluster(rank, size, job)
            if started is not None:
                return cls(None, started[0], started[1], started[2], "", plugin, _join_timeout_s(), started[3])
            if (size or 1) > 1:
                raise ConfigurationError(
                    f"this process is rank {rank} of {size} but nothing says where the other ranks are: start the "
                    "job with `tessel run -n N script.py`, `tessel msrun`, or `mpirun` (OpenMPI); or set "
                    "RANK_TABLE_FILE to the job's rank table; or TESSEL_COORDINATOR=host:port of a running "
                    "`tessel coordinator`"
                )
        if coordinator is not None and job is None:
            raise ConfigurationError(
                "TESSEL_COORDINATOR is set but no job id: set TESSEL_JOB_ID to the same value on every rank "
                "(tessel run and mpirun set one for you)"
            )
        return cls(
            coordinator=coordinator,
            job_id=job[1] if job else f"local-{socket.gethostname()}-{os.getpid()}",
            rank=rank if rank is not None else (0 if coordinator is None else -1),
            world_size=size or 1,
            daemon_id=os.environ.get("TESSEL_DAEMON_ID", ""),
            plugin=plugin,
            join_timeout_s=_join_timeout_s(),
        )


def _bootstrap_without_cluster(rank, size, job) -> tuple[str, int, int, Bootstrap] | None:
    """(job id, rank, world size, bootstrap) for a job that starts its own coordinator and daemons: mpirun
    (OpenMPI) or a rank table; None for anything else."""
    from tessel.communication import bootstrap

    if os.environ.get("OMPI_COMM_WORLD_SIZE"):
        plan = bootstrap.mpirun(rank, size, job[1], time.monotonic() + _join_timeout_s())
        return job[1], rank, size, plan
    if os.environ.get("RANK_TABLE_FILE"):
        job_id, rank, size, plan = bootstrap.rank_table(time.monotonic() + _join_timeout_s())
        return job_id, rank, size, plan
    return None


@dataclass
class Runtime:
    job_id: str
    rank: int
    world_size: int
    local_rank: int
    local_size: int
    daemon: DaemonHandle
    session_id: str
    coordinator: object | None = None
    heartbeat: object | None = None
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)  # user group name -> global ranks
    failure: str | None = None
    culprit_rank: int = -1
    started: Started | None = None  # the coordinator / daemon this rank started for its job (bootstrap)
    hosts: tuple[str, ...] = ()  # the host of each world rank (equal: same host); empty when not known

    def check(self) -> None:
        if self.failure is not None:
            raise JobFailedError(f"job {self.job_id!r} failed: {self.failure}", self.culprit_rank)


_lock = threading.Lock()
_runtime: Runtime | None = None


def current() -> Runtime:
    if _runtime is None:
        raise TesselError(
            "the distributed runtime is not initialized: call tessel.communication.init() first "
            "(MindSpore scripts do this right after set_context)"
        )
    return _runtime


def is_initialized() -> bool:
    return _runtime is not None


def _embedded(env: LaunchEnv) -> Runtime:
    from tessel import context
    from tessel.communication.daemon_handle import LocalDaemon
    from tessel.daemon.core import DaemonCore
    from tessel.plugins import load_plugin

    device = context._requested_device()
    if device is None:
        device = int(os.environ["DEVICE_ID"]) if os.environ.get("DEVICE_ID", "").isdigit() else 0
    threads = int(os.environ.get("TESSEL_THREADS", "0")) or (os.cpu_count() or 1)
    plugin = load_plugin(env.own_plugin, device_id=device, threads=threads)
    daemon = LocalDaemon(DaemonCore(plugin))
    session = daemon.open_session(env.job_id, 0, 1)
    runtime = Runtime(env.job_id, 0, 1, 0, 1, daemon, session, hosts=(socket.gethostname(),))
    context._bind_daemon([plugin.name], plugin.name, plugin.device.device_id, 1)
    return runtime


def _simulated(level_rank_world: tuple[int, int, int]) -> Runtime:
    """Rank `rank` of a world that is not running: an in-process daemon that compiles and never runs
    (tessel.communication.simulation)."""
    from tessel import context
    from tessel.communication.simulation import SimulatedDaemon
    from tessel.daemon.core import DaemonCore
    from tessel.plugins import load_plugin

    _, rank, world = level_rank_world
    plugin = load_plugin(os.environ.get("TESSEL_PLUGIN", "cpu").split(",")[0] or "cpu", threads=os.cpu_count() or 1)
    daemon = SimulatedDaemon(DaemonCore(plugin), rank, world)
    session = daemon.open_session("simulation", 0, 1)
    context._bind_daemon([plugin.name], plugin.name, plugin.device.device_id, world)
    return Runtime("simulation", rank, world, rank, world, daemon, session, hosts=("simulated",) * world)


def _distributed(env: LaunchEnv) -> Runtime:
    from tessel.core import rpc

    if env.bootstrap is None:
        return _join(env, env.coordinator, rpc.cluster_token(), env.daemon_id, None)
    from tessel import context

    device = context._requested_device()
    if device is not None:
        env.bootstrap.device = device
    started = env.bootstrap.start(env.own_plugin)
    try:
        return _join(env, started.coordinator, started.token, started.daemon_id, started)
    except BaseException:
        started.stop()
        raise


def _join(env: LaunchEnv, address: str, token: str, daemon_id: str, started: Started | None) -> Runtime:
    from tessel.communication import supervision
    from tessel.communication.daemon_handle import RemoteDaemon
    from tessel.core.coordinator_client import COORDINATOR_LOST, CoordinatorClient
    from tessel.v1 import coordinator_pb2

    coordinator = CoordinatorClient(address, token)
    try:
        reply = coordinator.join_job(
            env.job_id,
            env.world_size,
            rank=env.rank,
            plugin=env.plugin,
            daemon_id=daemon_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            timeout_s=env.join_timeout_s,
        )
    except TesselError as exc:
        coordinator.close()
        if env.what:  # say which launcher's settings the error is about
            gone = "; the scheduler is gone: its job ended without this worker" if "unreachable" in str(exc) else ""
            try:
                named = type(exc)(f"{env.what}: {exc}{gone}")
            except TypeError:
                raise exc from None
            raise named from None
        raise
    if env.scheduler is None and env.what:
        # MindSpore's workers log this line; its docs tell users to grep for "rank id:" to map logs to ranks.
        node = os.environ.get("MS_NODE_ID") or str(os.getpid())
        log.warning("This node %s rank id: %d", node, reply.rank)
    daemon = RemoteDaemon(reply.daemon.daemon_address, token)
    session = daemon.open_session(
        env.job_id,
        reply.rank,
        reply.world_size,
        list(reply.members),
        reply.job_nonce,
        collectives=os.environ.get("TESSEL_COLLECTIVES", ""),
    )
    runtime = Runtime(
        env.job_id, reply.rank, reply.world_size, reply.local_rank, reply.local_size, daemon, session, coordinator
    )
    runtime.started = started
    runtime.hosts = hosts_of(reply.members, reply.world_size)
    _check_device_target(reply)

    def on_event(event) -> None:
        # A lost coordinator also ends the job: nobody would tell this rank that a peer died.
        supervision.on_event(runtime, event, COORDINATOR_LOST)

    member = coordinator_pb2.ClientRef(job_id=env.job_id, rank=reply.rank, pid=os.getpid())
    runtime.heartbeat = coordinator.heartbeat(member, on_event)
    supervision.install(runtime)  # failures and exit statuses reach the coordinator with their culprit
    return runtime


def hosts_of(members, world_size: int) -> tuple[str, ...]:
    """The host of each world rank, from the job's members (the coordinator's host_id: equal on one host); empty
    when the members do not name every rank once."""
    by_rank = {m.rank: m.host_id for m in members}
    if len(members) != world_size or sorted(by_rank) != list(range(world_size)):
        return ()
    return tuple(by_rank[r] for r in range(world_size))


def _check_device_target(reply) -> None:
    from tessel import context

    plugins = [m.plugin for m in reply.members]
    context._bind_daemon(plugins, reply.daemon.plugin, reply.daemon.device_id, reply.world_size)


def init() -> Runtime:
    global _runtime
    with _lock:
        if _runtime is None:
            from tessel.communication.simulation import settings

            simulated = settings()
            if simulated is not None:
                _runtime = _simulated(simulated)
                return _runtime
            from tessel.communication.supervision import exit_timeout_s

            exit_timeout_s()  # a malformed TESSEL_EXIT_TIMEOUT is an error now, not at the exit
            env = LaunchEnv.from_environ()
            if env.scheduler is not None:
                from tessel.communication.dynamic_cluster import serve_scheduler

                serve_scheduler(env.scheduler)  # serves the job, then ends this process
            _runtime = _embedded(env) if env.coordinator is None and env.bootstrap is None else _distributed(env)
            atexit.register(release, at_exit=True)
        return _runtime


def release(at_exit: bool = False) -> None:
    """Finish this rank cleanly: tell the coordinator, close the session, stop the heartbeat; then take down what
    this rank started for its job (its daemon, rank 0's coordinator) once every rank finished. `at_exit`: the
    interpreter is ending: closing the channels is bounded, and so is the interpreter's end after the program's own
    exit hooks (supervision)."""
    from tessel.communication import supervision

    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
    if runtime is None:
        return
    try:
        if runtime.coordinator is not None and runtime.failure is None:
            supervision.finish(runtime)  # or fails the job, if this rank exits with a non-zero status
        runtime.daemon.close_session(runtime.session_id)
    except TesselError:
        pass  # the job already failed or the daemon is gone: nothing left to release there
    finally:
        if at_exit:
            supervision.bound_exit()
        try:
            if runtime.heartbeat is not None:
                runtime.heartbeat.stop()
            runtime.daemon.close()
            if runtime.coordinator is not None:
                runtime.coordinator.close()
        finally:
            if at_exit:
                supervision.unbound_exit()
                supervision.released_at_exit()
        if runtime.started is not None:
            runtime.started.finish(runtime.job_id)  # waits for the job's other ranks
