"""Checkpoints (MindSpore's protobuf .ckpt or safetensors; atomic, checksummed) and ONNX export."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
from tessel import nn
from tessel.core.errors import ConfigurationError


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, has_bias=True)
        self.bn = nn.BatchNorm2d(2)
        self.flatten = nn.Flatten()
        self.dense = nn.Dense(2 * 5 * 5, 3)

    def construct(self, x):
        return self.dense(self.flatten(ms.ops.relu(self.bn(self.conv(x)))))


def test_round_trip_restores_every_parameter(tmp_path):
    ms.set_seed(1)
    source = Net()
    ms.save_checkpoint(source, str(tmp_path / "net"), append_dict={"epoch_num": 3})
    assert (tmp_path / "net.ckpt").exists() and not list(tmp_path.glob(".tmp-*"))
    ms.set_seed(2)
    target = Net()
    loaded = ms.load_checkpoint(str(tmp_path / "net.ckpt"))
    assert list(loaded)[:2] == ["conv.weight", "conv.bias"] and int(loaded["epoch_num"].asnumpy()) == 3
    not_loaded, unused = ms.load_param_into_net(target, loaded)
    assert not_loaded == [] and unused == ["epoch_num"]
    x = ms.Tensor(rand(2, 1, 5, 5))
    np.testing.assert_array_equal(target(x).asnumpy(), source(x).asnumpy())


def test_saved_values_are_the_trained_ones(tmp_path):
    net = nn.Dense(3, 2)
    optimizer = nn.SGD(net.trainable_params(), 0.5)
    optimizer((ms.Tensor(np.ones((2, 3), np.float32)), ms.Tensor(np.ones(2, np.float32))))
    ms.save_checkpoint([{"name": "w", "data": net.weight}], str(tmp_path / "w.ckpt"))
    np.testing.assert_array_equal(ms.load_checkpoint(str(tmp_path / "w.ckpt"))["w"].asnumpy(), net.weight.asnumpy())


@pytest.mark.parametrize("suffix", ["ckpt", "safetensors"])
def test_a_flipped_bit_or_a_cut_is_a_clear_error(tmp_path, suffix):
    """.ckpt is MindSpore's protobuf with its CRC-32 trailer, .safetensors tessel's with a SHA-256: either way a
    changed byte or a truncated file is an error, never other weights."""
    path = tmp_path / f"net.{suffix}"
    ms.save_checkpoint(nn.Dense(3, 2), str(path), format=suffix)
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # one flipped byte of tensor data (before .ckpt's 17-byte trailer)
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigurationError, match=r"is corrupt: its (tensors|CRC-32) do(es)? not match"):
        ms.load_checkpoint(str(path), format=suffix)
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ConfigurationError, match=r"is truncated, corrupt|nor a readable MindSpore"):
        ms.load_checkpoint(str(path), format=suffix)


def test_corrupt_and_wrong_files_are_clear_errors(tmp_path):
    net = nn.Dense(3, 2)
    path = tmp_path / "net.ckpt"
    # another writer's safetensors (MindSpore's): loaded as MindSpore loads it, its crc_num checked when present
    header = json.dumps({"__metadata__": {}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    assert ms.load_checkpoint(str(path))["w"].asnumpy().tolist() == [0.0]
    metadata = {"crc_num": "12345"}
    header = json.dumps({"__metadata__": metadata, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 4)
    with pytest.raises(ConfigurationError, match="crc_num does not match its tensors"):
        ms.load_checkpoint(str(path))
    with pytest.raises(ConfigurationError, match="does not exist"):
        ms.load_checkpoint(str(tmp_path / "missing.ckpt"))
    ms.save_checkpoint({"weight": np.zeros((5, 5), np.float32)}, str(tmp_path / "other.ckpt"))
    with pytest.raises(ConfigurationError, match=r"'weight' has shape \(2, 3\) in the network but \(5, 5\)"):
        ms.load_param_into_net(net, ms.load_checkpoint(str(tmp_path / "other.ckpt")))


def test_export_runs_standalone_in_onnxruntime(tmp_path):
    ms.set_seed(4)
    net = Net()
    net.set_train(True)
    net(ms.Tensor(rand(4, 1, 5, 5)))  # move the BatchNorm statistics away from their initial values
    x = rand(3, 1, 5, 5, seed=1)
    ms.export(net, ms.Tensor(x), file_name=str(tmp_path / "net"), file_format="ONNX")
    assert net.training  # restored after exporting in inference mode
    np.save(tmp_path / "x.npy", x)
    # A fresh process with plain onnxruntime: the file must not depend on anything of tessel's.
    standalone = (
        "import sys, numpy as np, onnxruntime as ort\n"
        "s = ort.InferenceSession(sys.argv[1] + '/net.onnx', providers=['CPUExecutionProvider'])\n"
        "assert [i.name for i in s.get_inputs()] == ['input_0']\n"
        "np.save(sys.argv[1] + '/y.npy', s.run(None, {'input_0': np.load(sys.argv[1] + '/x.npy')})[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", standalone, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    got = np.load(tmp_path / "y.npy")
    net.set_train(False)
    np.testing.assert_allclose(got, net(ms.Tensor(x)).asnumpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigurationError, match="file_format 'MINDIR' is not supported"):
        ms.export(net, ms.Tensor(x), file_name=str(tmp_path / "net"), file_format="MINDIR")


def test_a_save_killed_midway_leaves_no_temp_file_after_the_next_save(tmp_path):
    # A process saving a large checkpoint in a loop is SIGKILLed while a temp file of the save exists.
    saver = (
        "import sys, numpy as np, tessel as ms\n"
        "big = {'w': np.ones(1 << 24, np.float32)}\n"
        "while True:\n"
        "    ms.save_checkpoint(big, sys.argv[1])\n"
    )
    target = tmp_path / "big.ckpt"
    proc = subprocess.Popen([sys.executable, "-c", saver, str(target)])
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    left = list(tmp_path.glob(".tmp-*"))
    assert left and all(p.name.startswith(".tmp-big.ckpt.") for p in left), left
    ms.save_checkpoint({"w": np.zeros(4, np.float32)}, str(target))
    assert not list(tmp_path.glob(".tmp-*"))
    np.testing.assert_array_equal(ms.load_checkpoint(str(target))["w"].asnumpy(), np.zeros(4, np.float32))
    # Another file's temp in the same folder, or one of a live writer, is not touched.
    other = tmp_path / f".tmp-other.ckpt.{socket.gethostname()}.1.x"
    live = tmp_path / f".tmp-big.ckpt.{socket.gethostname()}.{os.getpid()}.x"
    other.touch()
    live.touch()
    ms.save_checkpoint({"w": np.zeros(4, np.float32)}, str(target))
    assert other.exists() and live.exists()


def test_append_dict_values_round_trip_as_mindspore_stores_them(tmp_path):
    path = str(tmp_path / "extra.ckpt")
    transposed = np.arange(6.0, dtype=np.float32).reshape(2, 3).T  # not C-contiguous
    ms.save_checkpoint(
        nn.Dense(2, 2),
        path,
        append_dict={
            "t": transposed,
            "tt": ms.Tensor(transposed),
            "lr": 0.5,
            "epoch": 3,
            "done": True,
            "model": "resnet",
        },
    )
    loaded = ms.load_checkpoint(path)
    np.testing.assert_array_equal(loaded["t"].asnumpy(), transposed)
    np.testing.assert_array_equal(loaded["tt"].asnumpy(), transposed)
    assert (loaded["lr"].dtype, loaded["epoch"].dtype, loaded["done"].dtype) == (ms.float32, ms.int64, ms.bool_)
    assert loaded["model"] == "resnet"  # strings load back as str, as in MindSpore
    with pytest.raises(ConfigurationError, match=r"append_dict\['bad'\] is a list; values must be int, float"):
        ms.save_checkpoint(nn.Dense(2, 2), path, append_dict={"bad": [1, 2]})
    with pytest.raises(ConfigurationError, match=r"append_info\['x'\] is a NoneType"):
        ms.train.CheckpointConfig(append_info=[{"x": None}])
    # a string altered in the file is caught like a tensor
    with open(path, "rb") as source:  # a .ckpt holds text as MindSpore does: UTF-32
        data = source.read().replace("resnet".encode("utf-32-le"), "resneX".encode("utf-32-le"))
    with open(path, "wb") as out:
        out.write(data)
    with pytest.raises(ConfigurationError, match="its CRC-32 does not match"):
        ms.load_checkpoint(path)


def test_loading_casts_within_floats_or_integers_only(tmp_path):
    net = nn.Dense(2, 2)
    half = {name: ms.Tensor(p.asnumpy().astype(np.float16)) for name, p in net.parameters_and_names()}
    not_loaded, _ = ms.load_param_into_net(net, half)
    assert not_loaded == [] and net.weight.dtype == ms.float32
    with pytest.raises(ConfigurationError, match="only floats cast to floats and integers to integers"):
        ms.load_param_into_net(net, {"weight": ms.Tensor(np.ones((2, 2), np.int32))})
    with pytest.raises(ConfigurationError, match="strict_load=True"):
        ms.load_param_into_net(net, half, strict_load=True)


def test_prefix_filters_override_choice_func_and_may_not_filter_out_everything(tmp_path):
    path = str(tmp_path / "net.ckpt")
    ms.save_checkpoint(Net(), path)
    assert list(ms.load_checkpoint(path, specify_prefix="conv", choice_func=lambda n: False)) == [
        "conv.weight",
        "conv.bias",
    ]
    assert "bn.gamma" not in ms.load_checkpoint(path, choice_func=lambda n: not n.startswith("bn"))
    with pytest.raises(ConfigurationError, match=r"nothing of .* is left after filter_prefix"):
        ms.load_checkpoint(path, specify_prefix="zzz")
    with pytest.raises(ConfigurationError, match="specify_prefix must be a non-empty str"):
        ms.load_checkpoint(path, specify_prefix=("conv", ""))


def test_a_broken_mindspore_protobuf_checkpoint_is_named_as_such(tmp_path):
    path = tmp_path / "mindspore.ckpt"  # a MindSpore checkpoint's first bytes, then garbage
    path.write_bytes(b"\n\x8a\x01\n\x0cconv1.weight\x12z\x08\x06\x08\x01\x08\x05\x08\x05\x10\x0b" + b"\0" * 64)
    with pytest.raises(ConfigurationError, match=r"nor a readable MindSpore \(protobuf\) checkpoint"):
        ms.load_checkpoint(str(path))


def test_predict_strategy_must_be_the_networks_own_layouts(tmp_path):
    path = str(tmp_path / "net.ckpt")
    net = nn.Dense(2, 2)
    ms.save_checkpoint(net, path)
    with pytest.raises(ConfigurationError, match=r"has no compiled layouts yet; call model\.infer_predict_layout"):
        ms.load_distributed_checkpoint(net, [path], predict_strategy={"weight": [[1], [-1, -1]]})
    with pytest.raises(ConfigurationError, match="predict_strategy must be None or the dict"):
        ms.load_distributed_checkpoint(net, [path], predict_strategy=[1])
    ms.load_distributed_checkpoint(net, [path])


def test_a_checkpoint_of_the_earlier_names_still_loads(tmp_path, caplog):
    # before parameters were named by attribute path, a CellList filled after assignment named its weights 0.weight
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layers = nn.CellList()
            for _ in range(2):
                self.layers.append(nn.Dense(2, 2))

    source, target = Net(), Net()
    old = {p.name.removeprefix("layers."): p for p in source.get_parameters()}
    ms.save_checkpoint(old, str(tmp_path / "old.ckpt"))
    not_loaded, unused = ms.load_param_into_net(target, ms.load_checkpoint(str(tmp_path / "old.ckpt")))
    assert not_loaded == [] and unused == [] and "its name in a checkpoint of an earlier tessel" in caplog.text
    for a, b in zip(source.get_parameters(), target.get_parameters()):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
