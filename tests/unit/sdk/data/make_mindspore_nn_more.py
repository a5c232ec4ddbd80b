"""Writes tests/unit/sdk/data/mindspore_nn_more.npz, which tests/unit/sdk/test_sdk_nn_more.py reads: run
`python make_mindspore_nn_more.py OUT.npz` under MindSpore 2.7.0 (CPU; not run by the tests: tessel does not
depend on MindSpore). For each case it stores the cell's constructor (evaluated with `nn` = mindspore.nn or
tessel.nn), its inputs, a cotangent, the output and the gradients of sum(output * cotangent) w.r.t. the float
inputs and the trainable parameters, from PYNATIVE (GRAPH_MODE is run too and must agree to 1e-6 relative)."""

import sys

import mindspore as ms
import numpy as np
from mindspore import nn

rng = np.random.default_rng(7)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def sign(*shape):
    return np.where(rng.standard_normal(shape) > 0, 1.0, -1.0).astype(np.float32)


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
    "reflectionpad3d": ("nn.ReflectionPad3d((1, 1, 2, 0, 1, 0))", [normal(1, 2, 3, 3, 4)]),
    "replicationpad3d": ("nn.ReplicationPad3d((1, 2, 0, 0, 1, 1))", [normal(2, 3, 3, 4)]),
    "channelshuffle": ("nn.ChannelShuffle(2)", [normal(2, 6, 2, 3)]),
    "pad_constant": ("nn.Pad(((0, 0), (1, 2), (2, 1)), 'CONSTANT')", [normal(2, 3, 3)]),
    "pad_reflect": ("nn.Pad(((1, 1), (2, 1)), 'REFLECT')", [normal(3, 4)]),
    "pad_symmetric": ("nn.Pad(((0, 0), (2, 3), (1, 2)), 'SYMMETRIC')", [normal(2, 3, 4)]),
    "pixelshuffle": ("nn.PixelShuffle(2)", [normal(2, 8, 2, 3)]),
    "pixelunshuffle": ("nn.PixelUnshuffle(2)", [normal(2, 2, 4, 6)]),
    "rmse": ("nn.RMSELoss()", [normal(3, 4), normal(3, 4)]),
    "margin_ranking": ("nn.MarginRankingLoss(0.3, 'sum')", [normal(6), normal(6), sign(6)]),
    "margin_ranking_mean": ("nn.MarginRankingLoss()", [normal(6), normal(6), sign(6)]),
    "cosine_embedding": ("nn.CosineEmbeddingLoss(0.2)", [normal(5, 3), normal(5, 3), sign(5)]),
    "cosine_embedding_none": ("nn.CosineEmbeddingLoss(-0.5, 'none')", [normal(5, 3), normal(5, 3), sign(5)]),
    "multilabel_soft_margin": (
        "nn.MultiLabelSoftMarginLoss(ms.Tensor(np.array([0.5, 1.0, 2.0, 1.5], np.float32)), 'none')",
        [normal(3, 4), (normal(3, 4) > 0).astype(np.float32)],
    ),
    "multilabel_soft_margin_mean": ("nn.MultiLabelSoftMarginLoss()", [normal(3, 4), rng.random((3, 4), np.float32)]),
    "multi_margin": ("nn.MultiMarginLoss()", [normal(4, 5), np.array([0, 2, 4, 1], np.int64)]),
    "multi_margin_p2": (
        "nn.MultiMarginLoss(p=2, margin=0.7, reduction='sum', weight=ms.Tensor(np.array([1, 2, 3, 4, 5], np.float32)))",
        [normal(4, 5), np.array([0, 2, 4, 1], np.int64)],
    ),
    "hinge_embedding": ("nn.HingeEmbeddingLoss(0.5)", [normal(3, 4), sign(3, 4)], (0,)),
    "hinge_embedding_none": ("nn.HingeEmbeddingLoss(2, 'none')", [normal(3, 4), sign(3, 4)], (0,)),
    "poisson_nll": ("nn.PoissonNLLLoss()", [normal(3, 4), rng.random((3, 4), np.float32) * 4]),
    "poisson_nll_full": (
        "nn.PoissonNLLLoss(log_input=False, full=True, reduction='sum')",
        [rng.random((3, 4), np.float32) + 0.1, rng.random((3, 4), np.float32) * 4],
    ),
    "gaussian_nll": ("nn.GaussianNLLLoss()", [normal(3, 4), normal(3, 4), rng.random((3, 4), np.float32) + 0.1]),
    "gaussian_nll_full": (
        "nn.GaussianNLLLoss(full=True, reduction='none')",
        [normal(3, 4), normal(3, 4), rng.random(3, np.float32) + 0.1],
    ),
    "dice": ("nn.DiceLoss(1e-3)", [rng.random((3, 4), np.float32), (normal(3, 4) > 0).astype(np.float32)]),
    "multiclass_dice": ("nn.MultiClassDiceLoss()", [normal(3, 4), (normal(3, 4) > 0).astype(np.float32)]),
    "multiclass_dice_weights": (
        "nn.MultiClassDiceLoss(ms.Tensor(np.array([[1.0], [2.0], [0.5]], np.float32)), 1, 'sigmoid')",
        [normal(2, 3, 4), (normal(2, 3, 4) > 0).astype(np.float32)],
    ),
    "focal_indices": (
        "nn.FocalLoss(ms.Tensor(np.array([1.0, 2.0, 0.5], np.float32)), 2.0)",
        [normal(4, 3, 2), np.array([[[0, 1]], [[2, 2]], [[1, 0]], [[0, 2]]], np.int32)],
    ),
    "focal_onehot": (
        "nn.FocalLoss(gamma=1.5, reduction='sum')",
        [normal(4, 3), np.eye(3, dtype=np.float32)[[0, 2, 1, 1]]],
    ),
    "tril": ("nn.Tril()", [normal(2, 3, 4)]),
    "triu": ("nn.Triu()", [normal(4, 3)]),
    "norm_axis": ("nn.Norm(axis=1)", [normal(1, 3, 4)]),
    "norm_all_keep": ("nn.Norm(keep_dims=True)", [normal(2, 3)]),
    "range_int": ("nn.Range(5)", []),
    "range_float": ("nn.Range(1.0, 3, 0.5)", []),
    "matmul": ("nn.MatMul()", [normal(2, 1, 3, 4), normal(5, 4, 2)]),
    "matmul_transposed": ("nn.MatMul(True, True)", [normal(4, 3), normal(2, 5, 4)]),
    "matmul_vector": ("nn.MatMul()", [normal(4), normal(2, 4, 3)]),
    "matmul_dot": ("nn.MatMul()", [normal(4), normal(4)]),
    "moments": ("nn.Moments(axis=2)", [normal(1, 3, 4)], (0,)),
    "moments_all": ("nn.Moments(keep_dims=True)", [normal(2, 3)], (0,)),
    "clip_by_norm": ("nn.ClipByNorm()", [normal(2, 3), np.array(1.2, np.float32)], (0,)),
    "onehot": ("nn.OneHot(axis=0, depth=4, on_value=2.0, off_value=-1.0)", [np.array([0, 3, 1], np.int32)]),
}


