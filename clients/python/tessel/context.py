"""Execution context (MindSpore `set_context`) and the auto-parallel context (`set_auto_parallel_context`).

    >>> import tessel as ms
    >>> ms.set_context(mode=ms.GRAPH_MODE)
    >>> ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)

Settings are validated here; the parallel pass reads the auto-parallel ones.
"""

from __future__ import annotations

import os
import sys
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
    "runtime_num_threads": 30,
    "inter_op_parallel_num": 0,
    "jit_config": {},
    "print_file_path": None,
    "env_config_path": None,
    "precompile_only": False,
    "check_bprop": False,
    "enable_compile_cache": False,
    "compile_cache_path": "",
    "grad_for_scalar": False,
    "exec_order": "bfs",
    "enable_profiling": False,
    "profiling_options": "",
}
# Options MindSpore uses only on GPU/Ascend devices (memory pools, kernel fusion, device configs): any value is
# accepted, and logged once as having no effect on CPU. Values are MindSpore's defaults.
_IGNORED: dict[str, Any] = {
    "enable_graph_kernel": False,
    "graph_kernel_flags": "",
    "max_device_memory": "1024GB",
    "mempool_block_size": "1GB",
    "variable_memory_max_size": "0",
    "enable_reduce_precision": True,
    "pynative_synchronize": False,
    "memory_optimize_level": "O0",
    "ascend_config": None,
    "gpu_config": None,
    "op_timeout": 1900,
    "aoe_tune_mode": None,
    "aoe_config": None,
}
# Options tessel accepts but does not act on yet: the default value passes, any other value raises
# "not supported yet: <option>=<value>, <why>". Whoever implements one removes it from here and marks it
# "working" in README's option table (tests/unit/sdk/test_context_options.py checks that both agree).
_NOT_SUPPORTED: dict[str, str] = {
    "max_call_depth": "graphs are traced within Python's own recursion limit (sys.setrecursionlimit)",
    "deterministic": "tessel does not promise bitwise-reproducible kernels and reductions yet",
    "jit_level": "every graph is compiled one way (ONNX Runtime with all graph optimizations)",
    "runtime_num_threads": "the daemons' compute threads are set when they start (tessel run/daemon --threads, "
    "TESSEL_THREADS)",
    "inter_op_parallel_num": "each daemon runs a step's operators with one ONNX Runtime thread pool",
    "jit_config": "every graph is compiled one way (ONNX Runtime with all graph optimizations)",
    "print_file_path": "ops.Print writes to standard output, which cannot be redirected to a file yet",
    "env_config_path": "there is no debug environment configuration file",
    "precompile_only": "compiling a network without running it is not wired to set_context",
    "check_bprop": "custom bprop functions are not supported",
    "enable_compile_cache": "daemons cache compiled programs in memory only, for as long as they run",
    "compile_cache_path": "daemons cache compiled programs in memory only, for as long as they run",
    "grad_for_scalar": "the gradient of a Python scalar input is not computed; pass the scalar as a Tensor",
    "exec_order": "each daemon runs a program in the order its scheduler derives from the dependency graph",
}
_context: dict[str, Any] = {**_IGNORED, **_CONTEXT_DEFAULTS}
_explicit_context: set[str] = set()

WORKING = "working"
NO_EFFECT_ON_CPU = "no effect on CPU"


def option_status(option: str) -> str:
    """What tessel does with a set_context / set_auto_parallel_context option: "working", "no effect on CPU" or
    "not supported yet: <why>" (README's option table lists the same)."""
    if option in _IGNORED:
        return NO_EFFECT_ON_CPU
    why = _NOT_SUPPORTED.get(option) or _PARALLEL_NOT_SUPPORTED.get(option)
    if why:
        return f"not supported yet: {why}"
    if option in _CONTEXT_DEFAULTS or option in _PARALLEL_DEFAULTS:
        return WORKING
    raise ConfigurationError(f"{option!r} is not a set_context or set_auto_parallel_context option")


