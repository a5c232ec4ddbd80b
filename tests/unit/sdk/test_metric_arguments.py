"""Metrics, TimeMonitor, Cell.to_float and AutoParallel.enable_fp32_communication as MindSpore documents them
(the third audit): Accuracy's class axis and label shapes, top-k with (N, 1) labels, Loss of a 1-D loss."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import nn, train
from tessel.core.errors import ConfigurationError
from tessel.train.callback import CallbackParam


def test_accuracy_takes_the_class_axis_one_and_refuses_labels_of_another_shape():
    logits = np.eye(3)[[2, 1, 0, 2]]
    accuracy = train.Accuracy()
    accuracy.update(logits, np.array([2, 1, 0, 0]))
    assert accuracy.eval() == pytest.approx(0.75)
    accuracy.clear()
    accuracy.update(logits, np.eye(3)[[2, 1, 0, 2]])  # one-hot labels
    assert accuracy.eval() == 1.0
    with pytest.raises(ConfigurationError, match=r"labels of shape \(4,\).*got \(4, 1\)"):
        accuracy.update(logits, np.array([[2], [1], [0], [2]]))  # (N, 1) indices: read as one-hot before
    segmentation = np.zeros((1, 3, 4))  # (N, C, L): class 2 wins at every position
    segmentation[0, 2] = 1.0
    accuracy.clear()
    accuracy.update(segmentation, np.array([[2, 2, 2, 1]]))
    assert accuracy.eval() == pytest.approx(0.75)  # argmax over axis 1, 4 positions counted


def test_top_k_reads_n_by_1_labels_as_indices():
    logits = np.eye(3)[[2, 1, 0, 2]]
    for labels in (np.array([2, 1, 0, 2]), np.array([[2], [1], [0], [2]])):
        top1 = train.Top1CategoricalAccuracy()
        top1.update(logits, labels)
        assert top1.eval() == 1.0  # (N, 1) labels gave 0.25 when argmax'ed as one-hot
    top2 = train.TopKCategoricalAccuracy(2)
    top2.update(np.array([[0.1, 0.5, 0.4], [0.6, 0.3, 0.1]]), np.array([2, 2]))
    assert top2.eval() == pytest.approx(0.5)


def test_loss_metric_takes_a_1d_loss_as_its_mean():
    loss = train.Loss()
    loss.update(np.array([0.5, 1.5]))
    loss.update(np.array(3.0))
    assert loss.eval() == pytest.approx(2.0)
    with pytest.raises(ConfigurationError, match="scalar or 1-D loss"):
        loss.update(np.ones((2, 2)))


class _RunContext:
    def __init__(self, **params):
        self._params = CallbackParam(params)

    def original_args(self):
        return self._params


def test_time_monitor_divides_by_the_runs_steps_before_data_size(capsys):
    monitor = train.TimeMonitor(data_size=100)
    monitor.on_train_epoch_begin(_RunContext(batch_num=4))
    monitor.epoch_time -= 1.0  # one second ago
    monitor.on_train_epoch_end(_RunContext(batch_num=4))
    printed = capsys.readouterr().out
    per_step = float(printed.split("per step time: ")[1].split(" ms")[0])
    assert per_step == pytest.approx(250.0, rel=0.05)  # 1 s over batch_num=4 steps, not data_size=100
    with pytest.raises(ConfigurationError, match="data_size must be a positive int"):
        train.TimeMonitor(data_size=0)


def test_to_float_takes_float16_and_float32_only():
    nn.Dense(2, 2).to_float(ms.float16)
    for dtype in (ms.float64, ms.int32):
        with pytest.raises(ConfigurationError, match="dst_type must be float16 or float32"):
            nn.Dense(2, 2).to_float(dtype)


def test_enable_fp32_communication_sets_force_fp32_communication():
    from tessel.parallel.auto_parallel import AutoParallel

    try:
        half = AutoParallel(nn.Dense(2, 2).to_float(ms.float16), "semi_auto")
        assert ms.get_auto_parallel_context("force_fp32_communication") is False
        half.enable_fp32_communication()  # the reductions' casts: tests/unit/parallel/test_fp32_communication.py
        assert ms.get_auto_parallel_context("force_fp32_communication") is True
    finally:
        ms.reset_auto_parallel_context()


def test_he_initializers_take_every_linear_nonlinearity_mindspore_names():
    from tessel.common.initializer import HeUniform

    ms.set_seed(2)
    draws = {
        name: HeUniform(nonlinearity=name).generate((64, 32), ms.float32) for name in ("conv1d", "conv_transpose3d")
    }
    bound = np.sqrt(3.0 / 32)  # gain 1: sqrt(3 / fan_in)
    for name, values in draws.items():
        assert np.abs(values).max() <= bound and np.abs(values).max() > 0.9 * bound, name


def test_metric_base_class_as_mindspore_defines_it():
    class Counter(train.Metric):  # MindSpore's pattern: the subclass sets its fields, then calls clear() itself
        def __init__(self, scale):
            super().__init__()
            self.scale = scale
            self.clear()

        def clear(self):
            self.total = 0.0

        @train.rearrange_inputs
        def update(self, *inputs):
            self.total += self.scale * float(np.sum(self._convert_data(inputs[0])))

        def eval(self):
            return self.total

    assert Counter(2)([1.0, 2.0]) == 6.0  # __call__: clear, update, eval
    picked = Counter(1).set_indexes([1])
    picked.update(ms.Tensor(np.ones(3, np.float32)), np.array([5.0]))
    assert picked.eval() == 5.0 and picked.indexes == [1]
    accuracy = train.Accuracy().set_indexes([1, 2])  # built-in metrics honour set_indexes too
    accuracy.update(None, np.array([[0.1, 0.9], [0.8, 0.2]]), np.array([1, 1]))
    assert accuracy.eval() == 0.5
    with pytest.raises(ConfigurationError, match=r"MAE\.update takes \(predicted value, true value\), got 1"):
        train.MAE().update(np.ones(2))
    with pytest.raises(ConfigurationError, match=r"MSE\.eval: no samples"):
        train.MSE().eval()
    with pytest.raises(ConfigurationError, match="set_indexes: indexes must be a list of int"):
        train.Loss().set_indexes((0,))
