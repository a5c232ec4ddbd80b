"""mint.optim's Adam, AdamW and SGD: PyTorch's formulas, parameter groups, learning-rate changes and MindSpore's
checkpoint names.

MindSpore 2.7.0's CPU build runs only Adam, and only compiled (nn.TrainOneStepCell in GRAPH_MODE): in PYNATIVE_MODE
its Adam has no Muls kernel, its AdamW has no AdamW kernel in either mode, and its SGD's in-place add_ leaves the
weights unchanged (tests/unit/sdk/data/make_mindspore_mint_optim.py). So every case is checked against a numpy
float64 implementation of PyTorch's documented formulas, and Adam's against MindSpore's printed weights too; the
checkpoint keys and the gradients of the first step are MindSpore 2.7.0's.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import nn
from tessel.core.errors import NotSupportedYetError
from tessel.mint import optim

X = np.arange(12).reshape(4, 3) * 0.1
Y = np.ones((4, 2))
W0 = np.arange(6).reshape(2, 3) * 0.1 - 0.2
B0 = np.array([0.5, -0.5])


def _groups(d, **first):
    return [{"params": [d.weight], **first}, {"params": [d.bias]}]


# name: (constructor, the numpy reference's settings: per parameter (weight, bias) lr and weight decay, then the rest)
CASES = {
    "adam": (lambda d: optim.Adam(d.trainable_params()), dict(kind="adam", lr=(1e-3,) * 2, wd=(0.0,) * 2)),
    "adam_lr_decay": (
        lambda d: optim.Adam(d.trainable_params(), lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
        dict(kind="adam", lr=(0.05,) * 2, wd=(0.1,) * 2, betas=(0.8, 0.99), eps=1e-6),
    ),
    "adam_groups": (
        lambda d: optim.Adam(_groups(d, lr=0.02, weight_decay=0.3), lr=0.05, weight_decay=0.1),
        dict(kind="adam", lr=(0.02, 0.05), wd=(0.3, 0.1)),
    ),
    "adam_maximize": (
        lambda d: optim.Adam(d.trainable_params(), lr=0.05, weight_decay=0.1, maximize=True),
        dict(kind="adam", lr=(0.05,) * 2, wd=(0.1,) * 2, maximize=True),
    ),
    "adamw": (lambda d: optim.AdamW(d.trainable_params()), dict(kind="adamw", lr=(1e-3,) * 2, wd=(1e-2,) * 2)),
    "adamw_lr_decay": (
        lambda d: optim.AdamW(d.trainable_params(), lr=0.05, betas=(0.8, 0.99), weight_decay=0.3),
        dict(kind="adamw", lr=(0.05,) * 2, wd=(0.3,) * 2, betas=(0.8, 0.99)),
    ),
    "adamw_groups": (
        lambda d: optim.AdamW(_groups(d, lr=0.02, weight_decay=0.3), lr=0.05, weight_decay=0.1),
        dict(kind="adamw", lr=(0.02, 0.05), wd=(0.3, 0.1)),
    ),
    "adamw_maximize": (
        lambda d: optim.AdamW(d.trainable_params(), lr=0.05, maximize=True),
        dict(kind="adamw", lr=(0.05,) * 2, wd=(1e-2,) * 2, maximize=True),
    ),
    "sgd": (lambda d: optim.SGD(d.trainable_params(), lr=0.1), dict(kind="sgd", lr=(0.1,) * 2, wd=(0.0,) * 2)),
    "sgd_decay": (
        lambda d: optim.SGD(d.trainable_params(), lr=0.1, weight_decay=0.2),
        dict(kind="sgd", lr=(0.1,) * 2, wd=(0.2,) * 2),
    ),
    "sgd_nesterov": (
        lambda d: optim.SGD(d.trainable_params(), lr=0.1, momentum=0.9, nesterov=True),
        dict(kind="sgd", lr=(0.1,) * 2, wd=(0.0,) * 2, momentum=0.9, nesterov=True),
    ),
    "sgd_dampening": (
        lambda d: optim.SGD(d.trainable_params(), lr=0.1, momentum=0.8, dampening=0.5, weight_decay=0.1),
        dict(kind="sgd", lr=(0.1,) * 2, wd=(0.1,) * 2, momentum=0.8, dampening=0.5),
    ),
    "sgd_groups": (
        lambda d: optim.SGD(_groups(d, lr=0.05, weight_decay=0.3), lr=0.1, momentum=0.9),
        dict(kind="sgd", lr=(0.05, 0.1), wd=(0.3, 0.0), momentum=0.9),
    ),
    "sgd_maximize": (
        lambda d: optim.SGD(d.trainable_params(), lr=0.1, momentum=0.5, maximize=True),
        dict(kind="sgd", lr=(0.1,) * 2, wd=(0.0,) * 2, momentum=0.5, maximize=True),
    ),
}

# MindSpore 2.7.0 gives these keys for a saved mint optimizer (no learning rates: they live in param_groups)
ADAM_KEYS = ["bias", "exp_avg.bias", "exp_avg.weight", "exp_avg_sq.bias", "exp_avg_sq.weight", "state_step", "weight"]
SGD_KEYS = ["bias", "momentum_buf.bias", "momentum_buf.weight", "step_t", "weight"]


# MindSpore 2.7.0 gives these weights after 4 nn.TrainOneStepCell steps in GRAPH_MODE on CPU
MINDSPORE_ADAM = {
    "adam": (
        [[-0.196001112, -0.0960010737, 0.00399894314], [0.10399922, 0.203999266, 0.303999305]],
        [0.503998995, -0.496000558],
    ),
    "adam_lr_decay": (
        [[-0.0125706904, 0.0873446688, 0.187280118], [0.291753918, 0.392581224, 0.49311018]],
        [0.687997699, -0.303923845],
    ),
    "adam_groups": (
        [[-0.121200323, -0.021344861, 0.078524366], [0.178959817, 0.279010445, 0.379045635]],
        [0.696282268, -0.301252604],
    ),
    "adam_maximize": (
        [[-0.400248557, -0.300304443, -0.200339735], [-0.100545272, -0.000564172864, 0.0994267017]],
        [0.299530387, -0.700584352],
    ),
}


def _gradients(w, b):
    """MSELoss of Dense(3, 2) on X, Y: its gradients (float64)."""
    delta = 2.0 * (X @ w.T + b - Y) / Y.size
    return delta.T @ X, delta.sum(0)


def reference(kind, lr, wd, steps=4, betas=(0.9, 0.999), eps=1e-8, momentum=0.0, dampening=0.0, nesterov=False,
              maximize=False, lr_after=None):  # fmt: skip
    """PyTorch's documented Adam / AdamW / SGD in float64; `lr_after`: (update number, new lr, the indices of the
    parameters that take it) from that update on."""
    params, lr = [W0.copy(), B0.copy()], list(lr)
    state = [dict(m=0.0, v=0.0, buf=None) for _ in params]
    for t in range(1, steps + 1):
        if lr_after is not None and t == lr_after[0]:
            lr = [lr_after[1] if i in lr_after[2] else rate for i, rate in enumerate(lr)]
        for i, g in enumerate(_gradients(*params)):
            p, s = params[i], state[i]
            g = -g if maximize else g
            if kind == "adamw":
                p = p * (1 - lr[i] * wd[i])
            else:
                g = g + wd[i] * p
            if kind == "sgd":
                if momentum:
                    s["buf"] = g if s["buf"] is None else momentum * s["buf"] + (1 - dampening) * g
                    g = g + momentum * s["buf"] if nesterov else s["buf"]
                params[i] = p - lr[i] * g
                continue
            s["m"] = betas[0] * s["m"] + (1 - betas[0]) * g
            s["v"] = betas[1] * s["v"] + (1 - betas[1]) * g * g
            bias1, bias2 = 1 - betas[0] ** t, 1 - betas[1] ** t
            params[i] = p - lr[i] / bias1 * s["m"] / (np.sqrt(s["v"]) / np.sqrt(bias2) + eps)
    return params


def _dense():
    d = nn.Dense(3, 2)
    d.weight.set_data(ms.Tensor(W0.astype(np.float32)))
    d.bias.set_data(ms.Tensor(B0.astype(np.float32)))
    return d


def _train(d, opt, loop, steps):
    x, y = ms.Tensor(X.astype(np.float32)), ms.Tensor(Y.astype(np.float32))
    if loop == "train_one_step":
        step = nn.TrainOneStepCell(nn.WithLossCell(d, nn.MSELoss()), opt)
        for _ in range(steps):
            step(x, y)
        return
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(d(a), b), None, opt.parameters)
    for _ in range(steps):
        _, grads = grad_fn(x, y)
        opt(grads)


def _close(d, want):
    for got, expected in zip((d.weight.asnumpy(), d.bias.asnumpy()), want):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_the_first_gradients_are_mindsporess():
    """MindSpore 2.7.0 gives these gradients at the first step (the numpy reference's start)."""
    gw, gb = _gradients(W0, B0)
    np.testing.assert_allclose(gw, [[-0.324, -0.38849998, -0.453], [-0.45, -0.565, -0.68]], rtol=1e-6)
    np.testing.assert_allclose(gb, [-0.645, -1.15], rtol=1e-6)


@pytest.mark.parametrize("loop", ["functional", "train_one_step"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_weights_follow_pytorchs_formulas(name, loop):
    make, settings = CASES[name]
    d = _dense()
    _train(d, make(d), loop, 4)
    _close(d, reference(**settings))


@pytest.mark.parametrize("name", ["adamw_groups", "sgd_maximize", "sgd_decay"])
def test_model_train_runs_a_mint_optimizer(name):
    import tessel.dataset as ds

    make, settings = CASES[name]
    d = _dense()
    repeat = {"x": np.repeat(X[None], 4, 0).astype(np.float32), "y": np.repeat(Y[None], 4, 0).astype(np.float32)}
    ms.train.Model(d, nn.MSELoss(), make(d)).train(1, ds.NumpySlicesDataset(repeat, shuffle=False))
    _close(d, reference(**settings))


@pytest.mark.parametrize("loop", ["functional", "train_one_step"])
@pytest.mark.parametrize("name", sorted(MINDSPORE_ADAM))
def test_adam_weights_are_mindsporess(name, loop):
    """Within 2e-7: MindSpore takes 1 - beta2^t in float32 (1 - float32(0.999) is 1.3e-5 off 0.001), which puts its
    weights up to 1.8e-7 from float64's; tessel's are within 6e-8 of float64's."""
    make, _ = CASES[name]
    d = _dense()
    _train(d, make(d), loop, 4)
    for got, expected in zip((d.weight.asnumpy(), d.bias.asnumpy()), MINDSPORE_ADAM[name]):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=2e-7)


@pytest.mark.parametrize("name", ["adam_groups", "adamw", "sgd", "sgd_nesterov"])
def test_checkpoint_holds_mindsporess_keys_and_resumes(name, tmp_path):
    make, settings = CASES[name]
    d = _dense()
    opt = make(d)
    _train(d, opt, "functional", 2)
    ms.save_checkpoint(opt, str(tmp_path / "opt.ckpt"))
    saved = ms.load_checkpoint(str(tmp_path / "opt.ckpt"))
    assert sorted(saved) == (SGD_KEYS if name.startswith("sgd") else ADAM_KEYS)
    step = saved["step_t" if name.startswith("sgd") else "state_step"].asnumpy()
    # MindSpore's step_t is an int32 scalar; its state_step a float32 [1], which AdamW's kernel starts at -1
    assert step.tolist() == {"adamw": [1.0], "sgd": 2, "sgd_nesterov": 2}.get(name, [2.0])
    again = _dense()
    opt = make(again)
    ms.load_param_into_net(again, saved)
    ms.load_param_into_net(opt, saved)
    _train(again, opt, "functional", 2)
    _close(again, reference(**settings))


@pytest.mark.parametrize("how", ["number", "set_data"])
@pytest.mark.parametrize("name", ["adam_groups", "adamw", "sgd_nesterov"])
def test_a_new_group_rate_takes_effect_from_the_next_update(name, how):
    make, settings = CASES[name]
    d = _dense()
    opt = make(d)
    _train(d, opt, "functional", 2)
    if how == "number":
        opt.param_groups[0]["lr"] = 0.01
    else:
        opt.param_groups[0]["lr"].set_data(ms.Tensor(np.float32(0.01)))
    _train(d, opt, "functional", 2)
    first_group = [0] if name.endswith("groups") else [0, 1]
    _close(d, reference(**settings, lr_after=(3, 0.01, first_group)))
    assert opt.param_groups[0]["lr"].name == "learning_rate_group_0"


def test_param_groups_and_defaults_read_as_mindsporess():
    d = _dense()
    opt = optim.AdamW(_groups(d, lr=0.02), weight_decay=0.1)
    first, second = opt.param_groups
    assert first["params"] == [d.weight] and second["params"] == [d.bias]
    assert (first["weight_decay"], second["betas"], second["amsgrad"], second["maximize"]) == (
        0.1,
        (0.9, 0.999),
        False,
        False,
    )
    assert float(first["lr"].asnumpy()) == pytest.approx(0.02) and float(second["lr"].asnumpy()) == pytest.approx(1e-3)
    assert opt.defaults["weight_decay"] == 0.1


def test_what_tessel_cannot_do_is_refused():
    d = _dense()
    with pytest.raises(NotSupportedYetError, match=r"Adam\(amsgrad=True\)"):
        optim.Adam(d.trainable_params(), amsgrad=True)
    with pytest.raises(NotSupportedYetError, match=r"AdamW\(amsgrad=True\)"):
        optim.AdamW(_groups(d, amsgrad=True))
    with pytest.raises(NotSupportedYetError, match="different 'betas'"):
        optim.Adam(_groups(d, betas=(0.8, 0.9)))
    with pytest.raises(NotSupportedYetError, match="different 'momentum'"):
        optim.SGD(_groups(d, momentum=0.5), lr=0.1)
    with pytest.raises(NotSupportedYetError, match=r"keys \['centered'\]"):
        optim.SGD(_groups(d, centered=True), lr=0.1)
    opt = optim.SGD(d.trainable_params(), lr=0.1, momentum=0.9)
    with pytest.raises(NotSupportedYetError, match=r"param_groups\[...\]\['momentum'\]"):
        opt.param_groups[0]["momentum"] = 0.5
    opt.param_groups[0]["momentum"] = 0.9  # the same value: nothing to change


def test_mindsporess_argument_checks():
    d = _dense()
    with pytest.raises(TypeError, match="'lr' should be 'float'"):
        optim.Adam(d.trainable_params(), lr=1)
    with pytest.raises(TypeError, match="'betas'"):
        optim.AdamW(d.trainable_params(), betas=[0.9, 0.999])
    with pytest.raises(ValueError, match="beta parameter at index 1"):
        optim.AdamW(d.trainable_params(), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="'nesterov' is true"):
        optim.SGD(d.trainable_params(), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [d.weight]}, {"params": [d.weight, d.bias]}], lr=0.1)
