"""Checkpoint format conversion: `ckpt_to_safetensors` and `safetensors_to_ckpt`, MindSpore 2.7's.

A file path converts that file (into save_path, else beside it); a directory path converts the files of each
`rank*` subdirectory into the same subdirectory of save_path (else in place). `name_map` renames parameters
({old: new}); `file_name_regex` picks the files. The values are read with load_checkpoint and written with
save_checkpoint, so both formats are MindSpore's own (a .ckpt its protobuf with the CRC trailer).

    >>> ms.ckpt_to_safetensors("./ckpt/rank0/checkpoint_0.ckpt", "./out/")   # writes ./out/checkpoint_0.safetensors
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from tessel.common.support import log_once

__all__ = ["ckpt_to_safetensors", "safetensors_to_ckpt"]


def ckpt_to_safetensors(
    file_path: str,
    save_path: str | None = None,
    name_map: dict | None = None,
    file_name_regex: str | None = None,
    processes_num: int = 1,
) -> None:
    """Convert .ckpt checkpoints into .safetensors files (see the module docstring)."""
    _convert("ckpt_to_safetensors", file_path, save_path, name_map, file_name_regex, processes_num, "ckpt")


def safetensors_to_ckpt(
    file_path: str,
    save_path: str | None = None,
    name_map: dict | None = None,
    file_name_regex: str | None = None,
    processes_num: int = 1,
) -> None:
    """Convert .safetensors checkpoints into .ckpt files (see the module docstring)."""
    _convert("safetensors_to_ckpt", file_path, save_path, name_map, file_name_regex, processes_num, "safetensors")


def _convert(
    call: str, file_path: str, save_path: str | None, name_map: Any, regex: str | None, processes: Any, source: str
) -> None:
    target = "safetensors" if source == "ckpt" else "ckpt"
    if not os.path.isdir(file_path) and not os.path.isfile(file_path):
        raise ValueError(f"For '{call}', the input path must be a valid path or file, but got {file_path}")
    if save_path and os.path.splitext(save_path)[1]:
        raise ValueError(f"For '{call}', the save_path must be a directory, but got '{save_path}'")
    if name_map is not None and not isinstance(name_map, dict):
        raise ValueError(f"For '{call}', the type of 'name_map' must be a directory, but got '{type(name_map)}'")
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"For '{call}', 'processes_num' must be an int >= 1, but got {processes!r}")
    if processes > 1:
        log_once(
            f"{call}.processes_num",
            f"{call}: processes_num={processes} has no effect in tessel, which converts one file at a time (the same "
            "files)",
            logging.INFO,
        )
    if os.path.isfile(file_path):
        if not file_path.endswith(f".{source}"):
            raise ValueError(f"For '{call}', the input file must be a .{source} file, but got {file_path}")
        if regex is not None and not re.findall(regex, file_path):
            raise ValueError(f"For '{call}', the input file does not match the regular expression.")
        destination = save_path or os.path.dirname(file_path)
        os.makedirs(destination, exist_ok=True)
        _convert_file(file_path, destination, name_map, source, target)
        return
    ranks = sorted(
        d for d in os.listdir(file_path) if d.startswith("rank") and os.path.isdir(os.path.join(file_path, d))
    )
    if not ranks:
        raise ValueError(f"For '{call}', no directories starting with 'rank' found in {file_path}")
    for rank in ranks:
        folder = os.path.join(file_path, rank)
        destination = os.path.join(save_path, rank) if save_path else folder
        os.makedirs(destination, exist_ok=True)
        for name in sorted(os.listdir(folder)):
            if name.endswith(f".{source}") and (regex is None or re.findall(regex, name)):
                _convert_file(os.path.join(folder, name), destination, name_map, source, target)


def _convert_file(path: str, destination: str, name_map: dict | None, source: str, target: str) -> None:
    from tessel.train.serialization import load_checkpoint, save_checkpoint

    values = load_checkpoint(path, format=source)
    renamed = {(name_map or {}).get(name, name): value for name, value in values.items()}
    name = os.path.basename(path)[: -len(source)] + target
    save_checkpoint(renamed, os.path.join(destination, name), format=target)
