"""Jobs started without a running cluster: which process serves the coordinator, which starts each daemon, and
who takes them down at the end.

| launch                                            | coordinator                       | daemons          |
|---------------------------------------------------|-----------------------------------|------------------|
| dynamic networking (MS_ROLE), `tessel msrun`      | the MS_SCHED process, in init()   | each MS_WORKER   |
| `mpirun -n N python x.py`, no TESSEL_COORDINATOR  | rank 0, in init()                 | each rank        |
| RANK_TABLE_FILE + RANK_ID, no TESSEL_COORDINATOR  | rank 0 (rank_id 0 of the table)   | each rank        |

A rank's daemon runs the rank's device (`DEVICE_ID`, else its local rank) with its share of the host's cores, and
is pinned to it. At the end every rank waits until the whole job finished (or failed) before stopping its daemon
— a peer may still be reading from it — and rank 0 stops the coordinator last.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass

from tessel.core import rpc
from tessel.core.errors import ConfigurationError, JobFailedError, RendezvousTimeoutError, TesselError

_LOOPBACK = "127.0.0.1"
_RETRY_S = 0.5  # how often a worker retries a coordinator that is not up yet (MindSpore's workers: 0.5 s)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def is_local_address(host: str) -> bool:
    """True if `host` is an address of this machine (it can be bound here)."""
    try:
        address = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def address_toward(host: str) -> str:
    """This host's address on the route to `host` (loopback for a loopback peer); $TESSEL_HOST, or MindSpore's
    $MS_WORKER_IP, overrides."""
    chosen = os.environ.get("TESSEL_HOST") or os.environ.get("MS_WORKER_IP")
    if chosen:
        return chosen
    if is_loopback(host):
        return _LOOPBACK
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(host), 9))  # UDP: no packet is sent, the route is looked up
            return probe.getsockname()[0]
    except OSError as exc:
        why = f"no route from this host to {host} ({exc}); set TESSEL_HOST to this host's address"
        raise ConfigurationError(why) from None


def daemon_threads(local_workers: int) -> int:
    """Compute threads for this rank's daemon: $TESSEL_THREADS, else the host's cores shared by its workers."""
    explicit = os.environ.get("TESSEL_THREADS")
    if explicit:
        return max(1, int(explicit))
    return max(1, (len(os.sched_getaffinity(0)) or 1) // max(1, local_workers))


def wait_reachable(address: str, token: str, deadline: float, what: str) -> None:
    """Block until the coordinator at `address` answers (retrying every 0.5 s), or raise before the deadline."""
    from tessel.core.coordinator_client import CoordinatorClient

    with CoordinatorClient(address, token, timeout_s=5.0) as client:
        while True:
            try:
                client.cluster_status()
                return
            except ConfigurationError as exc:  # it answered, but refused this token
                raise ConfigurationError(
                    f"{what}: the coordinator at {address} rejected this process ({exc}); every process of the job "
                    "needs the same cluster token: set TESSEL_TOKEN to one value for all of them (on one host the "
                    "token file ~/.tessel/token is shared already)"
                ) from None
            except TesselError as exc:
                if time.monotonic() + _RETRY_S > deadline:
                    raise RendezvousTimeoutError(f"{what}: no coordinator answers at {address}: {exc}") from None
            time.sleep(_RETRY_S)


@dataclass
class Bootstrap:
    """What this rank must start before joining its job, and where it finds the rest."""

    what: str  # "mpirun rank 3 of 8", for messages
    deadline: float  # time.monotonic() by which the job must be formed
    coordinator: str | None = None  # a known address (dynamic networking, a rank table across hosts)
    serve_at: tuple[str, int] | None = None  # this rank serves the coordinator here (port 0: any free port)
    exchange: object | None = None  # discovery.FileExchange / PmixExchange: how rank 0's address travels
    own_daemon: bool = True
    device: int = 0
    threads: int = 1
    token: str | None = None  # None: TESSEL_TOKEN, else the token file (created if missing)

    def start(self, plugin: str) -> Started:
        started = Started(self)
        try:
            started.run(plugin)
        except BaseException:
            started.stop()
            raise
        return started


class Started:
    """The coordinator and daemon a `Bootstrap` started for this rank; `finish()` takes them down.

    Rank 0's coordinator is a child process, not threads of the script: the script's interpreter stops taking new
    work for thread pools once it begins to exit, and rank 0 must keep serving its peers until they finished."""

    def __init__(self, plan: Bootstrap):
        self.plan = plan
        self.coordinator = plan.coordinator or ""
        self.token = plan.token or ""
        self.daemon_id = ""
        self.server = None  # the coordinator process this rank serves
        self.daemon = None

    def run(self, plugin: str) -> None:
        plan = self.plan
        if not self.token and plan.exchange is None:
            self.token = rpc.cluster_token(create=True)
        if plan.serve_at is not None:
            self._serve(*plan.serve_at)
        elif plan.exchange is not None:
            found = _lookup(plan.exchange, plan.deadline, plan.what)
            self.coordinator, self.token = found["address"], found["token"]
        # Fork the daemon before this process opens any gRPC channel (gRPC's threads and fork do not mix).
        if plan.own_daemon:
            self._spawn_daemon(plugin)
        wait_reachable(self.coordinator, self.token, plan.deadline, plan.what)
        if self.daemon is not None:
            self._await_daemon(plugin)

    def _serve(self, host: str, port: int) -> None:
        import subprocess
        import sys

        from tessel import local_daemons

        plan = self.plan
        if not self.token:
            self.token = os.environ.get("TESSEL_TOKEN") or secrets.token_hex(16)
        cmd = [sys.executable, "-m", "tessel.coordinator", "--host", host, "--port", str(port), "--log-level", "ERROR"]
        self.server = subprocess.Popen(
            cmd,
            env=dict(os.environ, TESSEL_TOKEN=self.token),
            stdout=subprocess.PIPE,
            stderr=None,  # a coordinator that cannot start says why in this rank's output
            start_new_session=True,
            preexec_fn=local_daemons.die_with_parent,
        )
        line = _first_line(self.server, max(5.0, plan.deadline - time.monotonic()))
        if not line or ":" not in line:
            self.server.kill()  # alive but silent (or saying something else): it must not hold this rank's init
            self.server.wait()
            raise ConfigurationError(f"{plan.what}: the job's coordinator did not start on {host}:{port}")
        self.coordinator = line.strip()
        if plan.exchange is not None:
            plan.exchange.publish({"address": self.coordinator, "token": self.token})
            _lookup(plan.exchange, plan.deadline, plan.what)  # PMIx: rank 0 takes part in the fence too

    def _spawn_daemon(self, plugin: str) -> None:
        from tessel import local_daemons

        host = self.coordinator.rsplit(":", 1)[0].strip("[]")
        self.daemon = local_daemons.spawn_daemon(
            self.coordinator,
            self.token,
            plugin=plugin,
            device=self.plan.device,
            threads=self.plan.threads,
            host=address_toward(host),
            connect_timeout_s=max(1.0, self.plan.deadline - time.monotonic()),
            stderr=None,  # its errors land in this rank's output
        )

    def _await_daemon(self, plugin: str) -> None:
        from tessel import local_daemons

        what = f"{self.plan.what}: its daemon (plugin {plugin!r}, device {self.plan.device})"
        timeout = max(60.0, self.plan.deadline - time.monotonic())
        self.daemon_id = local_daemons.read_started(self.daemon, what, timeout)[0]
        # The daemon prints nothing more on stdout, but a full pipe would block it: drain it.
        threading.Thread(target=self.daemon.stdout.read, name="tessel-daemon-stdout", daemon=True).start()

    def finish(self, job_id: str) -> None:
        """At the end of this rank: wait for the job to end everywhere, then stop what this rank started."""
        if self.server is not None or self.daemon is not None:
            _wait_job_end(self.coordinator, self.token, job_id)
        self.stop(wait_for_daemons=True)

    def stop(self, wait_for_daemons: bool = False) -> None:
        from tessel import local_daemons

        if self.daemon is not None:
            local_daemons.stop([self.daemon])
            self.daemon = None
        if self.server is not None:
            if wait_for_daemons:  # the peers' daemons stop once they saw the job end; then nobody needs it
                _wait_daemons_gone(self.coordinator, self.token)
            local_daemons.stop([self.server])
            self.server = None
        if self.plan.exchange is not None:
            self.plan.exchange.remove()


def _first_line(proc, timeout_s: float) -> str:
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return lines[0].decode(errors="replace") if lines else ""


def _wait_daemons_gone(address: str, token: str, timeout_s: float = 10.0) -> None:
    from tessel.core.coordinator_client import CoordinatorClient

    deadline = time.monotonic() + timeout_s
    with CoordinatorClient(address, token, timeout_s=5.0) as client:
        while time.monotonic() < deadline:
            try:
                if all(d.state == "dead" for d in client.cluster_status().daemons):
                    return
            except TesselError:
                return
            time.sleep(0.1)


def _lookup(exchange, deadline: float, what: str) -> dict:
    """exchange.lookup with the deadline enforced even where the exchange itself blocks (a PMIx fence)."""
    result: list = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(exchange.lookup(deadline, what))
        except BaseException as exc:  # delivered to the caller
            errors.append(exc)

    thread = threading.Thread(target=run, name="tessel-discovery", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
    if errors:
        raise errors[0]
    if not result:
        raise RendezvousTimeoutError(
            f"{what}: the other ranks did not all reach init() in time to exchange the coordinator's address "
            "(a rank is slow, failed, or never calls init())"
        )
    return result[0]


def _wait_job_end(address: str, token: str, job_id: str) -> None:
    """Until the job finished or failed at the coordinator (or the coordinator is gone)."""
    from tessel.core.coordinator_client import CoordinatorClient

    with CoordinatorClient(address, token, timeout_s=5.0) as client:
        while True:
            try:
                if client.get_job(job_id).state in ("finished", "failed"):
                    return
            except (KeyError, JobFailedError, TesselError):
                return  # no such job (it never formed) or the coordinator is gone: nothing left to wait for
            time.sleep(0.1)


# ---------------------------------------------------------------------------------------------------- launchers


def _hnp_host() -> str:
    """The host mpirun runs on, from OpenMPI's HNP URI ("<jobid>.0;tcp://10.0.0.1,10.0.1.1:4567;...")."""
    uri = os.environ.get("OMPI_MCA_orte_hnp_uri", "")  # noqa: SIM112 (OpenMPI spells it so)
    for part in uri.split(";"):
        if part.startswith("tcp://"):
            return part[len("tcp://") :].rsplit(":", 1)[0].split(",")[0]
    return _LOOPBACK


