"""Checkpoints of sliced parameters (SEMI_AUTO/AUTO_PARALLEL), MindSpore's way:

- `save_checkpoint(net, path)` (integrated_save=True, the default) gathers every sliced parameter and writes the
  full values once per distinct path; with integrated_save=False each rank writes its slices plus the layout each
  was cut with (in the file's metadata). Saving is a collective: every rank calls it; a rank that does not is
  named in a clear error within the rendezvous deadline ($TESSEL_CHECKPOINT_TIMEOUT, 60 s), never a deadlock.
- `load_checkpoint` + `load_param_into_net` load a full checkpoint into any world size and strategy (each rank
  keeps its slice); a rank's slice file loads back into the same slice; `load_distributed_checkpoint` assembles a
  set of sliced files into any other world size or strategy; `transform_checkpoints` / `convert_checkpoints` /
  `transform_checkpoint_by_rank` rewrite sliced checkpoints offline for another strategy file.
- Strategy files (`strategy_ckpt_config={"save_file": ...}`, `AutoParallel.save_param_strategy_file`) are JSON:
  each parameter's full shape, device matrix and tensor map.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError

STRATEGY_FORMAT = "tessel-parameter-strategy-1"
_saves = itertools.count()


# --- layouts as records -------------------------------------------------------------------------------------------


def layout_record(layout: Any, shape: Sequence[int]) -> dict:
    return {"shape": list(shape), "device_matrix": list(layout.device_matrix), "tensor_map": _plain(layout.tensor_map)}


def _plain(tensor_map: Sequence) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in tensor_map]


def layout_of(record: Mapping) -> Any:
    from tessel.compiler.parallel import Layout

    tensor_map = tuple(tuple(e) if isinstance(e, list) else e for e in record["tensor_map"])
    return Layout(tuple(record["device_matrix"]), tensor_map)


def save_strategy_file(params: Iterable[Any], path: str) -> None:
    """Write every laid-out parameter's layout (by name) as JSON."""
    from tessel.train.serialization import atomic_write

    records = {p.name: layout_record(p.layout, p.shape) for p in params if p.layout is not None}
    document = {"format": STRATEGY_FORMAT, "parameters": records}
    atomic_write(os.fspath(path), json.dumps(document, indent=1, sort_keys=True).encode())


def read_strategy_file(path: str) -> dict[str, dict]:
    """name -> layout record of a strategy file (a clear error for anything else)."""
    try:
        with open(path) as source:
            document = json.load(source)
    except FileNotFoundError:
        raise ConfigurationError(f"strategy file {path!r} does not exist") from None
    except ValueError:
        raise ConfigurationError(f"strategy file {path!r} is not JSON; write it with save_strategy_file") from None
    if not isinstance(document, dict) or document.get("format") != STRATEGY_FORMAT:
        raise ConfigurationError(f"strategy file {path!r} was not written by tessel ({STRATEGY_FORMAT})")
    return document["parameters"]


# --- saving -------------------------------------------------------------------------------------------------------


def sliced(values: Iterable[Any]) -> bool:
    """True when some value is a parameter this rank holds a slice of, in a world of several ranks."""
    from tessel.common.parameter import Parameter

    return any(isinstance(v, Parameter) and v.layout is not None and world_size() > 1 for v in values)


def world_size() -> int:
    from tessel.communication import runtime

    return runtime.current().world_size if runtime.is_initialized() else 1


def rendezvous(what: str) -> None:
    """Every rank reaches this point, or a clear error naming the ones missing (never a wait without end)."""
    from tessel.communication import runtime

    rt = runtime.current()
    if rt.coordinator is None or rt.world_size == 1:
        return
    timeout = float(os.environ.get("TESSEL_CHECKPOINT_TIMEOUT", "60"))
    rt.coordinator.barrier(rt.job_id, f"{what}#{next(_saves)}", rt.rank, timeout_s=timeout)


