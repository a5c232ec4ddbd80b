"""tessel.amp (MindSpore's mindspore.amp): overflow checks, loss scalers, auto_mixed_precision's levels, the loss
scale managers, and Model(amp_level=..., loss_scale_manager=...).

References: MindSpore's own docstring examples (amp.py) and its rules (train/amp.py, loss_scale_manager.py), and
float16 arithmetic emulated in numpy."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
import tessel.dataset as ds
from tessel import amp, nn, ops
from tessel.common.dtype import DType
from tessel.core.errors import ConfigurationError, NotSupportedYetError

X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(16, 4)
Y = np.stack([X.sum(1), X[:, 0] - X[:, 3]], 1).astype(np.float32)
MODES = pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])


class Net(nn.Cell):
    """A cell the user wrote: white-list cells, a black-list cell, and a white-list primitive it holds."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.relu = ops.ReLU()
        self.fc2 = nn.Dense(8, 2)

    def construct(self, x):
        return self.fc2(self.relu(self.bn(self.fc1(x))))


def test_ops_all_and_any_reduce_to_bool_in_both_modes():
    x = ms.Tensor(np.array([[1.0, np.inf], [2.0, 0.0]], np.float32))
    for mode in (ms.PYNATIVE_MODE, ms.GRAPH_MODE):
        ms.set_context(mode=mode)
        assert not bool(ops.all(ops.isfinite(x)))
        assert ops.all(ops.isfinite(x), axis=1).asnumpy().tolist() == [False, True]
        assert ops.any(x == 0, axis=0, keep_dims=True).asnumpy().tolist() == [[False, True]]
        assert x.all().dtype == DType.bool_ and not bool(x.all()) and bool(x.any())
        assert ms.jit(lambda t: ops.any(ops.isfinite(t) == False))(x).asnumpy()  # noqa: E712


def test_all_finite_and_the_scalers_give_mindsporess_documented_values():
    grads = (ms.Tensor(np.array([np.nan, 1.0], np.float32)), ms.Tensor(np.array([1.0], np.float32)))
    assert not bool(amp.all_finite(grads)) and bool(amp.all_finite(grads[1:]))
    assert amp.init_status().shape == (8,)
    static = amp.StaticLossScaler(scale_value=2**10)
    assert static.scale(ms.Tensor(np.array([1.0], np.float32))).asnumpy().tolist() == [1024.0]
    unscaled = static.unscale((ms.Tensor(np.array([1.5, 1.0], np.float16)), ms.Tensor(np.array([1.2], np.float16))))
    assert unscaled[0].dtype == DType.float16  # MindSpore's example: [1.4648e-03, 9.7656e-04], [1.1721e-03]
    np.testing.assert_allclose(unscaled[0].asnumpy(), [1.4648e-03, 9.7656e-04], rtol=1e-3)
    np.testing.assert_allclose(unscaled[1].asnumpy(), [1.1721e-03], rtol=1e-3)
    assert static.adjust(True) is False
    dynamic = amp.DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=1)
    overflowing = (ms.Tensor(np.array([np.nan, 1.0], np.float16)), ms.Tensor(np.array([0.2], np.float16)))
    assert dynamic.adjust(amp.all_finite(dynamic.unscale(overflowing))) is True
    assert float(dynamic.scale_value.asnumpy()) == 512.0


def _dynamic_rule(scale, counter, finite, factor, window):
    """MindSpore's DynamicLossScaler.adjust in plain Python."""
    if finite:
        grown = scale * factor if np.isfinite(np.float32(scale * factor)) else scale
        scale = grown if counter == window - 1 else scale
        counter = (counter + 1) % window
    else:
        scale, counter = max(1.0, scale / factor), 0
    return scale, counter


