"""Giving freed memory back to the operating system, for long-running servers.

A burst of large requests leaves glibc's heaps (one arena per busy thread) holding memory Python has freed; the
process's RSS then stays at its peak for weeks. `release_free_memory()` asks glibc to return it (malloc_trim);
servers call it now and then when idle. A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_ARENA_MAX = -8


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def limit_heaps(count: int = 4) -> bool:
    """Let at most `count` C heaps serve the process's threads (glibc makes up to 8 per core, and each keeps its
    own free memory): for servers whose many RPC threads mostly wait."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(_M_ARENA_MAX, count))


def release_free_memory() -> bool:
    """Return the C heap's free memory to the OS; True if the C library could do it."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