def gather(named: Sequence[tuple[str, Any]]) -> dict[str, np.ndarray]:
    """name -> full value; each sliced parameter all-gathered from every rank and assembled (a collective). Under
    pipeline parallel a parameter's slices come from the ranks of a stage that holds it (the others send zeros)."""
    from tessel.common.parameter import Parameter
    from tessel.communication import comm_func
    from tessel.compiler.parallel import assemble
    from tessel.train.serialization import contiguous

    world, out = world_size(), {}
    sliced_ = [v for _, v in named if isinstance(v, Parameter) and v.layout is not None and world > 1]
    holders = None
    if any(v._pipeline is not None for v in sliced_):  # which ranks hold which parameter
        mine = np.array([v.held for v in sliced_], np.int32)
        holders = comm_func.all_gather_into_tensor(mine)[0].asnumpy().reshape(world, len(sliced_))
    index = 0
    for name, value in named:
        if not (isinstance(value, Parameter) and value.layout is not None and world > 1):
            out[name] = contiguous(value.asnumpy() if hasattr(value, "asnumpy") else value)
            continue
        shape = value.layout.local_shape(tuple(value.shape))
        local = np.asarray(value.asnumpy() if value.held else np.zeros(shape, value.dtype.numpy), order="C")
        everyone = comm_func.all_gather_into_tensor(local.reshape(-1))[0].asnumpy()
        pieces = [piece.reshape(local.shape) for piece in np.split(everyone, world)]
        if holders is not None:  # the pieces of the first stage holding it (stages hold layout.mesh.size ranks)
            devices = value.layout.mesh.size
            first = int(np.flatnonzero(holders[:, index])[0]) // devices * devices
            pieces = pieces[first : first + devices]
        out[name] = assemble(pieces, value.layout, tuple(value.shape))
        index += 1
    return out


def _paths(path: str) -> tuple[int, list[int]]:
    """This rank's digest of `path` and every rank's (a collective)."""
    from tessel.communication import comm_func

    digest = int.from_bytes(hashlib.blake2b(os.path.abspath(path).encode(), digest_size=6).digest(), "little")
    return digest, comm_func.all_gather_into_tensor(np.array([digest], np.int64))[0].asnumpy().tolist()


def first_writer(path: str) -> bool:
    """True on the lowest rank that asked to write `path` (a full checkpoint is written once per path)."""
    from tessel.communication.runtime import current

    digest, everyone = _paths(path)
    return everyone.index(digest) == current().rank


def own_path(path: str, call: str) -> None:
    """Every rank writes a file of its own (a collective; all ranks raise together if two share a path)."""
    _, everyone = _paths(path)
    shared = sorted({r for r, d in enumerate(everyone) if everyone.count(d) > 1})
    if shared:
        raise ConfigurationError(
            f"{call}: ranks {shared} write the same file (this rank: {path!r}); each rank writes its own share, so "
            "give each its own path, e.g. os.path.join(directory, f'rank_{get_rank()}', 'net.ckpt')"
        )


def slice_metadata(named: Sequence[tuple[str, Any]]) -> dict[str, str]:
    """The metadata of a rank's slice file: which rank, of how many, and each sliced tensor's layout."""
    from tessel.common.parameter import Parameter
    from tessel.communication.runtime import current

    rt = current()
    layouts = {}
    for name, v in named:
        if isinstance(v, Parameter) and v.layout is not None:
            layouts[name] = layout_record(v.layout, v.shape)
            if v._pipeline is not None:  # cut over the ranks of this rank's stage (as gather assembles them)
                devices = v.layout.mesh.size
                first = rt.rank // devices * devices
                layouts[name]["ranks"] = list(range(first, first + devices))
    return {"layouts": json.dumps(layouts), "rank": str(rt.rank), "world": str(rt.world_size)}


# --- redundancy removed (remove_redundancy=True) -------------------------------------------------------------------


def copy_groups(value: Any, world: int) -> tuple[tuple[int, ...], ...]:
    """The groups of ranks that hold the same piece of `value`, in the order of the pieces (MindSpore's
    get_parameter_redundancy for this job): a parameter no layout cuts is one group of every rank."""
    layout = getattr(value, "layout", None)
    if layout is None or world == 1:
        return (tuple(range(world)),)
    pieces: dict[tuple, list[int]] = {}
    for rank in range(world):
        pieces.setdefault(_place(layout, tuple(value.shape), rank), []).append(rank)
    return tuple(tuple(ranks) for _, ranks in sorted(pieces.items()))


def _place(layout: Any, shape: tuple[int, ...], index: int) -> tuple[tuple[int, int], ...]:
    """Where the piece of mesh place `index` sits in the whole tensor (equal places: the same piece)."""
    return tuple((s.start, s.stop) for s in layout.local_slices(shape, index))