@MODES
def test_dynamic_loss_scaler_follows_mindspores_rule_eagerly_and_in_a_graph(mode):
    ms.set_context(mode=getattr(ms, mode))
    scaler = amp.DynamicLossScaler(scale_value=4, scale_factor=2, scale_window=3)
    step = ms.jit(scaler.adjust) if mode == "GRAPH_MODE" else scaler.adjust
    scale, counter = 4.0, 0
    for finite in [True, True, True, False, False, False, False, True, True, True, True]:
        step(ms.Tensor(np.bool_(finite)))
        scale, counter = _dynamic_rule(scale, counter, finite, 2, 3)
        assert float(scaler.scale_value.asnumpy()) == scale and int(scaler.counter.asnumpy()) == counter
    with pytest.raises(ConfigurationError, match="scale_value must be >= 1"):
        amp.DynamicLossScaler(0.5, 2, 3)
    with pytest.raises(ConfigurationError, match="scale_window must be an int > 0"):
        amp.DynamicLossScaler(2, 2, 0)
    with pytest.raises(ConfigurationError, match="scale_value must be an int or a float"):
        amp.StaticLossScaler(True)


@MODES
def test_levels_set_the_precision_mindspore_sets_and_keep_parameter_names(mode):
    ms.set_context(mode=getattr(ms, mode))
    x = ms.Tensor(X)
    for level, fc, bn, relu in [("O0", None, None, None), ("O1", "float16", None, "float16"),
                                ("O2", "float16", "float32", None), ("O3", "float16", "float16", None)]:  # fmt: skip
        ms.set_seed(0)
        net = Net()
        names = [p.name for p in net.get_parameters()]
        reference = net(x).asnumpy()
        mixed = amp.auto_mixed_precision(net, level)
        out = mixed(x)
        assert out.dtype == DType.float32, level  # O1: the white-list cells' results; O2/O3: the network's output
        assert [p.name for p in mixed.get_parameters()] == names, level
        assert (net.fc1._float_dtype and net.fc1._float_dtype.name) == fc, level
        assert (net.bn._float_dtype and net.bn._float_dtype.name) == bn, level
        assert (net.relu.__dict__.get("_amp_dtype") and net.relu._amp_dtype.name) == relu, level
        error = np.abs(out.asnumpy() - reference).max()
        assert (error == 0) if level == "O0" else (0 < error < 0.02), (level, error)
    seq = amp.auto_mixed_precision(nn.SequentialCell(nn.Dense(4, 8), nn.ReLU()), "O1")
    inner = [v for cell in seq.cells() for v in vars(cell).values() if isinstance(v, ops.Primitive)]
    assert all(v.__dict__.get("_amp_dtype") is None for v in inner)  # tessel's own cells: unchanged, as MindSpore's


def test_o3_dense_computes_in_float16():
    ms.set_seed(0)
    dense = nn.Dense(4, 3)
    w, b = dense.weight.asnumpy(), dense.bias.asnumpy()
    out = amp.auto_mixed_precision(dense, "O3")(ms.Tensor(X)).asnumpy()
    half = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    expected = half(half(X) @ half(w).T + half(b))
    np.testing.assert_allclose(out, expected, rtol=2e-3, atol=2e-3)
    assert np.abs(out - (X @ w.T + b)).max() > 0  # not the float32 result


def test_level_and_dtype_errors_name_the_rule():
    with pytest.raises(NotSupportedYetError, match="level 'auto' is not supported yet"):
        amp.auto_mixed_precision(Net(), "auto")
    with pytest.raises(ConfigurationError, match="one of O0, O1, O2, O3, auto, got 'O4'"):
        amp.auto_mixed_precision(Net(), "O4")
    with pytest.raises(NotSupportedYetError, match="float16"):
        amp.auto_mixed_precision(Net(), "O2", dtype=ms.float32)
    with pytest.raises(ConfigurationError, match="network must be a Cell"):
        amp.auto_mixed_precision(lambda x: x, "O2")


def _train(scale, labels=Y):
    ms.set_seed(0)
    net = amp.auto_mixed_precision(nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2)), "O2")
    loss_fn, optimizer = nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1)
    scaler = amp.DynamicLossScaler(scale_value=scale, scale_factor=2, scale_window=50)

    def forward(data, label):
        return scaler.scale(loss_fn(net(data), label))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    _, grads = grad_fn(ms.Tensor(X), ms.Tensor(labels))
    finite = amp.all_finite(grads)
    if finite:
        optimizer(scaler.unscale(grads))
    scaler.adjust(finite)
    return net, bool(finite), float(scaler.scale_value.asnumpy())


