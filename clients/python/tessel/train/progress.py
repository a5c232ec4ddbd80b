"""A progress bar for `Model.train` on a terminal: epoch, step of the epoch, loss, samples/s and time left.

`Model.train` shows it by itself on rank 0 when standard output is a terminal, or reaches one through `tessel run`
(which sets TESSEL_TERMINAL=1 then, and keeps only each line's last redraw in the log); never into a pipe or a file
otherwise. Pass `ProgressBar()` in `callbacks` to choose the stream or the redraw rate yourself:

    >>> model.train(10, dataset, callbacks=[ProgressBar(stream=sys.stderr)])
    epoch 1/10 [####################] 100/100  loss 0.5123  41,250 samples/s  0:09 left
    epoch 2/10 [########............]  40/100  loss 0.4410  40,981 samples/s  0:08 left

Each finished epoch keeps its line; the current one is redrawn in place, at most every `min_interval_s` (reading the
loss costs a daemon round trip in feed mode, so it is read only when drawn). Lines other code prints meanwhile
(LossMonitor, warnings) first erase the bar, so they never run into it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from tessel.train.callback import Callback, RunContext, loss_value

_ERASE_LINE = "\r\x1b[2K"  # tessel.launcher.ERASE_LINE: the launcher's logs keep only the text after the last one
_WIDTH = 20  # characters of the bar itself


def _duration(seconds: float) -> str:
    """'0:09', '12:30', '2:05:00'."""
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _shards(dataset: Any) -> int:
    """How many ranks share the dataset (num_shards of its source): samples/s counts every rank's samples."""
    node = dataset
    while node is not None:
        shards = getattr(node, "num_shards", None)
        if shards:
            return int(shards)
        node = node.children[0] if getattr(node, "children", None) else None
    return 1


class ProgressBar(Callback):
    """Draws the training progress on `stream` (default: standard output at the time training starts)."""

    def __init__(self, stream: TextIO | None = None, min_interval_s: float = 0.1):
        self._stream, self._min_interval_s = stream, min_interval_s
        self._out: TextIO | None = None
        self._shown = False  # the bar is on the screen (no newline after it yet)
        self._last_draw = 0.0
        self._start_time, self._start_step = 0.0, 0
        self._samples_per_step = 0

    # ------------------------------------------------------------------------------------------ callbacks

    def on_train_begin(self, run_context: RunContext) -> None:
        cb = run_context.original_args()
        out = self._stream or sys.stdout
        self._out = out._stream if isinstance(out, _ErasesBar) else out  # the bar's own writes erase nothing
        self._shown, self._last_draw = False, 0.0
        self._start_time, self._start_step = time.perf_counter(), cb.cur_step_num
        batch = getattr(cb.train_dataset, "get_batch_size", None)
        self._samples_per_step = (batch() if batch is not None else 0) * _shards(cb.train_dataset)

    def on_train_step_end(self, run_context: RunContext) -> None:
        # Redraw at once when other output erased the bar; else no more often than min_interval_s.
        if not self._shown or time.perf_counter() - self._last_draw >= self._min_interval_s:
            self._draw(run_context.original_args())

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        self._draw(run_context.original_args())
        self._write("\n")  # the finished epoch keeps its line
        self._shown = False

    def on_train_end(self, run_context: RunContext) -> None:
        if self._shown:  # stopped mid-epoch
            self._write("\n")
            self._shown = False

    # ------------------------------------------------------------------------------------------ drawing

    def erase(self) -> None:
        """Take the bar off the screen (before other output); the next step draws it again."""
        if self._shown:
            self._shown = False
            self._write(_ERASE_LINE)

    def line(self, cb: Any, now: float) -> str:
        """The bar's text for the current state of `cb` (the cb_params)."""
        steps = max(int(cb.batch_num), 1)
        step_in_epoch = (cb.cur_step_num - 1) % steps + 1 if cb.cur_step_num else 0
        filled = _WIDTH * step_in_epoch // steps
        last_epoch = cb.get("initial_epoch", 0) + cb.epoch_num
        parts = [f"epoch {cb.cur_epoch_num}/{last_epoch} [{'#' * filled}{'.' * (_WIDTH - filled)}]"]
        parts.append(f"{step_in_epoch:>{len(str(steps))}}/{steps}")
        loss = loss_value(cb.net_outputs)
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        done, elapsed = cb.cur_step_num - self._start_step, now - self._start_time
        if done > 0 and elapsed > 0:
            rate = done / elapsed
            if self._samples_per_step:
                parts.append(f"{rate * self._samples_per_step:,.0f} samples/s")
            left = (last_epoch - cb.cur_epoch_num) * steps + (steps - step_in_epoch)
            parts.append(f"{_duration(left / rate)} left")
        return "  ".join(parts)

    def _draw(self, cb: Any) -> None:
        now = time.perf_counter()
        self._write(_ERASE_LINE + self.line(cb, now))
        self._shown, self._last_draw = True, now

    def _write(self, text: str) -> None:
        out = self._out
        if out is None:
            return
        try:
            out.write(text)
            out.flush()
        except (OSError, ValueError):  # the terminal went away: training goes on without the bar
            self._out = None


class _ErasesBar:
    """Standard output or error while the bar is shown: a write first erases the bar, so lines never mix."""

    def __init__(self, stream: TextIO, bar: ProgressBar):
        self._stream, self._bar = stream, bar

    def write(self, text: str) -> int:
        if text:
            self._bar.erase()
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def terminal_progress(rank: int, callbacks: list[Callback]) -> Iterator[list[Callback]]:
    """The callbacks `Model.train` runs: with a ProgressBar added last on rank 0 when standard output is a terminal
    (unless the user passed one). While a bar is in use, other writes to stdout and stderr erase it first."""
    passed = [c for c in callbacks if isinstance(c, ProgressBar)]
    if passed:
        bar, run = passed[0], callbacks
    elif rank == 0 and (_is_terminal(sys.stdout) or os.environ.get("TESSEL_TERMINAL") == "1"):
        bar = ProgressBar()
        run = [*callbacks, bar]  # last: it draws after the other callbacks printed
    else:
        yield callbacks
        return
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (None if stream is None else _ErasesBar(stream, bar) for stream in saved)
    try:
        yield run
    finally:
        sys.stdout, sys.stderr = saved