def mpirun(rank: int, size: int, job_id: str, deadline: float) -> Bootstrap:
    """OpenMPI's `mpirun -n N python script.py` with no cluster: rank 0 serves the coordinator; the address travels
    through a file on one host (OpenMPI's session directory) and through PMIx across hosts
    (TESSEL_RENDEZVOUS=file|pmix and TESSEL_RENDEZVOUS_DIR override)."""
    from tessel.communication import discovery

    local_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    local_size = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", str(size)))
    one_host = local_size >= size
    how = os.environ.get("TESSEL_RENDEZVOUS") or (
        "file" if one_host or os.environ.get("TESSEL_RENDEZVOUS_DIR") else "pmix"
    )
    if how == "pmix":
        exchange = discovery.PmixExchange()
    elif how == "file":
        session = os.environ.get("OMPI_MCA_orte_jobfam_session_dir", "")  # noqa: SIM112
        directory = None if os.environ.get("TESSEL_RENDEZVOUS_DIR") or not os.path.isdir(session) else session
        exchange = discovery.FileExchange(f"mpirun-{job_id}", directory, same_host=one_host)
    else:
        raise ConfigurationError(f"TESSEL_RENDEZVOUS={how!r}: use 'file' or 'pmix'")
    serve_host = _LOOPBACK if one_host else address_toward(_hnp_host())
    device = os.environ.get("DEVICE_ID", "")
    return Bootstrap(
        what=f"mpirun rank {rank} of {size}",
        deadline=deadline,
        serve_at=(serve_host, 0) if rank == 0 else None,
        exchange=exchange,
        device=int(device) if device.isdigit() else local_rank,
        threads=daemon_threads(local_size),
    )


