"""The process-wide distributed runtime behind `tessel.communication`: who we are, which daemon we drive.

`init()` resolves the launch environment:
* `tessel run` sets TESSEL_COORDINATOR, TESSEL_JOB_ID, TESSEL_RANK, TESSEL_WORLD_SIZE (and pins TESSEL_DAEMON_ID);
* `mpirun` / PMI launchers set the rank and size (OMPI_COMM_WORLD_*, PMI_*, PMIX_*); the user sets
  TESSEL_COORDINATOR; the job id comes from TESSEL_JOB_ID or the launcher's namespace;
* nothing set: a world of 1 on a daemon hosted in this process (no coordinator, no sockets).
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tessel.core.errors import ConfigurationError, JobFailedError, TesselError

if TYPE_CHECKING:  # the handle module loads the daemon library, which a remote rank never needs
    from tessel.communication.daemon_handle import DaemonHandle

_RANK_VARS = ("TESSEL_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK_ID")
_SIZE_VARS = ("TESSEL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "RANK_SIZE")
_JOB_VARS = ("TESSEL_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")


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


@dataclass
class LaunchEnv:
    coordinator: str | None
    job_id: str
    rank: int
    world_size: int
    daemon_id: str
    plugin: str
    join_timeout_s: float

    @classmethod
    def from_environ(cls) -> LaunchEnv:
        rank, size = _env_int(_RANK_VARS), _env_int(_SIZE_VARS)
        coordinator = os.environ.get("TESSEL_COORDINATOR") or None
        job = _first_env(_JOB_VARS)
        if coordinator is None and (size or 1) > 1:
            raise ConfigurationError(
                f"this process is rank {rank} of {size} but TESSEL_COORDINATOR is not set; start the job with "
                "`tessel run -n N script.py`, or set TESSEL_COORDINATOR=host:port of a running `tessel coordinator`"
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
            plugin=os.environ.get("TESSEL_PLUGIN", "cpu"),
            join_timeout_s=float(os.environ.get("TESSEL_JOIN_TIMEOUT", "120")),
        )


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


def _embedded() -> Runtime:
    from tessel.communication.daemon_handle import LocalDaemon
    from tessel.daemon.core import DaemonCore
    from tessel.plugins import load_plugin

    env = LaunchEnv.from_environ()
    plugin = load_plugin(env.plugin, threads=int(os.environ.get("TESSEL_THREADS", "0")) or (os.cpu_count() or 1))
    daemon = LocalDaemon(DaemonCore(plugin))
    session = daemon.open_session(env.job_id, 0, 1)
    return Runtime(env.job_id, 0, 1, 0, 1, daemon, session)


def _distributed(env: LaunchEnv) -> Runtime:
    from tessel.communication import supervision
    from tessel.communication.daemon_handle import RemoteDaemon
    from tessel.core import rpc
    from tessel.core.coordinator_client import COORDINATOR_LOST, CoordinatorClient
    from tessel.v1 import coordinator_pb2

    token = rpc.cluster_token()
    coordinator = CoordinatorClient(env.coordinator, token)
    reply = coordinator.join_job(
        env.job_id,
        env.world_size,
        rank=env.rank,
        plugin=env.plugin,
        daemon_id=env.daemon_id,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        timeout_s=env.join_timeout_s,
    )
    daemon = RemoteDaemon(reply.daemon.daemon_address, token)
    session = daemon.open_session(env.job_id, reply.rank, reply.world_size, list(reply.members), reply.job_nonce)
    runtime = Runtime(
        env.job_id, reply.rank, reply.world_size, reply.local_rank, reply.local_size, daemon, session, coordinator
    )

    def on_event(event) -> None:
        # A lost coordinator also ends the job: nobody would tell this rank that a peer died.
        supervision.on_event(runtime, event, COORDINATOR_LOST)

    member = coordinator_pb2.ClientRef(job_id=env.job_id, rank=reply.rank, pid=os.getpid())
    runtime.heartbeat = coordinator.heartbeat(member, on_event)
    supervision.install(runtime)  # failures and exit statuses reach the coordinator with their culprit
    return runtime


def init() -> Runtime:
    global _runtime
    with _lock:
        if _runtime is None:
            env = LaunchEnv.from_environ()
            _runtime = _embedded() if env.coordinator is None else _distributed(env)
            atexit.register(release)
        return _runtime


def release() -> None:
    """Finish this rank cleanly: tell the coordinator, close the session, stop the heartbeat."""
    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
    if runtime is None:
        return
    try:
        if runtime.coordinator is not None and runtime.failure is None:
            from tessel.communication import supervision

            supervision.finish(runtime)  # or fails the job, if this rank exits with a non-zero status
        runtime.daemon.close_session(runtime.session_id)
    except TesselError:
        pass  # the job already failed or the daemon is gone: nothing left to release there
    finally:
        if runtime.heartbeat is not None:
            runtime.heartbeat.stop()
        runtime.daemon.close()
        if runtime.coordinator is not None:
            runtime.coordinator.close()
