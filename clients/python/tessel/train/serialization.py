"""Checkpoints and export.

Checkpoints are safetensors files (no pickle), written atomically (temp file + fsync + rename) with a SHA-256 of
every tensor's name, dtype, shape and bytes in the metadata; loading checks it, so a truncated or altered file is
a clear error instead of silently wrong weights. Parameters are saved under their MindSpore names
("dense_relu_sequential.0.weight", optimizer slots as "moments.<name>").

`export(net, *inputs, file_name, file_format="ONNX")` writes a self-contained ONNX model (parameters as
initializers) that runs in plain onnxruntime.
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
from tessel.core.errors import ConfigurationError

FORMAT = "tessel-checkpoint-1"


def _checksum(tensors: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _collect(save_obj: Any) -> OrderedDict:
    """name -> array from a Cell, a dict of name -> Tensor/array, or MindSpore's list of {"name", "data"}."""
    from tessel.nn.cell import Cell

    if isinstance(save_obj, Cell):
        params = list(save_obj.get_parameters())
        fetch_all(params)
        items = [(p.name, p) for p in params]
    elif isinstance(save_obj, dict):
        items = list(save_obj.items())
    elif isinstance(save_obj, list):
        try:
            items = [(entry["name"], entry["data"]) for entry in save_obj]
        except (TypeError, KeyError):
            raise ConfigurationError('save_checkpoint: a list must hold {"name": ..., "data": ...} dicts') from None
    else:
        raise ConfigurationError(f"save_checkpoint: cannot save a {type(save_obj).__name__}; pass a Cell, dict or list")
    fetch_all([v for _, v in items if isinstance(v, Parameter)])
    out = OrderedDict()
    for name, value in items:
        if name in out:
            raise ConfigurationError(f"save_checkpoint: two parameters are named {name!r}; names must be unique")
        out[name] = np.ascontiguousarray(value.asnumpy() if isinstance(value, Tensor) else np.asarray(value))
    return out


def _with_suffix(path: str) -> str:
    path = os.fspath(path)
    return path if path.endswith((".ckpt", ".safetensors")) else path + ".ckpt"


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
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    async_save: bool = False,
    append_dict: dict | None = None,
    **_: Any,
) -> None:
    """Save parameters (of a Cell, or a dict/list of named tensors) to a checkpoint file (".ckpt" appended if
    the name has no suffix). `append_dict` adds extra named numbers or tensors (e.g. {"epoch_num": 3})."""
    from safetensors.numpy import save

    tensors = _collect(save_obj)
    for name, value in (append_dict or {}).items():
        tensors[name] = np.asarray(value.asnumpy() if isinstance(value, Tensor) else value)
    metadata = {"format": FORMAT, "sha256": _checksum(tensors), "order": json.dumps(list(tensors))}
    atomic_write(_with_suffix(ckpt_file_name), save(dict(tensors), metadata=metadata))


def _read_header(data: bytes, path: str) -> dict:
    if len(data) < 8:
        raise ConfigurationError(f"checkpoint {path!r} is corrupt: {len(data)} bytes is too short for a header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ConfigurationError(f"checkpoint {path!r} is corrupt or truncated: its header claims {size} bytes")
    try:
        return json.loads(data[8 : 8 + size]).get("__metadata__") or {}
    except (ValueError, UnicodeDecodeError):
        raise ConfigurationError(f"checkpoint {path!r} is corrupt or not a safetensors checkpoint") from None


def load_checkpoint(
    ckpt_file_name: str,
    net: Any = None,
    strict_load: bool = False,
    filter_prefix: Any = None,
    specify_prefix: Any = None,
    choice_func: Any = None,
    **_: Any,
) -> dict[str, Parameter]:
    """name -> Parameter of a checkpoint (verified against its checksum); with `net`, also load it into net."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    path = os.fspath(ckpt_file_name)
    if not os.path.isfile(path):
        raise ConfigurationError(f"checkpoint file {path!r} does not exist")
    with open(path, "rb") as source:
        data = source.read()
    metadata = _read_header(data, path)
    try:
        tensors = load(data)
    except (SafetensorError, ValueError) as err:
        raise ConfigurationError(f"checkpoint {path!r} is corrupt: {err}. Re-save it or use another one") from None
    expected = metadata.get("sha256")
    if expected is None:
        raise ConfigurationError(f"checkpoint {path!r} has no checksum: it was not written by tessel.save_checkpoint")
    if _checksum(tensors) != expected:
        raise ConfigurationError(
            f"checkpoint {path!r} is corrupt: its tensors do not match the checksum stored when it was saved. "
            "Re-save it or use another checkpoint"
        )
    order = json.loads(metadata.get("order", "[]")) or sorted(tensors)
    params = OrderedDict()
    for name in order:
        if _keep(name, filter_prefix, specify_prefix, choice_func):
            params[name] = Parameter(tensors[name], name=name)
    if net is not None:
        load_param_into_net(net, params, strict_load)
    return params


def _keep(name: str, filter_prefix: Any, specify_prefix: Any, choice_func: Any) -> bool:
    as_tuple = lambda v: (v,) if isinstance(v, str) else tuple(v or ())  # noqa: E731
    if filter_prefix and name.startswith(as_tuple(filter_prefix)):
        return False
    if specify_prefix and not name.startswith(as_tuple(specify_prefix)):
        return False
    return choice_func is None or bool(choice_func(name))


def load_param_into_net(
    net: Any, parameter_dict: dict, strict_load: bool = False, remove_redundancy: bool = False
) -> tuple[list[str], list[str]]:
    """Copy checkpoint values into net's parameters by name; returns (net params not loaded, ckpt names unused)."""
    if not isinstance(parameter_dict, dict):
        raise ConfigurationError("load_param_into_net: parameter_dict must be a dict of name -> Parameter/Tensor")
    used, not_loaded = set(), []
    for param in net.get_parameters():
        value = parameter_dict.get(param.name)
        if value is None:
            not_loaded.append(param.name)
            continue
        array = value.asnumpy() if isinstance(value, Tensor) else np.asarray(value)
        if tuple(array.shape) != tuple(param.shape):
            raise ConfigurationError(
                f"load_param_into_net: parameter {param.name!r} has shape {tuple(param.shape)} in the network but "
                f"{tuple(array.shape)} in the checkpoint; was the checkpoint saved from another network?"
            )
        param.set_data(array.astype(param.dtype.numpy, copy=False))
        used.add(param.name)
    if strict_load and not_loaded:
        raise ConfigurationError(f"load_param_into_net(strict_load=True): not in the checkpoint: {not_loaded}")
    return not_loaded, [name for name in parameter_dict if name not in used]


def export(net: Any, *inputs: Any, file_name: str, file_format: str = "ONNX", **_: Any) -> None:
    """Write net (in inference mode) as a standalone ONNX model for `inputs`' shapes; ".onnx" is appended."""
    if file_format.upper() != "ONNX":
        raise ConfigurationError(f"export: file_format {file_format!r} is not supported; use file_format='ONNX'")
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