def _refuse_unsupported(option: str, value: Any, default: Any, table: dict[str, str]) -> None:
    why = table.get(option)
    if why is not None and value != default:
        raise _not_supported(f"{option}={value!r}", why)


def set_device(device_target: str, device_id: int | None = None) -> None:
    """MindSpore 2.5+'s `ms.set_device`: `set_context(device_target=..., device_id=...)`; without device_id the
    rank keeps its daemon's device."""
    if device_target not in _DEVICE_PLUGINS:
        raise ConfigurationError(
            f"set_device: device_target must be one of {sorted(_DEVICE_PLUGINS)}, got {device_target!r}"
        )
    if device_id is not None and (isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0):
        raise ConfigurationError(f"set_device: device_id must be an int >= 0, got {device_id!r}")
    set_context(device_target=device_target, **({} if device_id is None else {"device_id": device_id}))


def set_context(**kwargs: Any) -> None:
    """Set execution options: mode (GRAPH_MODE/PYNATIVE_MODE), device_target ("CPU"/"GPU"/"Ascend": the plugin of
    the daemons; a job whose daemons provide none of it fails at init()), device_id, save_graphs (graph dumps of
    every compiled segment into save_graphs_path), ... README's option table says what each option does."""
    for key, value in kwargs.items():
        if key in _IGNORED:
            _context[key] = _validate(key, value)
            from tessel.common.support import log_once

            log_once(f"set_context:{key}", f"set_context({key}={value!r}): no effect on CPU; tessel does not use it")
            continue
        if key not in _CONTEXT_DEFAULTS:
            known = sorted(set(_CONTEXT_DEFAULTS) | set(_IGNORED))
            raise ConfigurationError(f"set_context: unknown option {key!r}; options: {known}")
        if key in _PROFILING:
            continue  # below, once both are known
        value = _validate(key, value)
        _refuse_unsupported(key, value, _CONTEXT_DEFAULTS[key], _NOT_SUPPORTED)
        previous, was_explicit = _context[key], key in _explicit_context
        _context[key] = value
        _explicit_context.add(key)
        plugin_before = os.environ.get("TESSEL_PLUGIN")
        if key == "device_target":
            _choose_plugin(_DEVICE_PLUGINS[value])
        if key in ("device_target", "device_id") and _bound_daemon is not None:
            try:
                _check_daemon(*_bound_daemon)
            except ConfigurationError:
                _context[key] = previous  # a refused value is not kept
                if not was_explicit:
                    _explicit_context.discard(key)
                _restore_plugin(plugin_before)
                raise
    profiling = {key: _validate(key, kwargs[key]) for key in _PROFILING if key in kwargs}
    if profiling:
        _profiling({**_context, **profiling}, starts_or_stops="enable_profiling" in profiling)
        _context.update(profiling)
        _explicit_context.update(profiling)


# The plugin set_context(device_target=...) chose for the daemon this process starts for itself (None: none yet).
# A launcher's TESSEL_PLUGIN wins; one chosen here follows the last device_target set.
_plugin_chosen: str | None = None


def _choose_plugin(plugin: str) -> None:
    global _plugin_chosen
    current = os.environ.get("TESSEL_PLUGIN")
    if current is None or current == _plugin_chosen:
        os.environ["TESSEL_PLUGIN"] = _plugin_chosen = plugin


def _restore_plugin(before: str | None) -> None:
    global _plugin_chosen
    if before is None:
        os.environ.pop("TESSEL_PLUGIN", None)
        _plugin_chosen = None
    else:
        os.environ["TESSEL_PLUGIN"] = before


# What init() learnt: (plugins of the job's daemons by rank, this rank's daemon plugin, its device id, the world).
_bound_daemon: tuple[list[str], str, int, int] | None = None


