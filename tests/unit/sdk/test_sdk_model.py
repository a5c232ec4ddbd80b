"""Model.train / eval / predict, the callback protocol, LossMonitor's exact output and ModelCheckpoint."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sdk_testkit import log_softmax, rand

import tessel as ms
import tessel.dataset as ds
from tessel import nn, train
from tessel.core.errors import ConfigurationError, NotSupportedYetError

DATA = rand(40, 6)
LABELS = (DATA[:, 0] > 0).astype(np.int32) + (DATA[:, 1] > 0).astype(np.int32)


def dataset(batch=4):
    return ds.NumpySlicesDataset({"data": DATA, "label": LABELS}, shuffle=False).batch(batch)


def make(optimizer=nn.Momentum, seed=7, **kw):
    ms.set_seed(seed)
    net = nn.SequentialCell(nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3))
    opt = (
        optimizer(net.trainable_params(), 0.1, 0.9)
        if optimizer is nn.Momentum
        else optimizer(net.trainable_params(), 0.1)
    )
    return net, ms.Model(net, nn.CrossEntropyLoss(), opt, **kw)


class Recorder(train.Callback):
    def __init__(self, stop_at=None):
        self.calls, self.losses, self.stop_at = [], [], stop_at

    def on_train_begin(self, rc):
        self.calls.append("begin")

    def on_train_epoch_begin(self, rc):
        self.calls.append(f"epoch_begin{rc.original_args().cur_epoch_num}")

    def on_train_step_end(self, rc):
        cb = rc.original_args()
        self.losses.append(float(cb.net_outputs.asnumpy()))
        self.calls.append(f"step{cb.cur_step_num}")
        assert isinstance(cb.train_network, nn.TrainOneStepCell) and cb.batch_num == 10 and cb.epoch_num == 2
        if cb.cur_step_num == self.stop_at:
            rc.request_stop()

    def on_train_epoch_end(self, rc):
        self.calls.append("epoch_end")

    def on_train_end(self, rc):
        self.calls.append("end")


def test_loss_monitor_prints_mindspore_format_on_global_step_multiples(capsys):
    _, model = make()
    recorder = Recorder()
    model.train(2, dataset(), callbacks=[recorder, train.LossMonitor(3)])
    lines = capsys.readouterr().out.splitlines()
    steps = [3, 6, 9, 12, 15, 18]
    want = [f"epoch: {(s - 1) // 10 + 1} step: {(s - 1) % 10 + 1}, loss is {recorder.losses[s - 1]}" for s in steps]
    assert lines == want
    assert lines[3].startswith("epoch: 2 step: 2, loss is ")
    assert recorder.calls[:3] == ["begin", "epoch_begin1", "step1"] and recorder.calls[-2:] == ["epoch_end", "end"]
    assert recorder.losses[-1] < recorder.losses[0]


def test_a_nan_loss_raises_naming_epoch_and_step():
    class NanLoss(nn.Cell):
        def construct(self, logits, labels):
            return logits.sum() * float("nan")

    net = nn.Dense(6, 3)
    model = ms.Model(net, NanLoss(), nn.SGD(net.trainable_params(), 0.1))
    # MindSpore 2.7.0's text (measured with a NaN in the second batch: "In epoch: 1 step: 2, loss is NAN or INF, ...")
    nan_or_inf = r"^In epoch: 1 step: 1, loss is NAN or INF, training process cannot continue, terminating training\.$"
    with pytest.raises(ValueError, match=nan_or_inf):
        model.train(1, dataset(), callbacks=[train.LossMonitor()])


def test_request_stop_ends_training_after_the_step():
    _, model = make()
    recorder = Recorder(stop_at=13)
    model.train(2, dataset(), callbacks=[recorder])
    assert recorder.calls[-3:] == ["step13", "epoch_end", "end"]


def test_model_train_equals_the_custom_loop():
    net_a, model = make(optimizer=nn.Adam)
    model.train(2, dataset())
    net_b, _ = make(optimizer=nn.Adam)
    loss_fn, optimizer = nn.CrossEntropyLoss(), nn.Adam(net_b.trainable_params(), 0.1)
    grad_fn = ms.value_and_grad(lambda d, y: loss_fn(net_b(d), y), None, optimizer.parameters)
    for _ in range(2):
        for data, label in dataset():
            _, grads = grad_fn(data, label)
            optimizer(grads)
    for a, b in zip(net_a.trainable_params(), net_b.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=a.name)


def test_eval_and_predict_match_numpy():
    net, model = make(metrics={"accuracy", "loss"})
    model.train(1, dataset())
    w0, b0, w1, b1 = (p.asnumpy().astype(np.float64) for p in net.trainable_params())
    logits = np.maximum(DATA @ w0.T + b0, 0) @ w1.T + b1
    result = model.eval(dataset(batch=16))  # batches of 16, 16 and 8
    assert result["accuracy"] == pytest.approx((logits.argmax(1) == LABELS).mean())
    per_batch = [-log_softmax(logits[i : i + 16])[np.arange(len(LABELS[i : i + 16])), LABELS[i : i + 16]].mean()
                 for i in (0, 16, 32)]  # fmt: skip
    assert result["loss"] == pytest.approx(np.mean(per_batch), rel=1e-5)
    np.testing.assert_allclose(model.predict(ms.Tensor(DATA)).asnumpy(), logits, rtol=1e-4, atol=1e-5)


def test_an_eval_network_without_eval_indexes_gives_every_metric_every_output():
    # MindSpore's Model._update_metrics: metric.update(*outputs), a single Tensor output as a 1-tuple
    net, _ = make()
    per_sample = nn.WithLossCell(net, nn.CrossEntropyLoss(reduction="none"))
    model = ms.Model(net, nn.CrossEntropyLoss(), metrics={"loss"}, eval_network=per_sample)
    w0, b0, w1, b1 = (p.asnumpy().astype(np.float64) for p in net.trainable_params())
    logits = np.maximum(DATA @ w0.T + b0, 0) @ w1.T + b1
    losses = -log_softmax(logits)[np.arange(len(LABELS)), LABELS]
    assert model.eval(dataset(batch=20))["loss"] == pytest.approx(np.mean([losses[:20].mean(), losses[20:].mean()]))

    class LogitsAndLabel(nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = net

        def construct(self, x, y):
            return self.net(x), y

    model = ms.Model(net, metrics={"accuracy"}, eval_network=LogitsAndLabel())
    assert model.eval(dataset())["accuracy"] == pytest.approx((logits.argmax(1) == LABELS).mean())
    model = ms.Model(net, metrics={"accuracy"}, eval_network=LogitsAndLabel(), eval_indexes=[0, 0, 1])
    with pytest.raises(ConfigurationError, match=r"returned 2 output\(s\), but eval_indexes \[0, 0, 1\]"):
        model.eval(dataset())


def test_model_checkpoint_saves_every_n_steps_and_keeps_the_newest(tmp_path):
    net, model = make()
    config = train.CheckpointConfig(save_checkpoint_steps=4, keep_checkpoint_max=2)
    checkpoint = train.ModelCheckpoint("net", str(tmp_path), config)
    model.train(2, dataset(), callbacks=[checkpoint])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net-2_10.ckpt", "net-2_6.ckpt"]
    saved = ms.load_checkpoint(str(tmp_path / "net-2_10.ckpt"))
    for p in net.trainable_params():
        np.testing.assert_array_equal(saved[p.name].asnumpy(), p.asnumpy())
    assert "moments.0.weight" in saved  # the optimizer's state is in the train network's checkpoint
    assert checkpoint.latest_ckpt_file_name.endswith("net-2_10.ckpt")
    # MindSpore's rules: a new ModelCheckpoint in a directory holding "net-..." files saves as "net_1-..."; steps,
    # when set, replace seconds; a resumed run (initial_epoch) counts its steps from 0, as MindSpore's cb_params
    again = train.ModelCheckpoint("net", str(tmp_path), train.CheckpointConfig(save_checkpoint_steps=4,
                                                                              save_checkpoint_seconds=1))  # fmt: skip
    assert again.prefix == "net_1" and again.config.save_checkpoint_seconds is None
    model.train(3, dataset(), callbacks=[again], initial_epoch=2)
    saved = sorted(p.name for p in tmp_path.glob("net_1-*"))  # steps 4, 8 and the end, 10, of this run
    assert saved == ["net_1-3_10.ckpt", "net_1-3_4.ckpt", "net_1-3_8.ckpt"]
    assert train.ModelCheckpoint("net", str(tmp_path)).prefix == "net_2"
    with pytest.raises(ConfigurationError, match="can't all be 0"):
        train.CheckpointConfig(save_checkpoint_steps=0, keep_checkpoint_max=0)
    assert train.CheckpointConfig(save_checkpoint_steps=0).keep_checkpoint_max == 5
    assert train.CheckpointConfig(keep_checkpoint_max=0).keep_checkpoint_max == 1


def test_checkpoint_config_hands_integrated_save_on_and_refuses_async_save():
    assert train.CheckpointConfig(integrated_save=False).integrated_save is False
    assert train.CheckpointConfig().integrated_save is True
    with pytest.raises(NotSupportedYetError, match=r"async_save=True.*async_save=False"):
        train.CheckpointConfig(async_save=True)


def test_sink_size_makes_epochs_of_that_many_steps():
    _, model = make()
    recorder = []
    cb = train.LambdaCallback(on_train_step_end=lambda rc: recorder.append(rc.original_args().cur_step_num))
    model.train(3, dataset(), callbacks=[cb], dataset_sink_mode=True, sink_size=7)
    assert recorder == list(range(1, 22))


def test_misuse_is_a_clear_error():
    net = nn.Dense(6, 3)
    with pytest.raises(ConfigurationError, match=r"Model\.eval needs metrics"):
        ms.Model(net, nn.CrossEntropyLoss()).eval(dataset())
    with pytest.raises(ConfigurationError, match="epoch must be an int >= 1"):
        make()[1].train(0, dataset())
    with pytest.raises(ConfigurationError, match=r"needs a tessel\.dataset Dataset"):
        make()[1].train(1, [(DATA, LABELS)])
    with pytest.raises(ConfigurationError, match="unknown metric 'f1'"):
        ms.Model(net, metrics={"f1"})


def test_time_monitor_and_history_report_every_epoch(capsys):
    _, model = make()
    history = train.History()
    model.train(2, dataset(), callbacks=[train.TimeMonitor(), history])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(
        re.fullmatch(r"Train epoch time: \d+\.\d{3} ms, per step time: \d+\.\d{3} ms", line) for line in lines
    )
    assert history.epoch == {"epoch": [1, 2]} and len(history.history["net_output"]) == 2


def test_callbacks_follow_mindspore_hooks_numbering_and_context_managers(capsys):
    # MindSpore's Callback calls the 1.x hooks (begin, epoch_begin, step_end, ...) from the train and eval hooks
    calls = []

    class OldStyle(train.Callback):
        def __enter__(self):
            calls.append("enter")
            return self

        def __exit__(self, exc_type, exc_value, traceback):
            calls.append("exit")

        def step_end(self, run_context):
            cb = run_context.original_args()
            calls.append((cb.mode, cb.get("cur_epoch_num"), cb.cur_step_num))

    class QuietLoss(train.LossMonitor):
        def step_end(self, run_context):
            calls.append("quiet")

    _, model = make(metrics={"accuracy"})
    lam = train.LambdaCallback(None, lambda rc: calls.append(("epoch", rc.original_args().epoch_num)))
    model.train(3, dataset(batch=20), callbacks=[OldStyle(), QuietLoss(), lam], initial_epoch=1)
    # as MindSpore's cb_params: epoch_num is the epochs this call runs, steps count from 0, epochs go on from 1
    assert calls == ["enter", ("train", 2, 1), "quiet", ("train", 2, 2), "quiet", ("epoch", 2),
                     ("train", 3, 3), "quiet", ("train", 3, 4), "quiet", ("epoch", 2), "exit"]  # fmt: skip
    assert capsys.readouterr().out == ""  # QuietLoss replaced LossMonitor's printing
    calls.clear()
    model.eval(dataset(batch=20), callbacks=[OldStyle()])
    assert calls == ["enter", ("eval", None, 1), ("eval", None, 2), "exit"]
    with pytest.raises(ConfigurationError, match="unknown hook 'on_step_end'"):
        train.LambdaCallback(on_step_end=print)


class TupleStep(nn.TrainOneStepCell):
    """A train cell returning (loss, 2 * loss), as a loss-scale cell returns (loss, overflow, scale)."""

    def construct(self, data, label):
        loss = super().construct(data, label)
        return loss, loss * 2


def test_loss_monitor_and_history_read_a_tuple_output_as_mindspore(capsys):
    # MindSpore 2.7.0, same kind of cell (Dense(4, 3), Momentum): "epoch: 1 step: 2, loss is 1.1870627" (the Tensor's
    # str of the first output, not a Python float's 17 digits) and History "{'net_output': [0.8393387]}" (np.float32)
    net = nn.Dense(6, 3)
    step = TupleStep(nn.WithLossCell(net, nn.CrossEntropyLoss()), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    history, outputs = train.History(), []
    keep = train.LambdaCallback(on_train_step_end=lambda rc: outputs.append(rc.original_args().net_outputs[0]))
    ms.Model(step).train(1, dataset(batch=20), callbacks=[keep, train.LossMonitor(), history])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"epoch: 1 step: {i + 1}, loss is {loss}" for i, loss in enumerate(outputs)]
    assert re.fullmatch(r"epoch: 1 step: 2, loss is \d\.\d{1,7}", lines[1])
    (last,) = history.history["net_output"]
    assert type(last) is np.float32 and last == outputs[-1].asnumpy()


def test_model_checkpoint_reused_across_train_calls_counts_from_its_save_at_the_end(tmp_path):
    # MindSpore 2.7.0 (10 steps an epoch, save_checkpoint_steps=3): train(1) writes u-1_3, _6, _9, _10; train(2) with
    # the same callback then u-2_3, _6, _9, _10 (the save at the end, step 10, is the last save step 13 counts from)
    _, model = make()
    checkpoint = train.ModelCheckpoint("u", str(tmp_path), train.CheckpointConfig(3, keep_checkpoint_max=10))
    model.train(1, dataset(), callbacks=[checkpoint])
    model.train(2, dataset(), callbacks=[checkpoint])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"u-1_{s}.ckpt" for s in (3, 6, 9, 10)] + [f"u-2_{s}.ckpt" for s in (3, 6, 9, 10)]
    )


def test_model_checkpoint_prefix_rules_follow_mindspore(tmp_path):
    # MindSpore 2.7.0 on this directory: p -> p_1 (.safetensors counts), k -> k ("_breakpoint.ckpt" does not),
    # q -> q_4, r -> r_1, s -> s, t -> t (.txt does not), v -> v_8, also with format="safetensors"
    for name in ["p-1_1.safetensors", "k-1_1_breakpoint.ckpt", "q_3-1_1.safetensors", "r-1_1.ckpt",
                 "r_2-1_1_breakpoint.ckpt", "s_x-1.ckpt", "t-1_1.txt", "v_7-1_1.ckpt"]:  # fmt: skip
        (tmp_path / name).touch()
    prefixes = {p: train.ModelCheckpoint(p, str(tmp_path)).prefix for p in "pkqrstv"}
    assert prefixes == {"p": "p_1", "k": "k", "q": "q_4", "r": "r_1", "s": "s", "t": "t", "v": "v_8"}
    config = train.CheckpointConfig(format="safetensors")
    assert train.ModelCheckpoint("v", str(tmp_path), config).prefix == "v_8"


def test_keep_checkpoint_max_counts_the_directory_files_of_the_prefix(tmp_path):
    # MindSpore 2.7.0, two callbacks of prefix z (every step, keep 3; every 2 steps, keep 2), 4 steps, with z-0_0.ckpt
    # and z-9_9_breakpoint.ckpt put there after they were made: z-1_3.ckpt, z-1_4.ckpt, z-9_9_breakpoint.ckpt remain
    _, model = make()
    every_step = train.ModelCheckpoint("z", str(tmp_path), train.CheckpointConfig(1, keep_checkpoint_max=3))
    every_two = train.ModelCheckpoint("z", str(tmp_path), train.CheckpointConfig(2, keep_checkpoint_max=2))
    for name in ["z-9_9_breakpoint.ckpt", "z-0_0.ckpt"]:
        (tmp_path / name).touch()
    model.train(1, dataset(batch=10), callbacks=[every_step, every_two])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["z-1_3.ckpt", "z-1_4.ckpt", "z-9_9_breakpoint.ckpt"]


def test_checkpoint_config_of_no_steps_and_no_seconds_saves_nothing(tmp_path):
    # MindSpore 2.7.0: CheckpointConfig(save_checkpoint_steps=0) over a whole train call writes no file
    _, model = make()
    checkpoint = train.ModelCheckpoint("e", str(tmp_path), train.CheckpointConfig(save_checkpoint_steps=0))
    model.train(1, dataset(), callbacks=[checkpoint])
    assert list(tmp_path.iterdir()) == []


def test_a_model_without_optimizer_runs_its_network_each_step_as_mindspore():
    # MindSpore 2.7.0: Model(Wrap(TrainOneStepCell(...))) trains (LossMonitor "loss is 1.1870627", net_outputs the
    # cell's (loss, 2 * loss)); Model(net, loss_fn) runs WithLossCell each step and leaves the parameters as they were
    net = nn.Dense(6, 3)

    class Wrap(nn.Cell):
        def __init__(self, step):
            super().__init__()
            self.step = step

        def construct(self, data, label):
            loss = self.step(data, label)
            return loss, loss * 2

    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.CrossEntropyLoss()), optimizer)
    model, outputs = ms.Model(Wrap(step)), []
    keep = train.LambdaCallback(on_train_step_end=lambda rc: outputs.append(rc.original_args().net_outputs))
    model.train(2, dataset(batch=10), callbacks=[keep])
    assert model.train_network is model.predict_network and len(outputs) == 8
    assert all(2 * loss.asnumpy() == double.asnumpy() for loss, double in outputs)
    assert outputs[-1][0].asnumpy() < outputs[0][0].asnumpy()  # it trained
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    model = ms.Model(net, nn.CrossEntropyLoss())
    model.train(1, dataset(batch=10), callbacks=[keep])
    assert isinstance(model.train_network, nn.WithLossCell) and len(outputs) == 12
    for p, old in zip(net.trainable_params(), before):
        np.testing.assert_array_equal(p.asnumpy(), old)


def test_metrics_without_loss_fn_or_eval_network_is_mindspores_value_error():
    # MindSpore 2.7.0: Model(net, metrics={"mae"}) raises this ValueError as it is made (also for a WithLossCell)
    with pytest.raises(ValueError, match=r"^If `metrics` is set, `eval_network` must not be None\. Do not set"):
        ms.Model(nn.Dense(6, 3), metrics={"mae"})
    with pytest.raises(ValueError, match=r"automatically build an evaluation network with `network` and `loss_fn`\.$"):
        ms.Model(nn.WithLossCell(nn.Dense(6, 3), nn.MSELoss()), metrics={"mae"})


def test_time_monitor_data_time_adds_the_fetch_time_per_step(capsys):
    # MindSpore 2.7.0: "Train epoch time: 67.329 ms, per step time: 16.832 ms (data time: 0.532 ms)", an eval's
    # "(data time: 0.000 ms)", and TimeMonitor(data_time=1) is TypeError "The 'data_time' must be a bool, but got int."
    import time

    def slow_rows():
        for row, label in zip(DATA[:8], LABELS[:8]):
            time.sleep(0.01)
            yield row, label

    _, model = make(metrics={"accuracy"})
    model.train(2, ds.GeneratorDataset(slow_rows, ["data", "label"], shuffle=False).batch(4),
                callbacks=[train.TimeMonitor(data_time=True)])  # fmt: skip
    line = r"Train epoch time: (\d+\.\d{3}) ms, per step time: (\d+\.\d{3}) ms \(data time: (\d+\.\d{3}) ms\)"
    found = [re.fullmatch(line, text) for text in capsys.readouterr().out.splitlines()]
    assert len(found) == 2 and all(found)
    for match in found:  # each step waits for 4 rows of 10 ms
        assert 40 <= float(match[3]) <= float(match[2])
    model.eval(dataset(), callbacks=[train.TimeMonitor(data_time=True)])
    assert capsys.readouterr().out.endswith(" ms (data time: 0.000 ms)\n")
    with pytest.raises(TypeError, match=r"^The 'data_time' must be a bool, but got int\.$"):
        train.TimeMonitor(data_time=1)
    with pytest.raises(NotSupportedYetError, match=r"TimeMonitor\(data_time=True\) with dataset_sink_mode=True"):
        model.train(1, dataset(), callbacks=[train.TimeMonitor(data_time=True)], dataset_sink_mode=True)


def test_cb_params_hold_the_batch_the_callbacks_and_initial_step_as_mindspore():
    # MindSpore 2.7.0: train_dataset_element is None at on_train_begin, then from each on_train_step_begin the step's
    # batch as a list of Tensors (the last one at on_train_end); initial_step is None; list_callback holds the
    # callbacks. In eval: eval_dataset_element likewise, list_callback, network; metric values are np.float64
    seen = []

    class Look(train.Callback):
        def on_train_begin(self, rc):
            cb = rc.original_args()
            seen.append(("begin", cb.train_dataset_element, cb.initial_step, self in cb.list_callback))

        def on_train_step_begin(self, rc):
            element = rc.original_args().train_dataset_element
            seen.append(("step", [type(t) for t in element], [t.asnumpy() for t in element]))

        def on_train_end(self, rc):
            seen.append(("end", rc.original_args().train_dataset_element[1].asnumpy()))

        def on_eval_begin(self, rc):
            cb = rc.original_args()
            seen.append(("eval", cb.get("eval_dataset_element"), cb.list_callback == [self], cb.network is net))

        def on_eval_step_end(self, rc):
            seen.append(("eval step", rc.original_args().eval_dataset_element[0].asnumpy()))

    net, model = make(metrics={"accuracy", "loss"})
    model.train(1, dataset(batch=20), callbacks=[Look()])
    assert seen[0] == ("begin", None, None, True) and len(seen) == 4
    for (_, types, arrays), start in zip(seen[1:3], (0, 20)):
        assert types == [ms.Tensor, ms.Tensor]
        np.testing.assert_array_equal(arrays[0], DATA[start : start + 20])
        np.testing.assert_array_equal(arrays[1], LABELS[start : start + 20])
    np.testing.assert_array_equal(seen[3][1], LABELS[20:])
    seen.clear()
    result = model.eval(dataset(batch=40), callbacks=[Look()])
    assert seen[0] == ("eval", None, True, True)
    np.testing.assert_array_equal(seen[1][1], DATA)
    assert {name: type(value) for name, value in result.items()} == {"accuracy": np.float64, "loss": np.float64}