def _local_shape(param: Any) -> tuple[int, ...]:
    return param.layout.local_shape(tuple(param.shape)) if param.layout is not None else tuple(param.shape)


def _check_redundancy_scope(call: str, named: Sequence[tuple[str, Any]]) -> None:
    from tessel.common.support import not_supported_yet

    world = world_size()
    for name, value in named:
        if getattr(value, "_pipeline", None) is not None:
            raise not_supported_yet(
                f"{call}(remove_redundancy=True) under pipeline parallel ({name!r} belongs to a stage)",
                "save each rank's slices with integrated_save=False instead",
            )
        if getattr(value, "layerwise_parallel", False):
            raise not_supported_yet(
                f"{call}(remove_redundancy=True) with layerwise_parallel parameters ({name!r} differs from rank to "
                "rank)",
                "save each rank's values with remove_redundancy=False",
            )
        layout = getattr(value, "layout", None)
        if layout is not None and (layout.device_num != world or layout.partial):
            raise not_supported_yet(
                f"{call}(remove_redundancy=True) for {name!r}, laid out as {layout} over {world} ranks",
                "save each rank's slices with integrated_save=False instead",
            )


def local_array(value: Any) -> np.ndarray:
    """This rank's piece of a checkpoint value: a laid-out parameter whose host copy is still the whole value (never
    fetched back: frozen, or not run yet) gives its slice."""
    from tessel.compiler.parallel import piece
    from tessel.train.serialization import contiguous

    array = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
    layout = getattr(value, "layout", None)
    if layout is not None and tuple(array.shape) == tuple(value.shape) != layout.local_shape(value.shape):
        from tessel.common.engine import engine
        from tessel.common.parameter import layout_rank

        array = piece(array, layout, layout_rank(engine()))
    return contiguous(array)


def without_redundancy(named: Sequence[tuple[str, Any]]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """What this rank writes when redundancy is removed: of each group of ranks holding the same piece, one writes
    it; the group's parameters go to its ranks in turn (MindSpore's remove_param_redundancy), so the files of all
    ranks hold every piece once. Returns this rank's arrays and its file's metadata."""
    from tessel.communication.runtime import current

    _check_redundancy_scope("save_checkpoint", named)
    rank, world = current().rank, world_size()
    turns: dict[tuple[int, ...], int] = {}
    mine = []
    for name, value in named:
        owners = []
        for group in copy_groups(value, world):
            turn = turns.get(group, 0)
            turns[group] = turn + 1
            owners.append(group[turn % len(group)])
        if rank in owners:
            mine.append((name, value))
    arrays = {name: local_array(value) for name, value in mine}
    return arrays, {**slice_metadata(mine), REDUNDANCY_REMOVED: "true"}


REDUNDANCY_REMOVED = "remove_redundancy"  # the metadata key of a file saved with remove_redundancy=True


def _unfit(entry: Any, param: Any, strict_load: bool) -> str:
    """Why a value of this rank's file cannot be this rank's piece of `param` ('' when it can)."""
    array = entry.asnumpy() if hasattr(entry, "asnumpy") else np.asarray(entry)
    saved = getattr(entry, "_saved", (None, None))[0]
    layout = param.layout
    if saved is not None and layout is None:
        return (
            f"saved as a slice ({layout_of(saved)}) but not laid out in this network yet: compile the network first "
            "(model.build(...), or one step), with the strategy it was saved with"
        )
    if saved is not None and not layout_of(saved).same_as(layout):
        return f"saved as a slice of {layout_of(saved)}, laid out here as {layout}"
    local = _local_shape(param)
    if saved is None and local != tuple(param.shape):
        return f"saved whole, laid out here as {layout}"
    if tuple(array.shape) != local:
        return f"{tuple(array.shape)} in the file, this rank's piece is {local}"
    if strict_load and array.dtype != param.dtype.numpy:
        return f"{array.dtype} in the file, {param.dtype.numpy} in the network (strict_load=True keeps dtypes)"
    return ""


def saved_by(parameter_dict: Mapping[str, Any]) -> set[tuple[int, int]]:
    """The (rank, world size) of the files saved with remove_redundancy=True that `parameter_dict` came from: the
    dict's own (load_checkpoint's, known even when the file holds no value) and each value's."""
    shares = {getattr(v, "_saved_by", None) for v in parameter_dict.values()}
    return (shares | {getattr(parameter_dict, "saved_by", None)}) - {None}


def _names_digest(named: Sequence[tuple[str, Any]]) -> int:
    text = json.dumps([(name, list(param.shape)) for name, param in named])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=6).digest(), "little")


