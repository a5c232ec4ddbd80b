"""`tessel.runtime` — MindSpore's `mindspore.runtime` (2.6+): memory, executor and stream settings.

    >>> import tessel as ms
    >>> ms.runtime.set_memory(max_size="28GB")          # once per process, as MindSpore
    >>> ms.runtime.memory_settings().max_size
    30064771072

tessel's compute runs in its daemons, not in the script process, so most of these settings tune nothing here.
Each function validates its arguments exactly as MindSpore does (same errors, same once-per-process rules) and
then does one of three things: what MindSpore documents (the memory queries on a CPU target, `synchronize`),
records the setting and logs once that it has no effect yet (`set_memory`: `memory_settings()` keeps it for a
daemon memory budget), or raises `NotSupportedYetError` (streams, events, `memory_replay`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from tessel.common.support import log_once, not_supported_yet
from tessel.core.errors import ConfigurationError

__all__ = [
    "Event",
    "MemorySettings",
    "Stream",
    "StreamCtx",
    "communication_stream",
    "current_stream",
    "default_stream",
    "dispatch_threads_num",
    "empty_cache",
    "launch_blocking",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_replay",
    "memory_reserved",
    "memory_settings",
    "memory_stats",
    "memory_summary",
    "reset_max_memory_allocated",
    "reset_max_memory_reserved",
    "reset_peak_memory_stats",
    "set_cpu_affinity",
    "set_cur_stream",
    "set_kernel_launch_capture",
    "set_kernel_launch_group",
    "set_memory",
    "synchronize",
]

# MindSpore's formats (mindspore/runtime/memory.py): sizes are "<number>GB", matched from the start of the string.
_MEMORY_PATTERN = re.compile(r"[1-9][0-9]*(\.)?[0-9]*GB|0\.[0-9]*GB", re.ASCII)
_RESERVE_PATTERN = re.compile(r"[0-9][0-9]*(\.)?[0-9]*GB|0\.[0-9]*GB", re.ASCII)
_GB = 1024**3
_NO_EFFECT = "tessel's compute runs in its daemons (ONNX Runtime), which this setting does not reach"

_configured: set[str] = set()  # the settings MindSpore allows once per process that were made


@dataclass(frozen=True)
class MemorySettings:
    """What `set_memory` recorded, in bytes (MindSpore's defaults until it is called)."""

    init_size: int = 2 * _GB
    increase_size: int = 2 * _GB
    max_size: int = 1024 * _GB
    optimize_level: str = "O0"
    huge_page_reserve_size: int = 0
    configured: bool = False


_memory = MemorySettings()


def _once(name: str, message: str) -> None:
    """MindSpore's rule for settings made once per process: a second call is a RuntimeError."""
    if name in _configured:
        raise ConfigurationError(f"runtime.{name}: {message}")


def _device_target() -> str:
    from tessel import context

    return context.get_context("device_target")


def _check_str(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"runtime.set_memory: the parameter '{name}' must be str (e.g. \"28GB\"), got {type(value)}")


def _size(name: str, value: str, pattern: re.Pattern, zero_ok: bool) -> int:
    if pattern.match(value) is None or (not zero_ok and value in ("0GB", "0.0GB")):
        more = "" if zero_ok else ", not 0"
        raise ConfigurationError(
            f'runtime.set_memory: {name}={value!r} must be a size in GB such as "5GB" or "3.5GB"{more}'
        )
    try:
        return int(float(value[:-2]) * _GB)
    except ValueError:
        raise ConfigurationError(f"runtime.set_memory: {name}={value!r} is not a number followed by 'GB'") from None


# --- memory ---------------------------------------------------------------------------------------------------


def set_memory(
    init_size: str = "2GB",
    increase_size: str = "2GB",
    max_size: str = "1024GB",
    optimize_level: str = "O0",
    huge_page_reserve_size: str = "0GB",
) -> None:
    """Set the device memory pool (MindSpore `runtime.set_memory`): sizes as "xxGB"; callable once per process.

    tessel records the values (`memory_settings()`) for the daemons' memory budget; ONNX Runtime's arena in the
    daemons is not sized from them yet, which is logged once.

        >>> ms.runtime.set_memory(max_size="28GB")
    """
    for name, value in [
        ("init_size", init_size),
        ("increase_size", increase_size),
        ("max_size", max_size),
        ("optimize_level", optimize_level),
        ("huge_page_reserve_size", huge_page_reserve_size),
    ]:
        _check_str(name, value)
    _once("set_memory", "The 'set_memory' can not be set repeatedly (MindSpore allows one call per process)")
    sizes = {
        name: _size(name, value, _MEMORY_PATTERN, zero_ok=False)
        for name, value in [("init_size", init_size), ("increase_size", increase_size), ("max_size", max_size)]
    }
    huge = _size("huge_page_reserve_size", huge_page_reserve_size, _RESERVE_PATTERN, zero_ok=True)
    if optimize_level not in ("O0", "O1"):
        raise ConfigurationError(
            f"runtime.set_memory: optimize_level must be one of ['O0', 'O1'], got {optimize_level}"
        )
    global _memory
    _memory = MemorySettings(**sizes, optimize_level=optimize_level, huge_page_reserve_size=huge, configured=True)
    _configured.add("set_memory")
    target = _device_target()
    log_once(
        "runtime.set_memory",
        f"runtime.set_memory: recorded (max_size={max_size}); {_NO_EFFECT}: daemons do not size their memory from "
        "it yet. tessel.runtime.memory_settings() returns it",
        logging.INFO if target == "CPU" else logging.WARNING,
    )


def memory_settings() -> MemorySettings:
    """The memory settings of this process: set_memory's values in bytes, or MindSpore's defaults."""
    return _memory


def _cpu_only(what: str) -> None:
    """Memory statistics exist for a CPU target (all zero, as MindSpore's CPU backend reports); a GPU or Ascend
    daemon's pool is not reported to the script yet."""
    target = _device_target()
    if target != "CPU":
        raise not_supported_yet(
            f"mindspore.runtime.{what} with device_target={target!r}",
            "the daemons do not report their device memory pool to the script yet",
        )


def _stats(what: str) -> dict:
    _cpu_only(what)
    pool = {"block_unit_size": 0, "block_counts": 0, "blocks_info": {}}
    figures = dict.fromkeys(
        [
            "total_reserved_memory",
            "total_allocated_memory",
            "total_idle_memory",
            "total_eager_free_memory",
            "max_reserved_memory",
            "max_allocated_memory",
        ],
        0,
    )
    # "commom" is MindSpore's own spelling of this key (MindSpore 2.7 on CPU).
    return {**figures, "commom_mem_pool_stats": dict(pool), "persistent_mem_pool_stats": dict(pool)}


def memory_stats() -> dict:
    """The memory pool's statistics; on a CPU target every figure is 0 (what MindSpore's CPU backend returns,
    key names included)."""
    return _stats("memory_stats")


def memory_reserved() -> int:
    """Bytes held by the memory pool (0 on a CPU target, as MindSpore)."""
    return _stats("memory_reserved")["total_reserved_memory"]


def max_memory_reserved() -> int:
    return _stats("max_memory_reserved")["max_reserved_memory"]


def memory_allocated() -> int:
    """Bytes occupied by tensors (0 on a CPU target, as MindSpore)."""
    return _stats("memory_allocated")["total_allocated_memory"]


def max_memory_allocated() -> int:
    return _stats("max_memory_allocated")["max_allocated_memory"]


def memory_summary() -> str:
    """The memory statistics as MindSpore's table."""
    stats = _stats("memory_summary")
    rows = [
        ("total_reserved_memory", "Reserved memory"),
        ("total_allocated_memory", "Allocated memory"),
        ("total_idle_memory", "Idle memory"),
        ("total_eager_free_memory", "Eager free memory"),
        ("max_reserved_memory", "Max reserved memory"),
        ("max_allocated_memory", "Max allocated memory"),
    ]
    lines = ["=" * 45, f" {'Memory summary':^43} ", "=" * 45, f" {'Metric':<20} | {'Data':<20} "]
    for key, title in rows:
        lines += ["-" * 45, f" {title:<20} | {_format_size(stats[key]):<20} "]
    lines.append("=" * 45)
    return "|" + "|\n|".join(lines) + "|\n"


def _format_size(size: int) -> str:
    unit, value = "B  ", size
    for next_unit in ("KB", "MB", "GB", "TB", "PB"):
        if value < 768 * 1024:
            break
        unit, value = next_unit, value // 1024
    return f"{value:6d} {unit}"


def reset_peak_memory_stats() -> None:
    """Reset the peak figures (they stay 0 on a CPU target)."""
    _cpu_only("reset_peak_memory_stats")


def reset_max_memory_reserved() -> None:
    _cpu_only("reset_max_memory_reserved")


def reset_max_memory_allocated() -> None:
    _cpu_only("reset_max_memory_allocated")


def empty_cache() -> None:
    """Release the pool's cached blocks (MindSpore: Ascend only). Logged once: there is no such cache here."""
    log_once("runtime.empty_cache", f"runtime.empty_cache: no effect; {_NO_EFFECT}", logging.INFO)


def memory_replay(file_path: str) -> None:
    raise not_supported_yet(
        "mindspore.runtime.memory_replay", "replaying Ascend memory_block.csv traces needs MindSpore's Ascend pool"
    )


# --- executor ---------------------------------------------------------------------------------------------------


def launch_blocking() -> None:
    """Run operators synchronously so errors point at the failing line (MindSpore `runtime.launch_blocking`).

    tessel already behaves so: every call returns after its daemon has run it, and an error raises at that call."""
    _configured.add("launch_blocking")
    log_once(
        "runtime.launch_blocking",
        "runtime.launch_blocking: tessel runs each call synchronously already; nothing changes",
        logging.INFO,
    )


def _check_int(where: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"runtime.{where}: the parameter '{name}' must be int, got {type(value)}")


def dispatch_threads_num(threads_num: int) -> None:
    """Threads of MindSpore's runtime dispatcher (callable once). No effect in tessel, logged once; the daemons'
    ONNX Runtime pool is sized by TESSEL_THREADS."""
    _check_int("dispatch_threads_num", "threads_num", threads_num)
    _once("dispatch_threads_num", "The 'dispatch_threads_num' can not be set repeatedly")
    if threads_num <= 0:
        raise ConfigurationError(f"runtime.dispatch_threads_num: threads_num must be an int > 0, got {threads_num}")
    _configured.add("dispatch_threads_num")
    log_once(
        "runtime.dispatch_threads_num",
        f"runtime.dispatch_threads_num({threads_num}): no effect; {_NO_EFFECT}. Size the daemons' thread pool with "
        "TESSEL_THREADS",
        logging.INFO,
    )


_CPU_RANGE = re.compile(r"^\d+-\d+$")


def set_cpu_affinity(
    enable_affinity: bool, affinity_cpu_list: list | dict | None = None, module_to_cpu_dict: dict | None = None
) -> None:
    """Bind MindSpore's threads to CPU cores (callable once). Validated as MindSpore does; no effect in tessel,
    logged once: the work runs in the daemons, which `taskset` / `numactl` bind."""
    if not isinstance(enable_affinity, bool):
        raise TypeError(f"runtime.set_cpu_affinity: enable_affinity must be a bool, got {type(enable_affinity)}")
    if isinstance(affinity_cpu_list, dict):  # {"device0": [...], ...}: only this device's entry counts
        from tessel import context

        affinity_cpu_list = affinity_cpu_list.get(f"device{context.get_context('device_id')}", False)
        if affinity_cpu_list is False:
            return
    if affinity_cpu_list is not None:
        if not isinstance(affinity_cpu_list, list):
            raise TypeError(
                f"runtime.set_cpu_affinity: affinity_cpu_list must be a list, got {type(affinity_cpu_list)}"
            )
        for cpu_range in affinity_cpu_list:
            if not isinstance(cpu_range, str) or not _CPU_RANGE.match(cpu_range):
                raise ConfigurationError(
                    f"runtime.set_cpu_affinity: CPU range {cpu_range!r} in {affinity_cpu_list} must be a string "
                    "'cpuidX-cpuidY', e.g. '0-3'"
                )
    if module_to_cpu_dict is not None:
        if not isinstance(module_to_cpu_dict, dict):
            raise TypeError(
                f"runtime.set_cpu_affinity: module_to_cpu_dict must be a dict, got {type(module_to_cpu_dict)}"
            )
        for module, cpus in module_to_cpu_dict.items():
            if not isinstance(cpus, list) or not all(isinstance(c, int) and c >= 0 for c in cpus):
                raise ConfigurationError(
                    f"runtime.set_cpu_affinity: module_to_cpu_dict[{module!r}] must be a list of CPU indices >= 0, "
                    f"got {cpus!r}"
                )
    _once("set_cpu_affinity", "The 'mindspore.runtime.set_cpu_affinity' cannot be set repeatedly")
    _configured.add("set_cpu_affinity")
    if enable_affinity:
        log_once(
            "runtime.set_cpu_affinity",
            f"runtime.set_cpu_affinity: no effect; {_NO_EFFECT}. Bind the daemons with taskset or numactl",
            logging.WARNING,
        )


def set_kernel_launch_group(thread_num: int = 2, kernel_group_num: int = 8) -> None:
    """Parallel kernel launch of MindSpore's O0 mode (callable once). Validated; no effect in tessel, logged once."""
    _check_int("set_kernel_launch_group", "thread_num", thread_num)
    _check_int("set_kernel_launch_group", "kernel_group_num", kernel_group_num)
    _once("set_kernel_launch_group", "The 'kernel_launch_group' can not be set repeatedly")
    if "set_kernel_launch_capture" in _configured:
        raise ConfigurationError(
            "runtime.set_kernel_launch_group: The kernel launch group and kernel launch capture can not be set together"
        )
    if thread_num < 1 or kernel_group_num < 1:
        raise ConfigurationError(
            f"runtime.set_kernel_launch_group: thread_num ({thread_num}) and kernel_group_num ({kernel_group_num}) "
            "must be at least 1"
        )
    if kernel_group_num % thread_num:
        raise ConfigurationError(
            f"runtime.set_kernel_launch_group: kernel_group_num {kernel_group_num} must be divisible by thread_num "
            f"{thread_num}"
        )
    _configured.add("set_kernel_launch_group")
    log_once(
        "runtime.set_kernel_launch_group", f"runtime.set_kernel_launch_group: no effect; {_NO_EFFECT}", logging.INFO
    )


def set_kernel_launch_capture(enable_capture_graph: bool) -> None:
    """Capture operator dispatch into a graph (MindSpore, experimental). Validated; no effect, logged once: tessel
    compiles whole graphs already."""
    if not isinstance(enable_capture_graph, bool):
        raise TypeError(
            f"runtime.set_kernel_launch_capture: enable_capture_graph must be a bool, got {type(enable_capture_graph)}"
        )
    if "set_kernel_launch_group" in _configured:
        raise ConfigurationError(
            "runtime.set_kernel_launch_capture: The kernel launch group and kernel launch capture can not be set "
            "together"
        )
    if enable_capture_graph:
        _configured.add("set_kernel_launch_capture")
    else:
        _configured.discard("set_kernel_launch_capture")
    log_once(
        "runtime.set_kernel_launch_capture",
        "runtime.set_kernel_launch_capture: no effect; tessel compiles whole graphs into daemon segments already",
        logging.INFO,
    )


# --- streams and events -------------------------------------------------------------------------------------------


def synchronize() -> None:
    """Wait until the device has finished all submitted work. Every tessel call returns after its daemon finished
    it, so there is nothing left to wait for."""


_STREAMS_WHY = "tessel's daemons own the device streams and do not expose them to scripts"


def _no_streams(what: str):
    def unsupported(*args: Any, **kwargs: Any) -> Any:
        raise not_supported_yet(f"mindspore.runtime.{what}", _STREAMS_WHY)

    unsupported.__name__ = unsupported.__qualname__ = what
    unsupported.__doc__ = f"MindSpore `runtime.{what}`: raises NotSupportedYetError ({_STREAMS_WHY})."
    return unsupported


set_cur_stream = _no_streams("set_cur_stream")
current_stream = _no_streams("current_stream")
default_stream = _no_streams("default_stream")
communication_stream = _no_streams("communication_stream")


class _NoStreamObject:
    def __init__(self, *args: Any, **kwargs: Any):
        raise not_supported_yet(f"mindspore.runtime.{type(self).__name__}", _STREAMS_WHY)


class Stream(_NoStreamObject):
    """MindSpore `runtime.Stream`: raises NotSupportedYetError."""


class StreamCtx(_NoStreamObject):
    """MindSpore `runtime.StreamCtx`: raises NotSupportedYetError."""


class Event(_NoStreamObject):
    """MindSpore `runtime.Event`: raises NotSupportedYetError."""
