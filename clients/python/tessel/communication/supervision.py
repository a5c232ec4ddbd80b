"""How a rank takes part in failure detection (the coordinator judges: coordinator/state.py).

* An exception that ends the rank fails the job at once, blaming this rank, or the rank the exception names (a
  peer died, closed its links or never came: `JobFailedError.culprit_rank`); the coordinator blames that one
  unless it learns of a death first.
* A non-zero exit status fails the job too. Python does not tell an exit hook the status, so `install` wraps
  `sys.exit` and the `exit`/`quit` builtins to note it, and at exit the rank reports it instead of finishing.
  A bare `raise SystemExit(3)` escapes the wrappers; `tessel run` sees every rank's status and reports it as well.
* When the job fails, the calls this rank has in flight to its daemon end at once with the cause (a stopped
  daemon would hold them until their deadline), and later ones fail at once.
* A stall the coordinator announces is printed to stderr (the rank's log): the waiting and the missing ranks.
* The rank prints its deadlines once, in one line, to stderr.
* Its exit is bounded where tessel's own work is: closing its channels at exit, and the interpreter's end after the
  exit hooks (gRPC's finalizers among others). A rank stuck there for TESSEL_EXIT_TIMEOUT seconds (60) writes its
  threads' stacks to stderr and ends with status 1. The program's own exit hooks (registered after `import tessel`)
  are not bounded: they may legitimately take long (a timeline written, an upload). SIGUSR1 writes the same stacks
  at any time, unless the program handles that signal itself.
"""

from __future__ import annotations

import builtins
import contextlib
import faulthandler
import gc
import os
import signal
import sys
import threading
from typing import Any

from tessel.core.errors import ConfigurationError, JobFailedError, TesselError

EXIT_CALL_S = 10.0  # the longest a dying rank waits on the coordinator (a lost one also ends the call at once)
EXIT_TIMEOUT_ENV = "TESSEL_EXIT_TIMEOUT"
EXIT_TIMEOUT_S = 60.0  # the default: the longest closing the channels, or the interpreter's end, may take
_released_at_exit = False  # a runtime was released by the exit hook: the interpreter's end is bounded too
STACKS_SIGNAL = signal.SIGUSR1  # a rank writes its threads' stacks to stderr on it
_exit_status: int = 0  # what the main thread last asked sys.exit / exit / quit for
_exit_culprit: int | None = None  # the rank named by the error being handled when it asked (if any)
_exit_error: str = ""  # that error