def load_without_redundancy(
    net: Any, parameter_dict: Mapping[str, Any], strict_load: bool = False
) -> tuple[list[str], list[str]]:
    """Load files saved with remove_redundancy=True (a collective: every rank loads its own file, into the network
    of the job that saved them, compiled): each piece comes from a rank of its group whose file holds it.

    Every rank first checks its own file against its network and one all-gathered table says what each rank holds
    and whether it fits, so that any problem is an error on every rank before any value moves. A parameter no
    rank's file holds is returned as not loaded. Returns (net params not loaded, names unused)."""
    from tessel.communication import comm_func
    from tessel.communication.runtime import current

    named = [(p.name, p) for p in net.get_parameters()]
    _check_redundancy_scope("load_checkpoint", named)
    rendezvous("load_checkpoint")
    rank, world = current().rank, world_size()
    codes, reasons = [], {}
    for name, param in named:
        entry = parameter_dict.get(name)
        why = "" if entry is None else _unfit(entry, param, strict_load)
        codes.append(0 if entry is None else 2 if why else 1)  # 0: not in my file, 1: fits, 2: does not fit
        if why:
            reasons[name] = why
    foreign = next((r for r, _ in saved_by(parameter_dict) if r != rank), -1)  # the file another rank saved
    row = np.array([*codes, foreign, _names_digest(named)], np.int64)
    table = comm_func.all_gather_into_tensor(row)[0].asnumpy().reshape(world, -1)
    codes_of, problems = table[:, :-2], []
    if len(set(table[:, -1].tolist())) > 1:
        problems.append("the ranks' networks differ (their parameters' names or shapes)")
    problems += [f"rank {r} was given rank {table[r, -2]}'s file" for r in range(world) if table[r, -2] not in (-1, r)]
    for r in range(world):
        unfit = [named[i][0] for i in np.flatnonzero(codes_of[r] == 2)] if codes_of.shape[1] else []
        if unfit:
            detail = f" ({reasons[unfit[0]]})" if r == rank else ""
            problems.append(f"rank {r}'s file does not fit {unfit[0]!r}{detail}")
    plan, not_loaded = [], []
    for i, (name, param) in enumerate(named):
        if not (codes_of[:, i] == 1).any():
            not_loaded.append(name)
            continue
        groups = copy_groups(param, world)
        source = [next((r for r in group if codes_of[r, i] == 1), None) for group in groups]
        lacking = [list(group) for group, r in zip(groups, source) if r is None]
        if lacking:
            problems.append(f"{name!r}: no file of ranks {lacking[0]} holds their piece")
        plan.append((param, groups, source))
    if problems:  # every rank read the same table: all raise together, before any value moves
        raise ConfigurationError(
            "load_checkpoint(remove_redundancy=True): "
            + "; ".join(problems[:5])
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
            + ". Each rank loads the file it saved with remove_redundancy=True, into this network compiled with the "
            "same world size and strategy"
        )
    values = []
    for param, groups, source in plan:
        local = _local_shape(param)
        entry = parameter_dict.get(param.name)
        value = np.zeros(local, param.dtype.numpy)
        if entry is not None:
            value = np.asarray(local_array(entry), dtype=param.dtype.numpy, order="C")  # 0-d stays 0-d
        if len(groups) == 1:
            got = comm_func.broadcast(value, source[0]).asnumpy()
        else:
            everyone = comm_func.all_gather_into_tensor(value.reshape(-1))[0].asnumpy()
            group = next(g for g in range(len(groups)) if rank in groups[g])
            got = np.split(everyone, world)[source[group]].reshape(local)
        values.append((param, got))
    for param, got in values:  # after the last collective: a failure here leaves no rank waiting
        saved = layout_record(param.layout, param.shape) if param.layout is not None else None
        load_value(param, got, saved, rank if saved is not None else None)
    names = {name for name, _ in named}
    if not_loaded:
        logging.getLogger("tessel").warning(
            "load_checkpoint: %d parameter(s) of the network are in no rank's file: %s", len(not_loaded), not_loaded
        )
    return not_loaded, [name for name in parameter_dict if name not in names]


