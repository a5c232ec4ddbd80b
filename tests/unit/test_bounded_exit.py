"""A rank's exit is bounded where tessel's own work is (tessel.communication.supervision): closing its channels, and
the interpreter's end after the program's exit hooks. A hang there writes every thread's stack to stderr and ends
the process with status 1 after TESSEL_EXIT_TIMEOUT seconds; the program's own exit hooks and the time after an
explicit release() are not bounded. SIGUSR1 writes the same stacks at any time. Each case runs in a process of its
own, since each acts on the whole process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from tests.conftest import ROOT


def _python(code: str, exit_timeout: str = "1", timeout_s: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env=dict(os.environ, TESSEL_EXIT_TIMEOUT=exit_timeout),
    )
    return done, time.monotonic() - started


WORLD_OF_ONE = """
import numpy as np
from tessel.communication import comm_func, init
init()
comm_func.all_reduce(np.ones(4, np.float32))
"""


def test_a_hang_in_the_interpreters_end_ends_the_process_with_its_stacks():
    # A hook registered before `import tessel` runs after tessel's last one: it stands for a finalizer that hangs.
    done, seconds = _python("import atexit, time\natexit.register(time.sleep, 600)\n" + WORLD_OF_ONE)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "most recent call first" in done.stderr, done.stderr[-2000:]
    assert seconds < 30, seconds


def test_a_hang_in_closing_the_channels_ends_the_process_with_its_stacks():
    done, _ = _python(
        WORLD_OF_ONE
        + """
import time
from tessel.communication import runtime
type(runtime.current().daemon).close = lambda self: time.sleep(600)  # a channel close that never returns
"""
    )
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "most recent call first" in done.stderr and "<lambda>" in done.stderr, done.stderr[-2000:]


def test_the_programs_own_exit_hooks_and_the_time_after_an_explicit_release_are_not_bounded():
    done, _ = _python(
        WORLD_OF_ONE
        + """
import atexit, time
from tessel.communication import release
atexit.register(lambda: (time.sleep(1.5), print("hook done", flush=True)))  # longer than the bound
release()
time.sleep(1.5)
print("still here", flush=True)
""",
        exit_timeout="0.5",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "still here\nhook done" in done.stdout, done.stdout


def test_a_malformed_exit_timeout_is_an_error_at_init():
    done, _ = _python(WORLD_OF_ONE, exit_timeout="soon")
    assert done.returncode == 1
    assert "TESSEL_EXIT_TIMEOUT='soon' must be a positive number of seconds (default 60)" in done.stderr, done.stderr


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
