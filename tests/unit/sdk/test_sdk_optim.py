"""Optimizers through the SDK against numpy implementations of MindSpore's formulas; learning-rate schedules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
from tessel import nn
from tessel.core.errors import ConfigurationError, NotSupportedYetError

STEPS = 3
GRADS = [[rand(3, 2, seed=10 + s), rand(2, seed=20 + s)] for s in range(STEPS)]


def numpy_steps(kind: str, params, lrs, wd=0.0, **hp):
    """MindSpore's update rules in float64, one parameter at a time."""
    params = [p.astype(np.float64) for p in params]
    state = [dict(m=np.zeros_like(p), v=np.zeros_like(p)) for p in params]
    for t in range(STEPS):
        lr = lrs[t]
        for p, g, s in zip(params, GRADS[t], state):
            g = g.astype(np.float64)
            if kind != "adamw" and wd:
                g = g + wd * p
            if kind == "sgd":
                m, d = hp.get("momentum", 0.0), hp.get("dampening", 0.0)
                s["m"] = g.copy() if t == 0 else m * s["m"] + (1 - d) * g
                step = g + m * s["m"] if hp.get("nesterov") else s["m"]
                p -= lr * (step if m else g)
            elif kind == "momentum":
                s["m"] = hp["momentum"] * s["m"] + g
                p -= lr * (g + hp["momentum"] * s["m"] if hp.get("use_nesterov") else s["m"])
            else:
                b1, b2, eps = hp.get("beta1", 0.9), hp.get("beta2", 0.999), hp["eps"]
                s["m"] = b1 * s["m"] + (1 - b1) * g
                s["v"] = b2 * s["v"] + (1 - b2) * g * g
                if kind == "adam":
                    scale = lr * math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
                    p -= scale * s["m"] / (np.sqrt(s["v"]) + eps)
                else:
                    p -= lr * (s["m"] / (np.sqrt(s["v"]) + eps) + wd * p)
    return params


CASES = [
    ("sgd", nn.SGD, {}),
    ("sgd", nn.SGD, {"momentum": 0.9, "dampening": 0.1}),
    ("sgd", nn.SGD, {"momentum": 0.9, "nesterov": True}),
    ("momentum", nn.Momentum, {"momentum": 0.9}),
    ("momentum", nn.Momentum, {"momentum": 0.8, "use_nesterov": True}),
    ("adam", nn.Adam, {"eps": 1e-8}),
    ("adamw", nn.AdamWeightDecay, {"eps": 1e-6}),
]