def _bind_daemon(plugins: list[str], own_plugin: str, own_device: int, world_size: int) -> None:
    """Called by init() once the rank knows its daemon: the daemons decide the device, so an explicit
    device_target no daemon of the job provides (or a device_id / device_num / global_rank other than the job's)
    is an error; unset, device_target and device_id report the daemon's."""
    global _bound_daemon
    _bound_daemon = (list(plugins), own_plugin, own_device, world_size)
    _check_daemon(*_bound_daemon)
    _check_parallel_against_world()


def _check_daemon(plugins: list[str], own_plugin: str, own_device: int, world_size: int) -> None:
    targets = {plugin: target for target, plugin in _DEVICE_PLUGINS.items()}
    if "device_target" in _explicit_context:
        wanted = _DEVICE_PLUGINS[_context["device_target"]]
        if wanted not in plugins:
            found = sorted(set(plugins))
            raise ConfigurationError(
                f"set_context(device_target={_context['device_target']!r}): no daemon of this job provides it; "
                f"the job's daemons run the plugin(s) {found} (this rank's: {own_plugin!r}). Start "
                f"{_context['device_target']} daemons (tessel run --plugin {wanted}, tessel daemon --plugin "
                f"{wanted}), or drop device_target to use the daemons' device"
            )
    else:
        _context["device_target"] = targets.get(own_plugin, own_plugin)
    if "device_id" not in _explicit_context:
        _context["device_id"] = own_device
    elif _context["device_id"] != own_device:
        raise ConfigurationError(
            f"set_context(device_id={_context['device_id']}): this rank's daemon runs device {own_device}; the "
            "daemon a rank drives owns its device: set device_id before init() where the rank starts its own daemon "
            "(a world of 1, mpirun, a rank table, dynamic networking), or leave it unset"
        )


def _requested_device() -> int | None:
    """The device_id the script set before init(), for the daemon the rank starts itself; None if unset."""
    return _context["device_id"] if "device_id" in _explicit_context else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate(key: str, value: Any) -> Any:
    if key == "mode" and (not _is_int(value) or value not in (GRAPH_MODE, PYNATIVE_MODE)):
        raise ConfigurationError(f"set_context: mode must be GRAPH_MODE (0) or PYNATIVE_MODE (1), got {value!r}")
    if key == "device_target" and value not in _DEVICE_PLUGINS:
        raise ConfigurationError(f"set_context: device_target must be one of {list(_DEVICE_PLUGINS)}, got {value!r}")
    if key == "device_id" and (not _is_int(value) or not 0 <= value <= 4095):
        raise ConfigurationError(f"set_context: device_id must be an int in [0, 4095], got {value!r}")
    if key == "save_graphs" and not (isinstance(value, bool) or (_is_int(value) and 0 <= value <= 3)):
        raise ConfigurationError(f"set_context: save_graphs must be a bool or an int 0-3, got {value!r}")
    if key == "jit_config":
        if not isinstance(value, dict):
            raise ConfigurationError(
                f"set_context: jit_config must be a dict such as {{'jit_level': 'O0'}}, got {value!r}"
            )
        if all(k == "jit_level" and v in ("", "O0") for k, v in value.items()):
            return {}  # MindSpore's default compilation, the one tessel has
    if key == "enable_profiling" and not isinstance(value, bool):
        raise ConfigurationError(f"set_context: enable_profiling must be True or False, got {value!r}")
    if key == "save_graphs_path" and (not isinstance(value, str) or not value):
        raise ConfigurationError(f"set_context: save_graphs_path must be a non-empty str, got {value!r}")
    # options with no effect on CPU are still checked as MindSpore checks them, so a typo is not carried along
    if key in ("enable_graph_kernel", "pynative_synchronize", "enable_reduce_precision") and not isinstance(
        value, bool
    ):
        raise ConfigurationError(f"set_context: {key} must be True or False, got {value!r}")
    if key == "memory_optimize_level" and value not in ("O0", "O1"):
        raise ConfigurationError(f"set_context: memory_optimize_level must be 'O0' or 'O1', got {value!r}")
    if key == "op_timeout" and (not _is_int(value) or value < 0):
        raise ConfigurationError(f"set_context: op_timeout must be an int >= 0 (seconds), got {value!r}")
    if key in ("graph_kernel_flags", "max_device_memory", "mempool_block_size", "variable_memory_max_size") and (
        not isinstance(value, str)
    ):
        raise ConfigurationError(f"set_context: {key} must be a str (e.g. {_IGNORED[key]!r}), got {value!r}")
    if key in ("ascend_config", "gpu_config") and value is not None and not isinstance(value, dict):
        raise ConfigurationError(f"set_context: {key} must be a dict, got {value!r}")
    if key != "save_graphs" and isinstance(_CONTEXT_DEFAULTS.get(key), bool) and not isinstance(value, bool):
        raise ConfigurationError(f"set_context: {key} must be True or False, got {value!r}")
    if key == "exec_order" and value not in ("bfs", "dfs", "gpto"):
        raise ConfigurationError(f"set_context: exec_order must be 'bfs', 'dfs' or 'gpto', got {value!r}")
    if key == "aoe_tune_mode" and value not in (None, "online", "offline"):
        raise ConfigurationError(f"set_context: aoe_tune_mode must be 'online' or 'offline', got {value!r}")
    if key == "aoe_config" and value is not None:
        _check_aoe_config(value)
    return value


