"""MindSpore's dynamic networking: the environment variables MS_ROLE, MS_SCHED_HOST, MS_SCHED_PORT, MS_WORKER_NUM,
MS_NODE_ID (MindSpore's `dynamic_cluster.md`) make one job of separately started processes. `tessel msrun` sets
them, as msrun does.

* MS_ROLE=MS_SCHED: the scheduler. Its `init()` serves the job's coordinator on MS_SCHED_HOST:MS_SCHED_PORT until
  every worker finished, then ends the process (exit status 0, 1 if the job failed): the rest of the script never
  runs, as in MindSpore, whose scheduler leaves `init()` through `exit(0)` once the cluster finalized.
* MS_ROLE=MS_WORKER: a rank. MS_NODE_ID, if an integer, is its rank; otherwise ranks go in order of arrival.
  It starts its own daemon (TESSEL_DAEMONS=attach: it uses the daemons registered at the scheduler's address
  instead, e.g. a long-running `tessel coordinator` there) and joins the job.

The job must form within MS_TOPO_TIMEOUT seconds (msrun --cluster_time_out; default 30 min as MindSpore's):
missing workers fail every waiting process with the ranks that never came; a worker beyond MS_WORKER_NUM fails.
Workers retry a scheduler that is not up yet every 0.5 s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass

from tessel.core import rpc
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.core.limits import Limits

SCHEDULER, WORKER, PSERVER = "MS_SCHED", "MS_WORKER", "MS_PSERVER"
DEFAULT_TOPO_TIMEOUT_S = 1800.0  # MindSpore's MS_TOPO_TIMEOUT default: 30 minutes
_FIX = "start them, or lower MS_WORKER_NUM"
log = logging.getLogger("tessel")


def _int_env(name: str, low: int, high: int | None = None) -> int:
    value = os.environ.get(name, "")
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < low or (high is not None and number > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ConfigurationError(f"dynamic networking: {name}={value!r} must be an integer {bound} (MS_ROLE is set)")
    return number


def topo_timeout_s() -> float:
    """MS_TOPO_TIMEOUT (MindSpore), else MS_CLUSTER_TIMEOUT (older msrun), else TESSEL_JOIN_TIMEOUT, else 30 min."""
    for name in ("MS_TOPO_TIMEOUT", "MS_CLUSTER_TIMEOUT", "TESSEL_JOIN_TIMEOUT"):
        value = os.environ.get(name)
        if value:
            try:
                seconds = float(value)
            except ValueError:
                raise ConfigurationError(f"{name}={value!r} must be a number of seconds") from None
            # MindSpore: a negative value waits for ever; here as long as any wait may (Limits.max_wait_s, 7 days)
            return Limits().max_wait_s if seconds < 0 else seconds
    return DEFAULT_TOPO_TIMEOUT_S


@dataclass(frozen=True)
class DynamicCluster:
    role: str
    sched_host: str
    sched_port: int
    worker_num: int
    node_id: str  # MS_NODE_ID as given ("" = none)
    timeout_s: float

    @classmethod
    def from_environ(cls) -> DynamicCluster | None:
        """The dynamic networking settings of this process, or None when MS_ROLE is unset."""
        role = os.environ.get("MS_ROLE")
        if not role:
            return None
        if role == PSERVER:
            raise NotSupportedYetError(
                "not supported yet: MS_ROLE=MS_PSERVER, tessel has no parameter-server mode; start the job's "
                "processes as MS_SCHED and MS_WORKER"
            )
        if role not in (SCHEDULER, WORKER):
            raise ConfigurationError(f"MS_ROLE={role!r} is not a role: use MS_SCHED (one process) or MS_WORKER")
        if os.environ.get("MS_ENABLE_RECOVERY", "0") not in ("", "0"):
            raise NotSupportedYetError(
                "not supported yet: MS_ENABLE_RECOVERY=1, a process that dies fails the job on every rank within "
                "seconds; tessel does not yet hold the job open for it to rejoin and roll the others back to the last "
                "checkpoint. Resume instead: restart the job and load the last checkpoint "
                "(Model.train(initial_epoch=...) continues exactly)"
            )
        host = os.environ.get("MS_SCHED_HOST", "")
        if not host:
            raise ConfigurationError(f"dynamic networking: MS_ROLE={role} but MS_SCHED_HOST is not set")
        return cls(
            role=role,
            sched_host=host,
            sched_port=_int_env("MS_SCHED_PORT", 1, 65535),
            worker_num=_int_env("MS_WORKER_NUM", 1),
            node_id=os.environ.get("MS_NODE_ID", ""),
            timeout_s=topo_timeout_s(),
        )

    @property
    def address(self) -> str:
        return f"{self.sched_host}:{self.sched_port}"

    @property
    def job_id(self) -> str:
        # Every process of the job derives the same id from the scheduler's address.
        return os.environ.get("TESSEL_JOB_ID") or f"ms-{self.sched_host}-{self.sched_port}"

    def rank(self) -> int:
        """MS_NODE_ID when it is an integer (it must then be a rank of MS_WORKER_NUM), else -1: next to arrive."""
        if not self.node_id.lstrip("-").isdigit():
            return -1
        rank = int(self.node_id)
        if not 0 <= rank < self.worker_num:
            raise ConfigurationError(
                f"dynamic networking: MS_NODE_ID={self.node_id} is not a rank of MS_WORKER_NUM={self.worker_num} "
                f"workers (0..{self.worker_num - 1}); give each worker its own id in that range, or none"
            )
        return rank

    def describe(self) -> str:
        node = f"MS_NODE_ID={self.node_id}, " if self.node_id else ""
        return f"dynamic networking worker ({node}MS_WORKER_NUM={self.worker_num}, scheduler {self.address})"

    def worker_bootstrap(self):
        from tessel.communication.bootstrap import Bootstrap, daemon_threads

        local = os.environ.get("MS_LOCAL_WORKER")
        local_workers = int(local) if local and local.isdigit() and int(local) > 0 else self.worker_num
        device = os.environ.get("DEVICE_ID", "")
        if not device.isdigit():
            rank = self.rank()
            device = str(rank % local_workers if rank >= 0 else 0)
        return Bootstrap(
            what=self.describe(),
            deadline=time.monotonic() + self.timeout_s,
            coordinator=self.address,
            own_daemon=os.environ.get("TESSEL_DAEMONS", "own") != "attach",
            device=int(device),
            threads=daemon_threads(local_workers),
            token=os.environ.get("TESSEL_TOKEN") or rpc.cluster_token(create=True),
        )


def serve_scheduler(cluster: DynamicCluster):
    """The MS_SCHED process's init(): serve the job until it ends, then end the process (never returns)."""
    code = _schedule(cluster)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)  # as MindSpore's scheduler: the script after init() does not run


