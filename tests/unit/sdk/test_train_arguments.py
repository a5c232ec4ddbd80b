"""Training arguments MindSpore scripts pass that tessel once accepted and ignored: the optimizer's loss_scale in
the fused step, TrainOneStepCell's return_grad and sens=None, Model's keyword options, Model.eval's callbacks and
the parameter-group key grad_centralization."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
import tessel.dataset as ds
from tessel import nn, train
from tessel.core.errors import ConfigurationError, NotSupportedYetError

X = np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4)
Y = np.stack([X.sum(1), X[:, 0] - X[:, 3]], 1).astype(np.float32)


@pytest.fixture(autouse=True)
def fresh_log_once(monkeypatch):
    from tessel.core import options

    monkeypatch.setattr(options, "_logged", set())


def _step(loss_scale=1.0, sens=1.0, return_grad=False):
    ms.set_seed(0)
    net = nn.Dense(4, 2)
    start = {p.name: p.asnumpy().astype(np.float64) for p in net.trainable_params()}
    optimizer = nn.SGD(net.trainable_params(), 0.1, loss_scale=loss_scale)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, sens=sens, return_grad=return_grad)
    return net, start, step


def _sgd_reference(start):
    """float64: one SGD step (lr 0.1) of MSELoss(mean) on Dense(4, 2) from `start`."""
    w, b = start["weight"], start["bias"]
    error = X.astype(np.float64) @ w.T + b - Y
    dout = 2 * error / error.size
    return {"weight": w - 0.1 * dout.T @ X, "bias": b - 0.1 * dout.sum(0)}


@pytest.mark.parametrize("scale", [1.0, 1024.0])
def test_static_loss_scaling_updates_as_the_unscaled_step(scale):
    # MindSpore's static loss scaling: TrainOneStepCell(sens=S) scales the gradients by S, the optimizer's
    # loss_scale=S divides them again; the fused step used to skip the division (updates S times too large).
    net, start, step = _step(loss_scale=scale, sens=scale)
    step(ms.Tensor(X), ms.Tensor(Y))
    want = _sgd_reference(start)
    for p in net.trainable_params():
        np.testing.assert_allclose(p.asnumpy(), want[p.name], rtol=1e-5, atol=1e-6, err_msg=p.name)


@pytest.mark.parametrize("fused", [True, False])
def test_weight_decay_is_the_same_under_loss_scaling_as_in_mindspore(fused):
    # MindSpore multiplies weight_decay by loss_scale, decays the scaled gradients and divides by loss_scale:
    # (S*g + S*wd*p) / S = g + wd*p (nn/optim/optimizer.py, _preprocess_weight_decay and group weight decays)
    scale, wd = 8.0, 0.5
    ms.set_seed(0)
    net = nn.Dense(4, 2)
    start = {p.name: p.asnumpy().astype(np.float64) for p in net.trainable_params()}
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9, weight_decay=wd, loss_scale=scale)
    if fused:
        nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, sens=scale)(ms.Tensor(X), ms.Tensor(Y))
    else:
        grads = ms.grad(nn.WithLossCell(net, nn.MSELoss()), None, optimizer.parameters)(ms.Tensor(X), ms.Tensor(Y))
        optimizer(tuple(g * scale for g in grads))
    plain = _sgd_reference(start)  # lr * g, the first momentum step being lr * (g + decay)
    for p in net.trainable_params():
        g = (start[p.name] - plain[p.name]) / 0.1
        want = start[p.name] - 0.1 * (scale * g + scale * wd * start[p.name]) / scale
        np.testing.assert_allclose(p.asnumpy(), want, rtol=1e-5, atol=1e-6, err_msg=p.name)


def test_loss_scale_alone_divides_the_gradients():
    net, start, step = _step(loss_scale=4.0)
    step(ms.Tensor(X), ms.Tensor(Y))
    want = _sgd_reference(start)
    for p in net.trainable_params():  # a quarter of the unscaled step
        np.testing.assert_allclose(p.asnumpy() - start[p.name], (want[p.name] - start[p.name]) / 4, rtol=1e-4,
                                   atol=1e-7, err_msg=p.name)  # fmt: skip


def test_return_grad_gives_the_loss_and_the_gradients_by_name_and_sens_none_is_one():
    net, start, step = _step(sens=None, return_grad=True)
    assert step.sens == 1.0
    loss, grads = step(ms.Tensor(X), ms.Tensor(Y))
    want = _sgd_reference(start)
    assert sorted(grads) == ["bias", "weight"]
    for p in net.trainable_params():
        np.testing.assert_allclose(p.asnumpy(), want[p.name], rtol=1e-5, atol=1e-6, err_msg=p.name)
        np.testing.assert_allclose(grads[p.name].asnumpy(), (start[p.name] - want[p.name]) / 0.1, rtol=1e-4,
                                   atol=1e-6, err_msg=p.name)  # fmt: skip
    error = X.astype(np.float64) @ start["weight"].T + start["bias"] - Y
    assert float(loss.asnumpy()) == pytest.approx(np.mean(error**2), rel=1e-5)
    with pytest.raises(ConfigurationError, match="return_grad must be a bool"):
        _step(return_grad=1)


def test_model_keyword_options_are_checked():
    net = nn.Dense(4, 2)
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    ms.Model(net, nn.MSELoss(), optimizer, keep_batchnorm_fp32=False, boost_config_dict={})
    with pytest.raises(ConfigurationError, match="loss_scale_manager must be a LossScaleManager"):
        ms.Model(net, nn.MSELoss(), optimizer, loss_scale_manager=object())
    with pytest.raises(NotSupportedYetError, match="boost_level 'O1'"):
        ms.Model(net, nn.MSELoss(), optimizer, boost_level="O1")
    with pytest.raises(ConfigurationError, match="amp_level 'O2' needs an optimizer"):
        ms.Model(net, nn.MSELoss(), amp_level="O2")
    with pytest.raises(TypeError, match="unexpected keyword argument 'metric'"):
        ms.Model(net, nn.MSELoss(), optimizer, metric={"loss"})


class EvalRecorder(train.Callback):
    def __init__(self, stop_after=None):
        self.calls, self.outputs, self.stop_after = [], [], stop_after

    def on_eval_begin(self, run_context):
        self.calls.append(("begin", run_context.original_args().mode))

    def on_eval_epoch_begin(self, run_context):
        self.calls.append("epoch_begin")

    def on_eval_step_begin(self, run_context):
        self.calls.append(("step_begin", run_context.original_args().cur_step_num))

    def on_eval_step_end(self, run_context):
        cb = run_context.original_args()
        self.outputs.append(cb.net_outputs)
        self.calls.append("step_end")
        if self.stop_after == cb.cur_step_num:
            run_context.request_stop()

    def on_eval_epoch_end(self, run_context):
        self.calls.append(("epoch_end", sorted(run_context.original_args().metrics)))

    def on_eval_end(self, run_context):
        self.calls.append("end")


def test_model_eval_runs_mindspores_eval_callbacks():
    net = nn.Dense(4, 2)
    model = ms.Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), metrics={"loss"})
    data = ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=False).batch(2)
    recorder = EvalRecorder()
    result = model.eval(data, callbacks=[recorder])
    assert recorder.calls == [("begin", "eval"), "epoch_begin", ("step_begin", 1), "step_end", ("step_begin", 2),
                              "step_end", ("step_begin", 3), "step_end", ("epoch_end", ["loss"]), "end"]  # fmt: skip
    losses = [float(out[0].asnumpy()) for out in recorder.outputs]  # (loss, prediction, label) per batch
    assert result["loss"] == pytest.approx(np.mean(losses), rel=1e-6)
    stopping = EvalRecorder(stop_after=1)
    model.eval(data, callbacks=stopping)
    assert stopping.calls.count("step_end") == 1 and stopping.calls[-1] == "end"
    with pytest.raises(ConfigurationError, match="callbacks must be Callback instances"):
        model.eval(data, callbacks=[print])


def test_grad_centralization_in_a_parameter_group_is_refused():
    net = nn.Dense(4, 2)
    nn.SGD([{"params": net.trainable_params(), "grad_centralization": False}], 0.1)
    with pytest.raises(NotSupportedYetError, match="'grad_centralization': True"):
        nn.SGD([{"params": net.trainable_params(), "grad_centralization": True}], 0.1)


def test_grad_reducer_fusion_type_zero_means_each_gradient_alone():
    net = nn.Dense(4, 2)
    assert nn.DistributedGradReducer(net.trainable_params(), fusion_type=0).fusion_type == 0  # was raised to 1
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigurationError, match="fusion_type must be an int >= 0"):
            nn.DistributedGradReducer(net.trainable_params(), fusion_type=bad)


def test_a_zero_sens_is_refused():
    net = nn.Dense(4, 2)
    with pytest.raises(ConfigurationError, match="sens can not be 0"):
        nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params()), sens=0)


def test_a_float16_layer_after_the_first_is_not_read_updated_by_the_backward_pass():
    # ONNX Runtime has no float16 MatMul on CPU: it removed the weight's Cast pair, and the in-place SGD update of
    # the float16 layer's weight was read by the backward pass of the layer before it (W1's step off by ~19 %)
    ms.set_seed(4)
    first, second = nn.Dense(4, 6, has_bias=False), nn.Dense(6, 2, has_bias=False)
    second.to_float(ms.float16)
    net = nn.SequentialCell(first, second)
    w1, w2 = first.weight.asnumpy().astype(np.float64), second.weight.asnumpy().astype(np.float64)
    nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.5))(
        ms.Tensor(X), ms.Tensor(Y)
    )
    hidden = X.astype(np.float64) @ w1.T
    dout = 2 * (hidden @ w2.T - Y) / Y.size
    grad_w1 = (dout @ w2).T @ X
    step_w1 = (w1 - first.weight.asnumpy()) / 0.5
    np.testing.assert_allclose(step_w1, grad_w1, rtol=0.02, atol=2e-3)


def test_batchnorm_statistics_move_once_per_step_when_the_step_runs_the_forward_twice():
    # MindSpore's TrainOneStepCell pattern: loss = network(x); grads = grad(network)(x, sens). The gradient's
    # forward repeated BatchNorm's moving-statistics update in the same graph (momentum applied twice)
    def moving_mean(return_grad: bool) -> np.ndarray:
        ms.set_seed(2)
        net = nn.SequentialCell(nn.Dense(4, 3), nn.BatchNorm1d(3), nn.Dense(3, 2))
        net.set_train()
        step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                   return_grad=return_grad)  # fmt: skip
        step(ms.Tensor(X), ms.Tensor(Y))
        return net[1].moving_mean.asnumpy()

    ms.set_seed(2)
    reference = nn.SequentialCell(nn.Dense(4, 3), nn.BatchNorm1d(3), nn.Dense(3, 2))
    hidden = X.astype(np.float64) @ reference[0].weight.asnumpy().T + reference[0].bias.asnumpy()
    once = 0.1 * hidden.mean(0)  # MindSpore's momentum 0.9: moving = 0.9 * 0 + 0.1 * batch mean
    for mode in (ms.GRAPH_MODE, ms.PYNATIVE_MODE):
        ms.set_context(mode=mode)
        np.testing.assert_allclose(moving_mean(False), once, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(moving_mean(True), once, rtol=1e-5, atol=1e-7)


def test_to_float_computes_the_cells_tensors_in_its_dtype_too():
    class Scaled(nn.Cell):
        def __init__(self):
            super().__init__()
            self.scale = ms.Tensor(np.full(4, 3.0, np.float32))

        def construct(self, x):
            return x * self.scale + ms.Tensor(np.float32(1.0))

    for mode in (ms.GRAPH_MODE, ms.PYNATIVE_MODE):
        ms.set_context(mode=mode)
        out = Scaled().to_float(ms.float16)(ms.Tensor(np.ones((2, 4), np.float32)))
        assert out.dtype == ms.float16 and out.asnumpy().tolist() == [[4.0] * 4] * 2, mode