def _check_aoe_config(value: Any) -> None:
    """MindSpore's aoe_config: a dict whose only key, job_type, is '1' (subgraph tuning) or '2' (operator tuning)."""
    if not isinstance(value, dict) or set(value) - {"job_type"}:
        raise ConfigurationError(f"set_context: aoe_config must be a dict like {{'job_type': '2'}}, got {value!r}")
    if value.get("job_type", "2") not in ("1", "2"):
        raise ConfigurationError(
            f"set_context: aoe_config's job_type must be '1' (subgraph tuning) or '2' (operator tuning), got "
            f"{value['job_type']!r}"
        )


_PROFILING = ("enable_profiling", "profiling_options")


def _profiling(settings: dict[str, Any], starts_or_stops: bool = True) -> None:
    """MindSpore's set_context(enable_profiling=True, profiling_options='{"output": DIR}'): the timeline of
    tessel.profiler, written into DIR (default ./data); enable_profiling=False stops and writes it. Setting only
    profiling_options checks and stores them (as MindSpore), starting or stopping nothing."""
    import json

    from tessel import profiler

    options = settings["profiling_options"] or "{}"
    try:
        parsed = json.loads(options) if isinstance(options, str) else dict(options)
    except (ValueError, TypeError):
        parsed = None
    if not isinstance(parsed, dict):
        raise ConfigurationError(
            f'set_context: profiling_options must be a JSON object such as \'{{"output": "./data"}}\', got {options!r}'
        )
    other = sorted(set(parsed) - {"output"})
    if other:
        raise ConfigurationError(
            f"set_context: profiling_options {other} are not supported yet; only 'output' (the directory of the "
            "timeline files) is"
        )
    if not starts_or_stops:
        return
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
    "search_mode": "recursive_programming",  # MindSpore's default
    "device_num": 1,
    "global_rank": 0,
    "pipeline_stages": 1,
    "gradient_fp32_sync": True,
    "loss_repeated_mean": True,
    "parameter_broadcast": False,
    "enable_parallel_optimizer": False,
    "parallel_optimizer_config": None,
    "strategy_ckpt_load_file": "",
    "strategy_ckpt_save_file": "",
    "strategy_ckpt_config": {"load_file": "", "save_file": "", "only_trainable_params": True},
    "all_reduce_fusion_config": [],
    "grad_accumulation_step": 1,
    "comm_fusion": None,
    "batch_split": "even",
    "pipeline_config": None,
    "auto_pipeline": False,
    # every stage returns the last stage's result in either case (tessel sends it to every stage): True is what
    # MindSpore's broadcast gives; with False MindSpore's other stages return no meaningful value
    "pipeline_result_broadcast": False,
    "force_fp32_communication": False,  # AllReduce / ReduceScatter of float16 values run in float32
    # MindSpore's default is False (AllGather, Split and Concat where a split moves to another dim); tessel's is True,
    # since an AlltoAll sends 1/n of the bytes. False gives MindSpore's collectives (common.partition).
    "enable_alltoall": True,
    "group_ckpt_save_file": "",
    "dump_local_norm": False,
    "dump_local_norm_path": "",
    "dump_device_local_norm": False,
}
_parallel: dict[str, Any] = dict(_PARALLEL_DEFAULTS)
_explicit: set[str] = set()
# As _NOT_SUPPORTED, for set_auto_parallel_context.
_PARALLEL_NOT_SUPPORTED: dict[str, str] = {
    "all_reduce_fusion_config": "gradients are fused by size: comm_fusion={'allreduce': {'mode': 'size', "
    "'config': MB}}",
    "auto_pipeline": "the network's cells are not split into stages automatically: set Cell.pipeline_stage",
    "group_ckpt_save_file": "communication groups are not saved to a file; tessel's checkpoints record each "
    "parameter's layout instead",
    "dump_local_norm": "there is no per-rank dump of parameter and gradient norms",
    "dump_local_norm_path": "there is no per-rank dump of parameter and gradient norms",
    "dump_device_local_norm": "there is no per-rank dump of parameter and gradient norms",
}
_COMM_FUSION_KINDS = ("openstate", "allreduce", "allgather", "reducescatter")


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
    elif key == "strategy_ckpt_config":
        unknown = set(value) - {"load_file", "save_file", "only_trainable_params"} if isinstance(value, dict) else 1
        if unknown:
            raise ConfigurationError(
                "strategy_ckpt_config must be a dict with load_file, save_file and only_trainable_params, e.g. "
                f"{{'save_file': './strategy.json'}}; got {value!r}"
            )
        value = {**_STRATEGY_CKPT_DEFAULTS, **value}  # MindSpore fills in the keys not given
        for name in ("load_file", "save_file"):
            if not isinstance(value[name], str):
                raise ConfigurationError(f"strategy_ckpt_config's {name} must be a str path, got {value[name]!r}")
        if not isinstance(value["only_trainable_params"], bool):
            raise ConfigurationError(
                f"strategy_ckpt_config's only_trainable_params must be a bool, got {value['only_trainable_params']!r}"
            )
    elif key in ("strategy_ckpt_load_file", "strategy_ckpt_save_file") and not isinstance(value, str):
        raise ConfigurationError(f"{key} must be a str path, got {value!r}")
    elif key == "search_mode" and value not in SEARCH_MODES:
        raise ConfigurationError(f"search_mode must be one of {list(SEARCH_MODES)}, got {value!r}")
    elif key in ("device_num", "pipeline_stages", "grad_accumulation_step"):
        value = _positive_int(key, value, 4096 if key == "device_num" else None)
    elif key == "global_rank" and (not isinstance(value, int) or value < 0):
        raise ConfigurationError(f"global_rank must be a non-negative int, got {value!r}")
    elif key == "dataset_strategy":
        value = _dataset_strategy(value)
    elif key == "all_reduce_fusion_config" and (
        not isinstance(value, (list, tuple)) or not all(isinstance(i, int) for i in value)
    ):
        raise ConfigurationError(f"all_reduce_fusion_config must be a list of int indices, got {value!r}")
    elif key == "comm_fusion" and value is not None:
        _comm_fusion(value)
    elif key == "pipeline_config" and value is not None:
        value = _pipeline_config(value)
    elif key == "batch_split":
        value = _batch_split(value)
    elif key == "parallel_optimizer_config" and value is not None:
        value = _parallel_optimizer_config(value)
    elif isinstance(_PARALLEL_DEFAULTS.get(key), bool) and not isinstance(value, bool):
        raise ConfigurationError(f"set_auto_parallel_context: {key} must be a bool, got {value!r}")
    return value


