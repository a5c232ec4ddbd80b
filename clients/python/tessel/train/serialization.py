"""Checkpoints and export.

Checkpoints are written atomically (temp file + fsync + rename), never with pickle, and always checksummed, so a
truncated or altered file is a clear error instead of silently wrong weights: a `.ckpt` is MindSpore's own
protobuf format with its CRC-32 trailer (protos/tessel/v1/mindspore_checkpoint.proto), which MindSpore's
load_checkpoint reads; a `.safetensors`, and the sliced or redundancy-free files whose layouts need metadata, are
safetensors with a SHA-256 of every tensor's name, dtype, shape and bytes. tessel reads MindSpore's .ckpt and
safetensors files too. Parameters are saved under their MindSpore names ("dense_relu_sequential.0.weight",
optimizer slots as "moments.<name>").

`export(net, *inputs, file_name, file_format="ONNX")` writes a self-contained ONNX model (parameters as
initializers) that runs in plain onnxruntime.

Under SEMI_AUTO/AUTO parallelism parameters are sliced; `tessel.parallel.checkpoint` gathers them (integrated_save,
the default), writes slices with their layouts (integrated_save=False) and loads either into any strategy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import struct
import tempfile
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from tessel.common.parameter import Parameter, fetch_all
from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.core.process import pid_alive

FORMAT = "tessel-checkpoint-1"


def _checksum(tensors: dict[str, np.ndarray], strings: dict[str, str] | None = None) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    for name in sorted(strings or {}):  # append_dict's str values (none in files of older versions)
        digest.update(f"{name}|str|{len(strings[name])}|{strings[name]}".encode())
    return digest.hexdigest()


def appended_values(
    append_dict: Any, call: str = "save_checkpoint", field: str = "append_dict"
) -> tuple[OrderedDict, dict[str, str]]:
    """MindSpore's append_dict: str -> int, float, bool, str, Tensor or Parameter (numpy arrays too). Numbers
    become 0-d tensors as MindSpore's Tensor(value) makes them (int64, float32, bool); strings are kept as strings
    and load back as str. Returns (tensors, strings)."""
    tensors, strings = OrderedDict(), {}
    if append_dict is None:
        return tensors, strings
    if not isinstance(append_dict, dict):
        raise ConfigurationError(f"{call}: {field} must be a dict of str -> value, got {type(append_dict).__name__}")
    for name, value in append_dict.items():
        if not isinstance(name, str):
            raise ConfigurationError(f"{call}: {field}'s keys must be str, got {name!r}")
        if isinstance(value, str):
            strings[name] = value
        elif isinstance(value, (bool, np.bool_)):
            tensors[name] = np.array(value, np.bool_)
        elif isinstance(value, (int, np.integer)):
            tensors[name] = np.array(value, np.int64)
        elif isinstance(value, (float, np.floating)):
            tensors[name] = np.array(value, np.float32)
        elif isinstance(value, (Tensor, np.ndarray)):
            tensors[name] = contiguous(value.asnumpy() if isinstance(value, Tensor) else value)
        else:
            raise ConfigurationError(
                f"{call}: {field}[{name!r}] is a {type(value).__name__}; values must be int, float, bool, str, "
                "Tensor or Parameter"
            )
    return tensors, strings


def _named(save_obj: Any) -> list[tuple[str, Any]]:
    """(name, value) from a Cell, a dict of name -> Tensor/array, or MindSpore's list of {"name", "data"}."""
    from tessel.nn.cell import Cell

    if isinstance(save_obj, Cell):
        params = list(save_obj.get_parameters())
        fetch_all(params)
        items = [(p.name, p) for p in params]
    elif isinstance(save_obj, dict):
        items = list(save_obj.items())
    elif isinstance(save_obj, list) and all(isinstance(entry, Parameter) for entry in save_obj):
        items = [(p.name, p) for p in save_obj]  # e.g. net.trainable_params()
    elif isinstance(save_obj, list):
        try:
            items = [(entry["name"], entry["data"]) for entry in save_obj]
        except (TypeError, KeyError):
            raise ConfigurationError(
                'save_checkpoint: a list must hold Parameters (e.g. net.trainable_params()) or {"name": ..., '
                '"data": ...} dicts'
            ) from None
    else:
        raise ConfigurationError(f"save_checkpoint: cannot save a {type(save_obj).__name__}; pass a Cell, dict or list")
    fetch_all([v for _, v in items if isinstance(v, Parameter)])
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigurationError(f"save_checkpoint: two parameters are named {twice}; names must be unique")
    return items