@pytest.mark.parametrize(("kind", "cls", "hp"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_updates_match_mindspore_formulas(kind, cls, hp, weight_decay):
    w = ms.Parameter(ms.Tensor(rand(3, 2)), name="w")
    b = ms.Parameter(ms.Tensor(rand(2, seed=1)), name="b")
    start = [w.asnumpy().copy(), b.asnumpy().copy()]
    lrs = [0.1, 0.05, 0.02]
    optimizer = cls([w, b], learning_rate=lrs, weight_decay=weight_decay, **hp)
    for grads in GRADS:
        optimizer(tuple(ms.Tensor(g) for g in grads))
    want = numpy_steps(kind, start, lrs, weight_decay, **hp)
    np.testing.assert_allclose(w.asnumpy(), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.asnumpy(), want[1], rtol=1e-5, atol=1e-6)
    assert optimizer.global_step.asnumpy().tolist() == [STEPS]


def test_gradients_left_on_the_daemon_update_like_host_gradients():
    x, labels = ms.Tensor(rand(8, 4)), ms.Tensor(np.arange(8, dtype=np.int32) % 3)
    results = []
    for from_daemon in (True, False):
        ms.set_seed(5)
        net = nn.Dense(4, 3)
        loss_fn, optimizer = nn.CrossEntropyLoss(), nn.Adam(net.trainable_params(), 0.01)
        grad_fn = ms.value_and_grad(
            lambda d, y, net=net, loss_fn=loss_fn: loss_fn(net(d), y), None, optimizer.parameters
        )
        for _ in range(3):
            _, grads = grad_fn(x, labels)
            optimizer(grads if from_daemon else tuple(ms.Tensor(g.asnumpy()) for g in grads))
        results.append(net.weight.asnumpy().copy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)


def test_weight_decay_skips_normalisation_parameters_and_groups_choose():
    # MindSpore 2.7: every optimizer leaves beta/gamma undecayed (optimizer.py decay_filter); SGD too, since its
    # construct decays through the base class (nn/optim/sgd.py: decay_weight, then P.SGD(dampening, 0.0, nesterov))
    for kind, gamma_after in ((nn.Momentum, 1.0), (nn.SGD, 1.0)):
        gamma = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="norm.gamma")
        w = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="w")
        extra = {"momentum": 0.0} if kind is nn.Momentum else {}
        opt = kind([gamma, w], learning_rate=1.0, weight_decay=0.5, **extra)
        opt((ms.Tensor(np.zeros(2, np.float32)), ms.Tensor(np.zeros(2, np.float32))))
        assert gamma.asnumpy().tolist() == [gamma_after] * 2 and w.asnumpy().tolist() == [0.5, 0.5], kind
    a = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="a")
    c = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="c")
    opt = nn.SGD([{"params": [a], "weight_decay": 0.5}, {"params": [c]}], learning_rate=1.0)
    opt((ms.Tensor(np.zeros(2, np.float32)),) * 2)
    assert a.asnumpy().tolist() == [0.5, 0.5] and c.asnumpy().tolist() == [1.0, 1.0]
    with pytest.raises(KeyError, match="the key in group params must be one of"):  # MindSpore's KeyError
        nn.SGD([{"params": [a], "momentum": 0.1}], learning_rate=1.0)
    with pytest.raises(ConfigurationError, match="updates 2 parameters but got 1 gradients"):
        opt((ms.Tensor(np.zeros(2, np.float32)),))


def test_learning_rate_lists_match_mindspore_examples():
    assert nn.piecewise_constant_lr([2, 5, 10], [0.1, 0.05, 0.01]) == [0.1] * 2 + [0.05] * 3 + [0.01] * 5
    assert nn.cosine_decay_lr(0.01, 0.1, 6, 2, 2) == pytest.approx([0.1, 0.1, 0.055, 0.055, 0.01, 0.01])
    assert nn.exponential_decay_lr(0.1, 0.9, 6, 2, 1) == pytest.approx([0.1, 0.1, 0.09, 0.09, 0.081, 0.081])
    assert nn.warmup_lr(0.1, 6, 2, 2) == pytest.approx([0.0, 0.0, 0.05, 0.05, 0.1, 0.1])
    poly = [0.1, 0.1, 0.07363961030678928, 0.07363961030678928, 0.01, 0.01]
    assert nn.polynomial_decay_lr(0.1, 0.01, 6, 2, 2, 0.5) == pytest.approx(poly)
    natural = [0.1] * 4 + [0.016529888822158657] * 2
    assert nn.natural_exp_decay_lr(0.1, 0.9, 6, 2, 2, True) == pytest.approx(natural)
    assert nn.inverse_decay_lr(0.1, 0.5, 6, 2, 2, True) == pytest.approx([0.1] * 4 + [0.1 / 1.5] * 2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: nn.piecewise_constant_lr([3], [1]), r"learning_rates\[0\] must be a float"),
        (lambda: nn.exponential_decay_lr(1, 0.9, 6, 2, 1), "learning_rate must be a float"),
        (lambda: nn.cosine_decay_lr(0, 1.0, 6, 2, 1), "min_lr must be a float"),
        (lambda: nn.warmup_lr(1, 6, 2, 1), "learning_rate must be a float"),
        (lambda: nn.ExponentialDecayLR(0.1, 1, 2), "decay_rate must be a float"),
        (lambda: nn.PolynomialDecayLR(1.0, 0.0, 2, 1), "power must be a float"),
    ],
)
def test_rates_must_be_floats_as_mindspore_checks_them(call, message):
    # MindSpore 2.7.0 raises TypeError for each of these ints (validator.check_is_float / check_positive_float)
    with pytest.raises(TypeError, match=message):
        call()


