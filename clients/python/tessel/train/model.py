"""`Model`: MindSpore's high-level train / eval / predict.

    >>> model = ms.Model(net, loss_fn=nn.CrossEntropyLoss(), optimizer=nn.SGD(net.trainable_params(), 1e-2),
    ...                  metrics={"accuracy", "loss"})
    >>> model.train(10, train_dataset, callbacks=[LossMonitor(20)])
    >>> model.eval(test_dataset)                       # {'accuracy': ..., 'loss': ...}

Training compiles forward, backward and the optimizer update into one graph (once per input signature) and runs
it on this rank's daemon; parameters and optimizer state stay there. The parallel mode decides the gradient
reduction (DATA_PARALLEL: bucketed AllReduce overlapping the backward, inserted by the step itself; manual /
HYBRID_PARALLEL: the network's own collectives), see `tessel.common.rank_step`.

* `dataset_sink_mode=True` with a declarative pipeline (`dataset.is_serializable()`): the pipeline goes to the
  daemon as a spec, the daemon reads its own shard and runs a whole epoch (or `sink_size` steps) per Execute,
  streaming each step's loss as the step ends (Daemon.ExecuteStream); the step callbacks run once per step as the
  losses arrive (LossMonitor's lines and the progress bar follow the steps while the epoch runs).
* Otherwise (feed mode: `dataset_sink_mode=False`, or a pipeline with Python callables such as
  GeneratorDataset or a map with a lambda): one Execute per step with the batch fed from the client.

On a terminal, rank 0 shows a progress bar (epoch, step, loss, samples/s, time left; see `train.progress`).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from tessel import context, profiler
from tessel.common import rank_step
from tessel.common.support import keyword_options
from tessel.common.tensor import Tensor
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.nn.cell import Cell
from tessel.nn.wrap import FusedTrainStep, TrainOneStepCell, WithEvalCell, WithLossCell
from tessel.train import batch_split
from tessel.train.callback import CallbackParam, RunContext, as_callbacks, entered
from tessel.train.metrics import Loss, get_metrics
from tessel.train.progress import terminal_progress


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"Model: {name} must be an int >= {minimum}, got {value!r}")
    return value


# MindSpore's Model(**kwargs): boost_config_dict acts only with boost_level above 'O0', which tessel refuses
_MODEL_HINTS = {"boost_config_dict": "it acts only with boost_level above 'O0'"}
_MODEL_AMP_OPTIONS = ("keep_batchnorm_fp32", "loss_scale_manager")


class Model:
    """Train, evaluate and predict with a network, a loss function and an optimizer."""

    def __init__(
        self,
        network: Cell,
        loss_fn: Cell | None = None,
        optimizer: Any = None,
        metrics: Any = None,
        eval_network: Cell | None = None,
        eval_indexes: list[int] | None = None,
        amp_level: str = "O0",
        boost_level: str = "O0",
        **kwargs: Any,
    ):
        if not isinstance(network, Cell):
            raise ConfigurationError(f"Model: network must be a Cell, got {type(network).__name__}")
        amp_options = {k: kwargs.pop(k) for k in _MODEL_AMP_OPTIONS if k in kwargs}
        keyword_options("Model", kwargs, _MODEL_HINTS, {})
        if boost_level != "O0":
            raise NotSupportedYetError(f"Model: boost_level {boost_level!r} is not supported yet; use 'O0'")
        if optimizer is None and amp_level != "O0":  # MindSpore's check
            raise ConfigurationError(f"Model: amp_level {amp_level!r} needs an optimizer; without one use 'O0'")
        if optimizer is None and amp_options.get("loss_scale_manager") is not None:
            raise ConfigurationError("Model: loss_scale_manager needs an optimizer")
        self._amp_level, self._amp_options = amp_level, amp_options
        if eval_indexes is not None and (len(eval_indexes) != 3 or eval_network is None):
            raise ConfigurationError("Model: eval_indexes needs eval_network and 3 indexes (loss, prediction, label)")
        self._network, self._loss_fn, self._optimizer = network, loss_fn, optimizer
        self._metrics = get_metrics(metrics)
        if self._metrics and eval_network is None and loss_fn is None:  # MindSpore's check and text
            raise ConfigurationError(_NO_EVAL_NETWORK)
        self._eval_network, self._eval_indexes = eval_network, eval_indexes
        self._train_network = self._build_train_network()
        self._sink_runners: dict[int, tuple[Any, ...]] = {}

    def _build_train_network(self) -> Cell:
        if self._optimizer is None:  # MindSpore's: each step runs the network (with the loss), which updates nothing
            return WithLossCell(self._network, self._loss_fn) if self._loss_fn is not None else self._network
        if self._amp_level != "O0" or self._amp_options:  # as MindSpore: amp.build_train_network
            from tessel import amp

            return amp.build_train_network(
                self._network, self._optimizer, self._loss_fn, level=self._amp_level, **self._amp_options
            )
        loss_net = WithLossCell(self._network, self._loss_fn) if self._loss_fn is not None else self._network
        return TrainOneStepCell(loss_net, self._optimizer)

    @property
    def train_network(self) -> Cell:
        return self._train_network

    @property
    def predict_network(self) -> Cell:
        return self._network

    @property
    def eval_network(self) -> Cell | None:
        return self._eval_network

    # --- training -------------------------------------------------------------------------------------------
    def train(
        self,
        epoch: int,
        train_dataset: Any,
        callbacks: Any = None,
        dataset_sink_mode: bool = False,
        sink_size: int = -1,
        initial_epoch: int = 0,
    ) -> None:
        """Train for `epoch` epochs (from initial_epoch), one compiled fused step per batch. As MindSpore's, a Model
        without an optimizer runs its network (with loss_fn, if given) on each batch: a custom train cell updates
        the parameters itself, and net_outputs is what it returns."""
        self._train(epoch, train_dataset, callbacks, dataset_sink_mode, sink_size, initial_epoch, None)

    def fit(
        self,
        epoch: int,
        train_dataset: Any,
        valid_dataset: Any = None,
        valid_frequency: int | list = 1,
        callbacks: Any = None,
        dataset_sink_mode: bool = False,
        valid_dataset_sink_mode: bool = False,
        sink_size: int = -1,
        initial_epoch: int = 0,
    ) -> None:
        """Train as `train` does and evaluate on valid_dataset at the end of every `valid_frequency`-th epoch (an
        int) or of the epochs listed (a list), before the callbacks' on_train_epoch_end: they then find the metrics
        and "eval_loss" in cb_params.eval_results (EarlyStopping, ReduceLROnPlateau monitor them): the mean loss
        over the pass, where MindSpore 2.7.0's is the last batch's (it makes a new Loss metric at every batch). As
        MindSpore's, the evaluation runs the callbacks' eval hooks, except those of tessel's own callbacks other
        than TimeMonitor. Batches are fed one step at a time either way of valid_dataset_sink_mode."""
        for name, value in (
            ("dataset_sink_mode", dataset_sink_mode),
            ("valid_dataset_sink_mode", valid_dataset_sink_mode),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"For 'Model.fit', '{name}' must be a bool, but got {type(value).__name__}")
        if isinstance(valid_frequency, bool) or not isinstance(valid_frequency, (int, list)):
            raise TypeError(
                "For 'Model.fit', the type of 'valid_frequency' must be a list or an integer, but got type "
                f"{type(valid_frequency)}."
            )
        if isinstance(valid_frequency, int):
            _positive_int("valid_frequency", valid_frequency)
        if valid_dataset is not None:
            _check_dataset(valid_dataset)
            if not self._metrics:
                raise ValueError(
                    "For 'Model.fit', if valid_dataset is not None, the model argument 'metrics' can not be None or "
                    "empty, you should set the argument 'metrics' for model."
                )
        valid = None if valid_dataset is None else (valid_dataset, valid_frequency)
        self._train(epoch, train_dataset, callbacks, dataset_sink_mode, sink_size, initial_epoch, valid)

    def _train(self, epoch, train_dataset, callbacks, dataset_sink_mode, sink_size, initial_epoch, valid) -> None:
        """train and fit: `valid` is fit's (valid_dataset, valid_frequency), or None."""
        _positive_int("epoch", epoch)
        _positive_int("initial_epoch", initial_epoch, 0)
        if initial_epoch >= epoch:
            raise ConfigurationError(f"Model.train: initial_epoch {initial_epoch} must be below epoch {epoch}")
        if sink_size != -1:
            _positive_int("sink_size", sink_size)
        _check_dataset(train_dataset)
        self._check_parallel(train_dataset)
        train_dataset.resume_at_epoch(initial_epoch)  # a resumed run sees the epochs (and shuffles) it would have
        net = self._train_network
        step = net._fused if isinstance(net, TrainOneStepCell) and net._runs_fused() else net
        fused = isinstance(step, FusedTrainStep)
        split = batch_split.splitter(train_dataset, sink_size, net, fused)
        runner = None
        if dataset_sink_mode and fused and _serializable(train_dataset) and split is None:
            runner = self._sink_runner(step, train_dataset)
        sinking = dataset_sink_mode and sink_size > 0
        steps = sink_size if sinking else train_dataset.get_dataset_size()
        cb = CallbackParam(
            train_network=net,
            network=self._network,
            optimizer=self._optimizer,
            loss_fn=self._loss_fn,
            epoch_num=epoch - initial_epoch,  # as MindSpore: the epochs this call runs, its steps counted from 0
            initial_epoch=initial_epoch,
            batch_num=steps,
            cur_epoch_num=initial_epoch,
            cur_step_num=0,
            net_outputs=None,
            train_dataset=train_dataset,
            train_dataset_element=None,
            initial_step=None,  # MindSpore's: set only where a failed run is resumed at a step
            dataset_sink_mode=dataset_sink_mode,
            mode="train",
            parallel_mode=context.get_auto_parallel_context("parallel_mode"),
            device_number=context.get_auto_parallel_context("device_num"),
        )
        net.set_train(True)
        numbers = range(initial_epoch + 1, epoch + 1)
        if split is not None:  # uneven shares (speed-aware data parallelism): a pipeline per split, asked per epoch
            sink = dataset_sink_mode and fused and _serializable(train_dataset)
            epochs = (self._split_epoch(split, step, sink, steps) for _ in numbers)
        elif runner is not None:  # the daemon runs each epoch; its per-step losses feed the step callbacks
            epochs = (_sunk_steps(runner, steps) for _ in numbers)
        else:
            batches = _sunk_epochs(train_dataset, sink_size) if sinking else _epochs(train_dataset)
            epochs = (_fed_steps(step, batches) for _ in numbers)
        try:
            with terminal_progress(_rank(), as_callbacks(callbacks)) as run_callbacks, entered(run_callbacks):
                cb["list_callback"] = run_callbacks
                evaluate = None if valid is None else lambda: self._eval_in_fit(valid, cb, run_callbacks)
                _run_epochs(epochs, numbers, cb, run_callbacks, evaluate)
        finally:
            if split is not None:
                rank_step.set_gradient_weight(None)
                train_dataset.resume_at_epoch(numbers[-1])
                with contextlib.suppress(Exception):  # after a failure (a daemon gone) the run's error is the one
                    split.finish()

    def _split_epoch(self, split: batch_split.BatchSplitter, step, sink: bool, steps: int) -> Iterator:
        """An epoch of an uneven split: asks for the split as the epoch starts."""
        pipeline = split.epoch()
        if sink:
            yield from split.counted(_sunk_steps(self._sink_runner(step, pipeline), steps))
        else:
            yield from split.counted(_fed_steps(step, _epochs(pipeline)))

    def _sink_runner(self, step: FusedTrainStep, dataset: Any) -> rank_step.SinkRunner:
        """The runner whose daemon-side reader has `dataset` open, kept across train() calls: opening it again
        would serialize the pipeline (with NumpySlicesDataset, all its data) and restart it; kept, the next call
        goes on from the epoch where the last one ended."""
        from tessel.common.engine import engine

        key = (weakref.ref(dataset), engine().id, step)
        kept = self._sink_runners.get(id(dataset))
        if kept is not None and kept[0]() is dataset and kept[1:3] == key[1:]:
            return kept[3]
        runner = rank_step.SinkRunner(step, dataset)
        if len(self._sink_runners) >= 4:
            self._sink_runners.pop(next(iter(self._sink_runners)))
        self._sink_runners[id(dataset)] = (*key, runner)
        return runner

    def _check_parallel(self, dataset: Any) -> None:
        rank_step.check_mode()
        if rank_step.data_parallel():
            rank_step.warn_unsharded(dataset)

    # --- layouts without running ----------------------------------------------------------------------------------
    def infer_train_layout(self, train_dataset: Any, dataset_sink_mode: bool = True, sink_size: int = -1) -> dict:
        """Compile the train network for `train_dataset`'s batches without running a step and return every
        parameter's layout (MindSpore `Model.infer_train_layout`; SEMI_AUTO/AUTO_PARALLEL only, sink mode only, as
        there). The plan is the one `train` then runs: parameters keep these layouts. Each entry is MindSpore's
        layout tuple, (device_matrix, tensor_map, slice_shape, field_size, uniform_split, opt_shard_group, ...),
        see tessel.parallel.parameter_layout.

            >>> layout = model.infer_train_layout(dataset)
            >>> layout["fc1.weight"][2]          # this rank's slice of fc1.weight
        """
        _apply_parallel_config(self._network)
        mode = context.get_auto_parallel_context("parallel_mode")
        if mode not in _LAYOUT_MODES:
            raise RuntimeError(
                f"'infer_train_layout' only supports 'semi_auto_parallel' and 'auto_parallel' mode, but got {mode}."
            )
        if not isinstance(dataset_sink_mode, bool):
            raise TypeError(f"dataset_sink_mode must be a bool, but got {type(dataset_sink_mode).__name__}")
        if not dataset_sink_mode:
            raise ValueError("Only dataset sink mode is supported for now.")
        if isinstance(sink_size, bool) or not isinstance(sink_size, int):
            raise TypeError(f"sink_size must be an int, but got {type(sink_size).__name__}")
        _check_dataset(train_dataset)
        if train_dataset.get_dataset_size() == 0:
            raise ValueError("There is no valid data in dataset, please check dataset file firstly.")
        if sink_size < -1 or sink_size == 0:
            raise ValueError(
                f"For 'infer_train_layout', the argument 'sink_size' must be -1 or positive, but got sink_size "
                f"{sink_size}."
            )
        first = next(iter(train_dataset.create_tuple_iterator(num_epochs=1, output_numpy=True)))
        self._train_network.set_train(True)
        self._train_network._compile(tuple(first), {})
        return self._train_network.parameter_layout_dict

    def infer_predict_layout(self, *predict_data: Any, skip_backend_compile: bool = False) -> dict:
        """Compile the predict network for `predict_data` without running it and return every parameter's layout
        (MindSpore `Model.infer_predict_layout`; SEMI_AUTO/AUTO_PARALLEL only). With skip_backend_compile the graph
        is traced and planned but not compiled on the daemon. The result can be given to
        load_distributed_checkpoint as predict_strategy.

            >>> layout = model.infer_predict_layout(ms.Tensor(np.ones((32, 128), np.float32)))
        """
        from tessel.common.support import logger

        _apply_parallel_config(self._network)
        if context.get_auto_parallel_context("parallel_mode") not in _LAYOUT_MODES:
            raise RuntimeError("Infer predict layout only supports semi auto parallel and auto parallel mode.")
        dataset = context.get_auto_parallel_context("dataset_strategy")
        if not context.get_auto_parallel_context("full_batch") and dataset in ("data_parallel", "full_batch"):
            logger.warning("Using non full-batch dataset in model prediction may lead to incorrect data.")
        for data in predict_data:
            if data is not None and not isinstance(data, (int, float, str, Tensor, np.ndarray)):
                raise TypeError(
                    f"The type of predict_data must be int, float, str, None or Tensor, but got {type(data).__name__}"
                )
        self._network.set_train(False)
        self._network._compile(predict_data, {}, backend=not skip_backend_compile)
        return self._network.parameter_layout_dict

    # --- evaluation and prediction ------------------------------------------------------------------------------
    def eval(self, valid_dataset: Any, callbacks: Any = None, dataset_sink_mode: bool = False) -> dict[str, float]:
        """The metrics over one pass of valid_dataset (network in inference mode). `callbacks` see MindSpore's eval
        hooks (on_eval_begin, on_eval_epoch_begin, on_eval_step_begin / _end per batch with net_outputs, then
        on_eval_epoch_end and on_eval_end with `metrics` set); one may stop the pass with request_stop().
        dataset_sink_mode gives the same metrics either way: batches are fed one step at a time."""
        if not self._metrics:
            raise ConfigurationError("Model.eval needs metrics: Model(..., metrics={'accuracy', 'loss'})")
        _check_dataset(valid_dataset)
        net, indexes = self._evaluator()
        for metric in self._metrics.values():
            metric.clear()
        net.set_train(False)
        cb = CallbackParam(
            eval_network=net,
            network=self._network,
            valid_dataset=valid_dataset,
            batch_num=valid_dataset.get_dataset_size(),
            mode="eval",
            cur_step_num=0,
            net_outputs=None,
            dataset_sink_mode=dataset_sink_mode,
        )
        hooks = as_callbacks(callbacks)
        cb["list_callback"] = hooks
        with entered(hooks):
            return self._eval_pass(valid_dataset, hooks, cb, net, indexes, eval_loss=False)

    def _eval_in_fit(self, valid: tuple, cb: CallbackParam, callbacks: list) -> None:
        """fit's evaluation at the end of an epoch (MindSpore's _eval_during_train): on train's cb_params, in eval
        mode, then back to the training's step count, batch count and outputs."""
        valid_dataset, frequency = valid
        number = cb["cur_epoch_num"]
        if not (number % frequency == 0 if isinstance(frequency, int) else number in frequency):
            return
        net, indexes = self._evaluator()
        kept = {key: cb[key] for key in ("cur_step_num", "batch_num", "dataset_sink_mode", "net_outputs")}
        cb.update(
            eval_network=net, valid_dataset=valid_dataset, batch_num=valid_dataset.get_dataset_size(), mode="eval"
        )
        cb.update(cur_step_num=0, dataset_sink_mode=False)
        for metric in self._metrics.values():
            metric.clear()
        net.set_train(False)
        try:
            self._eval_pass(valid_dataset, [c for c in callbacks if _evaluates(c)], cb, net, indexes, eval_loss=True)
        finally:
            cb.update(mode="train", **kept)
            self._train_network.set_train(True)

    def _eval_pass(self, valid_dataset, hooks: list, cb: CallbackParam, net, indexes, eval_loss: bool) -> dict:
        """One pass over valid_dataset with the eval hooks; sets cb_params.metrics (and with `eval_loss`, fit's
        eval_results: the metrics and the mean loss) and returns the metrics."""
        run_context = RunContext(cb)
        loss = Loss() if eval_loss else None
        for hook in hooks:
            hook.on_eval_begin(run_context)
        for hook in hooks:
            hook.on_eval_epoch_begin(run_context)
        for batch in next(_epochs(valid_dataset)):
            cb["cur_step_num"] += 1
            cb["eval_dataset_element"] = [Tensor._wrap(column) for column in batch]
            for hook in hooks:
                hook.on_eval_step_begin(run_context)
            outputs = net(*batch)
            found = outputs if isinstance(outputs, tuple) else (outputs,)
            if indexes is None:  # MindSpore: no eval_indexes, every metric gets every output
                updates = {"loss": found, "other": found}
            else:
                if len(found) < 3:
                    raise ConfigurationError(
                        f"Model.eval: the eval network returned {len(found)} output(s), but eval_indexes "
                        f"{list(indexes)} pick (loss, prediction, label) from at least 3"
                    )
                updates = {"loss": (found[indexes[0]],), "other": (found[indexes[1]], found[indexes[2]])}
            cb["net_outputs"] = outputs
            for hook in hooks:
                hook.on_eval_step_end(run_context)
            for metric in self._metrics.values():
                metric.update(*updates["loss" if isinstance(metric, Loss) else "other"])
            if loss is not None:
                loss.update(*updates["loss"][:1])
            if run_context._stop_requested:
                break
        cb["metrics"] = {name: metric.eval() for name, metric in self._metrics.items()}
        if loss is not None:
            cb["eval_results"] = {**cb["metrics"], "eval_loss": loss.eval()}
        for hook in hooks:
            hook.on_eval_epoch_end(run_context)
        for hook in hooks:
            hook.on_eval_end(run_context)
        return cb["metrics"]

    def _evaluator(self) -> tuple[Cell, Any]:
        """The eval network and how its outputs feed the metrics: eval_indexes (loss, prediction, label), or None
        (every metric gets every output)."""
        if self._eval_network is not None:
            return self._eval_network, None if self._eval_indexes is None else tuple(self._eval_indexes)
        # O2 / O3 ran the network in float16: its outputs enter the loss as float32
        return WithEvalCell(self._network, self._loss_fn, self._amp_level in ("O2", "O3")), (0, 1, 2)

    def predict(self, *predict_data: Any) -> Any:
        """network(*predict_data) in inference mode."""
        self._network.set_train(False)
        return self._network(*predict_data)


