"""Model.train's progress bar: shown on a terminal (epoch, step, loss, samples/s, time left), never elsewhere, and
never mixed into other output."""

from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
import tessel.dataset as ds
from tessel import nn, train
from tessel.train.progress import ProgressBar

DATA = rand(40, 6)
LABELS = (DATA[:, 0] > 0).astype(np.int32)
BAR = re.compile(r"epoch (\d+)/(\d+) \[([#.]{20})\] +(\d+)/(\d+)  loss (\S+)  ([\d,]+) samples/s  (\d+:\d\d) left")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _train(epochs: int = 2, callbacks=None) -> None:
    ms.set_seed(3)
    net = nn.Dense(6, 2)
    model = ms.Model(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1))
    dataset = ds.NumpySlicesDataset({"data": DATA, "label": LABELS}, shuffle=False).batch(8)  # 5 steps
    model.train(epochs, dataset, callbacks=callbacks)


def _screen(raw: str) -> list[str]:
    """What a terminal shows: each line as its last redraw left it."""
    return [re.split(r"\r\x1b\[2K", line)[-1] for line in raw.split("\n")]


def test_a_terminal_shows_epoch_step_loss_rate_and_time_left(monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    _train(callbacks=[train.LossMonitor(5)])
    assert sys.stdout is terminal  # put back after training
    screen = _screen(terminal.getvalue())
    bars = [BAR.fullmatch(line) for line in screen]
    # LossMonitor's lines stay whole, each finished epoch keeps its bar line, and nothing is left half-drawn.
    assert [line for line, bar in zip(screen, bars) if not bar] == [
        screen[0],
        screen[2],
        "",
    ], screen
    assert re.fullmatch(r"epoch: 1 step: 5, loss is \S+", screen[0]) and screen[2].startswith("epoch: 2 step: 5")
    for line, epoch in ((screen[1], "1"), (screen[3], "2")):
        found = BAR.fullmatch(line)
        assert found.group(1, 2, 3, 4, 5) == (epoch, "2", "#" * 20, "5", "5"), line
        assert np.isfinite(float(found.group(6))) and int(found.group(7).replace(",", "")) > 0
    assert BAR.fullmatch(screen[3]).group(8) == "0:00"  # nothing left after the last step


def test_no_bar_into_a_pipe_or_a_file(monkeypatch):
    captured = io.StringIO()  # isatty() is False, as for `tessel run`'s pipes and redirected output
    monkeypatch.setattr(sys, "stdout", captured)
    _train(callbacks=[train.LossMonitor(5)])
    assert "samples/s" not in captured.getvalue() and "\r" not in captured.getvalue()
    assert captured.getvalue().count("\n") == 2  # LossMonitor's two lines and nothing else


def test_only_rank_zero_draws(monkeypatch):
    monkeypatch.setattr(sys, "stdout", FakeTerminal())
    monkeypatch.setattr("tessel.train.model._rank", lambda: 1)
    _train(epochs=1)
    assert sys.stdout.getvalue() == ""


def test_a_bar_passed_by_the_user_draws_on_its_stream(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    _train(epochs=1, callbacks=[ProgressBar(stream=stream, min_interval_s=0.0)])
    screen = _screen(stream.getvalue())
    assert BAR.fullmatch(screen[0]).group(4) == "5" and screen[1:] == [""]
    assert stream.getvalue().count("\r\x1b[2K") == 6  # every step plus the epoch's final draw
    assert sys.stdout.getvalue() == ""


@pytest.mark.parametrize("seconds, text", [(9.4, "0:09"), (750, "12:30"), (7500, "2:05:00")])
def test_time_left_reads_like_a_clock(seconds, text):
    from tessel.train.progress import _duration

    assert _duration(seconds) == text