def test_schedules_give_the_rate_of_each_step():
    cases = [
        (nn.ExponentialDecayLR(0.1, 0.9, 4), lambda s: 0.1 * 0.9 ** (s / 4)),
        (nn.ExponentialDecayLR(0.1, 0.9, 4, is_stair=True), lambda s: 0.1 * 0.9 ** (s // 4)),
        # MindSpore's NaturalExpDecayLR.construct uses the step itself (its docstring divides by decay_steps)
        (nn.NaturalExpDecayLR(0.1, 0.9, 4), lambda s: 0.1 * math.exp(-0.9 * s)),
        (nn.NaturalExpDecayLR(0.1, 0.9, 4, is_stair=True), lambda s: 0.1 * math.exp(-0.9 * (s // 4) * 4)),
        (nn.InverseDecayLR(0.1, 0.5, 4), lambda s: 0.1 / (1 + 0.5 * s / 4)),
        (nn.CosineDecayLR(0.01, 0.1, 4), lambda s: 0.01 + 0.045 * (1 + math.cos(math.pi * min(s, 4) / 4))),
        (nn.PolynomialDecayLR(0.1, 0.01, 4, 2.0), lambda s: 0.09 * (1 - min(s, 4) / 4) ** 2 + 0.01),
        (nn.WarmUpLR(0.1, 4), lambda s: 0.1 * min(s, 4) / 4),
    ]
    for schedule, formula in cases:
        for step in (0, 1, 3, 6):
            assert schedule.lr_at(step) == pytest.approx(formula(step)), type(schedule).__name__
            assert schedule(ms.Tensor(np.int32(step))).asnumpy() == pytest.approx(formula(step), rel=1e-6)
    w = ms.Parameter(ms.Tensor(np.zeros(1, np.float32)), name="w")
    opt = nn.SGD([w], learning_rate=nn.WarmUpLR(1.0, 4))
    for _ in range(3):
        opt((ms.Tensor(np.ones(1, np.float32)),))
    assert w.asnumpy()[0] == pytest.approx(-(0 + 0.25 + 0.5))  # steps 0, 1, 2 of the warm-up
    assert opt.get_lr().asnumpy() == pytest.approx(0.75)


def test_an_update_past_the_end_of_a_learning_rate_list_is_refused():
    # MindSpore gathers each step's rate from the list; past its end that gather fails on CPU and GPU
    w = ms.Parameter(ms.Tensor(np.zeros(1, np.float32)), name="w")
    opt = nn.SGD([w], learning_rate=[0.5, 0.25])
    for _ in range(2):
        opt((ms.Tensor(np.ones(1, np.float32)),))
    assert w.asnumpy()[0] == pytest.approx(-0.75)
    with pytest.raises(ConfigurationError, match=r"2 per-step values, but update 3 .*one value per step"):
        opt((ms.Tensor(np.ones(1, np.float32)),))
    assert w.asnumpy()[0] == pytest.approx(-0.75)  # nothing applied
    assert opt.get_lr().asnumpy() == pytest.approx(0.25)


def test_float16_parameters_update_with_momentum_sgd_and_adam():
    # the float32 globals (the first-step flag, the beta powers) met float16 slots: Assign(f16, f32) failed
    for mode in (ms.PYNATIVE_MODE, ms.GRAPH_MODE):
        ms.set_context(mode=mode)
        for make, want in [
            (lambda ps: nn.SGD(ps, 0.1, momentum=0.9), [0.855, -2.0725, 3.29, -0.08]),  # accum g then 1.9 g
            (lambda ps: nn.Adam(ps, 0.01), [0.98, -2.02, 3.02, 0.48]),  # two steps of lr * sign(g)
        ]:
            w = ms.Parameter(ms.Tensor(np.array([1.0, -2.0, 3.0, 0.5], np.float16)), "w")
            optimizer = make([w])
            g = ms.Tensor(np.array([0.5, 0.25, -1.0, 2.0], np.float16))
            optimizer((g,))
            optimizer((g,))
            assert w.dtype == ms.float16
            np.testing.assert_allclose(w.asnumpy().astype(np.float64), want, atol=2e-3)


def test_optimizer_and_schedule_arguments_are_checked_as_mindspore_does():
    net = nn.Dense(3, 2)
    a, b = net.weight, net.bias
    refused = [
        (lambda: nn.Momentum([{"params": [a]}, {"params": [b]}, {"order_params": [a]}], 0.1, 0.9), "order_params"),
        (lambda: nn.Momentum([{"params": [a]}, {"order_params": [a], "weight_decay": 0.1}], 0.1, 0.9), "only the key"),
        (lambda: nn.SGD([a], 0.1, dampening=-1.0), "dampening must be >= 0"),
        (lambda: nn.Adam([a], beta1=0.0), r"beta1 must be in \(0\.0, 1\.0\)"),
        (lambda: nn.AdamWeightDecay([a], beta2=0.0), r"beta2 must be in \(0\.0, 1\.0\)"),
        (lambda: nn.ExponentialDecayLR(-0.1, 0.9, 4), "learning_rate must be > 0"),
        (lambda: nn.ExponentialDecayLR(0.1, 0.9, 4, is_stair=1), "is_stair must be a bool"),
        (lambda: nn.exponential_decay_lr(0.1, -0.9, 10, 2, 2), "decay_rate must be > 0"),
        (lambda: nn.CosineDecayLR(0.1, 0.01, 4), "min_lr must be below max_lr"),
        (lambda: nn.cosine_decay_lr(0.1, 0.1, 10, 2, 2), "min_lr must be below max_lr"),
        (lambda: nn.PolynomialDecayLR(0.1, 0.01, 4, -1.0), "power must be > 0"),
    ]
    for make, message in refused:
        with pytest.raises(ConfigurationError, match=message):
            make()
    with pytest.raises(NotSupportedYetError, match="a weight_decay that is a Cell"):
        nn.Momentum([a], 0.1, 0.9, weight_decay=nn.WarmUpLR(0.1, 2))

    class Mine(nn.Optimizer):
        def __init__(self, params):
            super().__init__(0.1, params)

    with pytest.raises(NotSupportedYetError, match="an optimizer of your own"):
        Mine([a])
    assert nn.piecewise_constant_lr([2, 2, 5], [0.1, 0.05, 0.01]) == [0.1, 0.1, 0.01, 0.01, 0.01]  # MindSpore's
    ordered = nn.Momentum([{"params": [a]}, {"params": [b]}, {"order_params": [b, a]}], 0.1, 0.9)
    assert list(ordered.parameters) == [b, a]


@pytest.mark.parametrize("sink", [False, True])
def test_learning_rate_scheduler_changes_a_fixed_rate_as_mindspore(sink):
    import tessel.dataset as ds

    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4)
    y = np.stack([x.sum(1), x[:, 0] - x[:, 3]], 1).astype(np.float32)

    def trained(optimizer_for, callbacks):
        ms.set_seed(0)
        net = nn.Dense(4, 2)
        model = ms.Model(net, nn.MSELoss(), optimizer_for(net.trainable_params()))
        data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(2)
        model.train(1, data, callbacks=callbacks, dataset_sink_mode=sink)
        return [p.asnumpy() for p in net.trainable_params()], model

    halve = ms.train.LearningRateScheduler(lambda lr, step: lr * 0.5)
    got, model = trained(lambda ps: nn.SGD(ps, 0.1), [halve])
    # in sink mode a rate a callback sets takes effect from the next sink (here the next epoch), as on MindSpore's
    # devices; the steps of a sink still follow a per-step list
    want, _ = trained(lambda ps: nn.SGD(ps, [0.1, 0.1, 0.1] if sink else [0.1, 0.05, 0.025]), [])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    rate = model._optimizer.learning_rate
    assert float(rate.asnumpy()) == pytest.approx(0.0125)  # changed after the last step too, as MindSpore's
    rate.set_data(ms.Tensor(np.float32(0.5)))
    assert float(model._optimizer.learning_rate) == 0.5
    with pytest.raises(ConfigurationError, match="must be a fixed number"):
        trained(lambda ps: nn.SGD(ps, [0.1, 0.05, 0.025]), [halve])


@pytest.mark.parametrize("sink", [False, True])
def test_a_callback_changes_the_momentum_and_rate_as_mindsporess_parameters(sink):
    """MindSpore's momentum and learning_rate are Parameters: ops.assign (or set_data) in a callback changes them for
    the next steps (in sink mode, as on MindSpore's devices, from the next sink: here the next epoch). tessel
    compiles the momentum into the update, so a new value compiles it again."""
    import tessel.dataset as ds
    from tessel import ops

    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4)
    y = np.stack([x.sum(1), x[:, 0] - x[:, 3]], 1).astype(np.float32)

    class Change(ms.train.Callback):
        def on_train_epoch_end(self, run_context):
            opt = run_context.original_args().optimizer
            if run_context.original_args().cur_epoch_num == 1:
                ops.assign(opt.momentum, ms.Tensor(0.5, ms.float32))
                ops.assign(opt.learning_rate, ms.Tensor(0.05, ms.float32))

    ms.set_seed(0)
    net = nn.Dense(4, 2)
    w, b = (p.asnumpy().astype(np.float64) for p in net.trainable_params())
    model = ms.Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(2)
    model.train(2, data, callbacks=[Change()], dataset_sink_mode=sink)
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for i, (lr, m) in enumerate([(0.1, 0.9)] * 3 + [(0.05, 0.5)] * 3):
        xb, yb = x[2 * (i % 3) : 2 * (i % 3) + 2].astype(np.float64), y[2 * (i % 3) : 2 * (i % 3) + 2]
        g = 2 * (xb @ w.T + b - yb) / yb.size
        vw, vb = m * vw + g.T @ xb, m * vb + g.sum(0)
        w, b = w - lr * vw, b - lr * vb
    np.testing.assert_allclose(net.weight.asnumpy(), w, rtol=1e-5)
    np.testing.assert_allclose(net.bias.asnumpy(), b, rtol=1e-5)
    opt = model._optimizer
    assert opt.momentum == pytest.approx(0.5) and float(opt.learning_rate) == pytest.approx(0.05)
    sgd = nn.SGD(net.trainable_params(), 0.1)  # no momentum: no accumulator to carry one
    with pytest.raises(NotSupportedYetError, match=r"construct the optimizer with momentum=0\.9"):
        sgd.momentum.set_data(ms.Tensor(0.9, ms.float32))
    with pytest.raises(ConfigurationError, match="takes one non-negative number"):
        opt.momentum = -1.0


@pytest.mark.parametrize("rate", ["list", "schedule"])
def test_sink_mode_gives_each_step_its_own_rate(rate):
    """A per-step list or a schedule gives every step of a sink its own rate (the daemon stores each step's before
    the step runs), so sink mode trains as feed mode does; a list too short fails before the sink runs."""
    import tessel.dataset as ds

    x = np.linspace(-1, 1, 48, dtype=np.float32).reshape(12, 4)
    y = np.stack([x.sum(1), x[:, 0] - x[:, 3]], 1).astype(np.float32)

    def trained(sink, sink_size=-1, epochs=2):
        ms.set_seed(0)
        net = nn.Dense(4, 2)
        lr = nn.cosine_decay_lr(0.01, 0.1, 12, 6, 2) if rate == "list" else nn.CosineDecayLR(0.01, 0.1, 12)
        model = ms.Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), lr, 0.9))
        data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(2)
        model.train(epochs, data, dataset_sink_mode=sink, sink_size=sink_size)
        return [p.asnumpy() for p in net.trainable_params()]

    fed = trained(False)
    for got in (trained(True), trained(True, sink_size=4, epochs=3)):
        for a, b in zip(got, fed):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    if rate == "list":
        with pytest.raises(ConfigurationError, match="has 12 per-step values, but update 13 is about to run"):
            trained(True, epochs=3)