def _say(message: str) -> None:
    print(f"tessel scheduler: {message}", flush=True)


def _schedule(cluster: DynamicCluster) -> int:
    from tessel.coordinator import serve

    token = os.environ.get("TESSEL_TOKEN") or rpc.cluster_token(create=True)
    try:
        server = serve(host=cluster.sched_host, port=cluster.sched_port, token=token)
    except ConfigurationError as exc:
        _say(
            f"cannot serve the dynamic cluster at {cluster.address}: {exc} (MS_SCHED_HOST must be an address of "
            "this machine, MS_SCHED_PORT a free port; is another scheduler running there?)"
        )
        return 1
    job_id, n = cluster.job_id, cluster.worker_num
    # The scheduler says how the job went itself; daemons stopping at its end are no news for its log.
    logging.getLogger("tessel.coordinator").setLevel(logging.ERROR)
    try:
        server.state.expect_job(job_id, n, cluster.timeout_s, how_to_fix=_FIX, once=True)
        _say(f"serving the dynamic cluster at {server.address}: job {job_id!r} of MS_WORKER_NUM={n} workers")
        while True:
            try:
                info = server.state.job_info(job_id)
            except KeyError:  # every worker withdrew before the job started: wait for others
                server.state.expect_job(job_id, n, cluster.timeout_s, how_to_fix=_FIX, once=True)
                continue
            if info.state in ("finished", "failed"):
                _say(f"all {n} workers finished" if info.state == "finished" else f"the job failed: {info.cause}")
                return 0 if info.state == "finished" else 1
            time.sleep(0.1)
    finally:
        time.sleep(0.5)  # let the last workers read the job's end before the coordinator goes away
        server.stop()