_NO_EVAL_NETWORK = (
    "If `metrics` is set, `eval_network` must not be None. Do not set `metrics` if you don't want an evaluation.\n"
    "If evaluation is required, you need to specify `eval_network`, which will be used in the framework to evaluate "
    "the model.\nFor the simple scenarios with one data, one label and one logits, `eval_network` is optional, and "
    "then you can set `eval_network` or `loss_fn`. For the latter case, framework will automatically build an "
    "evaluation network with `network` and `loss_fn`."
)

_LAYOUT_MODES = (context.ParallelMode.SEMI_AUTO_PARALLEL, context.ParallelMode.AUTO_PARALLEL)


def _apply_parallel_config(network: Any) -> None:
    """An AutoParallel network's configuration is the job's context while it compiles (as when it runs)."""
    apply = getattr(network, "_apply", None)
    if apply is not None and type(network).__name__ == "AutoParallel":
        apply()


def _rank() -> int:
    from tessel.communication import runtime

    return runtime.init().rank  # training runs on the runtime anyway (a world of 1 when nothing was launched)


def _check_dataset(dataset: Any) -> None:
    if not hasattr(dataset, "create_tuple_iterator") or not hasattr(dataset, "get_dataset_size"):
        raise ConfigurationError(
            f"Model needs a tessel.dataset Dataset (e.g. ds.MnistDataset(...).batch(32)), got {type(dataset).__name__}"
        )