def _arrays(items: list[tuple[str, Any]]) -> OrderedDict:
    return OrderedDict(
        (name, contiguous(value.asnumpy() if isinstance(value, Tensor) else value)) for name, value in items
    )


def contiguous(value: Any) -> np.ndarray:
    """A C-contiguous array of `value`, 0-d values staying 0-d (np.ascontiguousarray alone makes them 1-d)."""
    array = np.asarray(value)
    return np.ascontiguousarray(array).reshape(array.shape)


def _with_suffix(path: str, format: str = "ckpt") -> str:
    path = os.fspath(path)
    return path if path.endswith((".ckpt", ".safetensors")) else f"{path}.{format}"


_FORMATS = ("ckpt", "safetensors")  # tessel writes one format (safetensors with a checksum) under either suffix
_ENC_MODES = ("AES-GCM", "AES-CBC", "SM4-CBC")


def check_file_options(call: str, key: Any, mode: str, format: str, key_name: str) -> None:
    """MindSpore's encryption and format arguments of save_checkpoint / load_checkpoint."""
    if key is not None:
        raise NotSupportedYetError(
            f"not supported yet: {call}({key_name}=...), tessel does not encrypt checkpoints; keep the file on "
            f"storage only the job can read, and drop {key_name}"
        )
    if mode not in _ENC_MODES:
        raise ConfigurationError(f"{call}: enc_mode/dec_mode must be one of {list(_ENC_MODES)}, got {mode!r}")
    if format not in _FORMATS:
        raise ConfigurationError(f"{call}: format must be one of {list(_FORMATS)}, got {format!r}")


def _check_redundancy(call: str, remove_redundancy: Any) -> None:
    if not isinstance(remove_redundancy, bool):
        raise ConfigurationError(f"{call}: remove_redundancy must be a bool, got {remove_redundancy!r}")


def _no_more_options(call: str, options: dict) -> None:
    if options:
        raise NotSupportedYetError(
            f"not supported yet: {call} options {sorted(options)}; tessel's {call} takes MindSpore's named arguments"
        )


def _temp_prefix(path: str) -> str:
    # ".tmp-<name>.<host>.<pid>.": the next save of the same file can tell a writer that died from a live one.
    return f".tmp-{os.path.basename(path)}.{socket.gethostname()}."


def _remove_stale_temps(path: str) -> None:
    """Remove temp files of earlier saves of `path` on this host whose writer died (e.g. SIGKILL mid-save)."""
    folder, prefix = os.path.dirname(os.path.abspath(path)), _temp_prefix(path)
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :].split(".", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))