class Stacked(nn.Cell):
    """A cell of several outputs as one: its outputs flattened and concatenated."""

    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def construct(self, *xs):
        return ms.ops.cat([y.reshape(-1) for y in self.cell(*xs)])


def run(expr, inputs, floats, mode):
    ms.set_context(mode=mode)
    cell = eval(expr, {"nn": nn, "ms": ms, "np": np})
    tensors = [ms.Tensor(x) for x in inputs]
    out = cell(*tensors)
    if isinstance(out, tuple):  # Moments: (mean, variance), stored and differentiated as one stacked tensor
        cell = Stacked(cell)
        out = cell(*tensors)
    result = {"out": out.asnumpy()}
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


def _softplus64(x):
    return np.log1p(np.exp(x))


def _triplet64(p, swap, eps, margin, reduction):
    def distance(a, b):
        return (np.abs(a - b + eps) ** p).sum(-1) ** (1 / p)

    def loss(x, positive, negative):
        far = distance(x, negative)
        if swap:
            far = np.minimum(far, distance(positive, negative))
        out = np.maximum(distance(x, positive) - far + margin, 0)
        return out.mean() if reduction == "mean" else out.sum() if reduction == "sum" else out

    return loss


def _clip_by_norm64(x, clip_norm):
    return x * clip_norm / np.maximum(np.sqrt((x * x).sum(1, keepdims=True)), clip_norm)