def _comm_fusion(value: Any) -> None:
    """comm_fusion={"allreduce": {"mode": "size", "config": MB}} sizes the gradient buckets ("auto": the default
    size); the other kinds and modes are refused rather than ignored."""
    if not isinstance(value, dict) or not set(value) <= set(_COMM_FUSION_KINDS):
        raise ConfigurationError(
            f"comm_fusion must be a dict with keys among {list(_COMM_FUSION_KINDS)}, got {value!r}"
        )
    if value.get("openstate", True) is not True:
        raise _not_supported("comm_fusion openstate=False", "gradients always travel in size-bounded buckets")
    for kind in ("allgather", "reducescatter"):
        if kind in value:
            raise _not_supported(f"comm_fusion {kind!r}={value[kind]!r}", "only the gradient all-reduce is fused")
    allreduce = value.get("allreduce", {"mode": "auto"})
    mode = allreduce.get("mode") if isinstance(allreduce, dict) else None
    if mode not in ("auto", "size"):
        raise _not_supported(
            f"comm_fusion 'allreduce'={allreduce!r}",
            "gradients are fused by size only: {'mode': 'size', 'config': MB} or {'mode': 'auto'}",
        )


PIPELINE_SCHEDULERS = ("1f1b", "gpipe", "zero_bubble_h1")
_MINDSPORE_ONLY_SCHEDULERS = ("seqpipe", "seqvpp", "seqsmartvpp", "zero_bubble_v")