def atomic_write(path: str, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder, fsync'd, then renamed over `path`. Temp files
    that an earlier, interrupted save of `path` left behind are removed first."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    _remove_stale_temps(path)
    fd, temp = tempfile.mkstemp(prefix=f"{_temp_prefix(path)}{os.getpid()}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def save_checkpoint(
    save_obj: Any,
    ckpt_file_name: str,
    integrated_save: bool = True,
    async_save: bool | str = False,
    append_dict: dict | None = None,
    enc_key: bytes | None = None,
    enc_mode: str = "AES-GCM",
    choice_func: Any = None,
    crc_check: bool = False,
    format: str = "ckpt",
    remove_redundancy: bool = False,
    **options: Any,
) -> None:
    """Save parameters (of a Cell, net.trainable_params(), or a dict/list of named tensors) to a checkpoint file
    (".ckpt", or ".safetensors" with format="safetensors", appended if the name has no suffix). `append_dict` adds
    extra named numbers or tensors (e.g. {"epoch_num": 3}); `choice_func(name)` keeps the parameters it returns
    True for. Every file carries a checksum of its tensors that load_checkpoint verifies, crc_check or not.

    With sliced parameters (SEMI_AUTO/AUTO over several ranks) every rank must call it: integrated_save=True
    gathers the full values and writes them once per distinct path; integrated_save=False writes this rank's
    slices with their layouts (tessel.parallel.checkpoint). remove_redundancy=True (in a job of several ranks,
    whatever integrated_save) writes only this rank's share: of the ranks holding the same value or slice, one
    writes it, so the files of all ranks hold each piece once; load_checkpoint(file, net) then loads each rank's
    file and sends every rank the pieces its own file lacks (every rank calls both)."""
    from tessel.parallel import checkpoint

    if async_save:
        from tessel.common.support import not_supported_yet

        raise not_supported_yet("save_checkpoint(async_save=True)", "checkpoints are written before save returns")
    check_file_options("save_checkpoint", enc_key, enc_mode, format, "enc_key")
    _no_more_options("save_checkpoint", options)
    extra, strings = appended_values(append_dict)  # checked before any rank waits for the others
    path = _with_suffix(ckpt_file_name, format)
    items = _named(save_obj)
    if choice_func is not None:
        items = [(name, value) for name, value in items if choice_func(name)]
    metadata: dict[str, str] = {}
    _check_redundancy("save_checkpoint", remove_redundancy)
    if remove_redundancy and checkpoint.world_size() > 1:
        checkpoint.rendezvous("save_checkpoint")
        checkpoint.own_path(path, "save_checkpoint(remove_redundancy=True)")
        tensors, metadata = checkpoint.without_redundancy(items)
    elif checkpoint.sliced(v for _, v in items):
        checkpoint.rendezvous("save_checkpoint")
        if integrated_save:
            tensors = OrderedDict(checkpoint.gather(items))
            if not checkpoint.first_writer(path):
                return
        else:  # this rank's slices (under pipeline parallel: of its stage's parameters)
            items = [(name, v) for name, v in items if getattr(v, "held", True)]
            tensors = OrderedDict((name, checkpoint.local_array(value)) for name, value in items)
            metadata = checkpoint.slice_metadata(items)
    else:
        tensors = _arrays(items)
    tensors.update(extra)
    write_checkpoint(tensors, path, metadata, strings)


def write_checkpoint(
    tensors: dict[str, np.ndarray],
    path: str,
    metadata: dict[str, str] | None = None,
    strings: dict[str, str] | None = None,
) -> None:
    """Write named arrays (and named strings) as a checkpoint, atomically: a `.ckpt` without tessel's metadata (a
    plain save) in MindSpore's protobuf format with its CRC-32 trailer, which MindSpore's load_checkpoint reads;
    anything else (a `.safetensors` name, sliced or redundancy-free files, whose layouts need metadata) as
    safetensors with a SHA-256."""
    from safetensors.numpy import save

    if path.endswith(".ckpt") and not metadata:
        atomic_write(path, _mindspore_protobuf(tensors, strings or {}))
        return
    metadata = {
        **(metadata or {}),
        "format": FORMAT,
        "sha256": _checksum(tensors, strings),
        "order": json.dumps([*tensors, *(strings or {})]),
    }
    if strings:
        metadata["strings"] = json.dumps(strings)
    atomic_write(path, save(dict(tensors), metadata=metadata))


def _read_header(data: bytes, path: str) -> dict:
    if len(data) < 8:
        raise ConfigurationError(f"checkpoint {path!r} is corrupt: {len(data)} bytes is too short for a header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ConfigurationError(
            f"checkpoint {path!r} is truncated, corrupt or not a checkpoint: its header claims {size} bytes of "
            f"{len(data)} (tessel reads its own safetensors files and MindSpore's .ckpt and safetensors files)"
        )
    try:
        return json.loads(data[8 : 8 + size]).get("__metadata__") or {}
    except (ValueError, UnicodeDecodeError):
        raise ConfigurationError(f"checkpoint {path!r} is corrupt or not a safetensors checkpoint") from None


class CheckpointDict(OrderedDict):
    """What load_checkpoint returns: name -> Parameter (a dict, as MindSpore's), which also knows its file: whether
    it was saved with remove_redundancy=True and by which rank of how many. A rank's share may hold no value at all
    (more ranks than values held by all); the dict still says whose share it is, so load_param_into_net joins the
    other ranks' collective load and can tell a rank given another rank's empty file. Each Parameter carries the
    same, for a dict the user builds anew from some of them."""

    redundancy_removed: bool = False
    saved_by: tuple[int, int] | None = None


def load_checkpoint(
    ckpt_file_name: str,
    net: Any = None,
    strict_load: bool = False,
    filter_prefix: Any = None,
    dec_key: bytes | None = None,
    dec_mode: str = "AES-GCM",
    specify_prefix: Any = None,
    choice_func: Any = None,
    crc_check: bool = False,
    remove_redundancy: bool = False,
    format: str = "ckpt",
    **options: Any,
) -> dict[str, Parameter]:
    """name -> Parameter of a checkpoint (verified against its checksum, crc_check or not); with `net`, also load it
    into net. A rank's slice file keeps, on each Parameter, the layout it was cut with (loads back into the same
    slice). A file saved with remove_redundancy=True is loaded as such, whatever `remove_redundancy` says (as
    MindSpore follows the file's flag): with `net`, every rank loads its own file and gets the pieces it lacks from
    the ranks whose files hold them; the network must be compiled first."""
    import json as _json

    from tessel.parallel import checkpoint

    check_file_options("load_checkpoint", dec_key, dec_mode, format, "dec_key")
    _check_redundancy("load_checkpoint", remove_redundancy)
    _no_more_options("load_checkpoint", options)
    filter_prefix = _prefixes("filter_prefix", filter_prefix)
    specify_prefix = _prefixes("specify_prefix", specify_prefix)
    if filter_prefix or specify_prefix:
        choice_func = None  # MindSpore: either prefix argument overrides choice_func
    tensors, metadata = read_checkpoint(ckpt_file_name)
    if crc_check and metadata.get(_UNCHECKED):
        from tessel.common.support import log_once

        log_once(  # MindSpore warns the same way and loads the file
            f"load_checkpoint.crc:{ckpt_file_name}",
            f"load_checkpoint({ckpt_file_name!r}, crc_check=True): the file has {metadata[_UNCHECKED]}, so nothing "
            "was checked (MindSpore saves one with save_checkpoint(..., crc_check=True))",
        )
    strings = json.loads(metadata.get("strings", "{}"))
    layouts = _json.loads(metadata.get("layouts", "{}"))
    rank = int(metadata["rank"]) if "rank" in metadata else None
    order = json.loads(metadata.get("order", "[]")) or sorted(tensors)
    removed = metadata.get(checkpoint.REDUNDANCY_REMOVED) == "true"
    params = CheckpointDict()
    params.redundancy_removed = removed
    if removed and rank is not None:
        params.saved_by = (rank, int(metadata.get("world", 1)))
    for name in order:
        if not _keep(name, filter_prefix, specify_prefix, choice_func):
            continue
        if name in strings:  # append_dict's str values load back as str, as in MindSpore
            params[name] = strings[name]
            continue
        if name in tensors:
            params[name] = Parameter(tensors[name], name=name)
            if name in layouts:
                params[name]._saved = (layouts[name], rank)
            params[name]._redundancy_removed = removed
            if params.saved_by is not None:
                params[name]._saved_by = params.saved_by
    if not params and (tensors or strings):
        raise ConfigurationError(
            f"load_checkpoint: nothing of {ckpt_file_name!r} is left after filter_prefix={filter_prefix!r}, "
            f"specify_prefix={specify_prefix!r} and choice_func; check that they name the checkpoint's parameters "
            f"(e.g. {next(iter(order))!r})"
        )
    if net is not None:
        load_param_into_net(net, params, strict_load, remove_redundancy=removed)
    return params


def read_checkpoint(ckpt_file_name: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A checkpoint's tensors and metadata, verified against its checksum: tessel's (safetensors with a SHA-256),
    MindSpore's protobuf .ckpt (its CRC-32 trailer checked when present) or MindSpore's safetensors (its crc_num
    checked when present)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    path = os.fspath(ckpt_file_name)
    if not os.path.isfile(path):
        raise ConfigurationError(f"checkpoint file {path!r} does not exist")
    with open(path, "rb") as source:
        data = source.read()
    if _is_mindspore_protobuf(data):
        return _read_mindspore_protobuf(data, path)
    metadata = _read_header(data, path)
    try:
        tensors = load(data)
    except (SafetensorError, ValueError) as err:
        raise ConfigurationError(f"checkpoint {path!r} is corrupt: {err}. Re-save it or use another one") from None
    expected = metadata.get("sha256")
    if expected is None:  # another writer's safetensors (MindSpore's): its own CRC, when it has one
        unchecked = "" if _check_mindspore_crc(tensors, metadata, path) else "no crc_num"
        return tensors, {**metadata, "order": json.dumps(sorted(tensors)), _UNCHECKED: unchecked}
    if _checksum(tensors, json.loads(metadata.get("strings", "{}"))) != expected:
        raise ConfigurationError(
            f"checkpoint {path!r} is corrupt: its tensors do not match the checksum stored when it was saved. "
            "Re-save it or use another checkpoint"
        )
    return tensors, metadata


# MindSpore's tensor_type names (train/serialization.py tensor_to_ms_type) of the dtypes tessel holds
_MINDSPORE_TYPES = {
    "Bool": np.bool_,
    "Int8": np.int8,
    "Int16": np.int16,
    "Int32": np.int32,
    "Int64": np.int64,
    "UInt8": np.uint8,
    "Float16": np.float16,
    "Float32": np.float32,
    "Float64": np.float64,
}
_CRC_MARK = b"crc_num"  # MindSpore's trailer: the mark, then a 10-byte big-endian CRC-32 of what comes before
_UNCHECKED = "unchecked"  # read_checkpoint's metadata: why a file written elsewhere had no checksum ("" if it had)


def _is_mindspore_protobuf(data: bytes) -> bool:
    """A MindSpore .ckpt starts with field 1 (Checkpoint.value, length-delimited): byte 0x0A; a safetensors file
    with an 8-byte header size and then its JSON header ('{')."""
    return data[:1] == b"\n" and data[8:9] != b"{"


def _read_mindspore_protobuf(data: bytes, path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """MindSpore's protobuf checkpoint: Checkpoint messages one after another (a large parameter in slices of one
    tag), and with crc_check a CRC-32 trailer, which is verified."""
    import binascii

    from google.protobuf.message import DecodeError

    from tessel.v1.mindspore_checkpoint_pb2 import MindSporeCheckpoint

    body, checked = data, data[-17:-10] == _CRC_MARK
    if checked:
        body = data[:-17]
        if binascii.crc32(body) != int.from_bytes(data[-10:], "big"):
            raise ConfigurationError(
                f"checkpoint {path!r} is corrupt: its CRC-32 does not match the one MindSpore stored when it was "
                "saved. Re-save it or use another checkpoint"
            )
    try:
        values = MindSporeCheckpoint.FromString(body).value
    except DecodeError as err:
        raise ConfigurationError(
            f"checkpoint {path!r} is neither a tessel (safetensors) nor a readable MindSpore (protobuf) checkpoint: "
            f"{err}. It may be truncated or encrypted (dec_key is not supported yet)"
        ) from None
    parts: dict[str, list] = OrderedDict()
    for value in values:
        if value.WhichOneof("value") != "tensor":
            raise NotSupportedYetError(
                f"not supported yet: MindSpore's MapParameter {value.tag!r} in checkpoint {path!r}; tessel loads "
                "dense tensors only"
            )
        parts.setdefault(value.tag, []).append(value.tensor)
    tensors: OrderedDict[str, np.ndarray] = OrderedDict()
    strings: dict[str, str] = {}
    for name, pieces in parts.items():
        kind, dims = pieces[0].tensor_type, list(pieces[0].dims)
        content = b"".join(piece.tensor_content for piece in pieces)
        if kind == "str":  # append_dict text: UTF-32, as numpy's 'U' dtype
            strings[name] = str(np.frombuffer(content, f"U{len(content) // 4}")[0]) if content else ""
            continue
        if kind not in _MINDSPORE_TYPES:
            raise NotSupportedYetError(
                f"not supported yet: parameter {name!r} of checkpoint {path!r} is {kind}, a dtype tessel does not "
                f"hold (it holds {', '.join(_MINDSPORE_TYPES)}); cast it in MindSpore before saving"
            )
        shape = () if dims == [0] else tuple(dims)  # MindSpore writes a 0-d tensor's dims as [0]
        tensors[name] = np.frombuffer(content, _MINDSPORE_TYPES[kind]).reshape(shape).copy()
    metadata = {"order": json.dumps(list(parts)), _UNCHECKED: "" if checked else "no CRC-32 trailer"}
    if strings:
        metadata["strings"] = json.dumps(strings)
    return tensors, metadata


_SLICE_BYTES = 512 << 20  # MindSpore writes a larger parameter in slices of this size (SLICE_SIZE, in KiB there)


def _mindspore_protobuf(tensors: dict[str, np.ndarray], strings: dict[str, str]) -> bytes:
    """MindSpore's .ckpt bytes: one Checkpoint message per parameter (per slice of a large one), in order, then
    b"crc_num" and the CRC-32 of all before it in 10 big-endian bytes (MindSpore's crc_check=True layout)."""
    import binascii

    from tessel.v1.mindspore_checkpoint_pb2 import MindSporeCheckpoint

    names = {np.dtype(t): name for name, t in _MINDSPORE_TYPES.items()}
    parts = []
    for name, array in tensors.items():
        array = np.asarray(array, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        if array.dtype not in names:
            raise ConfigurationError(f"save_checkpoint: {name!r} is {array.dtype}, which a checkpoint cannot hold")
        content = array.tobytes()
        for start in range(0, max(len(content), 1), _SLICE_BYTES):
            message = MindSporeCheckpoint()
            value = message.value.add()
            value.tag = name
            value.tensor.dims.extend(list(array.shape) or [0])  # MindSpore writes a 0-d tensor's dims as [0]
            value.tensor.tensor_type = names[array.dtype]
            value.tensor.tensor_content = content[start : start + _SLICE_BYTES]
            parts.append(message.SerializeToString())
    for name, text in strings.items():
        message = MindSporeCheckpoint()
        value = message.value.add()
        value.tag = name
        value.tensor.dims.append(0)
        value.tensor.tensor_type = "str"
        value.tensor.tensor_content = np.array(text).tobytes()  # UTF-32, as MindSpore stores a str
        parts.append(message.SerializeToString())
    body = b"".join(parts)
    return body + _CRC_MARK + binascii.crc32(body).to_bytes(10, "big")


def _check_mindspore_crc(tensors: dict[str, np.ndarray], metadata: dict[str, str], path: str) -> bool:
    """MindSpore's safetensors CRC: CRC-32 over each name then its bytes, names in sorted order. False when the
    file has none to check."""
    import binascii

    if "crc_num" not in metadata:
        return False
    crc = 0
    for name in sorted(tensors):
        crc = binascii.crc32(tensors[name].tobytes(), binascii.crc32(name.encode(), crc))
    if crc != int(metadata["crc_num"]):
        raise ConfigurationError(
            f"checkpoint {path!r} is corrupt: its crc_num does not match its tensors. Re-save it or use another one"
        )
    return True


def _prefixes(what: str, prefix: Any) -> tuple[str, ...]:
    """MindSpore's filter_prefix / specify_prefix: None, a str, or a non-empty list/tuple of non-empty str."""
    if prefix is None:
        return ()
    prefixes = (prefix,) if isinstance(prefix, str) else prefix
    if not isinstance(prefixes, (list, tuple)) or not prefixes or not all(isinstance(p, str) and p for p in prefixes):
        raise ConfigurationError(
            f"load_checkpoint: {what} must be a non-empty str or a non-empty list/tuple of non-empty str, "
            f"got {prefix!r}"
        )
    return tuple(prefixes)


def _keep(name: str, filter_prefix: tuple[str, ...], specify_prefix: tuple[str, ...], choice_func: Any) -> bool:
    if filter_prefix and name.startswith(filter_prefix):
        return False
    if specify_prefix and not name.startswith(specify_prefix):
        return False
    return choice_func is None or bool(choice_func(name))


def load_param_into_net(
    net: Any, parameter_dict: dict, strict_load: bool = False, remove_redundancy: bool = False
) -> tuple[list[str], list[str]]:
    """Copy checkpoint values into net's parameters by name; returns (net params not loaded, ckpt names unused).

    As MindSpore's: strict_load=True loads exact names only, and a value must have the parameter's dtype.
    strict_load=False (the default) also casts a float value to a float parameter's dtype (an integer to an
    integer one; other pairs are an error), and loads parameters whose
    checkpoint name has an extra prefix (a checkpoint saved from a wrapped network, "network.fc.weight" for
    "fc.weight"): the first unloaded parameter that ends a checkpoint name gives the prefix, every unloaded
    parameter found under prefix + its name is loaded, and this repeats while it finds new ones.

        >>> not_loaded, unused = ms.load_param_into_net(net, ms.load_checkpoint("train_net.ckpt"))
    """
    import logging

    from tessel.parallel import checkpoint

    _check_redundancy("load_param_into_net", remove_redundancy)
    if not isinstance(strict_load, bool):
        raise ConfigurationError(f"load_param_into_net: strict_load must be a bool, got {strict_load!r}")
    if not isinstance(parameter_dict, dict):
        raise ConfigurationError("load_param_into_net: parameter_dict must be a dict of name -> Parameter/Tensor")
    flags = {getattr(v, "_redundancy_removed", None) for v in parameter_dict.values()}
    flags = (flags | {getattr(parameter_dict, "redundancy_removed", None)}) - {None}
    removed = True in flags if flags else remove_redundancy  # what load_checkpoint read: the file's flag wins
    if removed and checkpoint.world_size() > 1:
        return checkpoint.load_without_redundancy(net, parameter_dict, strict_load)
    shares = sorted(checkpoint.saved_by(parameter_dict))
    if removed and shares:  # one device: a file of one rank's share lacks the values other ranks wrote
        saved_rank, saved_world = shares[0]
        raise ConfigurationError(
            f"load_param_into_net: this checkpoint holds rank {saved_rank}'s share of a {saved_world}-rank job "
            "(saved with remove_redundancy=True), not every value; load it in a job of that many ranks, each rank "
            "its own file, or save with remove_redundancy=False for one device"
        )
    used: set[str] = set()

    def load(param: Parameter, name: str) -> None:
        value = parameter_dict[name]
        array = value.asnumpy() if isinstance(value, Tensor) else np.asarray(value)
        want = np.dtype(param.dtype.numpy)
        if strict_load and array.dtype != want:
            raise ConfigurationError(
                f"load_param_into_net(strict_load=True): {name!r} is {array.dtype} in the checkpoint but parameter "
                f"{param.name!r} is {want}; strict loading keeps dtypes, pass strict_load=False to cast"
            )
        if array.dtype != want and not (array.dtype.kind == want.kind and want.kind in "fi"):
            # MindSpore casts float <-> float and signed int <-> signed int only (_type_convert)
            raise ConfigurationError(
                f"load_param_into_net: {name!r} is {array.dtype} in the checkpoint but parameter {param.name!r} is "
                f"{want}; only floats cast to floats and integers to integers. Convert the value first "
                f"(parameter_dict[{name!r}] = Tensor(value.asnumpy().astype(...)))"
            )
        saved, rank = getattr(value, "_saved", (None, None))
        checkpoint.load_value(param, array, saved, rank)
        used.add(name)

    not_loaded = []
    for param in net.get_parameters():
        if parameter_dict.get(param.name) is None:
            not_loaded.append(param)
        else:
            load(param, param.name)
    while not strict_load and not_loaded:  # MindSpore's prefix matching (_load_dismatch_prefix_params)
        ends = ((key, p.name) for p in not_loaded for key in parameter_dict if key != p.name and key.endswith(p.name))
        prefix = next((key[: -len(name)] for key, name in ends), "")
        found = [p for p in not_loaded if prefix and parameter_dict.get(prefix + p.name) is not None]
        if not found:
            break
        logging.getLogger("tessel").warning("load_param_into_net: loading names with prefix %r removed", prefix)
        for param in found:
            load(param, prefix + param.name)
        loaded_now = {id(p) for p in found}
        not_loaded = [p for p in not_loaded if id(p) not in loaded_now]
    if not strict_load and not_loaded:  # files of tessel before its names were attribute paths ("0.weight")
        unused = [key for key in parameter_dict if key not in used and parameter_dict.get(key) is not None]
        older = {}
        for param in not_loaded:
            found = [key for key in unused if param.name.endswith("." + key)]
            if len(found) == 1:
                older.setdefault(found[0], []).append(param)
        for key, params in older.items():
            if len(params) == 1:
                logging.getLogger("tessel").warning(
                    "load_param_into_net: %r loaded from %r, its name in a checkpoint of an earlier tessel",
                    params[0].name,
                    key,
                )
                load(params[0], key)
        not_loaded = [
            p for p in not_loaded if not any(p is q for q in (ps[0] for ps in older.values() if len(ps) == 1))
        ]
    names = [p.name for p in not_loaded]
    if names:
        logging.getLogger("tessel").warning(
            "load_param_into_net: %d parameter(s) of the network are not in the checkpoint: %s", len(names), names
        )
    return names, [name for name in parameter_dict if name not in used]


def export(net: Any, *inputs: Any, file_name: str, file_format: str = "AIR", **kwargs: Any) -> None:
    """Write net (in inference mode) as a standalone ONNX model for `inputs`' shapes; ".onnx" is appended.
    MindSpore's own formats (MINDIR, AIR) and its export options are not supported yet, each named at the call."""
    if file_format in ("MINDIR", "AIR"):
        raise ConfigurationError(
            f"export: file_format {file_format!r} is not supported yet (MindSpore's own IR format, read only by "
            "MindSpore); use file_format='ONNX'"
        )
    if file_format != "ONNX":
        raise ConfigurationError(f"export: file_format must be one of ['AIR', 'ONNX', 'MINDIR'], got {file_format!r}")
    if kwargs:
        raise NotSupportedYetError(
            f"not supported yet: export options {sorted(kwargs)} (encryption, dataset-driven inputs, incremental "
            "or custom export); call export(net, *inputs, file_name=..., file_format='ONNX')"
        )
    if any(getattr(x, "to_spec", None) is not None for x in inputs):
        raise NotSupportedYetError("not supported yet: export with a Dataset as input; pass example Tensors")
    model = onnx_model(net, *inputs)
    path = os.fspath(file_name)
    atomic_write(path if path.endswith(".onnx") else path + ".onnx", model.SerializeToString())


def onnx_model(net: Any, *inputs: Any):
    """The ONNX model of net(*inputs), parameters baked in as initializers named by their parameter names."""
    from onnx import numpy_helper

    from tessel.common.compiled import Call, rename_inputs, trace_call
    from tessel.compiler import to_onnx

    was_training = net.training
    net.set_train(False)
    try:
        call = Call.of(inputs, {}, [f"input_{i}" for i in range(len(inputs))])
        graph, _, trace = trace_call(net, call, net.cls_name, symbolic=False)
    finally:
        net.set_train(was_training)
    params = trace.parameters()
    fetch_all(params)
    names = _unique_names(params)
    graph = rename_inputs(graph, {p.key: name for p, name in zip(params, names)})
    model = to_onnx(graph)
    initializers = {name: p.asnumpy() for p, name in zip(params, names)}
    kept = [i for i in model.graph.input if i.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in initializers.items())
    return model


def _unique_names(params: Iterable[Parameter]) -> list[str]:
    names, seen = [], set()
    for p in params:
        name = p.name if p.name not in seen else p.key
        seen.add(name)
        names.append(name)
    return names
