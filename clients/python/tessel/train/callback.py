"""Training callbacks with MindSpore's API: Callback, RunContext, LossMonitor, TimeMonitor, ModelCheckpoint,
CheckpointConfig, LambdaCallback and History.

Model.train calls on_train_begin, then per epoch on_train_epoch_begin, per step on_train_step_begin/_end, then
on_train_epoch_end, and finally on_train_end; each receives a RunContext whose original_args() is cb_params
(cur_epoch_num, cur_step_num, batch_num, epoch_num, net_outputs, train_network, optimizer, ...).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.train.serialization import appended_values


class CallbackParam(dict):
    """cb_params: a dict whose keys are also attributes (MindSpore's _InternalCallbackParam)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"cb_params has no {name!r}; it has {sorted(self)}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class RunContext:
    """What callbacks get: original_args() (the cb_params) and request_stop()."""

    def __init__(self, original_args: CallbackParam):
        self._original_args, self._stop_requested = original_args, False

    def original_args(self) -> CallbackParam:
        return self._original_args

    def request_stop(self) -> None:
        self._stop_requested = True

    def get_stop_requested(self) -> bool:
        return self._stop_requested


class Callback:
    """Base class; override any of on_train_* / on_eval_* or MindSpore 1.x's begin / epoch_begin / step_begin /
    step_end / epoch_end / end, which both the train and the eval hooks call, as in MindSpore. Model.train and
    Model.eval enter every callback as a context manager around the run (__enter__ / __exit__)."""

    def __enter__(self) -> Callback:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        return None

    def on_train_begin(self, run_context: RunContext) -> None:
        self.begin(run_context)

    def on_train_epoch_begin(self, run_context: RunContext) -> None:
        self.epoch_begin(run_context)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        self.epoch_end(run_context)

    def on_train_step_begin(self, run_context: RunContext) -> None:
        self.step_begin(run_context)

    def on_train_step_end(self, run_context: RunContext) -> None:
        self.step_end(run_context)

    def on_train_end(self, run_context: RunContext) -> None:
        self.end(run_context)

    def on_eval_begin(self, run_context: RunContext) -> None:
        self.begin(run_context)

    def on_eval_epoch_begin(self, run_context: RunContext) -> None:
        self.epoch_begin(run_context)

    def on_eval_step_begin(self, run_context: RunContext) -> None:
        self.step_begin(run_context)

    def on_eval_step_end(self, run_context: RunContext) -> None:
        self.step_end(run_context)

    def on_eval_epoch_end(self, run_context: RunContext) -> None:
        self.epoch_end(run_context)

    def on_eval_end(self, run_context: RunContext) -> None:
        self.end(run_context)

    def begin(self, run_context: RunContext) -> None:
        pass

    def epoch_begin(self, run_context: RunContext) -> None:
        pass

    def epoch_end(self, run_context: RunContext) -> None:
        pass

    def step_begin(self, run_context: RunContext) -> None:
        pass

    def step_end(self, run_context: RunContext) -> None:
        pass

    def end(self, run_context: RunContext) -> None:
        pass


def as_callbacks(callbacks: Any) -> list[Callback]:
    if callbacks is None:
        return []
    items = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    bad = [type(c).__name__ for c in items if not isinstance(c, Callback)]
    if bad:
        raise ConfigurationError(f"callbacks must be Callback instances, got {bad}")
    return items


@contextlib.contextmanager
def entered(callbacks: list[Callback]) -> Iterator[list[Callback]]:
    """Every callback entered as a context manager for a run, as MindSpore's _CallbackManager does."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(c) for c in callbacks]


def loss_value(outputs: Any) -> float | None:
    """The scalar loss in net_outputs (the first output, averaged), as the progress bar shows it."""
    if isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], Tensor):
        outputs = outputs[0]
    if isinstance(outputs, Tensor):
        return float(np.mean(outputs.asnumpy()))
    return float(outputs) if isinstance(outputs, (int, float, np.number)) else None


def _printed_loss(outputs: Any) -> Any:
    """MindSpore's _handle_loss, what LossMonitor prints: a Tensor's mean as a Python float, but from a tuple or list
    (a loss-scale cell's (loss, overflow, scale)) its first Tensor as it is, printed as a Tensor prints; anything
    else unchanged."""
    if isinstance(outputs, (tuple, list)):
        return outputs[0] if outputs and isinstance(outputs[0], Tensor) else outputs
    return float(np.mean(outputs.asnumpy())) if isinstance(outputs, Tensor) else outputs


class LossMonitor(Callback):
    """Print "epoch: E step: S, loss is L" every per_print_times steps; a NaN or Inf loss stops training with an
    error naming the epoch and step. As MindSpore's, L is the mean of a Tensor output as a Python float, or the first
    Tensor of a tuple output printed as a Tensor (which is not checked for NaN)."""

    def __init__(self, per_print_times: int = 1):
        if isinstance(per_print_times, bool) or not isinstance(per_print_times, int) or per_print_times < 0:
            raise ConfigurationError(f"LossMonitor: per_print_times must be an int >= 0, got {per_print_times!r}")
        self._per_print_times, self._last_print_time = per_print_times, 0

    def step_end(self, run_context: RunContext) -> None:
        cb = run_context.original_args()
        loss = _printed_loss(cb.net_outputs)
        epoch = cb.get("cur_epoch_num", 1)
        step_in_epoch = (cb.cur_step_num - 1) % cb.batch_num + 1
        if isinstance(loss, float) and not np.isfinite(loss):
            # MindSpore's ValueError and text; ConfigurationError is one (divergence usually means bad hyper-parameters)
            raise ConfigurationError(
                f"In epoch: {epoch} step: {step_in_epoch}, loss is NAN or INF, training process cannot continue, "
                "terminating training."
            )
        # a new run counts its steps from 0 again: MindSpore steps the last print back until it is behind
        while self._per_print_times and cb.cur_step_num <= self._last_print_time:
            self._last_print_time -= max(self._per_print_times, cb.batch_num if cb.get("dataset_sink_mode") else 1)
        if self._per_print_times and cb.cur_step_num - self._last_print_time >= self._per_print_times:
            self._last_print_time = cb.cur_step_num
            print(f"epoch: {epoch} step: {step_in_epoch}, loss is {loss}", flush=True)

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        metrics = run_context.original_args().get("metrics")
        if metrics:
            print(f"Eval result: epoch {run_context.original_args().cur_epoch_num}, metrics: {metrics}", flush=True)


class TimeMonitor(Callback):
    """Print each epoch's time and the time per step. As MindSpore's, the steps of an epoch are the run's batch_num
    (what Model.train runs per epoch, sink_size included); data_size counts only where batch_num is unknown.
    data_time=True adds the mean time per step spent fetching data between steps, " (data time: 0.532 ms)" (an eval
    fetches no data between train steps: 0.000, as MindSpore's)."""

    def __init__(self, data_size: int | None = None, data_time: bool = False):
        if data_size is not None and (isinstance(data_size, bool) or not isinstance(data_size, int) or data_size < 1):
            raise ConfigurationError(f"TimeMonitor: data_size must be a positive int or None, got {data_size!r}")
        if not isinstance(data_time, bool):
            raise TypeError(f"The 'data_time' must be a bool, but got {type(data_time).__name__}.")
        self.data_size, self.epoch_time, self.data_time = data_size, 0.0, data_time
        self.data_time_sum, self.data_time_start = 0.0, 0.0

    def begin(self, run_context: RunContext) -> None:
        if self.data_time and run_context.original_args().get("dataset_sink_mode"):
            raise NotSupportedYetError(
                "not supported yet: TimeMonitor(data_time=True) with dataset_sink_mode=True, the time the sunk "
                "pipeline spends fetching data is not measured; use data_time=False or dataset_sink_mode=False"
            )

    def on_train_step_begin(self, run_context: RunContext) -> None:
        if self.data_time:
            self.data_time_sum += time.perf_counter() - self.data_time_start

    def on_train_step_end(self, run_context: RunContext) -> None:
        if self.data_time:
            self.data_time_start = time.perf_counter()

    def epoch_begin(self, run_context: RunContext) -> None:
        self.epoch_time = time.perf_counter()
        if self.data_time:
            self.data_time_sum, self.data_time_start = 0.0, self.epoch_time

    def epoch_end(self, run_context: RunContext) -> None:
        cb = run_context.original_args()
        elapsed_ms = (time.perf_counter() - self.epoch_time) * 1000
        batch_num = cb.get("batch_num")
        steps = max(batch_num if isinstance(batch_num, int) and batch_num > 0 else (self.data_size or 1), 1)
        mode = str(cb.get("mode", "")).title()
        line = f"{mode} epoch time: {elapsed_ms:5.3f} ms, per step time: {elapsed_ms / steps:5.3f} ms"
        if self.data_time:
            line += f" (data time: {self.data_time_sum * 1000 / steps:5.3f} ms)"
        print(line, flush=True)


_LAMBDA_HOOKS = (
    "on_train_epoch_begin",
    "on_train_epoch_end",
    "on_train_step_begin",
    "on_train_step_end",
    "on_train_begin",
    "on_train_end",
    "on_eval_epoch_begin",
    "on_eval_epoch_end",
    "on_eval_step_begin",
    "on_eval_step_end",
    "on_eval_begin",
    "on_eval_end",
)


class LearningRateScheduler(Callback):
    """Change the optimizer's learning rate after each step to learning_rate_function(lr, cur_step_num)
    (MindSpore's): for a fixed rate; a per-step list or a schedule already says the rate of every step."""

    def __init__(self, learning_rate_function: Any):
        if not callable(learning_rate_function):
            raise ConfigurationError(
                f"LearningRateScheduler: learning_rate_function must be callable, got {learning_rate_function!r}"
            )
        self.learning_rate_function = learning_rate_function

    def on_train_step_end(self, run_context: RunContext) -> None:
        cb = run_context.original_args()
        optimizer = cb.optimizer
        rate = getattr(optimizer, "learning_rate", None)
        if not isinstance(rate, float):  # a fixed rate (optimizer.LearningRate, or a float the script assigned)
            raise ConfigurationError(
                "LearningRateScheduler: the optimizer's learning_rate must be a fixed number; a per-step list or a "
                "LearningRateSchedule already gives the rate of every step"
            )
        lr = float(rate)
        new_lr = float(self.learning_rate_function(lr, cb.cur_step_num))
        if not np.isclose(lr, new_lr, rtol=1e-10, atol=0.0):
            from tessel.nn.optim.optimizer import LearningRate

            optimizer.learning_rate = LearningRate(new_lr, optimizer)


class LambdaCallback(Callback):
    """A callback from functions, MindSpore's argument order: LambdaCallback(on_train_epoch_begin,
    on_train_epoch_end, on_train_step_begin, on_train_step_end, on_train_begin, on_train_end, on_eval_...); a hook
    left None does nothing."""

    def __init__(self, *hooks: Any, **named: Any):
        if len(hooks) > len(_LAMBDA_HOOKS):
            raise ConfigurationError(f"LambdaCallback takes at most {len(_LAMBDA_HOOKS)} hooks, got {len(hooks)}")
        given = dict(zip(_LAMBDA_HOOKS, hooks))
        for name, fn in named.items():
            if name not in _LAMBDA_HOOKS:
                raise ConfigurationError(f"LambdaCallback: unknown hook {name!r}; the hooks are {list(_LAMBDA_HOOKS)}")
            if name in given:
                raise ConfigurationError(f"LambdaCallback: hook {name!r} given twice")
            given[name] = fn
        for name, fn in given.items():
            if fn is not None and not callable(fn):
                raise ConfigurationError(f"LambdaCallback: {name} must be callable or None, got {fn!r}")
            setattr(self, name, fn if fn is not None else _no_hook)


def _no_hook(run_context: RunContext) -> None:
    return None


class History(Callback):
    """As MindSpore's: .epoch is {"epoch": [numbers]} (reset as a run begins) and .history holds, per epoch end,
    "net_output" and every metric in cb_params.metrics. net_output is the mean of a Tensor output, or of the first
    Tensor of a tuple output, as a numpy scalar of its dtype (np.float32 for a float32 loss); other outputs as they
    are."""

    def __init__(self):
        self.history: dict[str, list] = {}
        self.epoch: dict[str, list] | None = None

    def begin(self, run_context: RunContext) -> None:
        self.epoch = {"epoch": []}

    def epoch_end(self, run_context: RunContext) -> None:
        cb = run_context.original_args()
        if self.epoch is None:
            self.epoch = {"epoch": []}
        self.epoch["epoch"].append(cb.get("cur_epoch_num", 1))
        output = cb.get("net_outputs")
        if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
            output = output[0]
        if isinstance(output, Tensor):
            output = np.mean(output.asnumpy())
        current = {"net_output": output, **(cb.get("metrics") or {})}
        for key, value in current.items():
            self.history.setdefault(key, []).append(value)


class CheckpointConfig:
    """When ModelCheckpoint saves, how many files it keeps and what they hold (MindSpore `CheckpointConfig`).

    append_info is MindSpore's list of "epoch_num", "step_num" and dicts of extra named values, written into each
    file. crc_check is accepted either way: every tessel checkpoint carries a checksum that loading verifies. Options
    tessel lacks (keep_checkpoint_per_n_minutes, async_save, encryption, exception_save) raise "not supported yet"
    at any value but their default. remove_redundancy=True: each rank writes only its share of the values that
    several ranks hold (save_checkpoint's remove_redundancy; give each rank its own directory)."""

    def __init__(
        self,
        save_checkpoint_steps: int = 1,
        save_checkpoint_seconds: int = 0,
        keep_checkpoint_max: int = 5,
        keep_checkpoint_per_n_minutes: int = 0,
        integrated_save: bool = True,
        async_save: bool | str = False,
        saved_network: Any = None,
        append_info: list | None = None,
        enc_key: bytes | None = None,
        enc_mode: str = "AES-GCM",
        exception_save: bool = False,
        crc_check: bool = False,
        remove_redundancy: bool = False,
        format: str = "ckpt",
        **options: Any,
    ):
        from tessel.common.support import keyword_options, not_supported_yet
        from tessel.train.serialization import check_file_options

        for name, value in (
            ("save_checkpoint_steps", save_checkpoint_steps),
            ("keep_checkpoint_max", keep_checkpoint_max),
            ("save_checkpoint_seconds", save_checkpoint_seconds),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"CheckpointConfig: {name} must be an int >= 0, got {value!r}")
        if not save_checkpoint_steps and not save_checkpoint_seconds and not keep_checkpoint_max:
            raise ConfigurationError(
                "CheckpointConfig: save_checkpoint_steps, save_checkpoint_seconds and keep_checkpoint_max can't all "
                "be 0; set save_checkpoint_steps (or save_checkpoint_seconds) to say when to save"
            )
        if save_checkpoint_steps:  # MindSpore: steps, when set, replace seconds (which then read None)
            save_checkpoint_seconds = None
        keep_checkpoint_max = keep_checkpoint_max or 1  # MindSpore: 0 keeps 1 (without keep_checkpoint_per_n_minutes)
        keyword_options(
            "CheckpointConfig",
            {
                "keep_checkpoint_per_n_minutes": keep_checkpoint_per_n_minutes,
                "async_save": async_save,
                "exception_save": exception_save,
            },
            unsupported=_CHECKPOINT_UNSUPPORTED,
        )
        if options:
            raise not_supported_yet(f"CheckpointConfig options {sorted(options)}", "it takes MindSpore's named ones")
        check_file_options("CheckpointConfig", enc_key, enc_mode, format, "enc_key")
        self.save_checkpoint_steps, self.save_checkpoint_seconds = save_checkpoint_steps, save_checkpoint_seconds
        self.keep_checkpoint_max, self.saved_network = keep_checkpoint_max, saved_network
        self.append_info = _check_append_info(append_info)
        self.format = format
        self.integrated_save = bool(integrated_save)  # False: each rank writes its slices and their layouts
        if not isinstance(remove_redundancy, bool):
            raise ConfigurationError(f"CheckpointConfig: remove_redundancy must be a bool, got {remove_redundancy!r}")
        if remove_redundancy and save_checkpoint_seconds:
            raise ConfigurationError(
                "CheckpointConfig: remove_redundancy=True saves a share on every rank at once, which a time on each "
                "rank's own clock does not agree on; use save_checkpoint_steps instead of save_checkpoint_seconds"
            )
        self.remove_redundancy = remove_redundancy


_CHECKPOINT_UNSUPPORTED = {
    "keep_checkpoint_per_n_minutes": ((0,), "ModelCheckpoint keeps the newest keep_checkpoint_max files"),
    "async_save": ((False,), "use async_save=False (each save is done before the step ends)"),
    "exception_save": ((False,), "a failed job keeps the checkpoints saved before the failure"),
}


def _unused_prefix(directory: str, prefix: str) -> str:
    """MindSpore's _chg_ckpt_file_name_if_same_exist: `prefix`, or "<prefix>_<n>" one past the highest n the
    directory's checkpoints of this prefix use ("<prefix>-..." counts as 0), so a rerun does not overwrite them.
    Checkpoints are .ckpt and .safetensors files, whatever the format saved, except "..._breakpoint.ckpt"."""
    if not os.path.isdir(directory):
        return prefix
    suffix = 0
    for name in os.listdir(directory):
        ext = os.path.splitext(name)[1]
        if ext not in (".ckpt", ".safetensors") or name.endswith("_breakpoint.ckpt"):
            continue
        if not name.startswith(prefix) or len(name) <= len(prefix) or name[len(prefix)].isalpha():
            continue
        rest = name[len(prefix) :]
        dash = rest.find("-")
        if dash == 0:
            suffix = max(suffix, 1)
        elif dash > 0 and rest[1:dash].isdigit():
            suffix = max(suffix, int(rest[1:dash]) + 1)
    return f"{prefix}_{suffix}" if suffix else prefix


def _checkpoints_of(directory: str, prefix: str, extension: str) -> list[str]:
    """MindSpore's CheckpointManager.update_ckpoint_filelist: the directory's "<prefix>-<no letters>.<extension>"
    files, whichever callback wrote them; only these count against keep_checkpoint_max and may be removed."""
    found = []
    for name in os.listdir(directory):
        if not name.startswith(f"{prefix}-") or os.path.splitext(name)[1] != f".{extension}":
            continue
        if not any(char.isalpha() for char in name[len(prefix) : -len(extension) - 1]):
            found.append(os.path.join(directory, name))
    return found


def _check_append_info(append_info: Any) -> list:
    """MindSpore's append_info: a list of "epoch_num", "step_num" and dicts of str -> number, str or Tensor."""
    if append_info is None:
        return []
    if not isinstance(append_info, list):
        raise ConfigurationError(
            f"CheckpointConfig: append_info must be a list of 'epoch_num', 'step_num' and dicts, got "
            f"{type(append_info).__name__}; e.g. append_info=['epoch_num', {{'lr': 0.01}}]"
        )
    for entry in append_info:
        if isinstance(entry, dict):
            appended_values(entry, "CheckpointConfig", "append_info")  # the first save would find the same
        elif entry not in ("epoch_num", "step_num"):
            raise ConfigurationError(
                f"CheckpointConfig: append_info entry {entry!r} is not 'epoch_num', 'step_num' or a dict"
            )
    return list(append_info)


class ModelCheckpoint(Callback):
    """Save "<prefix>-<epoch>_<step>.ckpt" into `directory` every save_checkpoint_steps steps (else every
    save_checkpoint_seconds; and at the end; with both 0, never, as MindSpore's), keeping the newest
    keep_checkpoint_max files. As MindSpore's: where the directory already holds checkpoints of this prefix, the
    prefix becomes "<prefix>_1" (then _2, ...); a step saves once save_checkpoint_steps steps passed since the last
    save, the one at the end of training included (steps counted over the train call, as MindSpore's cur_step_num,
    from 0 also in a run resumed at initial_epoch); keep_checkpoint_max counts the directory's
    "<prefix>-<epoch>_<step>" files, whoever wrote them."""

    def __init__(self, prefix: str = "CKP", directory: str | None = None, config: CheckpointConfig | None = None):
        if not isinstance(prefix, str) or not re.fullmatch(r"[\w.-]+", prefix):
            raise ConfigurationError(f"ModelCheckpoint: prefix {prefix!r} must be letters, digits, '_', '-', '.'")
        self.directory = os.path.abspath(directory or ".")
        self.config = config or CheckpointConfig()
        self.prefix = _unused_prefix(self.directory, prefix)
        self._last_time = time.monotonic()
        self._last_triggered_step = 0  # the step of the last save, kept across train calls as MindSpore's
        self.latest_ckpt_file_name = ""

    def on_train_step_end(self, run_context: RunContext) -> None:
        self._save(run_context.original_args(), at_end=False)

    def on_train_end(self, run_context: RunContext) -> None:
        self._save(run_context.original_args(), at_end=True)

    def _due(self, cb: CallbackParam, at_end: bool) -> bool:
        """MindSpore's _check_save_ckpt: by steps, or else by seconds; the end of training saves in either case."""
        steps, seconds = self.config.save_checkpoint_steps, self.config.save_checkpoint_seconds
        if steps:
            return at_end or cb.cur_step_num >= self._last_triggered_step + steps
        if seconds:
            now = time.monotonic()
            if at_end or now - self._last_time > seconds:
                self._last_time = now
                return True
        return False

    def _save(self, cb: CallbackParam, at_end: bool) -> None:
        """MindSpore's _save_ckpt: nothing where this step was saved already; else, when due, the oldest of the
        directory's checkpoints of this prefix goes if keep_checkpoint_max of them are there, then this one is
        written."""
        from tessel.common.support import logger
        from tessel.train.serialization import save_checkpoint

        if cb.cur_step_num == self._last_triggered_step or not self._due(cb, at_end):
            return
        step_in_epoch = (cb.cur_step_num - 1) % cb.batch_num + 1
        name = f"{self.prefix}-{cb.cur_epoch_num}_{step_in_epoch}.{self.config.format}"
        if os.path.isdir(self.directory):
            # a file of this very name is overwritten, not added: it does not count towards keep_checkpoint_max
            target = os.path.join(self.directory, name)
            kept = [f for f in _checkpoints_of(self.directory, self.prefix, self.config.format) if f != target]
            try:
                if len(kept) >= self.config.keep_checkpoint_max:
                    os.remove(min(kept, key=os.path.getmtime))
            except OSError as error:  # another writer removed it first; MindSpore warns and goes on saving
                logger.warning("ModelCheckpoint: could not remove the oldest checkpoint of %s: %s", self.prefix, error)
        self._last_triggered_step = cb.cur_step_num
        path = os.path.join(self.directory, name)
        network = self.config.saved_network or cb.train_network
        appended: dict = {}
        for entry in self.config.append_info:
            if isinstance(entry, dict):
                appended.update(entry)
            else:
                appended[entry] = cb.cur_epoch_num if entry == "epoch_num" else cb.cur_step_num
        save_checkpoint(
            network,
            path,
            self.config.integrated_save,
            append_dict=appended,
            remove_redundancy=self.config.remove_redundancy,
        )
        self.latest_ckpt_file_name = path
