"""Prints MindSpore 2.7.0's weights after 4 steps of its mint.optim optimizers, and their checkpoint keys, for
test_sdk_mint_optim.py.

Run with MindSpore's python (not by pytest): python tests/unit/sdk/data/make_mindspore_mint_optim.py
Each case: Dense(3, 2) with weight arange(6) * 0.1 - 0.2 and bias [0.5, -0.5], MSELoss on x = arange(12) * 0.1
(4 x 3) and y = 1, four steps of value_and_grad + optimizer(grads) in PYNATIVE_MODE (mint's examples' loop), then
four of nn.TrainOneStepCell in GRAPH_MODE, on CPU.

MindSpore 2.7.0's CPU build runs only Adam, and only compiled (TrainOneStepCell in GRAPH_MODE): in PYNATIVE_MODE its
Adam stops at "The kernel Muls unregistered"; AdamW stops at "Not found op AdamW on device CPU" in PYNATIVE_MODE and
fails in GRAPH_MODE (mint.optim documents Ascend only); SGD runs but leaves every weight as it was, in both modes (its
in-place Parameter.add_ does nothing on CPU; in PYNATIVE_MODE step_t stays 0 too). adam_amsgrad prints plain
Adam's weights: mint's Adam computes the running maximum but never stores it. The test therefore compares tessel
with a numpy float64 implementation of PyTorch's documented formulas, and with the Adam weights printed here; it
takes from here the checkpoint keys and the first step's gradients.
"""

import os
import tempfile

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.mint import optim


def groups(d, **first):
    return [{"params": [d.weight], **first}, {"params": [d.bias]}]


CASES = {
    "adam": lambda d: optim.Adam(d.trainable_params()),
    "adam_lr_decay": lambda d: optim.Adam(d.trainable_params(), lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "adam_groups": lambda d: optim.Adam(groups(d, lr=0.02, weight_decay=0.3), lr=0.05, weight_decay=0.1),
    "adam_maximize": lambda d: optim.Adam(d.trainable_params(), lr=0.05, weight_decay=0.1, maximize=True),
    "adam_amsgrad": lambda d: optim.Adam(d.trainable_params(), lr=0.05, amsgrad=True),
    "adamw": lambda d: optim.AdamW(d.trainable_params()),
    "adamw_lr_decay": lambda d: optim.AdamW(d.trainable_params(), lr=0.05, betas=(0.8, 0.99), weight_decay=0.3),
    "adamw_groups": lambda d: optim.AdamW(groups(d, lr=0.02, weight_decay=0.3), lr=0.05, weight_decay=0.1),
    "adamw_maximize": lambda d: optim.AdamW(d.trainable_params(), lr=0.05, maximize=True),
    "sgd": lambda d: optim.SGD(d.trainable_params(), lr=0.1),
    "sgd_decay": lambda d: optim.SGD(d.trainable_params(), lr=0.1, weight_decay=0.2),
    "sgd_nesterov": lambda d: optim.SGD(d.trainable_params(), lr=0.1, momentum=0.9, nesterov=True),
    "sgd_dampening": lambda d: optim.SGD(d.trainable_params(), lr=0.1, momentum=0.8, dampening=0.5, weight_decay=0.1),
    "sgd_groups": lambda d: optim.SGD(groups(d, lr=0.05, weight_decay=0.3), lr=0.1, momentum=0.9),
    "sgd_maximize": lambda d: optim.SGD(d.trainable_params(), lr=0.1, momentum=0.5, maximize=True),
}


def make():
    dense = nn.Dense(3, 2)
    dense.weight.set_data(ms.Tensor((np.arange(6).reshape(2, 3) * 0.1 - 0.2).astype(np.float32)))
    dense.bias.set_data(ms.Tensor(np.array([0.5, -0.5], np.float32)))
    return dense


X = (np.arange(12).reshape(4, 3) * 0.1).astype(np.float32)
Y = np.ones((4, 2), np.float32)


def show(name, dense, opt):
    weight, bias = ([float(f"{v:.9g}") for v in p.asnumpy().reshape(-1)] for p in (dense.weight, dense.bias))
    print(f'    "{name}": ([{weight[:3]}, {weight[3:]}], {bias}),', flush=True)
    path = os.path.join(tempfile.mkdtemp(), "opt.ckpt")
    ms.save_checkpoint(opt, path)
    print(f"    # {name} keys: {sorted(ms.load_checkpoint(path))}", flush=True)


def run(name, loop):
    dense = make()
    opt = CASES[name](dense)
    if loop == "train_one_step":
        step = nn.TrainOneStepCell(nn.WithLossCell(dense, nn.MSELoss()), opt)
    else:
        loss_fn = nn.MSELoss()
        grad_fn = ms.value_and_grad(lambda x, y: loss_fn(dense(x), y), None, opt.parameters)
        printed = []

        def step(x, y):
            _, grads = grad_fn(x, y)
            if name == "sgd" and not printed:
                printed.append(True)
                print(f"    # gradients of the first step: {[g.asnumpy().tolist() for g in grads]}")
            opt(grads)

    try:
        for _ in range(4):
            step(ms.Tensor(X), ms.Tensor(Y))
    except Exception as error:  # a missing CPU kernel is a result here
        print(f"    # {name} ({loop}): {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
    show(f"{name} ({loop})", dense, opt)


if __name__ == "__main__":
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    for case in CASES:
        run(case, "functional")
    ms.set_context(mode=ms.GRAPH_MODE)
    for case in CASES:
        run(case, "train_one_step")
