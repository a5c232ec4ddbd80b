"""tessel — MindSpore's programming model on ONNX Runtime daemons: write `import tessel as ms`.

    import tessel as ms
    from tessel import nn, ops
    import tessel.dataset as ds

    ms.set_context(mode=ms.GRAPH_MODE)
    net = nn.SequentialCell(nn.Flatten(), nn.Dense(784, 512), nn.ReLU(), nn.Dense(512, 10))
    model = ms.Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9), metrics={"accuracy"})
    model.train(3, ds.MnistDataset(path).map(...).batch(32), callbacks=[ms.train.LossMonitor(100)])

Names load on first use, so processes that only import a part of tessel (the daemon, the CLI) stay light.
"""

from __future__ import annotations

import atexit
import importlib
import sys
from typing import Any

from tessel.core import hooks as _hooks

_SUBMODULES = {
    "amp",
    "autograd",
    "common",
    "communication",
    "context",
    "dataset",
    "mint",
    "nn",
    "ops",
    "parallel",
    "profiler",
    "runtime",
    "train",
}
_DTYPES = {
    "bool_",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "float16",
    "float32",
    "float64",
    "half",
    "single",
    "double",
    "dtype_to_nptype",
    "pytype_to_dtype",
}
_PARALLEL_NAMES = {
    "set_algo_parameters",
    "get_algo_parameters",
    "reset_algo_parameters",
    "rank_list_for_transform",
    "transform_checkpoint_by_rank",
    "transform_checkpoints",
    "shard",
    "Layout",
    "parameter_broadcast",
    "load_segmented_checkpoints",
    "unified_safetensors",
    "load_distributed_checkpoint",
    "merge_sliced_parameter",
    "restore_group_info_list",
    "build_searched_strategy",
    "set_op_strategy_config",
    "rank_list_for_convert",
    "convert_checkpoint_by_rank",
    "convert_checkpoints",
    "merge_pipeline_strategys",
    "sync_pipeline_shared_parameters",
}
# mindspore.train's names MindSpore re-exports at the top level (`from mindspore.train import *`) that tessel has
_TRAIN_NAMES = {
    "Accuracy",
    "Callback",
    "CheckpointConfig",
    "ConfusionMatrix",
    "EarlyStopping",
    "F1",
    "Fbeta",
    "Precision",
    "Recall",
    "History",
    "LambdaCallback",
    "LearningRateScheduler",
    "Loss",
    "LossMonitor",
    "MAE",
    "MSE",
    "Metric",
    "ModelCheckpoint",
    "ReduceLROnPlateau",
    "RunContext",
    "TimeMonitor",
    "Top1CategoricalAccuracy",
    "Top5CategoricalAccuracy",
    "TopKCategoricalAccuracy",
    "rearrange_inputs",
}
# mindspore.runtime's names MindSpore re-exports at the top level (the same objects)
_RUNTIME_NAMES = {
    "Event",
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
}
_NAMES = {
    "Tensor": "tessel.common.tensor",
    "tensor": "tessel.common.tensor",
    "from_numpy": "tessel.common.tensor",
    "is_tensor": "tessel.common.tensor",
    "set_device": "tessel.context",
    "build_train_network": "tessel.amp",
    "Parameter": "tessel.common.parameter",
    "ParameterTuple": "tessel.common.parameter",
    "Symbol": "tessel.common.symbol",
    "lazy_inline": "tessel.common.lazy_inline",
    "set_seed": "tessel.common.seed",
    "get_seed": "tessel.common.seed",
    "Generator": "tessel.common.generator",
    "default_generator": "tessel.common.generator",
    "seed": "tessel.common.generator",
    "manual_seed": "tessel.common.generator",
    "run_check": "tessel.common.run_check",
    "set_deterministic": "tessel.common.run_check",
    "initial_seed": "tessel.common.generator",
    "get_rng_state": "tessel.common.generator",
    "set_rng_state": "tessel.common.generator",
    "jit": "tessel.common.compiled",
    "jit_class": "tessel.common.compiled",
    "recompute": "tessel.common.recompute",
    "set_context": "tessel.context",
    "get_context": "tessel.context",
    "GRAPH_MODE": "tessel.context",
    "PYNATIVE_MODE": "tessel.context",
    "ParallelMode": "tessel.context",
    "set_auto_parallel_context": "tessel.context",
    "get_auto_parallel_context": "tessel.context",
    "reset_auto_parallel_context": "tessel.context",
    "value_and_grad": "tessel.autograd",
    "grad": "tessel.autograd",
    "GradOperation": "tessel.autograd",
    "Model": "tessel.train.model",
    "LossScaleManager": "tessel.train.loss_scale_manager",
    "FixedLossScaleManager": "tessel.train.loss_scale_manager",
    "DynamicLossScaleManager": "tessel.train.loss_scale_manager",
    "Profiler": "tessel.profiler",
    "save_checkpoint": "tessel.train.serialization",
    "load_checkpoint": "tessel.train.serialization",
    "ckpt_to_safetensors": "tessel.train.convert",
    "safetensors_to_ckpt": "tessel.train.convert",
    "load_param_into_net": "tessel.train.serialization",
    "export": "tessel.train.serialization",
    **dict.fromkeys(_DTYPES, "tessel.common.dtype"),
    # mindspore.parallel's names MindSpore re-exports at the top level (its __init__.py imports them and extends
    # __all__ with parallel.__all__)
    **dict.fromkeys(_PARALLEL_NAMES, "tessel.parallel"),
    "reshard": "tessel.parallel.function",
    **dict.fromkeys(_TRAIN_NAMES, "tessel.train"),
    **dict.fromkeys(_RUNTIME_NAMES, "tessel.runtime"),
}