# --- loading ------------------------------------------------------------------------------------------------------


def load_value(param: Any, array: np.ndarray, saved: Mapping | None, saved_rank: int | None) -> None:
    """Put a checkpoint value into `param`: a full value (sliced again by this job's layout), or this rank's own
    slice saved with the same layout; anything else names the way that loads it."""
    from tessel.communication.runtime import current, is_initialized

    if tuple(array.shape) == tuple(param.shape) and saved is None:
        param.set_data(array.astype(param.dtype.numpy, copy=False))
        return
    rank = current().rank if is_initialized() else 0
    own = saved is not None and saved_rank == rank and layout_of(saved).device_num == world_size()
    if own and param.layout is None:
        from tessel.common.engine import engine

        param.place(layout_of(saved), engine().id)  # not laid out yet: it keeps the layout it was saved with
    same = saved is not None and param.layout is not None and layout_of(saved).same_as(param.layout)
    if same and saved_rank == rank:
        param.set_data(array.astype(param.dtype.numpy, copy=False), slice_shape=True)
        return
    if saved is not None:
        raise ConfigurationError(
            f"load_param_into_net: {param.name!r} in the checkpoint is rank {saved_rank}'s slice "
            f"{tuple(array.shape)} of {tuple(saved['shape'])}, cut as device matrix {saved['device_matrix']} / tensor "
            f"map {saved['tensor_map']}; this rank ({rank}) needs another piece. Load the slices of every rank with "
            "load_distributed_checkpoint(net, [rank_0.ckpt, ...]) or merge them with transform_checkpoints"
        )
    raise ConfigurationError(
        f"load_param_into_net: parameter {param.name!r} has shape {tuple(param.shape)} in the network but "
        f"{tuple(array.shape)} in the checkpoint; was the checkpoint saved from another network?"
    )


def _read(path: str) -> tuple[dict[str, np.ndarray], dict[str, dict], int | None]:
    """A checkpoint's tensors, the layouts of its sliced tensors and the rank that saved it (None: full)."""
    from tessel.train.serialization import read_checkpoint

    tensors, metadata = read_checkpoint(path)
    layouts = json.loads(metadata.get("layouts", "{}"))
    rank = int(metadata["rank"]) if "rank" in metadata else None
    return tensors, layouts, rank


def merged(paths: Sequence[str], strategies: Mapping[str, dict] | None = None) -> dict[str, np.ndarray]:
    """The full tensors of a set of slice files (one per rank, each knowing its rank and layouts), or of one full
    checkpoint. `strategies` (a strategy file's records) stands in for files that carry no layouts."""
    from tessel.compiler.parallel import assemble

    files = [_read(path) for path in paths]
    if len(files) == 1 and files[0][2] is None:
        return files[0][0]
    by_rank = {rank if rank is not None else i: (tensors, layouts) for i, (tensors, layouts, rank) in enumerate(files)}
    holding: dict[str, list[int]] = {}  # name -> the ranks whose file has it (under pipeline: one stage's ranks)
    for rank in sorted(by_rank):
        for name in by_rank[rank][0]:
            holding.setdefault(name, []).append(rank)
    out = {}
    for name, holders in holding.items():
        tensors, layouts = by_rank[holders[0]]
        record = layouts.get(name) or (strategies or {}).get(name)
        if record is None:
            out[name] = tensors[name]
            continue
        layout, shape = layout_of(record), tuple(record["shape"])
        if name not in layouts and tuple(tensors[name].shape) == shape:
            out[name] = tensors[name]  # a whole value (e.g. files saved with integrated_save=True)
            continue
        ranks = record.get("ranks") or list(range(layout.device_num))
        places = [_place(layout, shape, i) for i in range(len(ranks))]
        # a piece from any file holding it: files saved with remove_redundancy=True hold each piece once
        found = {places[ranks.index(h)]: h for h in reversed(holders) if h in ranks}
        missing = [r for r, place in zip(ranks, places) if place not in found]
        if missing:
            raise ConfigurationError(
                f"{name!r} is cut over ranks {ranks} but no checkpoint holding it was given for ranks {missing}; "
                "pass every rank's file"
            )
        pieces = [by_rank[found[place]][0][name] for place in places]
        out[name] = assemble(pieces, layout, shape)
    return out