# MindSpore 2.7.0's weights after 3 steps (Dense(3, 2), weight arange(6) * 0.1, bias [0.5, -0.5], MSELoss on
# x = arange(12) * 0.1, y = 1) and its get_lr() after them, for parameter groups with rates and weight decays of their
# own; lists 4 long (MindSpore's get_lr gathers the rate of update 4)
GROUPS = {
    "momentum_fixed": (
        lambda d: nn.Momentum(
            [{"params": [d.weight], "lr": 0.2, "weight_decay": 0.01}, {"params": [d.bias], "weight_decay": 0.05}],
            0.1,
            0.9,
        ),
        [[0.082155474, 0.20953217, 0.33690888], [0.46347278, 0.63714027, 0.81080782]],
        [0.62808871, -0.11321858],
        [0.2, 0.1],
    ),
    "momentum_lists": (
        lambda d: nn.Momentum(
            [{"params": [d.weight], "lr": [0.3, 0.2, 0.1, 0.1]}, {"params": [d.bias]}], [0.1, 0.1, 0.05, 0.05], 0.9
        ),
        [[0.072696313, 0.19749951, 0.32230276], [0.45181051, 0.61750084, 0.78319138]],
        [0.60826606, -0.21254785],
        [0.1, 0.05],
    ),
    "adam_groups": (
        lambda d: nn.Adam(
            [{"params": [d.weight], "lr": 0.05, "weight_decay": 0.1}, {"params": [d.bias], "lr": 0.01}], 0.02
        ),
        [[0.12610762, 0.22855492, 0.33022285], [0.44421858, 0.54589635, 0.64670587]],
        [0.52902371, -0.47018844],
        [0.05, 0.01],
    ),
    "sgd_schedule": (
        lambda d: nn.SGD([{"params": [d.weight], "lr": nn.ExponentialDecayLR(0.2, 0.5, 1)}, {"params": [d.bias]}], 0.1),
        [[0.030058378, 0.13970943, 0.24936047], [0.36343011, 0.48880813, 0.61418611]],
        [0.57490039, -0.30148426],
        [0.025, 0.1],
    ),
}


