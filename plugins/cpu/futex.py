"""Linux futex wait/wake on a 32-bit word in shared memory, through ctypes (no compiled extension).

The futexes are process-shared (no FUTEX_PRIVATE_FLAG) because the words live in a mapping that several
processes share. Waits always carry a timeout: the caller re-checks its deadline, abort flag and peers'
liveness after each one, and a wake-up lost to a race costs at most that timeout in latency.
"""

from __future__ import annotations

import ctypes
import errno
import platform

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_WAKE_ALL = 0x7FFFFFFF

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


def available() -> bool:
    """Whether this machine has a futex syscall number we know (else waits fall back to short sleeps)."""
    return _SYS_FUTEX is not None


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the word at `address` equals `expected`, at most `timeout_s`; spurious returns are fine."""
    if _SYS_FUTEX is None:
        import time

        time.sleep(min(timeout_s, 0.0005))
        return
    seconds = int(timeout_s)
    timeout = _Timespec(seconds, int((timeout_s - seconds) * 1e9))
    # The GIL is released during the call (ctypes.CDLL), so other threads of this process keep running.
    word = ctypes.c_void_p(address)
    result = _syscall(_SYS_FUTEX, word, _FUTEX_WAIT, ctypes.c_uint32(expected), ctypes.byref(timeout), None, 0)
    if result == -1:
        code = ctypes.get_errno()
        if code not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
            raise OSError(code, f"futex wait failed: {errno.errorcode.get(code, code)}")


def wake(address: int) -> None:
    """Wake every process sleeping on the word at `address`."""
    if _SYS_FUTEX is not None:
        _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
