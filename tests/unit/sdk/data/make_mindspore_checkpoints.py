"""Writes the MindSpore checkpoints tests/unit/sdk/test_mindspore_checkpoints.py reads:
python make_mindspore_checkpoints.py DIR, under MindSpore 2.7.0 (not run by the tests: tessel does not depend on
MindSpore)."""

import sys

import mindspore as ms
import numpy as np
from mindspore import nn

out = sys.argv[1]
ms.set_context(mode=ms.PYNATIVE_MODE)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, has_bias=True)
        self.bn = nn.BatchNorm2d(2)
        self.fc = nn.Dense(8, 3)

    def construct(self, x):
        return self.fc(self.bn(self.conv(x)).reshape(x.shape[0], -1))


net = Net()
for i, p in enumerate(net.get_parameters()):
    p.set_data(ms.Tensor((np.arange(int(np.prod(p.shape))) * 0.25 + i).reshape(p.shape).astype(np.float32)))
print([p.name for p in net.get_parameters()])
ms.save_checkpoint(net, f"{out}/plain.ckpt")
ms.save_checkpoint(net, f"{out}/crc.ckpt", crc_check=True, append_dict={"epoch_num": 3, "note": "hello", "lr": 0.5})
ms.save_checkpoint(net, f"{out}/weights.safetensors", format="safetensors", crc_check=True)