def _pipeline_config(value: Any) -> dict:
    """pipeline_config={"pipeline_interleave": bool, "pipeline_scheduler": "1f1b" | "gpipe" | "zero_bubble_h1"}
    (either key may be left out: False, "1f1b"); MindSpore's other schedulers are not supported yet."""
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"pipeline_config must be a dict such as {{'pipeline_interleave': False, 'pipeline_scheduler': '1f1b'}}, "
            f"got {value!r}"
        )
    unknown = sorted(set(value) - {"pipeline_interleave", "pipeline_scheduler"})
    if unknown:
        raise ConfigurationError(
            f"pipeline_config: unknown key(s) {unknown}; the keys are 'pipeline_interleave' and 'pipeline_scheduler'"
        )
    interleave = value.get("pipeline_interleave", False)
    if not isinstance(interleave, bool):
        raise ConfigurationError(f"pipeline_config: pipeline_interleave must be a bool, got {interleave!r}")
    scheduler = value.get("pipeline_scheduler", "1f1b")
    if scheduler in _MINDSPORE_ONLY_SCHEDULERS:
        raise _not_supported(
            f"pipeline_scheduler={scheduler!r}",
            f"tessel's schedules are {list(PIPELINE_SCHEDULERS)} ('zero_bubble_h1' is its zero-bubble schedule)",
        )
    if scheduler not in PIPELINE_SCHEDULERS:
        raise ConfigurationError(
            f"pipeline_config: pipeline_scheduler must be one of {list(PIPELINE_SCHEDULERS)}, got {scheduler!r}"
        )
    return dict(value)


def _batch_split(value: Any) -> Any:
    """batch_split: "even" (MindSpore's: every rank the same share), "speed" (shares in proportion to the ranks'
    measured speeds, refined epoch by epoch) or fixed weights, one positive number per rank."""
    import math

    if isinstance(value, str) and value in ("even", "speed"):
        return value
    numbers = isinstance(value, (tuple, list)) and len(value) > 0
    numbers = numbers and all(not isinstance(w, bool) and isinstance(w, (int, float)) for w in value)
    if not numbers or not all(math.isfinite(w) and w > 0 for w in value):
        raise ConfigurationError(
            "batch_split must be 'even', 'speed' or one positive weight per rank, e.g. (1, 2) for a rank twice as "
            f"fast as the other; got {value!r}"
        )
    return tuple(float(w) for w in value)


