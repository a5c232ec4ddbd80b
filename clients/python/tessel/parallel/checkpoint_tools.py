"""The rest of `mindspore.parallel`'s checkpoint and strategy functions, over tessel's checkpoints and strategy
files (tessel.parallel.checkpoint):

- `build_searched_strategy(file)`: name -> layout record (full shape, device matrix, tensor map) of a strategy file
  (`strategy_ckpt_config={"save_file": ...}`, `AutoParallel.save_param_strategy_file`);
- `merge_sliced_parameter(slices, strategy)`: one parameter's slices (in rank order) assembled whole, by its record
  in such a strategy, or concatenated along dim 0 without one;
- `load_segmented_checkpoints(dir, net)`: every .ckpt file of a directory, merged (and loaded into `net`);
- `rank_list_for_convert`, `convert_checkpoint_by_rank`: MindSpore 2.6's names of rank_list_for_transform and
  transform_checkpoint_by_rank;
- `parameter_broadcast`, `unified_safetensors`, `restore_group_info_list`, `set_op_strategy_config`: not supported
  yet, each says why.

    >>> strategy = ms.build_searched_strategy("strategy.json")
    >>> weight = ms.merge_sliced_parameter([rank0["fc.weight"], rank1["fc.weight"]], strategy)
"""

from __future__ import annotations

import glob
import os
from typing import Any

import numpy as np

from tessel.common.support import not_supported_yet
from tessel.parallel.checkpoint import (
    layout_of,
    rank_list_for_transform,
    read_strategy_file,
    transform_checkpoint_by_rank,
)

__all__ = [
    "build_searched_strategy",
    "convert_checkpoint_by_rank",
    "load_segmented_checkpoints",
    "merge_sliced_parameter",
    "parameter_broadcast",
    "rank_list_for_convert",
    "restore_group_info_list",
    "set_op_strategy_config",
    "unified_safetensors",
]

rank_list_for_convert = rank_list_for_transform
convert_checkpoint_by_rank = transform_checkpoint_by_rank


def build_searched_strategy(strategy_filename: str) -> dict[str, dict]:
    """name -> the layout record (full "shape", "device_matrix", "tensor_map") of every parameter in a strategy file
    tessel wrote (MindSpore returns its ParallelLayouts protobufs; merge_sliced_parameter takes either's role)."""
    if not isinstance(strategy_filename, str):
        raise TypeError(
            f"For 'build_searched_strategy', the argument 'strategy_filename' should be str, "
            f"but got {type(strategy_filename)}."
        )
    return read_strategy_file(strategy_filename)


def merge_sliced_parameter(sliced_parameters: list, strategy: dict | None = None) -> Any:
    """One Parameter from its slices in rank order: assembled by `strategy[name]` (a record of
    build_searched_strategy), or concatenated along dim 0 without a strategy (MindSpore `merge_sliced_parameter`)."""
    from tessel.common.parameter import Parameter
    from tessel.compiler.parallel import assemble

    if not isinstance(sliced_parameters, list):
        raise TypeError(
            f"For 'merge_sliced_parameter', the argument 'sliced_parameters' should be list, "
            f"but got {type(sliced_parameters)}."
        )
    if not sliced_parameters:
        raise ValueError("For 'merge_sliced_parameter', the argument 'sliced_parameters' should not be empty.")
    if strategy and not isinstance(strategy, dict):
        raise TypeError(
            f"For 'merge_sliced_parameter', the argument 'strategy' should be dict, but got {type(strategy)}."
        )
    first = sliced_parameters[0]
    for index, parameter in enumerate(sliced_parameters):
        if not isinstance(parameter, Parameter):
            raise TypeError(
                f"For 'merge_sliced_parameter', the element in 'sliced_parameters' should be "
                f"'Parameter', but got {type(parameter)} at index {index}."
            )
        if parameter.name != first.name or tuple(parameter.shape[1:]) != tuple(first.shape[1:]):
            raise ValueError(
                f"For 'merge_sliced_parameter', please make sure that the elements in 'slice_parameters' have the "
                f"same name, dimension length and shape except 0 axis; got {parameter.name} {tuple(parameter.shape)} "
                f"at index {index} after {first.name} {tuple(first.shape)}"
            )
    pieces = [np.asarray(p.asnumpy()) for p in sliced_parameters]
    if not strategy:
        whole = np.concatenate(pieces)
    else:
        if first.name not in strategy:
            raise KeyError(
                f"For 'merge_sliced_parameter', the parameter name {first.name} should be a key in the "
                "'strategy'. Please check 'sliced_parameter' and 'strategy'."
            )
        record = strategy[first.name]
        layout = layout_of(record)
        if len(pieces) != layout.device_num:
            raise ValueError(
                f"For 'merge_sliced_parameter', {first.name} is cut over {layout.device_num} ranks "
                f"({layout.describe()}), but {len(pieces)} slices were given; give one per rank"
            )
        whole = assemble(pieces, layout, tuple(record["shape"]))
    return Parameter(whole, first.name, first.requires_grad)


