"""Checkpoints (safetensors, atomic, checksummed) and ONNX export."""

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


def test_corrupt_and_wrong_files_are_clear_errors(tmp_path):
    net = nn.Dense(3, 2)
    path = tmp_path / "net.ckpt"
    ms.save_checkpoint(net, str(path))
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # one flipped bit of tensor data
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigurationError, match="is corrupt: its tensors do not match the checksum"):
        ms.load_checkpoint(str(path))
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ConfigurationError, match="is corrupt"):
        ms.load_checkpoint(str(path))
    header = json.dumps({"__metadata__": {}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(ConfigurationError, match="has no checksum"):
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
