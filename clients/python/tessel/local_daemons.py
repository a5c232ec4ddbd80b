"""Daemon processes started on this host for one job: by `tessel run`, and by the ranks of a job that found no
cluster running (dynamic networking workers, mpirun ranks, rank-table ranks; see `tessel.communication.bootstrap`).

    proc = spawn_daemon("127.0.0.1:7070", token, plugin="cpu", device=0, threads=2)
    daemon_id, address = read_started(proc, "daemon 0")
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from tessel.core.errors import TesselError

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the child is killed when its parent dies, even by SIGKILL (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn_daemon(
    coordinator: str,
    token: str,
    *,
    plugin: str,
    device: int,
    threads: int,
    host: str = "127.0.0.1",
    advertise_host: str = "",
    connect_timeout_s: float = 30.0,
    env: dict[str, str] | None = None,
    stderr=subprocess.PIPE,
) -> subprocess.Popen:
    """Start `tessel daemon` for `coordinator` in its own session; it dies with this process."""
    cmd = [
        sys.executable,
        "-m",
        "tessel.daemon",
        "--coordinator",
        coordinator,
        "--plugin",
        plugin,
        "--device",
        str(device),
        "--threads",
        str(max(1, threads)),
        "--host",
        host,
        "--connect-timeout",
        f"{max(1.0, connect_timeout_s):.1f}",
    ]
    if advertise_host:
        cmd += ["--advertise-host", advertise_host]
    full_env = dict(os.environ if env is None else env, TESSEL_TOKEN=token)
    return subprocess.Popen(
        cmd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,  # a Ctrl-C meant for the script reaches its daemon only through the script
        preexec_fn=die_with_parent,
    )


def read_started(proc: subprocess.Popen, what: str, timeout_s: float = 60.0) -> tuple[str, str]:
    """(daemon id, gRPC address) from the daemon's first line `tessel daemon <id> listening on <address>`, or a
    TesselError carrying why it did not start (its stderr when it exited)."""
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    line = result[0].decode(errors="replace") if result else ""
    if not line.startswith("tessel daemon"):
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
        raise TesselError(f"{what} did not start within {timeout_s:.0f} s: {line.strip()} {err.strip()}".rstrip())
    words = line.split()
    return words[2], words[-1]


def stop(procs: list[subprocess.Popen], grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL whatever is still running after `grace_s`; reaps them all."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@contextlib.contextmanager
def signals_stop(launch: Any) -> Iterator[None]:
    """While in the block, SIGINT (Ctrl-C) and SIGTERM stop `launch` (tessel run's Launch, msrun's Msrun): they set
    `launch.stopping` (a threading.Event), and raise KeyboardInterrupt at once only while
    `launch.signals_deferred` is false; once it is true, the launch's own wait loop ends on the flag at a point of
    its choosing. A KeyboardInterrupt raised wherever a signal lands could land inside Popen.poll right after it took
    the process's wait lock and before its `try`: the lock stayed held and stopping the processes then blocked for
    ever in Popen.wait. The previous handlers are put back on exit."""

    def on_signal(_signum, _frame):
        launch.stopping.set()
        if not launch.signals_deferred:
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