def _serializable(dataset: Any) -> bool:
    check = getattr(dataset, "is_serializable", None)
    return bool(check()) if check is not None else False


def _epochs(dataset: Any) -> Iterator[Iterator]:
    """One iterator of batches (lists of numpy arrays) per epoch."""
    while True:
        yield iter(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))


def _sunk_epochs(dataset: Any, sink_size: int) -> Iterator[Iterator]:
    """Epochs of exactly sink_size steps, taken from the dataset repeated endlessly."""
    rows = dataset.create_tuple_iterator(num_epochs=-1, output_numpy=True)

    def take() -> Iterator:
        taken, empty_passes = 0, 0
        while taken < sink_size:
            try:
                batch = next(rows)
            except StopIteration:  # an epoch of the dataset ended; the next call starts another
                empty_passes += 1
                if empty_passes > 1:
                    raise ConfigurationError("Model.train: the dataset yields no batches") from None
                continue
            empty_passes, taken = 0, taken + 1
            yield batch

    while True:
        yield take()


def _fed_steps(step, batches: Iterator[Iterator]) -> Iterator:
    """One epoch's steps in feed mode (generators run lazily: after the epoch-begin callbacks). Reading each batch
    shows as data loading on the timeline."""
    rows = next(batches)
    while True:
        start = time.time_ns()
        batch = next(rows, None)
        if batch is None:
            return
        recorder = profiler.active()
        if recorder is not None:
            recorder.data_loading(start, time.time_ns(), batch)
        yield batch, lambda batch=batch: step(*batch)