_OPTIMIZER_CONFIG_KEYS = (
    "gradient_accumulation_shard",
    "parallel_optimizer_threshold",
    "optimizer_weight_shard_size",
    "optimizer_level",
)


def _parallel_optimizer_config(value: Any) -> dict:
    """MindSpore's parallel_optimizer_config: gradient_accumulation_shard (bool; True is optimizer_level
    "level2"), parallel_optimizer_threshold (KB, >= 0; default 64), optimizer_weight_shard_size (> 0 or -1) and
    optimizer_level ("level1" | "level2" | "level3"), checked as MindSpore checks them."""
    if not isinstance(value, dict):
        raise ConfigurationError(f"parallel_optimizer_config must be a dict, got {value!r}")
    unknown = sorted(set(value) - set(_OPTIMIZER_CONFIG_KEYS))
    if unknown:
        raise ConfigurationError(
            f"parallel_optimizer_config: unknown key(s) {unknown}; known: {list(_OPTIMIZER_CONFIG_KEYS)}"
        )
    shard = value.get("gradient_accumulation_shard", False)
    if not isinstance(shard, bool):
        raise ConfigurationError(f"gradient_accumulation_shard must be a bool, got {shard!r}")
    threshold = value.get("parallel_optimizer_threshold", 64)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
        raise ConfigurationError(f"parallel_optimizer_threshold must be an int >= 0 (KB), got {threshold!r}")
    size = value.get("optimizer_weight_shard_size", -1)
    if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
        raise ConfigurationError(f"optimizer_weight_shard_size must be a positive int or -1, got {size!r}")
    level = value.get("optimizer_level", "level2" if shard else "level1")
    if level not in ("level1", "level2", "level3"):
        raise ConfigurationError(f"optimizer_level should be in ['level1', 'level2', 'level3'], but got {level!r}")
    if shard and level != "level2":
        raise ConfigurationError(
            f"parallel_optimizer_config: gradient_accumulation_shard=True shards the accumulated gradients, which is "
            f"optimizer_level 'level2', but optimizer_level is {level!r}; drop one of the two"
        )
    return dict(value)


def optimizer_shard_config() -> tuple[str, int, int] | None:
    """(optimizer_level, threshold in KB, shard size) when optimizer parallel is on (enable_parallel_optimizer),
    else None."""
    if not _parallel["enable_parallel_optimizer"]:
        return None
    config = _parallel["parallel_optimizer_config"] or {}
    shard = config.get("gradient_accumulation_shard", False)
    level = config.get("optimizer_level", "level2" if shard else "level1")
    return level, config.get("parallel_optimizer_threshold", 64), config.get("optimizer_weight_shard_size", -1)


def _not_supported(what: str, why: str) -> Exception:
    from tessel.common.support import not_supported_yet

    return not_supported_yet(what, why)


def _check_parallel_against_world() -> None:
    """device_num and global_rank describe the running job: set to anything else, the job would silently differ."""
    if _bound_daemon is None or _bound_daemon[3] <= 1:
        return  # a world of 1 may plan for device_num devices (tessel.parallel.explain)
    world = _bound_daemon[3]
    if "device_num" in _explicit and _parallel["device_num"] != world:
        raise ConfigurationError(
            f"set_auto_parallel_context(device_num={_parallel['device_num']}): the job has {world} ranks; "
            "device_num must be the number of ranks (or left unset)"
        )
    if "global_rank" in _explicit:
        from tessel.communication import runtime

        rank = runtime.current().rank if runtime.is_initialized() else None
        if rank is not None and _parallel["global_rank"] != rank:
            raise ConfigurationError(
                f"set_auto_parallel_context(global_rank={_parallel['global_rank']}): this process is rank {rank}; "
                "the launcher assigns ranks (leave global_rank unset)"
            )


