"""Prints MindSpore 2.7.0's weights after 3 train steps and its checkpoint keys, for test_sdk_optim_more.py.

Run with MindSpore's python (not by pytest): python tests/unit/sdk/data/make_mindspore_optimizers.py
Each case: Dense(3, 2) with weight arange(6) * 0.1 and bias [0.5, -0.5], MSELoss on x = arange(12) * 0.1 (4 x 3)
and y = 1, three nn.TrainOneStepCell steps in GRAPH_MODE on CPU.

adagrad_no_slots shows that MindSpore's CPU kernel updates the accumulator even with update_slots=False (its weights
are those of update_slots=True), which tessel therefore refuses. With l1 > 0 MindSpore's CPU
ApplyFtrl takes +l1 wherever linear is not 0 (where its documentation has sign(linear) * l1): ftrl_l1_l2 shows it, and
tessel follows the documentation there. LazyAdam on these dense
gradients gives nn.Adam's weights bit for bit (the same arguments to Adam print the same numbers).
"""

import os
import tempfile

import mindspore as ms
import numpy as np
from mindspore import nn

CASES = {
    "rmsprop": lambda d: nn.RMSProp(d.trainable_params(), 0.01),
    "rmsprop_momentum": lambda d: nn.RMSProp(d.trainable_params(), 0.01, decay=0.8, momentum=0.9, epsilon=1e-6),
    "rmsprop_centered": lambda d: nn.RMSProp(d.trainable_params(), 0.01, momentum=0.5, centered=True),
    "rmsprop_schedule_decay": lambda d: nn.RMSProp(
        d.trainable_params(), nn.ExponentialDecayLR(0.02, 0.5, 1), momentum=0.9, centered=True, weight_decay=0.1
    ),
    "adagrad": lambda d: nn.Adagrad(d.trainable_params(), learning_rate=0.1),
    "adagrad_no_slots": lambda d: nn.Adagrad(d.trainable_params(), accum=0.5, learning_rate=0.1, update_slots=False),
    "adagrad_groups": lambda d: nn.Adagrad(
        [{"params": [d.weight], "lr": 0.05, "weight_decay": 0.1}, {"params": [d.bias]}], learning_rate=[0.1, 0.2, 0.3]
    ),
    "adadelta": lambda d: nn.Adadelta(d.trainable_params()),
    "adadelta_schedule": lambda d: nn.Adadelta(
        d.trainable_params(), nn.ExponentialDecayLR(2.0, 0.5, 1), rho=0.5, epsilon=1e-3, weight_decay=0.01
    ),
    "proximal_adagrad": lambda d: nn.ProximalAdagrad(d.trainable_params(), learning_rate=0.1),
    "proximal_adagrad_l1_l2": lambda d: nn.ProximalAdagrad(
        d.trainable_params(), accum=0.2, learning_rate=0.1, l1=0.05, l2=0.1, weight_decay=0.01
    ),
    "rprop": lambda d: nn.Rprop(d.trainable_params(), 0.01),
    "rprop_schedule_decay": lambda d: nn.Rprop(
        d.trainable_params(), nn.ExponentialDecayLR(0.05, 0.5, 1), (0.3, 1.5), (1e-3, 0.04), weight_decay=0.1
    ),
    "rprop_groups": lambda d: nn.Rprop([{"params": [d.weight], "lr": 0.02}, {"params": [d.bias]}], 0.05),
    "asgd": lambda d: nn.ASGD(d.trainable_params(), 0.1),
    "asgd_t0": lambda d: nn.ASGD(d.trainable_params(), 0.1, lambd=0.1, alpha=0.5, t0=1.0),
    "asgd_schedule": lambda d: nn.ASGD(
        d.trainable_params(), nn.ExponentialDecayLR(0.2, 0.5, 1), lambd=0.05, t0=0.0, weight_decay=0.1
    ),
    "lazy_adam": lambda d: nn.LazyAdam(d.trainable_params(), 0.05, weight_decay=0.01, use_nesterov=True),
    "lazy_adam_groups": lambda d: nn.LazyAdam(
        [{"params": [d.weight], "lr": 0.05}, {"params": [d.bias]}], nn.ExponentialDecayLR(0.1, 0.5, 1)
    ),
    "ftrl": lambda d: nn.FTRL(d.trainable_params(), learning_rate=0.1),
    "ftrl_l2": lambda d: nn.FTRL(
        [{"params": [d.weight], "weight_decay": 0.1}, {"params": [d.bias]}], 0.2, 0.1, lr_power=-0.7, l2=0.1
    ),
    "ftrl_l1_l2": lambda d: nn.FTRL(d.trainable_params(), 0.2, 0.1, lr_power=-0.7, l1=0.05, l2=0.1),
}


def run(name):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    dense = nn.Dense(3, 2)
    dense.weight.set_data(ms.Tensor((np.arange(6).reshape(2, 3) * 0.1).astype(np.float32)))
    dense.bias.set_data(ms.Tensor(np.array([0.5, -0.5], np.float32)))
    opt = CASES[name](dense)
    step = nn.TrainOneStepCell(nn.WithLossCell(dense, nn.MSELoss()), opt)
    x = ms.Tensor((np.arange(12).reshape(4, 3) * 0.1).astype(np.float32))
    y = ms.Tensor(np.ones((4, 2), np.float32))
    for _ in range(3):
        step(x, y)
    path = os.path.join(tempfile.mkdtemp(), "opt.ckpt")
    ms.save_checkpoint(step, path)
    keys = sorted(ms.load_checkpoint(path))
    weight, bias = ([float(f"{v:.9g}") for v in p.asnumpy().reshape(-1)] for p in (dense.weight, dense.bias))
    print(f'    "{name}": ([{weight[:3]}, {weight[3:]}], {bias}),')
    print(f"    # {name} keys: {keys}")
    if name.startswith("asgd"):
        print("    # state", {k: v.asnumpy().tolist() for k, v in ms.load_checkpoint(path).items() if "_" in k})


if __name__ == "__main__":
    for case in CASES:
        run(case)
