"""EarlyStopping and ReduceLROnPlateau against MindSpore 2.7.0.

Each scripted case drives the callback with the same cb_params MindSpore's was driven with: per epoch the train
network's weight set to the epoch number (so a restored weight names its epoch), the monitored value, then
on_train_epoch_end. A row is (epoch, learning rate after the epoch as float32, stop requested, weight after the
epoch)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.train import EarlyStopping, LambdaCallback, ReduceLROnPlateau, RunContext
from tessel.train.callback import CallbackParam


def net_and_optimizer(lr=0.1):
    net = nn.Dense(2, 1, weight_init="zeros", has_bias=False)
    return net, nn.Momentum(net.trainable_params(), lr, 0.9)


def drive(callback, monitor, values, lr=0.1):
    net, optimizer = net_and_optimizer(lr)
    cb = CallbackParam(train_network=net, optimizer=optimizer, cur_epoch_num=0)
    run_context = RunContext(cb)
    callback.on_train_begin(run_context)
    rows = []
    for epoch, value in enumerate(values, 1):
        cb.cur_epoch_num = epoch
        net.weight.set_data(ms.Tensor(np.full((1, 2), epoch, np.float32)))
        if monitor == "loss":
            cb.net_outputs = ms.Tensor(np.float32(value))
        else:
            cb.eval_results = {monitor: value}
        callback.on_train_epoch_end(run_context)
        stop = run_context.get_stop_requested()
        rows.append((epoch, float(np.float32(optimizer.learning_rate)), stop, float(net.weight.asnumpy()[0, 0])))
        if stop:
            break
    callback.on_train_end(run_context)
    return rows


LR = 0.10000000149011612  # float32(0.1)

# MindSpore 2.7.0 gives these rows for the same callbacks and values
EARLY_STOPPING = [
    (
        dict(patience=2, restore_best_weights=True),
        "eval_loss",
        [1.0, 0.8, 0.85, 0.9, 0.7, 0.6],
        [(1, LR, False, 1.0), (2, LR, False, 2.0), (3, LR, False, 3.0), (4, LR, True, 2.0)],
    ),
    (
        dict(monitor="acc", patience=1, min_delta=0.05),
        "acc",
        [0.5, 0.6, 0.62, 0.7, 0.71, 0.72],
        [(1, LR, False, 1.0), (2, LR, False, 2.0), (3, LR, True, 3.0)],
    ),
    (dict(), "eval_loss", [1.0, 0.5, 0.2], [(1, LR, True, 1.0)]),  # patience 0 stops after the first epoch
    (
        dict(monitor="acc", mode="min", patience=1, restore_best_weights=True),
        "acc",
        [0.5, 0.6, 0.4, 0.45, 0.46],
        [(1, LR, False, 1.0), (2, LR, True, 1.0)],
    ),
    (
        dict(monitor="loss", patience=2, restore_best_weights=True),
        "loss",
        [2.0, 1.0, 1.5, 0.9, 1.2, 1.3],
        [*[(epoch, LR, False, float(epoch)) for epoch in range(1, 6)], (6, LR, True, 4.0)],
    ),
    (  # a monitor no epoch reports: a warning each epoch, never a stop
        dict(monitor="f1", patience=1),
        "acc",
        [0.5, 0.5, 0.5],
        [(1, LR, False, 1.0), (2, LR, False, 2.0), (3, LR, False, 3.0)],
    ),
]

REDUCE_LR = [
    (
        dict(patience=1, factor=0.5, cooldown=1, min_lr=0.02),
        "eval_loss",
        [1.0, 1.0, 1.0, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6],
        [0.10000000149011612, 0.05000000074505806, 0.02500000037252903, 0.02500000037252903]
        + [0.019999999552965164] * 6,
    ),
    (
        dict(monitor="acc", patience=2, factor=0.2, min_delta=0.05),
        "acc",
        [0.5, 0.52, 0.54, 0.6, 0.7, 0.7, 0.7, 0.7],
        [LR, LR] + [0.020000001415610313] * 4 + [0.004000000189989805] * 2,
    ),
    (dict(monitor="loss", patience=0, factor=0.3), "loss", [1.0, 0.9, 0.95], [LR, LR, 0.030000001192092896]),
    (
        dict(monitor="acc", mode="min", patience=1, factor=0.5, min_lr=0.03),
        "acc",
        [0.5, 0.6, 0.7, 0.8, 0.9],
        [LR, 0.05000000074505806] + [0.029999999329447746] * 3,
    ),
]


@pytest.mark.parametrize(("kwargs", "monitor", "values", "expected"), EARLY_STOPPING)
def test_early_stopping_stops_and_restores_at_mindspores_epochs(kwargs, monitor, values, expected):
    assert drive(EarlyStopping(**kwargs), monitor, values) == expected


@pytest.mark.parametrize(("kwargs", "monitor", "values", "expected"), REDUCE_LR)
def test_reduce_lr_on_plateau_lowers_the_rate_as_mindspore(kwargs, monitor, values, expected):
    rows = drive(ReduceLROnPlateau(**kwargs), monitor, values)
    assert [row[1] for row in rows] == expected
    assert not any(row[2] for row in rows)


def test_reduce_lr_on_plateau_with_an_int_min_lr():
    # MindSpore 2.7.0 gives 3.0, 1.5, 1.0
    rows = drive(ReduceLROnPlateau(patience=1, factor=0.5, min_lr=1), "eval_loss", [1.0, 1.0, 1.0], lr=3.0)
    assert [row[1] for row in rows] == [3.0, 1.5, 1.0]


def test_early_stopping_baseline_is_the_one_given():
    # MindSpore 2.7.0 stores min_delta as the baseline (it never stops here); tessel uses the documented baseline:
    # no epoch beats 0.9 until the fifth, so patience 2 stops at the second
    rows = drive(EarlyStopping(monitor="acc", patience=2, baseline=0.9), "acc", [0.5, 0.6, 0.7, 0.8, 0.95, 0.96])
    assert [row[2] for row in rows] == [False, True]


def run_model(callback, epochs=5, lr=0.1):
    """A loss of exactly 1.0 every step with no gradient (zero inputs, zero weights, labels 1), so every epoch after
    the first is a plateau in MindSpore and tessel alike."""
    net, optimizer = net_and_optimizer(lr)
    data = ds.NumpySlicesDataset(
        {"x": np.zeros((8, 2), np.float32), "y": np.ones((8, 1), np.float32)}, shuffle=False
    ).batch(4)
    rates = []

    def record(run_context):
        rates.append((run_context.original_args().cur_epoch_num, float(np.float32(optimizer.learning_rate))))

    ms.Model(net, nn.MSELoss(), optimizer).train(
        epochs, data, callbacks=[callback, LambdaCallback(on_train_epoch_end=record)]
    )
    return rates


def test_model_train_stops_and_lowers_the_rate_at_mindspores_epochs():
    # MindSpore 2.7.0 gives [(1, 0.1), (2, 0.1), (3, 0.1)] and 0.1, 0.05, 0.025, 0.02, 0.02
    assert run_model(EarlyStopping(monitor="loss", patience=2)) == [(1, LR), (2, LR), (3, LR)]
    rates = run_model(ReduceLROnPlateau(monitor="loss", patience=1, factor=0.5, min_lr=0.02))
    assert rates == list(
        zip(range(1, 6), [LR, 0.05000000074505806, 0.02500000037252903, 0.019999999552965164, 0.019999999552965164])
    )


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [  # MindSpore 2.7.0's errors
        (lambda: EarlyStopping(mode="up"), ValueError, "mode should be 'auto', 'min' or 'max', but got up."),
        (lambda: EarlyStopping(monitor=1), TypeError, "'monitor' should be 'str'"),
        (lambda: EarlyStopping(patience=-1), ValueError, "must be int and must >= 0"),
        (lambda: EarlyStopping(patience=1.0), TypeError, "must be int"),
        (lambda: EarlyStopping(patience=True), TypeError, "must be int"),
        (lambda: EarlyStopping(min_delta="a"), TypeError, "'min_delta' should be one of"),
        (lambda: EarlyStopping(min_delta=True), TypeError, "'min_delta' should be one of"),
        (lambda: EarlyStopping(verbose=1), TypeError, "must be a bool"),
        (lambda: EarlyStopping(restore_best_weights=1), TypeError, "must be a bool"),
        (lambda: ReduceLROnPlateau(factor=1.0), ValueError, "range of (0.0, 1.0)"),
        (lambda: ReduceLROnPlateau(factor=0.0), ValueError, "range of (0.0, 1.0)"),
        (lambda: ReduceLROnPlateau(factor=1), TypeError, "must be 'float'"),
        (lambda: ReduceLROnPlateau(factor=True), TypeError, "must be 'float'"),
        (lambda: ReduceLROnPlateau(cooldown=-1), ValueError, "must >= 0"),
        (lambda: ReduceLROnPlateau(min_lr="a"), TypeError, "'min_lr' should be one of"),
        (lambda: ReduceLROnPlateau(mode="x"), ValueError, "but got x."),
        (lambda: ReduceLROnPlateau(verbose=0), TypeError, "must be a bool"),
    ],
)
def test_constructor_checks_are_mindspores(make, error, message):
    with pytest.raises(error, match=re.escape(message)):
        make()


def test_min_delta_is_taken_as_its_absolute_value():
    # MindSpore 2.7.0 gives 0.5 for both
    assert EarlyStopping(min_delta=-0.5).min_delta == 0.5
    assert ReduceLROnPlateau(min_delta=-0.5).min_delta == 0.5


def test_reduce_lr_on_plateau_refuses_a_per_step_or_group_rate():
    # MindSpore 2.7.0: ValueError "ReduceLROnPlateau does not support dynamic learning rate and group learning rate"
    net = nn.Dense(2, 1)
    for optimizer in (
        nn.Momentum(net.trainable_params(), [0.1, 0.05], 0.9),
        nn.Momentum([{"params": [net.weight], "lr": 0.2}, {"params": [net.bias]}], 0.1, 0.9),
    ):
        cb = CallbackParam(train_network=net, optimizer=optimizer, cur_epoch_num=1, eval_results={"eval_loss": 1.0})
        with pytest.raises(ValueError, match="does not support dynamic learning rate and group learning rate"):
            ReduceLROnPlateau().on_train_epoch_end(RunContext(cb))


def test_a_vector_monitor_is_mindspores_value_error():
    net, optimizer = net_and_optimizer()
    cb = CallbackParam(train_network=net, optimizer=optimizer, cur_epoch_num=1, eval_results={"eval_loss": [1.0, 2.0]})
    with pytest.raises(ValueError, match=r"EarlyStopping only supports scalar monitor now\."):
        EarlyStopping().on_train_epoch_end(RunContext(cb))


def test_both_are_exported_where_mindspore_has_them():
    assert ms.EarlyStopping is ms.train.EarlyStopping
    assert ms.ReduceLROnPlateau is ms.train.ReduceLROnPlateau


def test_verbose_prints_mindspores_lines(capsys):
    drive(EarlyStopping(patience=2, restore_best_weights=True, verbose=True), "eval_loss", [1.0, 0.8, 0.85, 0.9])
    drive(ReduceLROnPlateau(patience=1, factor=0.5, min_lr=0.03, verbose=True), "eval_loss", [1.0, 1.0, 1.0, 1.0])
    # MindSpore 2.7.0 gives these four lines
    assert capsys.readouterr().out.splitlines() == [
        "Restoring model weights from the end of the best epoch.",
        "Epoch 00004: early stopping",
        "Epoch 00002: ReduceLROnPlateau reducing learning rate to 0.05.",
        "Epoch 00003: ReduceLROnPlateau reducing learning rate to 0.03.",
    ]