@pytest.mark.parametrize("case", list(GROUPS))
@pytest.mark.parametrize("sink", [False, True])
def test_parameter_groups_with_their_own_rates_and_weight_decays_train_as_mindspore(case, sink):
    import tessel.dataset as ds

    make, weight, bias, rates = GROUPS[case]
    dense = nn.Dense(3, 2)
    dense.weight.set_data(ms.Tensor((np.arange(6).reshape(2, 3) * 0.1).astype(np.float32)))
    dense.bias.set_data(ms.Tensor(np.array([0.5, -0.5], np.float32)))
    opt = make(dense)
    x = (np.arange(12).reshape(4, 3) * 0.1).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": np.stack([x] * 3), "y": np.ones((3, 4, 2), np.float32)}, shuffle=False)
    ms.Model(dense, nn.MSELoss(), opt).train(1, data, dataset_sink_mode=sink)
    np.testing.assert_allclose(dense.weight.asnumpy(), weight, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dense.bias.asnumpy(), bias, rtol=1e-5, atol=1e-7)
    assert [float(rate.asnumpy()) for rate in opt.get_lr()] == pytest.approx(rates)  # one per parameter
    own = opt.get_lr_parameter(dense.weight)
    if case == "sgd_schedule":
        assert isinstance(own, nn.ExponentialDecayLR)
    else:
        assert own.name == "learning_rate_group_0" and any(own is p for p in opt.get_parameters())  # saved