def load_distributed_checkpoint(
    network: Any,
    checkpoint_filenames: Sequence[str] | None = None,
    predict_strategy: Any = None,
    train_strategy_filename: str | None = None,
    strict_load: bool = False,
    dec_key: Any = None,
    dec_mode: str = "AES-GCM",
    format: str = "ckpt",
    unified_safetensors_dir: str | None = None,
    dst_safetensors_dir: str | None = None,
    rank_id: int | None = None,
    output_format: str = "safetensors",
    name_map: dict | None = None,
    max_process_num: int = 64,
    return_param_dict: bool = False,
) -> Any:
    """Load the slice files of every rank of a training job (in any order; each knows its rank and layouts) into
    `network`, whatever its world size and strategy now: every parameter is assembled whole, and each rank keeps
    the slice its own layout asks for (MindSpore `load_distributed_checkpoint`). The slices follow the layouts
    the network was compiled with; a `predict_strategy` (infer_predict_layout's result) must be those layouts.
    rank_id and max_process_num, as in MindSpore, apply only to unified_safetensors_dir (not supported yet)."""
    from tessel.train.serialization import check_file_options, load_param_into_net

    check_file_options("load_distributed_checkpoint", dec_key, dec_mode, format, "dec_key")
    _check_predict_strategy(network, predict_strategy)
    if output_format not in ("ckpt", "safetensors"):
        raise ConfigurationError(
            f"load_distributed_checkpoint: output_format must be 'ckpt' or 'safetensors', got {output_format!r}"
        )
    if unified_safetensors_dir is not None or dst_safetensors_dir is not None:
        from tessel.common.support import not_supported_yet

        raise not_supported_yet(
            "load_distributed_checkpoint with unified_safetensors_dir / dst_safetensors_dir",
            "it loads the ranks' own files: give checkpoint_filenames",
        )
    if not checkpoint_filenames:
        raise ConfigurationError("load_distributed_checkpoint: give checkpoint_filenames (every rank's file)")
    strategies = read_strategy_file(train_strategy_filename) if train_strategy_filename else None
    full = merged(list(checkpoint_filenames), strategies)
    if name_map:
        full = {name_map.get(k, k): v for k, v in full.items()}
    if return_param_dict:
        from tessel.common.parameter import Parameter

        return {name: Parameter(value, name=name) for name, value in full.items()}
    load_param_into_net(network, full, strict_load)
    return None


def _check_predict_strategy(network: Any, predict_strategy: Any) -> None:
    """tessel cuts each parameter by the layout its network was compiled with: predict_strategy may only repeat
    it (MindSpore's usage: model.infer_predict_layout(...) then load_distributed_checkpoint(..., layout))."""
    if predict_strategy is None:
        return
    if isinstance(predict_strategy, str):
        from tessel.common.support import not_supported_yet

        raise not_supported_yet(
            "load_distributed_checkpoint(predict_strategy=<a strategy file>)",
            "pass model.infer_predict_layout(...)'s dict, or None: the network's compiled layouts are used",
        )
    if not isinstance(predict_strategy, dict):
        raise ConfigurationError(
            f"load_distributed_checkpoint: predict_strategy must be None or the dict infer_predict_layout returns, "
            f"got {type(predict_strategy).__name__}"
        )
    own = network.parameter_layout_dict if network is not None else {}
    if not own:
        raise ConfigurationError(
            "load_distributed_checkpoint(predict_strategy=...): the network has no compiled layouts yet; call "
            "model.infer_predict_layout(*inputs) first (it compiles the network) and pass its result"
        )
    as_lists = lambda v: [as_lists(x) for x in v] if isinstance(v, (list, tuple)) else v  # noqa: E731
    wrong = sorted(name for name, layout in predict_strategy.items() if as_lists(layout) != as_lists(own.get(name)))
    if wrong:
        raise ConfigurationError(
            f"load_distributed_checkpoint: predict_strategy gives {wrong[:5]} layouts other than the ones the network "
            "was compiled with; tessel cuts each parameter by the network's own layout: pass "
            "model.infer_predict_layout(...)'s result for this network, or None"
        )


# --- offline transforms -------------------------------------------------------------------------------------------


