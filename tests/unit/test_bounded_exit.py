"""A rank's exit is bounded: once it finished its part, a hang in what is left (closing channels, the interpreter's
own end) writes every thread's stack to stderr and ends the process (tessel.communication.supervision); SIGUSR1 writes
the same stacks at any time. Each case runs in a process of its own, since both act on the whole process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from tests.conftest import ROOT


def _python(code: str, timeout_s: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT
    )
    return done, time.monotonic() - started


def test_a_process_stuck_after_its_release_ends_with_its_stacks():
    # An embedded world of one: release() at exit arms the bound; a hook that runs after it hangs.
    done, seconds = _python(
        """
        import atexit, time
        atexit.register(time.sleep, 600)  # registered first, so it runs after tessel's release
        import numpy as np
        from tessel.communication import comm_func, init, supervision
        init()
        comm_func.all_reduce(np.ones(4, np.float32))
        supervision.EXIT_WATCHDOG_S = 1.0
        print("released next", flush=True)
        """
    )
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "released next" in done.stdout
    assert "most recent call first" in done.stderr, done.stderr[-2000:]
    assert seconds < 30, seconds


def test_an_explicit_release_does_not_bound_the_rest_of_the_program():
    done, _ = _python(
        """
        import time
        import numpy as np
        from tessel.communication import comm_func, init, release, supervision
        supervision.EXIT_WATCHDOG_S = 0.5
        init()
        comm_func.all_reduce(np.ones(4, np.float32))
        release()
        time.sleep(1.5)  # longer than the bound: only the interpreter's end is bounded
        print("still here", flush=True)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "still here" in done.stdout


def test_sigusr1_writes_every_threads_stack_and_the_rank_goes_on():
    done, _ = _python(
        """
        import os, signal, threading
        from tessel.communication import supervision
        supervision._dump_stacks_on_signal()
        threading.Thread(target=threading.Event().wait, name="waiter", daemon=True).start()
        os.kill(os.getpid(), supervision.STACKS_SIGNAL)
        print("went on", flush=True)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "went on" in done.stdout
    assert done.stderr.count("most recent call first") >= 2, done.stderr  # both threads


def test_a_program_that_handles_sigusr1_keeps_its_handler():
    done, _ = _python(
        """
        import signal
        from tessel.communication import supervision
        mine = lambda *_: None
        signal.signal(supervision.STACKS_SIGNAL, mine)
        supervision._dump_stacks_on_signal()
        assert signal.getsignal(supervision.STACKS_SIGNAL) is mine
        print("kept", flush=True)
        """
    )
    assert done.returncode == 0 and "kept" in done.stdout, done.stderr[-2000:]
