"""Model.train's sink mode on the embedded daemon: a serializable pipeline runs a whole epoch (or sink_size steps)
per Execute with the daemon reading the data itself, returns each step's loss for the callbacks, and trains
exactly as feed mode does; a pipeline with Python callables falls back to feed mode (one Execute per step)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.common.engine import engine
from tessel.train import LossMonitor

ROWS, BATCH = 24, 4


def _data():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((ROWS, 6)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def _train(sink: bool, dataset, epochs: int = 2, sink_size: int = -1):
    """(per-step losses, final weight, Executes run) of a fresh Dense net trained on `dataset`."""
    ms.set_seed(4)
    net = nn.Dense(6, 2)
    model = ms.Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    losses = []

    class Record(LossMonitor):
        def on_train_step_end(self, run_context):
            losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    daemon = engine().daemon
    calls, execute, execute_steps = [], daemon.execute, daemon.execute_steps

    def counting(*args, **kwargs):
        calls.append(kwargs.get("repeat", 1))
        return execute(*args, **kwargs)

    def counting_steps(session, program, repeat, **kwargs):
        calls.append(repeat)
        return execute_steps(session, program, repeat, **kwargs)

    daemon.execute, daemon.execute_steps = counting, counting_steps
    try:
        model.train(epochs, dataset, callbacks=[Record(1)], dataset_sink_mode=sink, sink_size=sink_size)
    finally:
        del daemon.execute, daemon.execute_steps
    return np.array(losses), net.weight.asnumpy(), calls


def test_sink_mode_runs_an_epoch_per_execute_and_trains_like_feed_mode():
    x, y = _data()
    sunk, weight, calls = _train(True, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH))
    fed, want, fed_calls = _train(False, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH))
    steps = ROWS // BATCH
    assert len(sunk) == 2 * steps and sorted(calls)[-2:] == [steps, steps]
    assert max(fed_calls) == 1 and len(fed_calls) >= 2 * steps
    np.testing.assert_allclose(sunk, fed, rtol=1e-6)
    np.testing.assert_allclose(weight, want, rtol=1e-6, atol=1e-7)


def test_sink_mode_reports_each_steps_loss_while_the_epoch_still_runs():
    """The daemon holds the epoch after its first step until the client's step callback has seen that step's loss:
    the callback runs while the Execute is still under way, not once the epoch has ended."""
    x, y = _data()
    core = engine().daemon.core
    execute, gate, running, seen = core.execute, threading.Event(), threading.Event(), []

    def gated(*args, **options):
        *head, progress = args

        def held(repetition, collected):
            progress(repetition, collected)
            if repetition == 0:
                gate.wait(30)

        running.set()
        try:
            return execute(*head, held, **options)
        finally:
            running.clear()

    class Watch(LossMonitor):
        def on_train_step_end(self, run_context):
            seen.append(running.is_set())
            gate.set()

    core.execute = gated
    try:
        ms.set_seed(4)
        net = nn.Dense(6, 2)
        model = ms.Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
        dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
        model.train(1, dataset, callbacks=[Watch(1)], dataset_sink_mode=True)
    finally:
        del core.execute
    assert len(seen) == ROWS // BATCH and seen[0], seen


def test_sink_size_sets_the_steps_per_execute_and_every_step_reaches_the_callbacks():
    x, y = _data()
    losses, _, calls = _train(True, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH), 3, 4)
    assert len(losses) == 12 and sorted(calls)[-3:] == [4, 4, 4]


def test_a_pipeline_with_python_callables_falls_back_to_feed_mode():
    x, y = _data()
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).map(lambda v: v * 1.0, "x").batch(BATCH)
    assert not dataset.is_serializable()
    losses, _, calls = _train(True, dataset, 1)
    assert len(losses) == ROWS // BATCH and max(calls) == 1


@pytest.mark.parametrize("mean", [True, False])
def test_gradients_mean_on_one_device_is_accepted_in_data_parallel(mean):
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=mean)
    x, y = _data()
    losses, _, _ = _train(True, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH), 1)
    assert np.all(np.isfinite(losses))


def test_train_calls_on_one_dataset_open_it_once_and_go_on_like_one_call():
    """Two train(1) calls in sink mode equal one train(2): the daemon's reader is kept, not reopened."""
    x, y = _data()
    ms.set_seed(4)
    net = nn.Dense(6, 2)
    model = ms.Model(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1))
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True).batch(BATCH)
    daemon = engine().daemon
    opened, open_dataset = [], daemon.open_dataset
    daemon.open_dataset = lambda *a, **k: opened.append(a[1]) or open_dataset(*a, **k)
    try:
        model.train(1, dataset, dataset_sink_mode=True)
        model.train(1, dataset, dataset_sink_mode=True)
    finally:
        del daemon.open_dataset
    assert len(opened) == 1
    ms.set_seed(4)
    whole = nn.Dense(6, 2)
    ms.Model(whole, nn.CrossEntropyLoss(), nn.SGD(whole.trainable_params(), 0.1)).train(
        2, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True).batch(BATCH), dataset_sink_mode=True
    )
    np.testing.assert_allclose(net.weight.asnumpy(), whole.weight.asnumpy(), rtol=1e-6, atol=1e-7)
