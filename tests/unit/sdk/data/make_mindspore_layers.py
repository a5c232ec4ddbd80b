"""Writes mindspore_layers.npz, which tests/unit/sdk/test_sdk_more_layers.py reads: python make_mindspore_layers.py
DIR, under MindSpore 2.7.0 (not run by the tests: tessel does not depend on MindSpore). For each case: the cell's
parameters (random, set with set_data), the input x, the output y, a random cotangent r and the gradients of
sum(y * r) with respect to x ("dx") and each parameter ("d<name>"); "cases" holds the case list as JSON."""

import json
import sys

import mindspore as ms
import numpy as np
from mindspore import nn

ms.set_context(mode=ms.PYNATIVE_MODE)

# (name, nn class, keyword arguments, input shape)
CASES = [
    ("c1", "Conv1d", dict(in_channels=4, out_channels=6, kernel_size=3), (2, 4, 11)),
    (
        "c2",
        "Conv1d",
        dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, pad_mode="valid", dilation=2),
        (2, 4, 11),
    ),
    (
        "c3",
        "Conv1d",
        dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, pad_mode="pad", padding=2, group=2, has_bias=True),
        (2, 4, 11),
    ),
    ("c4", "Conv1d", dict(in_channels=4, out_channels=6, kernel_size=4, stride=3, has_bias=True), (2, 4, 11)),
    ("t1", "Conv2dTranspose", dict(in_channels=4, out_channels=6, kernel_size=3, stride=2), (2, 4, 5, 6)),
    (
        "t2",
        "Conv2dTranspose",
        dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, pad_mode="valid"),
        (2, 4, 5, 6),
    ),
    (
        "t3",
        "Conv2dTranspose",
        dict(
            in_channels=4,
            out_channels=6,
            kernel_size=3,
            stride=2,
            pad_mode="pad",
            padding=1,
            output_padding=1,
            has_bias=True,
        ),
        (2, 4, 5, 6),
    ),
    (
        "t4",
        "Conv2dTranspose",
        dict(
            in_channels=4,
            out_channels=6,
            kernel_size=(3, 2),
            stride=(2, 3),
            pad_mode="pad",
            padding=(1, 0, 2, 1),
            group=2,
            dilation=2,
            output_padding=(1, 0),
        ),
        (2, 4, 5, 6),
    ),
    (
        "t5",
        "Conv2dTranspose",
        dict(in_channels=4, out_channels=6, kernel_size=2, stride=3, pad_mode="valid", has_bias=True),
        (2, 4, 5, 6),
    ),
    ("t6", "Conv2dTranspose", dict(in_channels=4, out_channels=2, kernel_size=3, stride=1, group=2), (2, 4, 5, 6)),
    ("u1", "Conv1dTranspose", dict(in_channels=4, out_channels=6, kernel_size=3, stride=2), (2, 4, 7)),
    (
        "u2",
        "Conv1dTranspose",
        dict(in_channels=4, out_channels=6, kernel_size=2, stride=3, pad_mode="valid"),
        (2, 4, 7),
    ),
    (
        "u3",
        "Conv1dTranspose",
        dict(
            in_channels=4,
            out_channels=6,
            kernel_size=3,
            stride=2,
            pad_mode="pad",
            padding=1,
            group=2,
            dilation=2,
            has_bias=True,
        ),
        (2, 4, 7),
    ),
    ("m1", "MaxPool1d", dict(kernel_size=3, stride=2), (2, 3, 11)),
    ("m2", "MaxPool1d", dict(kernel_size=2, stride=1, pad_mode="same"), (2, 3, 11)),
    ("m3", "MaxPool1d", dict(kernel_size=3, stride=2, pad_mode="pad", padding=1), (2, 3, 11)),
    ("m4", "MaxPool1d", dict(kernel_size=3, stride=2), (3, 11)),
    ("a1", "AvgPool1d", dict(kernel_size=3, stride=2), (2, 3, 11)),
    ("a2", "AvgPool1d", dict(kernel_size=3, stride=2, pad_mode="same"), (2, 3, 11)),
    ("a3", "AvgPool1d", dict(kernel_size=3, stride=2, pad_mode="pad", padding=1), (2, 3, 11)),
    ("a4", "AvgPool1d", dict(kernel_size=3, stride=2, pad_mode="pad", padding=1, count_include_pad=False), (2, 3, 11)),
    ("a5", "AvgPool1d", dict(kernel_size=4, stride=2, pad_mode="same"), (2, 3, 5)),
    ("a6", "AvgPool1d", dict(kernel_size=3, stride=2), (3, 11)),
    ("a7", "AvgPool1d", dict(kernel_size=11, stride=1, pad_mode="same"), (2, 3, 11)),
    ("p1", "AdaptiveAvgPool1d", dict(output_size=3), (2, 3, 12)),
    ("p2", "AdaptiveMaxPool1d", dict(output_size=4), (2, 3, 12)),
    ("q1", "AdaptiveAvgPool2d", dict(output_size=(3, None)), (2, 3, 7, 5)),
    ("q2", "AdaptiveAvgPool2d", dict(output_size=(2, 3)), (2, 3, 6, 6)),
    ("q3", "AdaptiveAvgPool2d", dict(output_size=3), (3, 5, 7)),
    ("q4", "AdaptiveAvgPool2d", dict(output_size=(4, 3)), (2, 3, 7, 5)),
    ("r1", "AdaptiveMaxPool2d", dict(output_size=(3, 4)), (2, 3, 7, 5)),
    ("r2", "AdaptiveMaxPool2d", dict(output_size=2), (2, 3, 6, 6)),
    ("r3", "AdaptiveMaxPool2d", dict(output_size=(None, 2)), (3, 5, 7)),
    ("f1", "Unflatten", dict(axis=1, unflattened_size=(2, 3)), (2, 6, 4)),
    ("f2", "Unflatten", dict(axis=-1, unflattened_size=[2, 2]), (2, 6, 4)),
    ("f3", "Unflatten", dict(axis=-2, unflattened_size=(3, 2)), (2, 6, 4)),
]

out = {"cases": np.array(json.dumps(CASES))}
for name, cls, kw, shape in CASES:
    rng = np.random.default_rng(sum(map(ord, name)) * 7)
    cell = getattr(nn, cls)(**kw)
    for p in cell.trainable_params():
        value = (rng.standard_normal(p.shape) * 0.5).astype(np.float32)
        p.set_data(ms.Tensor(value))
        out[f"{name}.{p.name}"] = value
    x = rng.standard_normal(shape).astype(np.float32)
    y = cell(ms.Tensor(x))
    r = rng.standard_normal(y.shape).astype(np.float32)
    weights = cell.trainable_params()

    def loss(inp, cell=cell, r=r):
        return (cell(inp) * ms.Tensor(r)).sum()

    _, grads = ms.value_and_grad(loss, grad_position=0, weights=weights or None)(ms.Tensor(x))
    dx, dweights = grads if weights else (grads, ())
    out.update({f"{name}.x": x, f"{name}.y": y.asnumpy(), f"{name}.r": r, f"{name}.dx": dx.asnumpy()})
    out.update({f"{name}.d{p.name}": g.asnumpy() for p, g in zip(weights, dweights)})
np.savez_compressed(f"{sys.argv[1]}/mindspore_layers.npz", **out)
