"""`mindspore.parallel`'s pipeline-parallel functions, over tessel's stages (tessel.parallel.pipeline) and strategy
files (tessel.parallel.planning, tessel.parallel.checkpoint):

- `sync_pipeline_shared_parameters(net)`: every parameter that cells on several stages use (an embedding table read
  by the first stage's embedding and the last stage's head) takes, on every rank holding it, the value the first
  stage holding it has. Training keeps such parameters in sync by itself (their gradients are summed over the
  stages); this is for a value changed on one stage afterwards. As in MindSpore the network is compiled first
  (`net.compile(*inputs)` or a call), and every rank of the job calls it (it is a collective).
- `merge_pipeline_strategys(src_strategy_dirs, dst_strategy_file)`: the strategy files of a directory (those
  `strategy_ckpt_config={"save_file": ...}` / `strategy_ckpt_save_file` / `AutoParallel.save_param_strategy_file`
  write, one per stage or one for all) merged into one. tessel's rank 0 already records every stage's parameters in
  its file, so a directory of that one file merges into a copy of it.

    >>> ms.sync_pipeline_shared_parameters(inference_net)
    >>> ms.merge_pipeline_strategys("./strategies", "./merged/strategy.json")
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError

__all__ = ["merge_pipeline_strategys", "sync_pipeline_shared_parameters"]


def sync_pipeline_shared_parameters(net: Any) -> None:
    """Give each parameter held by several pipeline stages the first holding stage's value on every rank that
    holds it (see the module docstring). Without pipeline stages (or on one rank) nothing is shared: no-op."""
    from tessel.common.engine import engine
    from tessel.communication import comm_func
    from tessel.nn.cell import Cell
    from tessel.parallel import pipeline
    from tessel.parallel.checkpoint import gather, load_value, world_size

    if not isinstance(net, Cell):
        raise TypeError(
            f"For 'sync_pipeline_shared_parameters', the argument 'net' should be a Cell, but got {type(net)}."
        )
    world = world_size()
    if pipeline.stages() == 1 or world == 1:
        return
    params = list(net.get_parameters())  # the same order on every rank
    eng = engine().id
    placed = [p for p in params if p._pipeline is not None and p._pipeline[0] == eng]
    if not placed:
        raise ConfigurationError(
            f"sync_pipeline_shared_parameters({type(net).__name__}): the network has not been compiled on the "
            "pipeline stages yet; the rule: the network is compiled before shared parameters are synchronized (as "
            "in MindSpore). Fix: call net.compile(*inputs) (or run it once) first"
        )
    devices = world // pipeline.stages()
    mine = np.array([p.held for p in placed], np.int32)
    holders = comm_func.all_gather_into_tensor(mine)[0].asnumpy().reshape(world, len(placed))
    shared = [p for i, p in enumerate(placed) if len({int(r) // devices for r in np.flatnonzero(holders[:, i])}) > 1]
    if not shared:
        return
    values = gather([(p.name, p) for p in shared])  # each whole, from the first stage holding it (a collective)
    for p in shared:
        if p.held:
            load_value(p, values[p.name], None, None)


def merge_pipeline_strategys(src_strategy_dirs: str, dst_strategy_file: str) -> None:
    """Merge the strategy files in `src_strategy_dirs` into `dst_strategy_file` (see the module docstring). A
    parameter or graph recorded differently by two files is an error naming both."""
    from tessel.parallel.checkpoint import STRATEGY_FORMAT
    from tessel.parallel.planning import FORMAT
    from tessel.train.serialization import atomic_write

    for arg, value in (("src_strategy_dirs", src_strategy_dirs), ("dst_strategy_file", dst_strategy_file)):
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(
                f"For 'merge_pipeline_strategys', the argument '{arg}' should be str, but got {type(value)}."
            )
    folder = os.fspath(src_strategy_dirs)
    if not os.path.isdir(folder):
        raise NotADirectoryError(f"For 'merge_pipeline_strategys', {folder!r} is not a directory.")
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if os.path.isfile(os.path.join(folder, f)))
    if not files:
        raise ConfigurationError(
            f"merge_pipeline_strategys: {folder!r} holds no strategy files. Fix: save them there with "
            "set_auto_parallel_context(strategy_ckpt_config={'save_file': ...}) first"
        )
    merged: dict[str, Any] = {}
    origin: dict[tuple[str, str], str] = {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as source:
                document = json.load(source)
        except ValueError:
            document = None
        kind = document.get("format") if isinstance(document, dict) else None
        if kind not in (FORMAT, STRATEGY_FORMAT):
            raise ConfigurationError(
                f"merge_pipeline_strategys: {path!r} is not a strategy file tessel wrote ({FORMAT} or "
                f"{STRATEGY_FORMAT}); the rule: the directory holds only the stages' strategy files. Fix: move other "
                "files out of it"
            )
        if merged and merged["format"] != kind:
            raise ConfigurationError(
                f"merge_pipeline_strategys: {path!r} is a {kind} file but the files before it are {merged['format']}; "
                "merge files of one kind"
            )
        merged.setdefault("format", kind)
        for section in ("parameters", "graphs"):
            if section not in document:
                continue
            into = merged.setdefault(section, {})
            for name, record in document[section].items():
                if name in into and into[name] != record:
                    raise ConfigurationError(
                        f"merge_pipeline_strategys: {section[:-1]} {name!r} is recorded differently in "
                        f"{origin[(section, name)]!r} and {path!r}; the files must come from one job"
                    )
                into[name] = record
                origin.setdefault((section, name), path)
    atomic_write(os.fspath(dst_strategy_file), json.dumps(merged, indent=1, sort_keys=True).encode())
