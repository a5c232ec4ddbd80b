"""Execution context (MindSpore `set_context`) and the auto-parallel context (`set_auto_parallel_context`).

    >>> import tessel as ms
    >>> ms.set_context(mode=ms.GRAPH_MODE)
    >>> ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)

Settings are validated here; the parallel pass reads the auto-parallel ones.
"""

from __future__ import annotations

import os
from typing import Any

from tessel.core.errors import ConfigurationError

GRAPH_MODE = 0
PYNATIVE_MODE = 1

_DEVICE_PLUGINS = {"CPU": "cpu", "GPU": "gpu", "Ascend": "ascend"}
_CONTEXT_DEFAULTS: dict[str, Any] = {
    "mode": GRAPH_MODE,
    "device_target": "CPU",
    "device_id": 0,
    "save_graphs": False,
    "save_graphs_path": ".",
    "max_call_depth": 1000,
    "deterministic": "OFF",
    "jit_level": "O0",
    "enable_profiling": False,
    "profiling_options": "",
}
# Accepted for compatibility with MindSpore scripts; they have no effect here.
_IGNORED = {
    "enable_graph_kernel",
    "graph_kernel_flags",
    "max_device_memory",
    "mempool_block_size",
    "variable_memory_max_size",
    "enable_reduce_precision",
    "pynative_synchronize",
    "runtime_num_threads",
    "inter_op_parallel_num",
    "memory_optimize_level",
    "jit_config",
    "ascend_config",
    "gpu_config",
    "print_file_path",
    "env_config_path",
    "precompile_only",
    "check_bprop",
    "enable_compile_cache",
    "compile_cache_path",
    "op_timeout",
}
_context: dict[str, Any] = dict(_CONTEXT_DEFAULTS)


def set_context(**kwargs: Any) -> None:
    """Set execution options: mode (GRAPH_MODE/PYNATIVE_MODE), device_target ("CPU"/"GPU"/"Ascend"),
    device_id, save_graphs (graph dumps of every compiled segment into save_graphs_path), ..."""
    for key, value in kwargs.items():
        if key in _IGNORED:
            _context[key] = value
            continue
        if key not in _CONTEXT_DEFAULTS:
            known = sorted(set(_CONTEXT_DEFAULTS) | _IGNORED)
            raise ConfigurationError(f"set_context: unknown option {key!r}; options: {known}")
        if key in _PROFILING:
            continue
        _context[key] = _validate(key, value)
        if key == "device_target":
            # Picks the plugin of the daemon this process starts for itself; a launcher's choice wins.
            os.environ.setdefault("TESSEL_PLUGIN", _DEVICE_PLUGINS[value])
    profiling = {key: _validate(key, kwargs[key]) for key in _PROFILING if key in kwargs}
    if profiling:
        _profiling({**_context, **profiling})
        _context.update(profiling)


def _validate(key: str, value: Any) -> Any:
    if key == "mode" and value not in (GRAPH_MODE, PYNATIVE_MODE):
        raise ConfigurationError(f"set_context: mode must be GRAPH_MODE (0) or PYNATIVE_MODE (1), got {value!r}")
    if key == "device_target" and value not in _DEVICE_PLUGINS:
        raise ConfigurationError(f"set_context: device_target must be one of {list(_DEVICE_PLUGINS)}, got {value!r}")
    if key == "device_id" and (not isinstance(value, int) or value < 0):
        raise ConfigurationError(f"set_context: device_id must be a non-negative int, got {value!r}")
    if key == "save_graphs" and not isinstance(value, (bool, int)):
        raise ConfigurationError(f"set_context: save_graphs must be a bool or 0-3, got {value!r}")
    if key == "enable_profiling" and not isinstance(value, bool):
        raise ConfigurationError(f"set_context: enable_profiling must be True or False, got {value!r}")
    if key == "save_graphs_path" and not isinstance(value, str):
        raise ConfigurationError(f"set_context: save_graphs_path must be a str, got {value!r}")
    return value


_PROFILING = ("enable_profiling", "profiling_options")


def _profiling(settings: dict[str, Any]) -> None:
    """MindSpore's set_context(enable_profiling=True, profiling_options='{"output": DIR}'): the timeline of
    tessel.profiler, written into DIR (default ./data); enable_profiling=False stops and writes it."""
    import json

    from tessel import profiler

    options = settings["profiling_options"] or "{}"
    try:
        parsed = json.loads(options) if isinstance(options, str) else dict(options)
    except (ValueError, TypeError):
        raise ConfigurationError(f"set_context: profiling_options must be a JSON object, got {options!r}") from None
    other = sorted(set(parsed) - {"output"})
    if other:
        raise ConfigurationError(
            f"set_context: profiling_options {other} are not supported yet; only 'output' (the directory of the "
            "timeline files) is"
        )
    if settings["enable_profiling"]:
        recorder = profiler.active()
        directory = os.path.realpath(parsed.get("output", "./data"))
        if recorder is None or os.path.realpath(recorder.directory) != directory:
            profiler.start(directory)
    else:
        profiler.stop()


def get_context(attr_key: str) -> Any:
    if attr_key not in _context:
        raise ConfigurationError(f"get_context: unknown option {attr_key!r}; options: {sorted(_context)}")
    return _context[attr_key]