@MODES
def test_an_overflowing_step_is_skipped_and_the_scale_halves_in_mindspores_training_loop(mode):
    ms.set_context(mode=getattr(ms, mode))
    ms.set_seed(0)
    start = [p.asnumpy() for p in amp.auto_mixed_precision(
        nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2)), "O2").trainable_params()]  # fmt: skip
    net, finite, scale = _train(2.0**120, Y * 1e4)  # the scaled gradients overflow
    assert not finite and scale == 2.0**119
    assert all(np.array_equal(p.asnumpy(), s) for p, s in zip(net.trainable_params(), start))
    net, finite, scale = _train(2.0**8)
    assert finite and scale == 2.0**8
    assert not all(np.array_equal(p.asnumpy(), s) for p, s in zip(net.trainable_params(), start))


def test_loss_scale_managers_follow_mindspores_rules():
    manager = ms.DynamicLossScaleManager(init_loss_scale=16, scale_factor=2, scale_window=2)
    seen = []
    for overflow in [False, False, True, False, False, False]:
        manager.update_loss_scale(overflow)
        seen.append(manager.get_loss_scale())
    assert seen == [16, 32, 16, 16, 32, 32]  # up every scale_window steps after the last overflow
    assert manager.get_drop_overflow_update() is True
    cell = manager.get_update_cell()
    assert isinstance(cell, nn.DynamicLossScaleUpdateCell) and cell.get_loss_scale() == 32
    fixed = ms.FixedLossScaleManager(1024.0, drop_overflow_update=False)
    assert fixed.get_loss_scale() == 1024.0 and fixed.get_update_cell() is None
    assert isinstance(ms.FixedLossScaleManager(64.0).get_update_cell(), nn.FixedLossScaleUpdateCell)
    with pytest.raises(ConfigurationError, match="loss_scale must be >= 1"):
        ms.FixedLossScaleManager(0.5)
    with pytest.raises(ConfigurationError, match="scale_window must be an int > 0"):
        ms.DynamicLossScaleManager(scale_window=0)
    with pytest.raises(ConfigurationError, match="DynamicLossScaleUpdateCell: scale_window must be an int > 0"):
        nn.DynamicLossScaleUpdateCell(1024.0, 2, True)
    assert ms.train.FixedLossScaleManager is ms.amp.FixedLossScaleManager is ms.FixedLossScaleManager


def _update_cell_rule(flags, scale, factor, window):
    """MindSpore's DynamicLossScaleUpdateCell.construct in plain Python: the scale after each step."""
    cur, last, seen = 1, 0, []
    for overflow in flags:
        lowered = max(scale / factor, 1.0) if overflow else scale
        grow = window <= cur - last
        last = cur if (overflow or grow) else last
        scale = lowered * factor if (grow and not overflow) else lowered
        cur += 1
        seen.append(scale)
    return seen


@MODES
def test_train_one_step_with_loss_scale_skips_overflowing_steps_and_follows_the_update_cell(mode):
    ms.set_context(mode=getattr(ms, mode))
    labels = ms.Tensor(Y * 100)

    def network():
        ms.set_seed(0)
        net = nn.Dense(4, 2)
        return net, nn.Momentum(net.trainable_params(), 0.01, 0.9)

    net, optimizer = network()
    update = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0**124, scale_factor=4, scale_window=3)
    step = nn.TrainOneStepWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, scale_sense=update)
    flags, scales = [], []
    for _ in range(12):
        loss, overflow, _ = step(ms.Tensor(X), labels)
        flags.append(bool(overflow.asnumpy()))
        scales.append(float(step.scale_sense.asnumpy()))
        assert np.isfinite(float(loss.asnumpy()))  # the unscaled loss
    assert True in flags and False in flags  # at 2**124 the gradients overflow; a few steps down they do not
    assert scales == _update_cell_rule(flags, 2.0**124, 4, 3)
    assert optimizer.global_step.asnumpy().tolist() == [flags.count(False)]  # skipped steps are not counted
    plain_net, plain_optimizer = network()
    plain = nn.TrainOneStepCell(nn.WithLossCell(plain_net, nn.MSELoss()), plain_optimizer)
    for _ in range(flags.count(False)):
        plain(ms.Tensor(X), labels)
    for a, b in zip(net.trainable_params(), plain_net.trainable_params()):  # power-of-two scales: exact
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_train_one_step_with_a_tensor_scale_and_its_errors():
    net = nn.Dense(4, 2)
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    step = nn.TrainOneStepWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, ms.Tensor([1024.0]))
    _, overflow, scale = step(ms.Tensor(X), ms.Tensor(Y))
    assert not bool(overflow.asnumpy()) and scale.asnumpy().tolist() == [1024.0]
    step.set_sense_scale(ms.Tensor([1.0]))
    assert step(ms.Tensor(X), ms.Tensor(Y))[2].asnumpy().tolist() == [1.0]
    with pytest.raises(ConfigurationError, match=r"scale_sense must have shape \(\) or \(1,\)"):
        nn.TrainOneStepWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, ms.Tensor([1.0, 2.0]))
    with pytest.raises(ConfigurationError, match="scale_sense must be a Cell or a Tensor"):
        nn.TrainOneStepWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, 1024.0)


