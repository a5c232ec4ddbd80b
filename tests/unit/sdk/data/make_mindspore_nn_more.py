"""Writes tests/unit/sdk/data/mindspore_nn_more.npz, which tests/unit/sdk/test_sdk_nn_more.py reads: run
`python make_mindspore_nn_more.py OUT.npz` under MindSpore 2.7.0 (CPU; not run by the tests: tessel does not
depend on MindSpore). For each case it stores the cell's constructor (evaluated with `nn` = mindspore.nn or
tessel.nn), its inputs, a cotangent, the output and the gradients of sum(output * cotangent) w.r.t. the float
inputs and the trainable parameters, from PYNATIVE (GRAPH_MODE is run too and must agree to 1e-6)."""

import sys

import mindspore as ms
import numpy as np
from mindspore import nn

rng = np.random.default_rng(7)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# name: (constructor, inputs); the inputs avoid kinks (x == 0, x == threshold) where gradients are one-sided
CASES = {
    "prelu_channel": ("nn.PReLU(3, [0.1, 0.2, 0.3])", [normal(2, 3, 4)]),
    "prelu_shared": ("nn.PReLU()", [normal(2, 5)]),
    "threshold": ("nn.Threshold(0.1, 20.0)", [normal(3, 4)]),
    "celu": ("nn.CELU(0.7)", [normal(3, 4)]),
    "glu": ("nn.GLU(1)", [normal(2, 4, 3)]),
    "softmax2d": ("nn.Softmax2d()", [normal(2, 3, 2, 2)]),
    "zeropad2d": ("nn.ZeroPad2d((1, 2, 0, 1))", [normal(1, 2, 3, 3)]),
    "constantpad1d": ("nn.ConstantPad1d((2, -1), 0.5)", [normal(2, 3, 4)]),
    "constantpad2d": ("nn.ConstantPad2d(1, -1.0)", [normal(2, 3, 3)]),
    "constantpad3d": ("nn.ConstantPad3d((1, 0, 0, 1, 1, 1), 2.0)", [normal(1, 2, 2, 3)]),
    "reflectionpad1d": ("nn.ReflectionPad1d((2, 1))", [normal(2, 3, 4)]),
    "reflectionpad2d": ("nn.ReflectionPad2d((1, 2, 2, 0))", [normal(1, 2, 3, 4)]),
    "replicationpad1d": ("nn.ReplicationPad1d((1, 3))", [normal(2, 3, 4)]),
    "replicationpad2d": ("nn.ReplicationPad2d(2)", [normal(1, 2, 3, 3)]),
    "pad_constant": ("nn.Pad(((0, 0), (1, 2), (2, 1)), 'CONSTANT')", [normal(2, 3, 3)]),
    "pad_reflect": ("nn.Pad(((1, 1), (2, 1)), 'REFLECT')", [normal(3, 4)]),
    "pad_symmetric": ("nn.Pad(((0, 0), (2, 3), (1, 2)), 'SYMMETRIC')", [normal(2, 3, 4)]),
    "pixelshuffle": ("nn.PixelShuffle(2)", [normal(2, 8, 2, 3)]),
    "pixelunshuffle": ("nn.PixelUnshuffle(2)", [normal(2, 2, 4, 6)]),
    "onehot": ("nn.OneHot(axis=0, depth=4, on_value=2.0, off_value=-1.0)", [np.array([0, 3, 1], np.int32)]),
}
WEIGHTS = {"prelu_channel": None}


def run(name, expr, inputs, mode):
    ms.set_context(mode=mode)
    cell = eval(expr, {"nn": nn})
    tensors = [ms.Tensor(x) for x in inputs]
    out = cell(*tensors)
    result = {"out": out.asnumpy()}
    floats = tuple(i for i, x in enumerate(inputs) if x.dtype.kind == "f")
    if not floats:
        return result, None
    cot = ms.Tensor(np.random.default_rng(1).standard_normal(out.shape).astype(np.float32))
    params = cell.trainable_params()

    def loss(*xs):
        return (cell(*xs) * cot).sum()

    _, grads = ms.value_and_grad(loss, grad_position=floats, weights=params or None)(*tensors)
    if params:
        input_grads, param_grads = grads
    else:
        input_grads, param_grads = grads, ()
    input_grads = input_grads if isinstance(input_grads, tuple) else (input_grads,)
    for i, g in zip(floats, input_grads):
        result[f"dx{i}"] = g.asnumpy()
    for p, g in zip(params, param_grads):
        result[f"dp_{p.name}"] = g.asnumpy()
    return result, cot.asnumpy()


data = {}
for name, (expr, inputs) in CASES.items():
    try:
        eager, cot = run(name, expr, inputs, ms.PYNATIVE_MODE)
        graph, _ = run(name, expr, inputs, ms.GRAPH_MODE)
    except Exception as error:  # a layer MindSpore's CPU build cannot run is reported, not stored
        print(f"{name}: MindSpore CPU fails: {type(error).__name__}: {str(error)[:200]}")
        continue
    for key, value in eager.items():
        gap = np.abs(value - graph[key]).max() if value.size else 0.0
        assert gap <= 1e-6, (name, key, gap)
        data[f"{name}/{key}"] = value
    data[f"{name}/expr"] = np.array(expr)
    for i, x in enumerate(inputs):
        data[f"{name}/x{i}"] = x
    if cot is not None:
        data[f"{name}/cot"] = cot
    print(name, {k: v.shape for k, v in eager.items()})

# CellDict: the parameter names its children get inside a network, and after update / __setitem__
ms.set_context(mode=ms.PYNATIVE_MODE)


class Heads(nn.Cell):
    def __init__(self):
        super().__init__()
        self.stem = nn.Dense(2, 2)
        self.heads = nn.CellDict({"cls": nn.Dense(2, 3), "box": nn.Dense(2, 4, has_bias=False)})


net = Heads()
net.heads["extra"] = nn.Dense(2, 1)
net.heads.update([("cls", nn.Dense(2, 5))])
data["celldict/names"] = np.array([p.name for p in net.get_parameters()])
data["celldict/keys"] = np.array(list(net.heads.keys()))
print("celldict", data["celldict/names"], data["celldict/keys"])
loose = nn.CellDict({"a": nn.Dense(2, 3)})
data["celldict/loose_names"] = np.array([p.name for p in loose.get_parameters()])
print("loose", data["celldict/loose_names"])
np.savez(sys.argv[1], **data)