class ParallelMode:
    """Parallel modes (MindSpore `ParallelMode`)."""

    STAND_ALONE = "stand_alone"
    DATA_PARALLEL = "data_parallel"
    SEMI_AUTO_PARALLEL = "semi_auto_parallel"
    AUTO_PARALLEL = "auto_parallel"
    HYBRID_PARALLEL = "hybrid_parallel"
    MODE_LIST = (STAND_ALONE, DATA_PARALLEL, SEMI_AUTO_PARALLEL, AUTO_PARALLEL, HYBRID_PARALLEL)


SEARCH_MODES = ("sharding_propagation", "recursive_programming", "dynamic_programming")
_PARALLEL_DEFAULTS: dict[str, Any] = {
    "parallel_mode": ParallelMode.STAND_ALONE,
    "gradients_mean": False,
    "full_batch": False,
    "dataset_strategy": "data_parallel",
    "search_mode": "sharding_propagation",
    "device_num": 1,
    "global_rank": 0,
    "pipeline_stages": 1,
    "gradient_fp32_sync": True,
    "loss_repeated_mean": True,
    "parameter_broadcast": False,
    "enable_parallel_optimizer": False,
    "strategy_ckpt_load_file": "",
    "strategy_ckpt_save_file": "",
    "all_reduce_fusion_config": [],
    "grad_accumulation_step": 1,
    "comm_fusion": None,
    "pipeline_config": None,
    "auto_pipeline": False,
}
_parallel: dict[str, Any] = dict(_PARALLEL_DEFAULTS)
_explicit: set[str] = set()


def _positive_int(key: str, value: Any, upper: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (upper and value > upper):
        limit = f" and at most {upper}" if upper else ""
        raise ConfigurationError(f"set_auto_parallel_context: {key} must be an int >= 1{limit}, got {value!r}")
    return value


def _validate_parallel(key: str, value: Any) -> Any:
    if key == "parallel_mode":
        value = value.lower() if isinstance(value, str) else value
        if value not in ParallelMode.MODE_LIST:
            raise ConfigurationError(f"parallel_mode must be one of {list(ParallelMode.MODE_LIST)}, got {value!r}")
    elif key == "search_mode" and value not in SEARCH_MODES:
        raise ConfigurationError(f"search_mode must be one of {list(SEARCH_MODES)}, got {value!r}")
    elif key in ("device_num", "pipeline_stages", "grad_accumulation_step"):
        value = _positive_int(key, value, 4096 if key == "device_num" else None)
    elif key == "global_rank" and (not isinstance(value, int) or value < 0):
        raise ConfigurationError(f"global_rank must be a non-negative int, got {value!r}")
    elif key == "dataset_strategy":
        value = _dataset_strategy(value)
    elif key == "all_reduce_fusion_config" and not all(isinstance(i, int) for i in value):
        raise ConfigurationError(f"all_reduce_fusion_config must be a list of int indices, got {value!r}")
    elif isinstance(_PARALLEL_DEFAULTS.get(key), bool) and not isinstance(value, bool):
        raise ConfigurationError(f"set_auto_parallel_context: {key} must be a bool, got {value!r}")
    return value


def _dataset_strategy(value: Any) -> Any:
    if value in ("data_parallel", "full_batch"):
        return value
    ok = isinstance(value, (tuple, list)) and all(
        isinstance(s, (tuple, list)) and all(isinstance(d, int) and d >= 1 for d in s) for s in value
    )
    if not ok:
        raise ConfigurationError(
            "dataset_strategy must be 'data_parallel', 'full_batch' or one tuple of positive ints per dataset "
            f"column, e.g. ((2, 1), (2,)); got {value!r}"
        )
    return tuple(tuple(s) for s in value)


def set_auto_parallel_context(**kwargs: Any) -> None:
    """Set parallel options (parallel_mode, gradients_mean, full_batch, dataset_strategy, search_mode, device_num,
    pipeline_stages, ...). Unknown options and invalid values are errors naming the option."""
    for key, value in kwargs.items():
        if key == "auto_parallel_search_mode":  # MindSpore's older name
            key = "search_mode"
        if key not in _PARALLEL_DEFAULTS:
            raise ConfigurationError(
                f"set_auto_parallel_context: unknown option {key!r}; options: {sorted(_PARALLEL_DEFAULTS)}"
            )
        _parallel[key] = _validate_parallel(key, value)
        _explicit.add(key)
    # full_batch and dataset_strategy describe the same thing; keep them consistent.
    if "full_batch" in kwargs and "dataset_strategy" not in kwargs:
        _parallel["dataset_strategy"] = "full_batch" if _parallel["full_batch"] else "data_parallel"
    if "dataset_strategy" in kwargs:
        _parallel["full_batch"] = _parallel["dataset_strategy"] == "full_batch"


def get_auto_parallel_context(attr_key: str) -> Any:
    """One parallel option; device_num and global_rank default to the running world once it is initialised."""
    if attr_key not in _PARALLEL_DEFAULTS:
        raise ConfigurationError(f"get_auto_parallel_context: unknown option {attr_key!r}")
    if attr_key in ("device_num", "global_rank") and attr_key not in _explicit:
        from tessel.communication import runtime

        if runtime.is_initialized():
            rt = runtime.current()
            return rt.world_size if attr_key == "device_num" else rt.rank
    return _parallel[attr_key]


def reset_auto_parallel_context() -> None:
    """Every parallel option back to its default."""
    _parallel.clear()
    _parallel.update(_PARALLEL_DEFAULTS)
    _explicit.clear()
