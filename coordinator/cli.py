"""`tessel coordinator` / `python -m tessel.coordinator`: run a coordinator until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Sequence

from tessel.coordinator.pace import PaceSettings
from tessel.coordinator.service import RECOVERY_GRACE_S, STALL_TIMEOUT_S, STALL_WARNING_S, serve
from tessel.coordinator.store import open_store
from tessel.core import errors, rpc
from tessel.core.coordinator_client import DEFAULT_PORT
from tessel.core.memory import limit_heaps


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessel coordinator",
        description="Run the cluster coordinator. Prints its address (host:port) as the first line of stdout.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any)")
    parser.add_argument("--heartbeat-interval-ms", type=int, default=500, help="how often members beat")
    parser.add_argument(
        "--heartbeat-timeout-ms", type=int, default=3000, help="a member silent this long is dead (default 3000)"
    )
    parser.add_argument(
        "--stall-warning-s",
        type=float,
        default=STALL_WARNING_S,
        help="announce a collective ranks have waited in this long, naming the ranks missing (default 2)",
    )
    parser.add_argument(
        "--stall-timeout-s",
        type=float,
        default=STALL_TIMEOUT_S,
        help="fail a job whose ranks waited this long for a rank that never came, blaming it (0 = never; 300)",
    )
    parser.add_argument(
        "--straggler-ratio",
        type=float,
        default=None,
        help="name a rank whose own work per step is this many times the median of the other ranks' "
        f"($TESSEL_STRAGGLER_RATIO, default {PaceSettings.ratio:g})",
    )
    parser.add_argument(
        "--straggler-windows",
        type=int,
        default=None,
        help=f"... for this many windows running ($TESSEL_STRAGGLER_WINDOWS, default {PaceSettings.windows})",
    )
    parser.add_argument(
        "--straggler-window-s",
        type=float,
        default=None,
        help="the shortest window over which ranks' work counters are compared, in seconds "
        f"($TESSEL_STRAGGLER_WINDOW_S, default {PaceSettings.window_s:g})",
    )
    parser.add_argument(
        "--store",
        default="auto",
        help="where the cluster's state survives a restart: sqlite:PATH, etcd://HOST:PORT[/PREFIX] or memory "
        "(default auto: sqlite:$TESSEL_HOME/coordinator-PORT.db, memory with --port 0, which cannot restart in place)",
    )
    parser.add_argument(
        "--recovery-grace-s",
        type=float,
        default=RECOVERY_GRACE_S,
        help="after a restart, how long restored daemons and ranks have to heartbeat again (default 10)",
    )
    parser.add_argument(
        "--tls",
        choices=["auto", "on", "off"],
        default=None,
        help="TLS on the gRPC port with the cluster CA (default $TESSEL_TLS, else auto: on unless --host is loopback)",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def default_store(port: int) -> str:
    """sqlite:$TESSEL_HOME/coordinator-PORT.db: one state per port, since a restarted coordinator must come back on
    its port for its daemons to find it; `memory` for port 0 (any free port)."""
    if port == 0:
        return "memory"
    return f"sqlite:{rpc.token_path().parent / f'coordinator-{port}.db'}"


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted; exit 0 on SIGINT/SIGTERM, 2 on a configuration error (e.g. port in use).

    The token is $TESSEL_TOKEN, else ~/.tessel/token (created if missing). Limits on what one request may ask
    for are tessel.core.limits' (TESSEL_LIMIT_* variables).
    """
    args = _parser().parse_args(argv)
    if args.tls is not None:
        os.environ["TESSEL_TLS"] = args.tls  # its own clients (none today) and any child follow the same setting
    limit_heaps()  # many RPC threads, mostly waiting: few heaps keep the memory in one place
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        pace = PaceSettings.from_env()
        chosen = {"ratio": args.straggler_ratio, "windows": args.straggler_windows, "window_s": args.straggler_window_s}
        pace = dataclasses.replace(pace, **{k: v for k, v in chosen.items() if v is not None})
        store = open_store(default_store(args.port) if args.store == "auto" else args.store)
        server = serve(
            args.host,
            args.port,
            None,
            args.heartbeat_interval_ms,
            args.heartbeat_timeout_ms,
            stall_warning_s=args.stall_warning_s,
            stall_timeout_s=args.stall_timeout_s,
            store=store,
            recovery_grace_s=args.recovery_grace_s,
            pace=pace,
        )
    except errors.ConfigurationError as exc:
        print(f"tessel coordinator: {exc}", file=sys.stderr)
        return 2
    print(server.address, flush=True)
    print(f"tessel coordinator deadlines: {server.deadlines}", file=sys.stderr, flush=True)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: server.stop())
    while not server.wait(1.0):  # a timed wait keeps the main thread responsive to signals
        pass
    return 0
