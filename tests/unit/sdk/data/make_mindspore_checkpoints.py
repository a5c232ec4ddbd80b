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

# Optimizer state, for resuming: 2 steps, a callback's new rate (and momentum), saved; then 2 steps more, saved.
x = ms.Tensor((np.arange(12).reshape(4, 3) * 0.1).astype(np.float32))
y = ms.Tensor(np.ones((4, 2), np.float32))
for name, make in [
    ("sgd", lambda params: nn.SGD(params, learning_rate=0.1, momentum=0.9, dampening=0.5)),
    ("momentum", lambda params: nn.Momentum(params, learning_rate=0.1, momentum=0.9)),
]:
    dense = nn.Dense(3, 2)
    dense.weight.set_data(ms.Tensor((np.arange(6).reshape(2, 3) * 0.1).astype(np.float32)))
    dense.bias.set_data(ms.Tensor(np.array([0.5, -0.5], np.float32)))
    opt = make(dense.trainable_params())
    step = nn.TrainOneStepCell(nn.WithLossCell(dense, nn.MSELoss()), opt)
    step(x, y)
    step(x, y)
    # ops.assign: MindSpore 2.7.0's set_data on these 0-d Parameters does not reach its PYNATIVE kernels (measured:
    # the next steps read a rate of 0, or a momentum of 0 and the rate 0.8)
    ms.ops.assign(opt.learning_rate, ms.Tensor(0.05, ms.float32))
    ms.ops.assign(opt.momentum, ms.Tensor(0.8, ms.float32))
    ms.save_checkpoint(step, f"{out}/{name}_step2.ckpt")
    step(x, y)
    step(x, y)
    ms.save_checkpoint(step, f"{out}/{name}_step4.ckpt")