def load_segmented_checkpoints(
    ckpt_file_dir: str,
    net: Any = None,
    strict_load: bool = False,
    filter_prefix: Any = None,
    dec_key: Any = None,
    dec_mode: str = "AES-GCM",
    specify_prefix: Any = None,
    choice_func: Any = None,
) -> dict:
    """Every .ckpt file in `ckpt_file_dir` loaded (into `net` too, when given) and merged into one dict (MindSpore
    `load_segmented_checkpoints`); a file with parameters of another holds them after it."""
    from tessel.train.serialization import load_checkpoint

    if not isinstance(ckpt_file_dir, str):
        raise TypeError("The ckpt_file_dir should be a str.")
    if not os.path.isdir(ckpt_file_dir):
        raise ValueError(f"The dst_strategy_file: {ckpt_file_dir} doesn't exist. Or it's not a directory")
    if dec_key is not None:
        raise not_supported_yet("load_segmented_checkpoints(dec_key=...)", "tessel's checkpoints are not encrypted")
    merged: dict = {}
    for path in sorted(glob.glob(os.path.join(ckpt_file_dir, "*.ckpt"))):
        loaded = load_checkpoint(path, net, strict_load, filter_prefix, dec_key, dec_mode, specify_prefix, choice_func)
        merged.update(loaded)
    return merged


def parameter_broadcast(net: Any, layout: dict, cur_rank: int = 0, initial_rank: int = 0) -> None:
    """MindSpore broadcasts every parameter over its data-parallel replicas. On one rank, or with an empty layout,
    there is nothing to broadcast (as in MindSpore); otherwise not supported yet."""
    from tessel.communication import get_group_size

    if not layout or get_group_size() <= 1:
        return
    raise not_supported_yet(
        "parameter_broadcast over several ranks",
        "tessel does not broadcast replicas; every rank draws each parameter from the same seed (ms.set_seed) and "
        "load_param_into_net gives every replica the checkpoint's value, so replicas start equal",
    )


def unified_safetensors(src_dir: str, src_strategy_file: str, dst_dir: str, *args: Any, **kwargs: Any) -> None:
    raise not_supported_yet(
        "unified_safetensors",
        "tessel's checkpoints are checksummed safetensors files of its own; merge slices with transform_checkpoints",
    )


def restore_group_info_list(group_info_file_name: str) -> list:
    raise not_supported_yet(
        "restore_group_info_list",
        "tessel writes no group information files (AutoParallel.set_group_ckpt_save_file is not supported either)",
    )


def set_op_strategy_config(mode: str = "SAVE", path: str = "") -> None:
    raise not_supported_yet(
        "set_op_strategy_config",
        "operator strategy files are not separate in tessel: strategy_ckpt_config (or "
        "AutoParallel.save_param_strategy_file) saves and loads every graph's op strategies with the layouts",
    )