def test_a_group_rate_is_saved_loaded_and_checked_as_mindsporess():
    dense = nn.Dense(3, 2)
    opt = nn.Momentum([{"params": [dense.weight], "lr": 0.2}, {"params": [dense.bias]}], 0.1, 0.9)
    names = [p.name for p in opt.get_parameters() if "learning_rate" in p.name]
    assert sorted(names) == ["learning_rate", "learning_rate_group_0"]  # MindSpore 2.7.0's checkpoint keys
    ms.load_param_into_net(opt, {"learning_rate_group_0": ms.Parameter(ms.Tensor(np.float32(0.05)), "x")})
    assert float(opt.get_lr_parameter(dense.weight).asnumpy()) == pytest.approx(0.05)
    # MindSpore 2.7.0: fixed rates come from get_lr() as their Parameters (ops.assign on one changes it); with every
    # group at its own rate there is no default learning_rate to save
    assert [p.name for p in opt.get_lr()] == ["learning_rate_group_0", "learning_rate"]
    ms.ops.assign(opt.get_lr()[1], ms.Tensor(0.02, ms.float32))
    assert float(opt.learning_rate) == pytest.approx(0.02)
    both = nn.Momentum([{"params": [dense.weight], "lr": 0.2}, {"params": [dense.bias], "lr": 0.3}], 0.1, 0.9)
    names = sorted(p.name for p in both.get_parameters() if "learning_rate" in p.name)
    assert names == ["learning_rate_group_0", "learning_rate_group_1"]
    from tessel.nn.dynamic_lr import piecewise_constant_lr  # MindSpore's module paths
    from tessel.nn.learning_rate_schedule import LearningRateSchedule

    assert issubclass(nn.WarmUpLR, LearningRateSchedule) and piecewise_constant_lr is nn.piecewise_constant_lr
    with pytest.raises(ValueError, match="dynamic learning rate in group must be the same size"):
        nn.Momentum([{"params": [dense.weight], "lr": [0.1, 0.2]}, {"params": [dense.bias]}], [0.1] * 3, 0.9)
    with pytest.raises(RuntimeError, match="the bias parameter already exists"):
        nn.Momentum([{"params": [dense.bias]}, {"params": [dense.bias]}], 0.1, 0.9)