def _sunk_steps(runner: rank_step.SinkRunner, steps: int) -> Iterator:
    """One epoch in sink mode: a single Execute on the daemon, each step's loss as the daemon reports it (the batch,
    which the daemon read, is not known here)."""
    for loss in runner.run(steps):
        yield None, lambda loss=loss: Tensor._wrap(np.array(loss, np.float32))


def _evaluates(callback: Any) -> bool:
    """Whether fit's evaluation runs a callback's eval hooks: MindSpore's skips its own callbacks but TimeMonitor."""
    from tessel.train.callback import TimeMonitor

    return isinstance(callback, TimeMonitor) or not type(callback).__module__.startswith("tessel.")


def _run_epochs(
    epochs: Iterator[Iterator], numbers: range, cb: CallbackParam, callbacks: list, evaluate: Any = None
) -> None:
    """The training loop proper: each epoch yields per step its batch (None where the daemon read it) and a thunk
    (running the step, or reading the loss a sunk epoch already computed on the daemon), with the callbacks around
    it. As MindSpore's, cb_params.train_dataset_element is the step's batch, a list of Tensors, from its
    on_train_step_begin on. `evaluate` (fit) runs after an epoch's steps, before on_train_epoch_end, and what it
    put in cb_params (metrics, eval_results) is gone after on_train_epoch_end."""
    run_context = RunContext(cb)
    for callback in callbacks:
        callback.on_train_begin(run_context)
    for number, steps in zip(numbers, epochs):
        cb["cur_epoch_num"] = number
        for callback in callbacks:
            callback.on_train_epoch_begin(run_context)
        for batch, run_step in steps:
            cb["cur_step_num"] += 1
            if batch is not None:
                cb["train_dataset_element"] = [Tensor._wrap(column) for column in batch]
            for callback in callbacks:
                callback.on_train_step_begin(run_context)
            cb["net_outputs"] = run_step()
            for callback in callbacks:
                callback.on_train_step_end(run_context)
            if run_context._stop_requested:
                break
        if evaluate is not None:
            evaluate()
        for callback in callbacks:
            callback.on_train_epoch_end(run_context)
        cb.pop("metrics", None)
        cb.pop("eval_results", None)
        if run_context._stop_requested:
            break
    for callback in callbacks:
        callback.on_train_end(run_context)