# MindSpore 2.7.0's CPU build has no SoftMarginLoss, TripletMarginLoss or Roll kernel, and its ClipByNorm kernel with
# an axis scales every row after the first wrongly (measured: ClipByNorm(axis=1) of [[3, 4, 0], [0, 0, 2]] with
# clip_norm 1 gives [[0.6, 0.8, 0], [0, 0, 0.5]], not [0, 0, 1]): NumPy float64 of the documented formula, gradients
# by central differences
NUMPY = {
    "roll": ("nn.Roll([1, -2], [0, 2])", [normal(3, 2, 4)], lambda x: np.roll(x, (1, -2), (0, 2))),
    "clip_by_norm_axis": (
        "nn.ClipByNorm(axis=1)",
        [normal(2, 3), np.array(1.2, np.float32)],
        _clip_by_norm64,
        (0,),
    ),
    "soft_margin": ("nn.SoftMarginLoss()", [normal(3, 4), sign(3, 4)], lambda x, y: _softplus64(-y * x).mean()),
    "soft_margin_sum": ("nn.SoftMarginLoss('sum')", [normal(3, 4), sign(3, 4)], lambda x, y: _softplus64(-y * x).sum()),
    "triplet_margin": (
        "nn.TripletMarginLoss()",
        [normal(4, 3), normal(4, 3), normal(4, 3)],
        _triplet64(2, False, 1e-6, 1.0, "mean"),
    ),
    "triplet_margin_p1": (
        "nn.TripletMarginLoss(p=1, swap=True, margin=2.0, reduction='none')",
        [normal(4, 3), normal(4, 3), normal(4, 3)],
        _triplet64(1, True, 1e-6, 2.0, "none"),
    ),
}


def numpy_case(inputs, loss64, floats):
    arrays = [x.astype(np.float64) for x in inputs]
    out = np.asarray(loss64(*arrays))
    cot = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    result = {"out": out.astype(np.float32)}
    for index in floats:
        array = arrays[index]
        grad = np.zeros_like(array)
        for i in np.ndindex(array.shape):
            up, down = [a.copy() for a in arrays], [a.copy() for a in arrays]
            up[index][i] += 1e-6
            down[index][i] -= 1e-6
            grad[i] = ((loss64(*up) - loss64(*down)) * cot).sum() / 2e-6
        result[f"dx{index}"] = grad.astype(np.float32)
    return result, cot


data = {}
for name, (expr, inputs, loss64, *positions) in NUMPY.items():
    floats = positions[0] if positions else tuple(range(len(inputs)))
    eager, cot = numpy_case(inputs, loss64, floats)
    for key, value in eager.items():
        data[f"{name}/{key}"] = value
    data[f"{name}/expr"] = np.array(expr)
    data[f"{name}/cot"] = cot
    data[f"{name}/floats"] = np.array(floats, np.int64)
    for i, x in enumerate(inputs):
        data[f"{name}/x{i}"] = x
    print(name, "(NumPy)", {k: v.shape for k, v in eager.items()})
for name, (expr, inputs, *positions) in CASES.items():
    floats = positions[0] if positions else tuple(i for i, x in enumerate(inputs) if x.dtype.kind == "f")
    try:
        eager, cot = run(expr, inputs, floats, ms.PYNATIVE_MODE)
        graph, _ = run(expr, inputs, floats, ms.GRAPH_MODE)
    except Exception as error:  # a layer MindSpore's CPU build cannot run is reported, not stored
        print(f"{name}: MindSpore CPU fails: {type(error).__name__}: {str(error)[:200]}")
        continue
    for key, value in eager.items():
        gap = np.abs(value - graph[key]).max() if value.size else 0.0
        assert gap <= 1e-6 * max(1.0, float(np.abs(value).max(initial=0))), (name, key, gap)
        data[f"{name}/{key}"] = value
    data[f"{name}/expr"] = np.array(expr)
    data[f"{name}/floats"] = np.array(floats, np.int64)
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