def _bound_interpreter_end() -> None:
    """The exit hook registered first, so run last: once a rank released its runtime at exit, what remains of the
    interpreter's end is bounded (tessel.communication.supervision); the program's own exit hooks ran before."""
    supervision = sys.modules.get("tessel.communication.supervision")
    if supervision is not None:
        supervision.bound_interpreter_end()


atexit.register(_bound_interpreter_end)


def _dataset_tensor(array: Any) -> Any:
    from tessel.common.tensor import dataset_tensor

    return dataset_tensor(array)


# Dataset iterators (output_numpy=False) yield SDK Tensors, as MindSpore's do, whatever a script imports first.
_hooks.dataset_output = _dataset_tensor


# MindSpore's other names of the dtypes tessel has (ms.bool is Bool, ms.int Int32, ms.float Float32, ...); the
# dtype module cannot define them, as they would shadow Python's bool, int and float there
_DTYPE_ALIASES = {
    "bool": "bool_",
    "int": "int32",
    "float": "float32",
    "long": "int64",
    "intp": "int64",
    "short": "int16",
    "byte": "int8",
    "ubyte": "uint8",
    "intc": "int32",
}


# MindSpore's subpackages tessel has no counterpart of: `import tessel.numpy` (or ms.numpy) says so, naming it,
# instead of "No module named 'tessel.numpy'"
_MISSING_SUBPACKAGES = {
    "boost": "MindSpore's boost (automatic acceleration) has no counterpart here",
    "dryrun": "for a dry run set MS_SIMULATION_LEVEL (or msrun --sim_level), which tessel honours",
    "device_context": "tessel's devices are configured per daemon (tessel daemon --plugin, --threads)",
    "device_manager": "tessel's devices are configured per daemon (tessel daemon --plugin, --threads)",
    "experimental": "MindSpore's experimental APIs are not mirrored",
    "hal": "use tessel.runtime (MindSpore 2.6+'s home of the same functions)",
    "log": "tessel logs through Python's logging ('tessel' logger)",
    "mindrecord": "read Arrow, Parquet or numpy data (tessel.dataset) instead of MindRecord files",
    "multiprocessing": "MindSpore's multiprocessing helpers are not mirrored",
    "numpy": "mindspore.numpy has no counterpart yet; use tessel.ops / tessel.mint functions",
    "rewrite": "MindSpore's network rewriting API is not mirrored",
    "safeguard": "MindSpore's model obfuscation is not mirrored",
    "scipy": "mindspore.scipy has no counterpart yet",
    "utils": "mindspore.utils is not mirrored",
}


class _MissingSubpackages:
    """A meta path finder: importing one of _MISSING_SUBPACKAGES raises NotSupportedYetError naming it."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> None:
        package, _, rest = fullname.partition(".")
        if package == "tessel" and rest.split(".")[0] in _MISSING_SUBPACKAGES:
            from tessel.core.options import not_supported_yet

            name = rest.split(".")[0]
            raise not_supported_yet(f"mindspore.{rest}", _MISSING_SUBPACKAGES[name])


sys.meta_path.append(_MissingSubpackages())


def __getattr__(name: str) -> Any:
    if name in _MISSING_SUBPACKAGES:
        _MissingSubpackages.find_spec(f"tessel.{name}")
    if name == "__version__":  # the installed package's
        from importlib.metadata import version

        return version("tessel")
    if name == "dtype":  # the dtype module, as mindspore.dtype (mstype)
        value: Any = importlib.import_module("tessel.common.dtype")
    elif name in _DTYPE_ALIASES:
        value = getattr(importlib.import_module("tessel.common.dtype"), _DTYPE_ALIASES[name])
    elif name in _SUBMODULES:
        value = importlib.import_module(f"tessel.{name}")
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    else:
        from tessel.common.mindspore_names import MINDSPORE
        from tessel.common.support import unsupported_names

        unsupported_names("mindspore", MINDSPORE, "tessel does not map this name yet (README: the API table)")(name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBMODULES, *_NAMES, *_DTYPE_ALIASES, "dtype"})


__all__ = sorted({*_SUBMODULES, *_NAMES, "dtype"})
