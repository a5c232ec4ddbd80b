"""`tessel daemon`: one long-running process per device, registered with the coordinator.

    tessel daemon --coordinator 127.0.0.1:7070 --plugin cpu --device 0 --threads 2
    tessel daemon --coordinator 10.0.0.1:7070 --host 10.0.0.5      # a cluster: peers on other hosts dial 10.0.0.5

`--host` is where both the gRPC service and the data plane (collectives between daemons) listen, and the address
registered for clients and peers to dial; `--advertise-host` registers another one (behind NAT, or with
`--host 0.0.0.0`).

The first line on stdout is `tessel daemon <id> listening on <host:port>` (the launcher and tests read it).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time

from tessel.core import rpc
from tessel.core.errors import TesselError
from tessel.core.limits import Limits
from tessel.core.memory import limit_heaps, release_free_memory
from tessel.daemon import executor, service
from tessel.daemon.core import DaemonCore
from tessel.daemon.stall import REPORT_AFTER_S, CollectiveWatch

ORPHAN_CHECK_S = 2.0  # how often the daemon asks the coordinator which job its sessions should belong to

log = logging.getLogger("tessel.daemon")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tessel daemon", description="Serve one device to tessel jobs.")
    parser.add_argument("--coordinator", default=os.environ.get("TESSEL_COORDINATOR", "127.0.0.1:7070"))
    parser.add_argument("--plugin", default="cpu", help="hardware plugin (entry point in 'tessel.plugins')")
    parser.add_argument("--device", type=int, default=0, help="device index on this host")
    parser.add_argument("--threads", type=int, default=0, help="compute threads (0 = all cores of this host)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on, gRPC and data plane (default: loopback only)"
    )
    parser.add_argument(
        "--advertise-host",
        default="",
        help="address other hosts reach this daemon at (default: --host; required when --host is 0.0.0.0)",
    )
    parser.add_argument("--port", type=int, default=0, help="gRPC port (0 = any free port)")
    parser.add_argument(
        "--tls",
        choices=["auto", "on", "off"],
        default=None,
        help="TLS on its gRPC port and to the coordinator, with the cluster CA pinned (default $TESSEL_TLS, else "
        "auto: on for any address other than loopback)",
    )
    parser.add_argument("--max-request-mb", type=int, default=1024, help="largest accepted request")
    parser.add_argument("--connect-timeout", type=float, default=30.0, help="seconds to reach the coordinator")
    parser.add_argument(
        "--no-unix-socket", action="store_true", help="serve Execute over gRPC only (no Unix socket for local clients)"
    )
    return parser.parse_args(argv)


def _measure(plugin):
    """The device's measurement to register with (daemon/calibration.py); None when there is none or it failed
    (logged: the coordinator then keeps its default figures for this daemon)."""
    from tessel.daemon.calibration import measure_device

    try:
        return measure_device(plugin, reuse_factors=True)
    except Exception:  # a broken measurement must not keep the device from serving
        log.exception("measuring the %s device failed; registering without measurements", plugin.name)
        return None


def _host_transport(plugin, host: str, advertised: str):
    """What joins the plugin's groups to other hosts and plugins (daemon/hierarchy.py): its own host transport, else
    the cpu plugin's (shared memory and TCP), else None (groups beyond this plugin's devices then fail, saying so)."""
    from tessel.core.plugin import plugin_class

    if plugin.host_transport is not None:
        return plugin.host_transport
    try:
        cpu = plugin_class("cpu")
    except TesselError as missing:
        log.warning("the %s plugin has no host transport and the cpu plugin is not installed: %s", plugin.name, missing)
        return None
    return cpu(device_id=0, threads=1, host=host, advertise_host=advertised).host_transport


def _register(args, core: DaemonCore, address: str, coordinator, forever: bool = False, stop=None, measured=None):
    """Register (retrying until --connect-timeout, or for ever); returns the RegisterDaemonReply."""
    from tessel.v1 import coordinator_pb2

    device = core.plugin.device
    info = coordinator_pb2.DaemonInfo(
        address=address,
        data_address=core.data_address,
        host_id=core.host_id,
        hostname=socket.gethostname(),
        plugin=core.plugin.name,
        device_kind=device.kind,
        device_id=device.device_id,
        cores=device.cores,
        memory_bytes=device.memory_bytes,
        speed=device.speed,
        pid=os.getpid(),
    )
    if measured is not None:
        info.measurement.CopyFrom(measured)
    deadline = time.monotonic() + args.connect_timeout
    while True:
        try:
            return coordinator.register_daemon(info)
        except TesselError as exc:
            if stop is not None and stop.is_set():
                raise
            if not forever and time.monotonic() > deadline:
                raise TesselError(
                    f"cannot register with the coordinator at {args.coordinator} within {args.connect_timeout} s: "
                    f"{exc}. Start it with `tessel coordinator` or pass --coordinator HOST:PORT."
                ) from None
            time.sleep(0.2)


def _heartbeat_deadlines(reply) -> tuple[float, float]:
    """(beat interval, silence after which the coordinator counts as lost), as registration told them."""
    interval_s = (reply.heartbeat_interval_ms or 500) / 1000
    return interval_s, max(3.0, 6 * interval_s, (reply.heartbeat_timeout_ms or 3000) / 1000)


def _deadlines(core: DaemonCore, interval_s: float, timeout_s: float) -> str:
    """Every deadline this daemon keeps, in one line (printed once at start-up)."""
    plugin = core.plugin.collective.deadlines()
    grace = core.coordinator.grace_s if core.coordinator is not None else 0.0
    return (
        f"tessel daemon {core.daemon_id} deadlines: heartbeat every {interval_s:g} s, coordinator lost after "
        f"{timeout_s + grace:g} s of silence or {grace:g} s unreachable (TESSEL_COORDINATOR_GRACE); collective "
        f"timeout {core.collective_timeout_s:g} s (TESSEL_COLLECTIVE_TIMEOUT); stall report after "
        f"{REPORT_AFTER_S:g} s in a collective; group rendezvous 60 s; sessions whose job is not running here "
        f"closed after {core.limits.orphan_session_s:g} s" + (f"; {plugin}" if plugin else "")
    )


def _housekeeping(core: DaemonCore, stop: threading.Event, trim_every_s: float = 10.0) -> None:
    """Close orphaned sessions; while no session is open, give freed memory back to the OS now and then."""
    trimmed = 0.0
    while not stop.wait(ORPHAN_CHECK_S):
        try:
            core.close_orphans()
            if not core.sessions() and time.monotonic() - trimmed > trim_every_s:
                release_free_memory()  # never during a job: it would pause the allocator under a training step
                trimmed = time.monotonic()
        except Exception:  # must outlive any bug: it is what frees sessions nobody closes
            log.exception("daemon housekeeping failed")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tls is not None:
        os.environ["TESSEL_TLS"] = args.tls
    limit_heaps(8)  # many RPC threads, mostly waiting: few heaps keep freed memory in few places
    logging.basicConfig(level=os.environ.get("TESSEL_LOG", "WARNING"), format="%(asctime)s %(name)s %(message)s")
    from tessel.core.coordinator_client import COORDINATOR_LOST, CoordinatorClient
    from tessel.core.plugin import load_plugin

    threads = args.threads or (os.cpu_count() or 1)
    advertised = args.advertise_host or args.host
    try:
        if advertised in ("0.0.0.0", "::", ""):
            raise TesselError(
                f"--host {args.host} listens on every interface: also pass --advertise-host ADDR, the address "
                "clients and the daemons of other hosts reach this one at"
            )
        token = rpc.cluster_token()
        plugin = load_plugin(
            args.plugin, device_id=args.device, threads=threads, host=args.host, advertise_host=advertised
        )
        measured = _measure(plugin)
        coordinator = CoordinatorClient(args.coordinator, token)
        host_transport = _host_transport(plugin, args.host, advertised)
        data_address = getattr(host_transport or plugin.collective, "data_address", "")
        watch = CollectiveWatch(lambda report: coordinator.report_stall(report, timeout_s=2.0))
        limits = Limits.from_env()
        core = DaemonCore(
            plugin, coordinator, data_address=data_address, host_transport=host_transport, limits=limits, watch=watch
        )
        max_bytes = args.max_request_mb << 20
        local = None if args.no_unix_socket else service.serve_local(core, token, max_bytes)
        handlers = [service.handler(core, token, max_bytes, local.path if local else "")]
        server, port = rpc.start_server(handlers, args.host, args.port, max_request_bytes=max_bytes)
        address = f"[{advertised}]:{port}" if ":" in advertised else f"{advertised}:{port}"
        registration = _register(args, core, address, coordinator, measured=measured)
        core.daemon_id = registration.daemon_id
    except TesselError as exc:
        print(f"tessel daemon: {exc}", file=sys.stderr)
        return 2
    print(f"tessel daemon {core.daemon_id} listening on {address}", flush=True)

    stop = threading.Event()
    lost = threading.Event()
    watch.start()
    threading.Thread(target=_housekeeping, args=(core, stop), name="tessel-housekeeping", daemon=True).start()

    def on_event(event) -> None:
        if event.state == COORDINATOR_LOST:
            # Its jobs cannot be supervised any more: fail them here, then register again when it is back.
            for session in core.sessions():
                core.on_job_event(session.job_id, "failed", event.cause)
            lost.set()
        else:
            core.on_job_event(event.job_id, event.state, event.cause, event.culprit_rank)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: (stop.set(), lost.set()))
    interval_s, timeout_s = _heartbeat_deadlines(registration)
    print(_deadlines(core, interval_s, timeout_s), file=sys.stderr, flush=True)
    if executor.TEST_SLOWDOWN_S > 0:
        log.warning(
            "TESSEL_TEST_SLOWDOWN_S (a test knob): every segment sleeps %g s after it runs", executor.TEST_SLOWDOWN_S
        )
    beat = coordinator.heartbeat(core.daemon_id, on_event, interval_s, timeout_s, core.heartbeat)
    while not stop.is_set():
        lost.wait()
        if stop.is_set():
            break
        lost.clear()
        beat.stop()
        try:
            registration = _register(args, core, address, coordinator, forever=True, stop=stop, measured=measured)
            core.daemon_id = registration.daemon_id
        except TesselError:
            break
        log.warning("re-registered with the coordinator at %s as %s", args.coordinator, core.daemon_id)
        beat = coordinator.heartbeat(core.daemon_id, on_event, interval_s, timeout_s, core.heartbeat)
    beat.stop()
    watch.stop()
    server.stop(grace=1.0).wait(2.0)
    if local is not None:
        local.close()
    core.close()
    coordinator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