def _dataset_strategy(value: Any) -> Any:
    from tessel.parallel.layout import TensorLayout

    if isinstance(value, str) and value in ("data_parallel", "full_batch"):
        return value
    if isinstance(value, (tuple, list)) and value and all(isinstance(s, TensorLayout) for s in value):
        return tuple(value)  # MindSpore's Layout form: one tensor layout per column
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
    before = {key: _parallel[key] for key in ("device_num", "global_rank")}, set(_explicit)
    for key, value in kwargs.items():
        if key == "auto_parallel_search_mode":  # MindSpore's older name
            key = "search_mode"
        if key not in _PARALLEL_DEFAULTS:
            raise ConfigurationError(
                f"set_auto_parallel_context: unknown option {key!r}; options: {sorted(_PARALLEL_DEFAULTS)}"
            )
        value = _validate_parallel(key, value)
        _refuse_unsupported(key, value, _PARALLEL_DEFAULTS[key], _PARALLEL_NOT_SUPPORTED)
        if key == "force_fp32_communication" and value != _parallel[key] and "tessel.common.engine" in sys.modules:
            sys.modules["tessel.common.engine"].check_fp32_communication_change(value)
        _parallel[key] = value
        _explicit.add(key)
        _sync_strategy_files(key, value)
    if {"device_num", "global_rank"} & set(kwargs):
        try:
            _check_parallel_against_world()
        except ConfigurationError:
            _parallel.update(before[0])  # a refused value is not kept
            _explicit.intersection_update(before[1])
            raise
    # full_batch and dataset_strategy describe the same thing; keep them consistent.
    if "full_batch" in kwargs and "dataset_strategy" not in kwargs:
        _parallel["dataset_strategy"] = "full_batch" if _parallel["full_batch"] else "data_parallel"
    if "dataset_strategy" in kwargs:
        _parallel["full_batch"] = _parallel["dataset_strategy"] == "full_batch"


_STRATEGY_CKPT_DEFAULTS = {"load_file": "", "save_file": "", "only_trainable_params": True}


def _sync_strategy_files(key: str, value: Any) -> None:
    """strategy_ckpt_config and the older strategy_ckpt_load_file / _save_file set the same files (in MindSpore,
    the same fields): the last one set wins."""
    if key == "strategy_ckpt_config":
        _parallel["strategy_ckpt_load_file"] = value["load_file"]
        _parallel["strategy_ckpt_save_file"] = value["save_file"]
    elif key in ("strategy_ckpt_load_file", "strategy_ckpt_save_file"):
        field = "load_file" if key.endswith("load_file") else "save_file"
        _parallel["strategy_ckpt_config"] = {**_parallel["strategy_ckpt_config"], field: value}


def get_auto_parallel_context(attr_key: str) -> Any:
    """One parallel option; device_num and global_rank default to the running world once it is initialised."""
    if attr_key == "auto_parallel_search_mode":  # MindSpore's older name
        attr_key = "search_mode"
    if attr_key not in _PARALLEL_DEFAULTS:
        raise ConfigurationError(f"get_auto_parallel_context: unknown option {attr_key!r}")
    if attr_key in ("device_num", "global_rank") and attr_key not in _explicit:
        from tessel.communication import runtime

        if runtime.is_initialized():
            rt = runtime.current()
            return rt.world_size if attr_key == "device_num" else rt.rank
    value = _parallel[attr_key]
    return dict(value) if isinstance(value, dict) else value


def reset_auto_parallel_context() -> None:
    """Every parallel option back to its default."""
    _parallel.clear()
    _parallel.update(_PARALLEL_DEFAULTS)
    _explicit.clear()