def test_sgd_without_momentum_saves_mindsporess_accumulators():
    """MindSpore 2.7.0's SGD(momentum=0) saves accum.* (zeros) and stat.* (ones, still after a step): the same keys
    and values, so neither side leaves a name unloaded."""
    dense = nn.Dense(3, 2)
    opt = nn.SGD(dense.trainable_params(), 0.1)
    step = nn.TrainOneStepCell(nn.WithLossCell(dense, nn.MSELoss()), opt)
    step(ms.Tensor(np.ones((2, 3), np.float32)), ms.Tensor(np.zeros((2, 2), np.float32)))
    state = {p.name: p.asnumpy() for p in opt.get_parameters()}
    assert sorted(state) == sorted(
        ["weight", "bias", "global_step", "learning_rate", "momentum"]
        + [f"{kind}.{name}" for kind in ("accum", "stat") for name in ("weight", "bias")]
    )
    assert not state["accum.weight"].any() and (state["stat.bias"] == 1).all() and state["stat.weight"].shape == (2, 3)
    ms.load_param_into_net(opt, {"accum.weight": ms.Tensor(np.ones((2, 3), np.float32))})  # nothing reads it
    assert not opt.accum[0].asnumpy().any()


def test_rates_kept_by_a_callback_read_the_optimizer_and_follow_its_kind():
    dense = nn.Dense(3, 2)
    opt = nn.Momentum(dense.trainable_params(), 0.1, 0.9)
    rate, momentum = opt.learning_rate, opt.momentum  # as MindSpore's Parameters, they read the values in force
    ms.ops.assign(rate, ms.Tensor(np.float32(0.5)))
    momentum.set_data(ms.Tensor(np.float32(0.5)))
    assert float(rate.asnumpy()) == 0.5 and float(momentum.asnumpy()) == 0.5
    opt.learning_rate = [0.1, 0.2, 0.3]  # another kind of rate: the Parameter checkpoints hold follows it
    assert opt.get_lr_parameter(dense.weight).shape == (3,)
    opt.learning_rate = nn.ExponentialDecayLR(0.1, 0.9, 1)
    assert "learning_rate" not in [p.name for p in opt.get_parameters()]
    # every group at its own rate: the default list is read by nothing and limits nothing
    own = nn.Momentum([{"params": dense.trainable_params(), "lr": 0.01}], learning_rate=[0.1, 0.1], momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(dense, nn.MSELoss()), own)
    for _ in range(3):
        step(ms.Tensor(np.ones((2, 3), np.float32)), ms.Tensor(np.zeros((2, 2), np.float32)))
    with pytest.raises(ValueError, match="must be the same size"):  # two group lists of other lengths
        nn.Momentum([{"params": [dense.weight], "lr": [0.1] * 3}, {"params": [dense.bias], "lr": [0.1] * 5}], 0.1, 0.9)