def rank_table(deadline: float) -> tuple[str, int, int, Bootstrap]:
    """RANK_TABLE_FILE + RANK_ID (+ RANK_SIZE, DEVICE_ID): (job id, rank, world size, bootstrap). The rank with
    rank_id 0 serves the coordinator: on one server the others find it through a file, across servers at
    <its server's host>:TESSEL_COORDINATOR_PORT (default 8118, msrun's default port)."""
    from tessel.communication import discovery
    from tessel.communication import rank_table as tables

    path = os.environ["RANK_TABLE_FILE"]
    table = tables.load(path)
    rank_id = os.environ.get("RANK_ID", "")
    if not rank_id.isdigit():
        raise ConfigurationError(
            f"RANK_TABLE_FILE={path} is set but RANK_ID={rank_id!r} is not: set RANK_ID to this process's rank_id "
            "in the table (and DEVICE_ID to its device_id)"
        )
    rank = int(rank_id)
    size_text = os.environ.get("RANK_SIZE", "")
    if size_text and size_text != str(table.size):
        raise ConfigurationError(f"RANK_SIZE={size_text} but the rank table {path} lists {table.size} devices")
    server, device = table.place(rank)
    device_env = os.environ.get("DEVICE_ID", "")
    if device_env and device_env != str(device.device_id):
        raise ConfigurationError(
            f"DEVICE_ID={device_env} but the rank table {path} puts rank_id {rank} on device_id {device.device_id} "
            f"of server {server.server_id!r}"
        )
    job_id = os.environ.get("TESSEL_JOB_ID") or f"rank-table-{table.digest}"
    what = f"rank table {path}, RANK_ID={rank}"
    serve_at = None
    if len(table.servers) == 1:
        exchange = discovery.FileExchange(job_id)
        coordinator = None
        if rank == 0:
            serve_at = (_LOOPBACK, 0)
    else:
        exchange = None
        first, _ = table.place(0)
        port = int(os.environ.get("TESSEL_COORDINATOR_PORT", "8118"))
        coordinator = f"{first.host}:{port}"
        if rank == 0:
            if not is_local_address(first.host):
                raise ConfigurationError(
                    f"{what}: rank_id 0 is on server {first.server_id!r} (host {first.host}), which is not an "
                    "address of this machine; run each rank on the server the table names"
                )
            serve_at = (socket.gethostbyname(first.host), port)
    plan = Bootstrap(
        what=what,
        deadline=deadline,
        coordinator=coordinator,
        serve_at=serve_at,
        exchange=exchange,
        device=device.device_id,
        threads=daemon_threads(len(server.devices)),
    )
    return job_id, rank, table.size, plan
