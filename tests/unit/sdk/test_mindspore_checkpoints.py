"""Checkpoints MindSpore 2.7.0 wrote (tests/unit/sdk/data, made by make_mindspore_checkpoints.py there) load into
tessel: its protobuf .ckpt with and without the CRC trailer and append_dict values, and its safetensors; every
parameter holds the pattern the script set (arange * 0.25 + its index in MindSpore's parameter order)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import tessel as ms
from tessel import nn
from tessel.core.errors import ConfigurationError

DATA = Path(__file__).parent / "data"
MINDSPORE_ORDER = [
    "conv.weight", "conv.bias", "bn.moving_mean", "bn.moving_variance", "bn.gamma", "bn.beta", "fc.weight", "fc.bias",
]  # fmt: skip


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, has_bias=True)
        self.bn = nn.BatchNorm2d(2)
        self.fc = nn.Dense(8, 3)

    def construct(self, x):
        return self.fc(self.bn(self.conv(x)).reshape(x.shape[0], -1))


def expected(name: str, shape: tuple) -> np.ndarray:
    index = MINDSPORE_ORDER.index(name)
    return (np.arange(int(np.prod(shape))) * 0.25 + index).reshape(shape).astype(np.float32)


@pytest.mark.parametrize("file", ["plain.ckpt", "crc.ckpt", "weights.safetensors"])
def test_mindsporess_checkpoints_load_into_the_same_network(file):
    net = Net()
    kind = "safetensors" if file.endswith("safetensors") else "ckpt"
    params = ms.load_checkpoint(str(DATA / file), format=kind)
    not_loaded, unused = ms.load_param_into_net(net, params)
    assert not_loaded == [] and sorted(k for k in unused) == (["epoch_num", "lr", "note"] if file == "crc.ckpt" else [])
    for name, param in net.parameters_and_names():
        np.testing.assert_array_equal(param.asnumpy(), expected(name, tuple(param.shape)), err_msg=name)
    if kind == "ckpt":
        assert list(params)[: len(MINDSPORE_ORDER)] == MINDSPORE_ORDER  # the file's order
    if file == "crc.ckpt":  # append_dict: an int, a float and a str
        assert int(params["epoch_num"].asnumpy()) == 3 and float(params["lr"].asnumpy()) == 0.5
        assert params["note"] == "hello"


def test_parameters_come_in_mindsporess_order():
    """MindSpore 2.7.0 printed this order for the same network: BatchNorm's moving statistics before gamma, beta."""
    assert [p.name for p in Net().get_parameters()] == MINDSPORE_ORDER


def test_a_damaged_mindspore_checkpoint_is_a_clear_error(tmp_path):
    damaged = tmp_path / "crc.ckpt"
    data = bytearray((DATA / "crc.ckpt").read_bytes())
    data[40] ^= 0xFF  # inside the first tensor's bytes: only the CRC notices
    damaged.write_bytes(bytes(data))
    with pytest.raises(ConfigurationError, match="its CRC-32 does not match"):
        ms.load_checkpoint(str(damaged))
    cut = tmp_path / "plain.ckpt"
    cut.write_bytes((DATA / "plain.ckpt").read_bytes()[:-5])
    with pytest.raises(ConfigurationError, match=r"neither a tessel .* nor a readable MindSpore"):
        ms.load_checkpoint(str(cut))
    changed = tmp_path / "weights.safetensors"
    shutil.copy(DATA / "weights.safetensors", changed)
    raw = bytearray(changed.read_bytes())
    raw[-3] ^= 0xFF
    changed.write_bytes(bytes(raw))
    with pytest.raises(ConfigurationError, match="crc_num does not match"):
        ms.load_checkpoint(str(changed), format="safetensors")


def test_tessels_ckpt_is_mindsporess_protobuf_format(tmp_path):
    """A plain .ckpt is MindSpore's layout (MindSpore 2.7.0 loaded one with crc_check=True): Checkpoint messages,
    a 0-d value's dims as [0], text as UTF-32, then b"crc_num" and a 10-byte big-endian CRC-32."""
    import binascii

    from tessel.v1.mindspore_checkpoint_pb2 import MindSporeCheckpoint

    path = tmp_path / "net.ckpt"
    ms.save_checkpoint(Net(), str(path), append_dict={"epoch_num": 3, "note": "hi"})
    data = path.read_bytes()
    assert data[-17:-10] == b"crc_num" and int.from_bytes(data[-10:], "big") == binascii.crc32(data[:-17])
    values = {v.tag: v.tensor for v in MindSporeCheckpoint.FromString(data[:-17]).value}
    assert list(values)[: len(MINDSPORE_ORDER)] == MINDSPORE_ORDER
    assert values["fc.weight"].tensor_type == "Float32" and list(values["fc.weight"].dims) == [3, 8]
    assert values["epoch_num"].tensor_type == "Int64" and list(values["epoch_num"].dims) == [0]
    assert values["note"].tensor_type == "str" and values["note"].tensor_content == "hi".encode("utf-32-le")
    loaded = ms.load_checkpoint(str(path))
    assert loaded["note"] == "hi" and int(loaded["epoch_num"].asnumpy()) == 3


def test_crc_check_on_a_file_without_a_crc_says_nothing_was_checked(caplog, monkeypatch):
    """MindSpore's plain.ckpt has no CRC trailer: crc_check=True loads it, as MindSpore does, with a warning."""
    from tessel.core import options

    monkeypatch.setattr(options, "_logged", set())
    ms.load_checkpoint(str(DATA / "plain.ckpt"))
    assert not caplog.records
    params = ms.load_checkpoint(str(DATA / "plain.ckpt"), crc_check=True)
    assert "conv.weight" in params and "has no CRC-32 trailer, so nothing was checked" in caplog.text
    caplog.clear()
    ms.load_checkpoint(str(DATA / "crc.ckpt"), crc_check=True)  # its CRC was checked: nothing to say
    assert not caplog.records


@pytest.mark.parametrize("name", ["sgd", "momentum"])
def test_training_resumes_from_mindsporess_optimizer_state(name):
    """MindSpore 2.7.0 trained 2 steps, set a new learning rate and momentum (as a callback would), saved, trained 2
    more and saved again (make_mindspore_checkpoints.py). tessel, resuming from the first file, lands on the second:
    the rate, the momentum, the step count and SGD's first-step flags ("stat.*", per parameter) come back."""
    dense = nn.Dense(3, 2)
    opt = (
        nn.SGD(dense.trainable_params(), learning_rate=0.1, momentum=0.9, dampening=0.5)
        if name == "sgd"
        else nn.Momentum(dense.trainable_params(), learning_rate=0.1, momentum=0.9)
    )
    step = nn.TrainOneStepCell(nn.WithLossCell(dense, nn.MSELoss()), opt)
    saved = ms.load_checkpoint(str(DATA / f"{name}_step2.ckpt"))
    not_loaded, unused = ms.load_param_into_net(step, saved)
    assert not_loaded == [] and unused == []  # the same names and shapes as MindSpore's
    assert float(opt.learning_rate) == pytest.approx(0.05) and opt.momentum == pytest.approx(0.8)
    assert int(opt.global_step.asnumpy()[0]) == 2
    x = ms.Tensor((np.arange(12).reshape(4, 3) * 0.1).astype(np.float32))
    y = ms.Tensor(np.ones((4, 2), np.float32))
    step(x, y)
    step(x, y)
    want = ms.load_checkpoint(str(DATA / f"{name}_step4.ckpt"))
    for param in step.get_parameters():
        got, expected = param.asnumpy(), want[param.name].asnumpy()
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7, err_msg=param.name)