def _status_of(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1  # sys.exit("message") prints it and exits with 1


def _noting(exit_function):
    def exit(code: Any = None):
        global _exit_status, _exit_culprit, _exit_error
        if threading.current_thread() is threading.main_thread():
            _exit_status = _status_of(code)
            handled = sys.exc_info()[1]  # `except PeerFailedError: sys.exit(4)` exits because of another rank
            culprit = getattr(handled, "culprit_rank", None)
            _exit_culprit = culprit if isinstance(culprit, int) and culprit >= 0 else None
            _exit_error = f"{type(handled).__name__}: {str(handled)[:1000]}" if handled is not None else ""
        exit_function(code)

    exit.__wrapped__ = exit_function
    return exit


def _wrap_exits() -> None:
    if not hasattr(sys.exit, "__wrapped__"):
        sys.exit = _noting(sys.exit)
    for name in ("exit", "quit"):
        original = getattr(builtins, name, None)
        if original is not None and not hasattr(original, "__wrapped__"):
            setattr(builtins, name, _noting(original))


def install(runtime) -> None:
    """Report uncaught exceptions and exit statuses of this rank, and print its deadlines."""
    _wrap_exits()
    previous = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if runtime.failure is None and runtime.coordinator is not None:
            culprit = getattr(value, "culprit_rank", -1)
            blamed = culprit if isinstance(culprit, int) and culprit >= 0 else runtime.rank
            runtime.failure, runtime.culprit_rank = f"{kind.__name__}: {value}", blamed
            # Its own exception decides at once; one naming another rank is a claim (coordinator/state.py fail_job).
            # If the coordinator is gone too, the broken heartbeat stream tells the same story.
            with contextlib.suppress(TesselError):
                claim = None if blamed == runtime.rank else blamed
                runtime.coordinator.fail_job(runtime.job_id, runtime.rank, runtime.failure, claim, EXIT_CALL_S)
        previous(kind, value, traceback)

    sys.excepthook = hook
    _dump_stacks_on_signal()
    print(deadlines(runtime), file=sys.stderr, flush=True)


def _stderr():
    """The process's own stderr (faulthandler writes to a file descriptor; sys.stderr may be replaced)."""
    stream = sys.__stderr__
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # no usable stderr (pythonw, a closed descriptor)
        return None
    return stream


def _dump_stacks_on_signal() -> None:
    """STACKS_SIGNAL writes every thread's stack to stderr, unless the program handles the signal itself."""
    stream = _stderr()
    if stream is not None and signal.getsignal(STACKS_SIGNAL) == signal.SIG_DFL:
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            faulthandler.register(STACKS_SIGNAL, file=stream, all_threads=True)


def exit_timeout_s() -> float:
    """TESSEL_EXIT_TIMEOUT: seconds a process may take to close its channels, or its interpreter to end."""
    text = os.environ.get(EXIT_TIMEOUT_ENV, "").strip()
    if not text:
        return EXIT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigurationError(
            f"{EXIT_TIMEOUT_ENV}={text!r} must be a positive number of seconds (default {EXIT_TIMEOUT_S:g})"
        )
    return seconds


def bound_exit() -> None:
    """From here the process only closes its channels, or ends its interpreter. Should that hang (a stuck thread, a
    finalizer), every thread's stack goes to stderr after TESSEL_EXIT_TIMEOUT seconds and the process ends with
    status 1: a job that did its work must not hang its launcher."""
    stream = _stderr()
    if stream is None:
        return
    try:
        seconds = exit_timeout_s()
    except TesselError:  # said at init(); the exit goes on with the default
        seconds = EXIT_TIMEOUT_S
    with contextlib.suppress(OSError, RuntimeError, ValueError):
        faulthandler.dump_traceback_later(seconds, exit=True, file=stream)


def unbound_exit() -> None:
    """What follows may wait legitimately (the job's other ranks, the program's own exit hooks)."""
    faulthandler.cancel_dump_traceback_later()


def released_at_exit() -> None:
    """The runtime was released by the exit hook: the interpreter's end, after the last exit hook, is bounded."""
    global _released_at_exit
    _released_at_exit = True


def bound_interpreter_end() -> None:
    """The last exit hook (registered by `import tessel`): bounds what remains of a rank that released its runtime at
    exit, the interpreter's own end. The garbage is collected first, while every thread still runs: a finalizer
    that the interpreter's end runs after it stopped the threads would wait forever on a lock one of them held."""
    if _released_at_exit:
        bound_exit()
        gc.collect()


def deadlines(runtime) -> str:
    beat = runtime.heartbeat
    daemon_s = getattr(runtime.daemon, "timeout_s", None)
    daemon = f"{daemon_s:g} s" if daemon_s else "none (in this process)"
    return (
        f"tessel rank {runtime.rank} of job {runtime.job_id!r} deadlines: heartbeat every {beat.interval_s:g} s, "
        f"coordinator lost after {beat.timeout_s + beat.grace_s:g} s of silence or {beat.grace_s:g} s unreachable; "
        f"calls to the daemon {daemon} (ended at once when the job fails); collectives time out on the daemon "
        "(its log lists its deadlines)"
    )


def on_event(runtime, event, lost_state: str) -> None:
    """A heartbeat event of this rank's job: a failure (or the coordinator lost) ends its daemon calls."""
    if event.state in ("failed", lost_state):
        if runtime.failure is None:
            runtime.failure, runtime.culprit_rank = event.cause, event.culprit_rank
        error = JobFailedError(f"job {runtime.job_id!r} failed: {event.cause}", event.culprit_rank)
        runtime.daemon.abort(error)
        if event.state == lost_state:  # what this rank would still tell the coordinator cannot arrive
            runtime.coordinator.abort(error)
    elif event.state == "stalled":
        print(f"tessel: stalled: {event.cause}", file=sys.stderr, flush=True)


def finish(runtime) -> None:
    """At exit of a rank that did not fail: finish its part, or fail the job if it exits with a non-zero status."""
    if _exit_status != 0:
        culprit = runtime.rank if _exit_culprit is None else _exit_culprit
        after = f" after {_exit_error}" if _exit_error else ""
        runtime.failure = f"rank {runtime.rank} exited with status {_exit_status}{after}"
        runtime.culprit_rank = culprit
        runtime.coordinator.fail_job(runtime.job_id, runtime.rank, runtime.failure, culprit, EXIT_CALL_S)
    else:
        runtime.coordinator.finish_rank(runtime.job_id, runtime.rank, EXIT_CALL_S)