def _model_weights(amp_level, optimizer_scale=1.0, **kwargs):
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dense(8, 2))
    optimizer = nn.Momentum(net.trainable_params(), 0.05, 0.9, loss_scale=optimizer_scale)
    model = ms.Model(net, nn.MSELoss(), optimizer, amp_level=amp_level, metrics={"loss"}, **kwargs)
    model.train(2, ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=False).batch(4))
    return model, [p.asnumpy() for p in net.trainable_params()]


def test_model_amp_levels_train_with_loss_scale_managers():
    _, o0 = _model_weights("O0")
    _, plain = _model_weights("O2", loss_scale_manager=None)
    model, scaled = _model_weights("O2", 128.0, loss_scale_manager=ms.FixedLossScaleManager(128.0, False))
    for a, b, c in zip(o0, plain, scaled):
        np.testing.assert_allclose(b, c, rtol=1e-3, atol=1e-4)  # scaled by 128 and unscaled: the same update
        np.testing.assert_allclose(a, b, rtol=0.05, atol=0.02)  # float16 trains close to float32
    assert any(not np.array_equal(a, b) for a, b in zip(o0, plain))
    _, forgot = _model_weights("O2", loss_scale_manager=ms.FixedLossScaleManager(128.0, False))
    assert not all(np.allclose(f, s, atol=0.1) for f, s in zip(forgot, scaled))  # the scale acts: 128x steps
    assert model.predict(ms.Tensor(X)).dtype == DType.float16  # the predict network is the float16 network
    loss = model.eval(ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=False).batch(4))["loss"]
    assert np.isfinite(loss)
    # O2's default manager is dynamic (2**24): a train step that skips overflowing updates, MindSpore's on Ascend/GPU
    dynamic, default = _model_weights("O2")
    assert isinstance(dynamic.train_network, nn.TrainOneStepWithLossScaleCell)
    dropping, fixed = _model_weights("O3", loss_scale_manager=ms.FixedLossScaleManager(128.0))
    assert isinstance(dropping.train_network.loss_scaling_manager, nn.FixedLossScaleUpdateCell)
    for a, b in zip(plain, default):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)  # no step overflowed: the same training
    assert all(np.isfinite(w).all() for w in fixed)


def test_float16_gradients_that_scatter_are_float16_as_mindsporess():
    """Gather, indexing, cross-entropy and max pooling differentiate by adding into zeros (ScatterElements /
    ScatterND with reduction add), which ONNX Runtime's CPU kernels do not do in float16: tessel adds in float32.
    MindSpore 2.7.0 returns these gradients in Float16; here they equal the float32 gradients to float16's rounding."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    image = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    labels, rows = ms.Tensor(np.array([0, 2, 4, 1], np.int32)), ms.Tensor(np.array([0, 2, 2], np.int32))
    cases = [
        (lambda a: ops.cross_entropy(a, labels), x),
        (lambda a: (ops.gather(a, rows, 0) * 3).sum(), x),
        (lambda a: a[rows].sum(), x),
        (lambda a: ops.max_pool2d(a, 2, 2).sum(), image),
    ]
    for fn, value in cases:
        half = ms.grad(fn)(ms.Tensor(value.astype(np.float16)))
        full = ms.grad(fn)(ms.Tensor(value))
        assert half.dtype == DType.float16
        np.testing.assert_allclose(half.asnumpy().astype(np.float32), full.asnumpy(), rtol=2e-3, atol=2e-3)
