"""`tessel run` stopped by Ctrl-C or SIGTERM while it waits for its ranks: the wait ends at a point of the launcher's
own choosing, so the shutdown that follows always completes.

A KeyboardInterrupt raised wherever the signal lands can land inside `Popen.poll` right after it took the process's
wait lock and before its `try`, leaving the lock held: the shutdown's `Popen.wait` then blocked for ever (seen once
in CI: `tessel run` did not exit within 30 s of SIGINT). The test makes the signal arrive exactly there.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading

import pytest

from tessel import launcher, local_daemons


class _SignalOnAcquire:
    """A lock that delivers `signum` to this process the first time it is taken without waiting (Popen.poll's way)."""

    def __init__(self, signum: int):
        self.lock, self.signum, self.fired = threading.Lock(), signum, False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self.lock.acquire(blocking, timeout)
        if got and not blocking and not self.fired:
            self.fired = True
            os.kill(os.getpid(), self.signum)  # handled as soon as this call returns, inside Popen's poll
        return got

    def release(self) -> None:
        self.lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_inside_popen_poll_ends_the_wait_and_the_shutdown_completes(monkeypatch, signum):
    monkeypatch.setenv("TESSEL_TOKEN", "signals-test-token")
    launch = launcher.Launch(argparse.Namespace(coordinator="127.0.0.1:1", nproc=2, quiet=True))
    launch.ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    launch.ranks[1]._waitpid_lock = _SignalOnAcquire(signum)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    finished = threading.Event()
    try:
        with local_daemons.signals_stop(launch):
            with pytest.raises(KeyboardInterrupt):
                launch.wait_ranks("job")
            assert launch.ranks[1]._waitpid_lock.fired and launch.stopping.is_set()
            threading.Thread(target=lambda: (launch.shutdown(), finished.set()), daemon=True).start()
            assert finished.wait(20), "the shutdown blocked: a process's wait lock was left held"
        assert all(p.returncode is not None for p in launch.ranks)
        assert {s: signal.getsignal(s) for s in previous} == previous
    finally:
        for proc in launch.ranks:
            if proc.poll() is None:
                proc.kill()