def _rank_files(directory: str) -> list[str]:
    """The last checkpoint (lexicographic) in each rank_<k> folder of `directory`, in rank order."""
    folders = sorted(glob.glob(os.path.join(directory, "rank_*")), key=lambda p: int(p.rsplit("_", 1)[-1]))
    files = []
    for folder in folders:
        found = sorted(glob.glob(os.path.join(folder, "*.ckpt")) + glob.glob(os.path.join(folder, "*.safetensors")))
        if not found:
            raise ConfigurationError(f"{folder!r} holds no checkpoint")
        files.append(found[-1])
    if not files:
        raise ConfigurationError(f"{directory!r} has no rank_<k> folders with checkpoints")
    return files


def _write_rank(full: Mapping[str, np.ndarray], strategies: Mapping[str, dict] | None, rank: int, path: str) -> None:
    from tessel.compiler.parallel import piece
    from tessel.train.serialization import write_checkpoint

    tensors, layouts = {}, {}
    for name, value in full.items():
        record = (strategies or {}).get(name)
        if record is None:
            tensors[name] = value
            continue
        tensors[name] = piece(value, layout_of(record), rank)
        layouts[name] = record
    world = layout_of(next(iter(strategies.values()))).device_num if strategies else 1
    metadata = {"layouts": json.dumps(layouts), "rank": str(rank), "world": str(world)} if layouts else {}
    write_checkpoint(tensors, path, metadata)


def transform_checkpoints(
    src_checkpoints_dir: str,
    dst_checkpoints_dir: str,
    ckpt_prefix: str,
    src_strategy_file: str | None = None,
    dst_strategy_file: str | None = None,
    process_num: int = 1,
    output_format: str = "ckpt",
) -> None:
    """Rewrite the sliced checkpoints in src_checkpoints_dir/rank_<k>/ for the strategy of dst_strategy_file (None:
    one full checkpoint) as dst_checkpoints_dir/rank_<k>/<ckpt_prefix><k>.ckpt (MindSpore `transform_checkpoints`)."""
    src = read_strategy_file(src_strategy_file) if src_strategy_file else None
    full = merged(_rank_files(src_checkpoints_dir), src)
    dst = read_strategy_file(dst_strategy_file) if dst_strategy_file else None
    world = layout_of(next(iter(dst.values()))).device_num if dst else 1
    for rank in range(world):
        folder = os.path.join(dst_checkpoints_dir, f"rank_{rank}")
        _write_rank(full, dst, rank, os.path.join(folder, f"{ckpt_prefix}{rank}.{output_format}"))


convert_checkpoints = transform_checkpoints


def transform_checkpoint_by_rank(
    rank_id: int,
    checkpoint_files_map: Mapping[int, str],
    save_checkpoint_file_name: str,
    src_strategy_file: str | None = None,
    dst_strategy_file: str | None = None,
) -> None:
    """Write rank `rank_id`'s checkpoint for the strategy of dst_strategy_file from the source ranks' files
    (MindSpore `transform_checkpoint_by_rank`; `rank_list_for_transform` says which source files it needs)."""
    if not isinstance(rank_id, int):
        raise TypeError("The rank_id should be a int.")
    src = read_strategy_file(src_strategy_file) if src_strategy_file else None
    full = merged([checkpoint_files_map[r] for r in sorted(checkpoint_files_map)], src)
    dst = read_strategy_file(dst_strategy_file) if dst_strategy_file else None
    _write_rank(full, dst, rank_id, save_checkpoint_file_name)


def rank_list_for_transform(rank_id: int, src_strategy_file: str | None = None, dst_strategy_file: str | None = None):
    """The source ranks whose slices rank `rank_id` of the destination strategy needs."""
    if not isinstance(rank_id, int):
        raise TypeError("The rank_id should be a int.")
    if src_strategy_file is None:
        return [0]
    src = read_strategy_file(src_strategy_file)
    dst = read_strategy_file(dst_strategy_file) if dst_strategy_file else {}
    needed: set[int] = set()
    for name, record in src.items():
        layout, shape = layout_of(record), tuple(record["shape"])
        want = layout_of(dst[name]).local_slices(shape, rank_id) if name in dst else tuple(slice(0, d) for d in shape)
        for rank in range(layout.device_num):
            have = layout.local_slices(shape, rank)
            if all(_overlap(a, b, d) for a, b, d in zip(have, want, shape)):
                needed.add(rank)
    return sorted(needed) or [0]


def _overlap(a: slice, b: slice, size: int) -> bool:
    a0, a1 = a.indices(size)[:2]
    b0, b1 = b.indices(size)[:2]
    return a0 < b1 and b0 < a1
