"""Training wrappers: WithLossCell, WithEvalCell, TrainOneStepCell (a fused step), DistributedGradReducer,
MicroBatchInterleaved and GradAccumulation (MindSpore's semantics: the sum of the copies' or micro-batches'
losses; a train step over GradAccumulation scales the gradients by 1/micro_size, as MindSpore's
_TrainGradAccuStepCell does), and the pipeline wrappers PipelineCell (the sum of the micro-batches' losses) and
PipelineGradReducer."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from tessel import context
from tessel.common import rank_step
from tessel.common.compiled import Call, CompiledFunction, arg_names_of, rename_inputs
from tessel.common.tensor import Tensor
from tessel.common.tracing import SdkTrace, current
from tessel.communication import GlobalComm
from tessel.compiler import DataDependentError, Graph, apply, bucket_allreduce
from tessel.core.errors import ConfigurationError
from tessel.nn.cell import Cell
from tessel.nn.layers import positive_int
from tessel.ops import functional as F


class WithLossCell(Cell):
    """loss_fn(backbone(data), label)."""

    def __init__(self, backbone: Cell, loss_fn: Cell):
        super().__init__(auto_prefix=False)
        self._backbone, self._loss_fn = backbone, loss_fn

    def construct(self, data, label):
        return self._loss_fn(self._backbone(data), label)

    @property
    def backbone_network(self) -> Cell:
        return self._backbone


class WithEvalCell(Cell):
    """(loss, outputs, label) of a network and a loss function, for evaluation."""

    def __init__(self, network: Cell, loss_fn: Cell, add_cast_fp32: bool = False):
        super().__init__(auto_prefix=False)
        self._network, self._loss_fn, self.add_cast_fp32 = network, loss_fn, add_cast_fp32

    def construct(self, data, label):
        outputs = self._network(data)
        if self.add_cast_fp32:
            outputs = F.cast(outputs, "float32")
        return self._loss_fn(outputs, label), outputs, label


class FusedTrainStep:
    """Forward, backward and the optimizer update of a loss network as one compiled graph (`build_train_step`):
    one Execute per step, parameters and optimizer slots updated in place on the daemon.

    The gradient reduction follows the parallel mode (`rank_step.parallel_train_program`): under DATA_PARALLEL the
    step all-reduces gradients in buckets that start while the backward still runs; collectives the network calls
    itself (manual parallelism) are part of the graph either way. `sens` scales the gradients (loss scaling); the
    step returns the unscaled loss.
    """

    def __init__(self, network: Cell, optimizer, sens: float = 1.0, python_step: Any = None):
        self.network, self.optimizer, self.sens = network, optimizer, float(sens)
        # PYNATIVE_MODE: where the network's Python reads a tensor's value (if loss > 0:), the step runs as
        # `python_step` does (TrainOneStepCell.construct, step by step), from then on; see __call__.
        self.python_step, self.python_steps = python_step, False
        self.compiled = CompiledFunction(
            self._forward,
            f"train_{network.cls_name}",
            params_first=lambda: optimizer.parameters,
            arg_names=arg_names_of(network.construct),
            transform=self._transform,
            key_extra=_step_settings,
            partition=False,  # _transform partitions (rank_step.parallel_train_program)
        )
        self._checked: set[int] = set()  # engines on which the replicas were found identical
        self._partition = None  # semi-auto: this rank's partition (slices of parameters and batches)
        self._shards: dict = {}  # optimizer parallel: this rank's ParamShard per parameter key
        self._placed: tuple = ()  # (engine id, id of the shards) whose layouts the parameters took

    def _forward(self, *inputs: Any) -> Any:
        network, micro = accumulated(self.network)
        current().differentiated = True  # the train step differentiates this forward
        out = network(*inputs)
        loss = out[0] if isinstance(out, (tuple, list)) else out
        # MindSpore's _TrainGradAccuStepCell: the micro-batches' summed loss is differentiated with sens 1/micro; the
        # optimizer divides the gradients by its loss_scale (static loss scaling: sens=S with loss_scale=S).
        scale = self.sens / micro / self.optimizer.loss_scale
        return (loss * scale, loss) if scale != 1.0 else loss

    def _transform(self, graph: Graph, trace: SdkTrace) -> tuple[Graph, list]:
        if trace.feeders:
            raise ConfigurationError(
                "the network given to Model/TrainOneStepCell calls an optimizer itself; pass the loss network only"
            )
        opt = self.optimizer
        keys = [p.key for p in opt.parameters]
        whole = [p.key for p in opt.parameters if not p.parallel_optimizer]
        program, self._partition, self._shards = rank_step.parallel_train_program(
            graph,
            trace,
            keys,
            opt._rule,
            opt.groups,
            lambda: _sliced(opt.parameters),
            whole,
            {p.key: p.comm_fusion for p in opt.parameters},
            local=[p.key for p in opt.parameters if p.layerwise_parallel],
        )
        self._partition_state = program.state
        trace.feeders[opt.lr_key] = opt.rate_feed()
        trace.after_run.append(opt._advance)
        return rename_inputs(program.graph, opt.rename_map()), opt.slot_parameters()

    def prepare(self, *inputs: Any):
        """(compiled entry, call) for inputs like these, after the once-per-engine replica check.

        Semi-auto parallelism plans the GLOBAL network, so where each rank's dataset yields its own slice of the
        batch (full_batch=False, dataset_strategy) the step is traced on stand-ins of the global shape
        (`semi_auto.global_shape`) while the call still feeds this rank's slice."""
        from tessel.common.engine import engine

        eng = engine()
        stand_ins = rank_step.global_inputs(inputs)
        if stand_ins is None:
            entry, call = self.compiled.entry(inputs, {})
        else:
            entry, _ = self.compiled.entry(stand_ins, {})
            call = Call.of(inputs, {}, self.compiled.arg_names, eng.id)
        if eng.id not in self._checked:
            if rank_step.data_parallel():
                replicas = [p for p in self.optimizer.parameters if not p.layerwise_parallel]
                rank_step.check_replicas([(p.name, p.asnumpy()) for p in replicas])
            if self._partition is not None:
                self._install_partition(eng)
            self._checked.add(eng.id)
        if self._partition is None and self._shards and self._placed != (eng.id, id(self._shards)):
            # Optimizer parallel turned on (or changed) in this job: the blocks take their layouts before they run.
            self._place_shards(eng, {})
        self._placed = (eng.id, id(self._shards))
        return entry, call

    def _place_shards(self, eng, layouts: dict) -> None:
        """Give each parameter and its optimizer slots their layouts: the plan's (`layouts`, semi-auto), or under
        optimizer parallel the layout of this rank's block (slots; level3 parameters too), so that checkpoints
        gather them whole and the daemon receives only the block."""
        from tessel.compiler.optimizer_parallel import shard_layout
        from tessel.compiler.parallel import Layout

        opt, rank = self.optimizer, eng.runtime.rank
        for p, *slots in zip(opt.parameters, *opt._slots.values()):
            layout, shard = layouts.get(p.key), self._shards.get(p.key)
            block = None
            if shard is not None:
                base = layout if layout is not None else Layout.replicated(len(p.shape), eng.world_size)
                block = shard_layout(base, shard, rank)
                if block is None:
                    raise ConfigurationError(
                        f"optimizer parallel: the blocks of parameter {p.name!r} over ranks {list(shard.group)} are "
                        f"not a cut of its layout {base.describe()}, so checkpoints could not reassemble it; use "
                        "optimizer_weight_shard_size=-1 (hsdp(shard_size=-1))"
                    )
            for q in slots:
                if len(q.shape) < len(p.shape):  # a slot of one number per parameter (ASGD's eta_): never cut
                    continue
                if block is not None or layout is not None:
                    q.place(block if block is not None else layout, eng.id)
            stored = block if shard is not None and shard.weights_sharded else layout
            if stored is not None:
                p.place(stored, eng.id)
                if stored is not layout:
                    p._compute_layout = layout  # what the train step plans with (level3 stores only the block)
                    if layout is None:
                        p._zero_shard = shard  # other graphs of this job all-gather the block (DATA_PARALLEL)

    def _install_partition(self, eng) -> None:
        """Semi-auto: the parameters take the plan's layouts (their slots the same), and this rank's slices go to
        the daemon (with buffers shaped like them for state the optimizer starts from a constant)."""
        import numpy as np

        from tessel.common import parameter as P

        opt, plan = self.optimizer, self._partition.plan
        self._place_shards(eng, {key: plan.input_layout(key) for key in plan.parameters})
        for p, *slots in zip(opt.parameters, *opt._slots.values()):
            for q in slots:  # under pipeline parallel a slot lives on its parameter's stages (checkpoints read it)
                q._pipeline = p._pipeline if p._pipeline is not None else q._pipeline
        from tessel.parallel import planning

        planning.record(plan, list(opt.parameters), eng.runtime.rank)
        values: dict = {}
        renamed = opt.rename_map()
        # What the step keeps on the daemon: under pipeline parallel, this stage's parameters and slots only.
        kept = {renamed.get(spec.name, spec.name) for spec in self._partition_state}
        P.stage(eng, [q for q in (*opt.parameters, *opt.slot_parameters()) if q.key in kept], values)
        for spec in self._partition_state:
            name = renamed.get(spec.name, spec.name)
            if name not in values and spec.init is not None:
                values[name] = np.full(spec.shape, spec.init, spec.dtype.numpy)
        eng.daemon.put(eng.session, values)

    def before_run(self, feed: dict) -> None:
        """Semi-auto: replace the batch in `feed` by this rank's slices of it."""
        if self._partition is not None:
            feed.update(self._partition.slice_feeds(dict(feed)))

    def __call__(self, *inputs: Any) -> Tensor:
        if self.python_steps:
            return self.python_step(*inputs)
        try:
            entry, call = self.prepare(*inputs)
        except DataDependentError:
            if self.python_step is None or not _python_steps_allowed():
                raise
            self.python_steps = True  # as MindSpore's PYNATIVE_MODE, whose TrainOneStepCell runs its construct
            return self.python_step(*inputs)
        out = entry.run(call) if self._partition is None else _run_partitioned(entry, call, self)
        return out[1] if isinstance(out, tuple) else out  # (scaled loss, loss) when sens or micro-batches scale


def _python_steps_allowed() -> bool:
    """A fused step whose network reads tensor values in Python may run step by step instead: in PYNATIVE_MODE,
    alone or under DATA_PARALLEL without optimizer parallel (the step-by-step form reduces gradients whole)."""
    ctx = context.get_auto_parallel_context
    return (
        context.get_context("mode") == context.PYNATIVE_MODE
        and ctx("parallel_mode") in (context.ParallelMode.STAND_ALONE, context.ParallelMode.DATA_PARALLEL)
        and not ctx("enable_parallel_optimizer")
    )


def _sliced(parameters) -> dict:
    """The layouts of the parameters an earlier plan of the current job sliced (for a parameter optimizer parallel
    stores as a block, the layout the plan computes with)."""
    from tessel.common.engine import engine
    from tessel.common.partition import parameter_layouts
    from tessel.parallel import pipeline

    eng = engine()
    world = pipeline.mesh(eng.world_size, eng.runtime.rank).devices
    return parameter_layouts(parameters, world, eng.id, lambda p: getattr(p, "_compute_layout", None) or p.layout)


def _step_settings() -> tuple:
    """What a fused train step's graph depends on besides its inputs: a change retraces it."""
    ctx = context.get_auto_parallel_context
    rank_step.check_split_runs()
    return (
        rank_step.parallel_mode(),
        ctx("gradients_mean"),
        ctx("grad_accumulation_step"),
        ctx("enable_parallel_optimizer"),
        repr(ctx("parallel_optimizer_config")),
        ctx("gradient_fp32_sync"),
        ctx("loss_repeated_mean"),
        ctx("enable_alltoall"),
        rank_step.gradient_weight(),  # an uneven batch split's weight of this rank's gradients
    )


def accumulated(network: Cell) -> tuple[Cell, int]:
    """(the network a train step differentiates, its micro-batches): `network` and the micro_size of the
    GradAccumulation cell inside it, or, with set_auto_parallel_context(grad_accumulation_step=k) and none inside,
    `network` wrapped in GradAccumulation(network, k). The step scales its gradients by 1/micro-batches (MindSpore's
    _TrainGradAccuStepCell), fused or not."""
    micro = _micro_size(network)
    steps = context.get_auto_parallel_context("grad_accumulation_step")
    if steps > 1 and micro == 1:
        # One wrapper per (network, k): a new one per step would be traced, compiled and cached anew every step.
        wrappers = _accumulating.setdefault(network, {})
        if steps not in wrappers:
            wrappers[steps] = GradAccumulation(network, steps)
        return wrappers[steps], steps
    return network, micro


_accumulating: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # network -> {k: GradAccumulation(network, k)}


def _micro_size(network: Cell) -> int:
    """micro_size of the GradAccumulation cell inside `network` (1 without one)."""
    for _, cell in [("", network), *network.cells_and_names()]:
        if isinstance(cell, GradAccumulation):
            return cell.micro_size
    return 1


def _run_partitioned(entry, call, step: FusedTrainStep) -> Any:
    """Entry.run with the batch sliced for this rank (semi-auto parallelism)."""
    from tessel.common import parameter as P
    from tessel.common.compiled import host_array
    from tessel.common.engine import engine

    eng = engine()
    prog = entry.program(eng, call.batch_size())
    feed = {name: host_array(call.leaves[i]) for name, i in entry.data}
    P.stage(eng, entry.params, feed)
    for name, feeder in entry.feeders.items():
        feed[name] = feeder()
    step.before_run(feed)
    fetched = eng.execute(prog, feed, [*entry.host_names, *entry.print_names])
    P.updated_on_device(entry.assigned)
    for hook in entry.after_run:
        hook()
    entry.print_fetched(fetched)
    return entry.out_tree.unflatten([Tensor._wrap(fetched[n]) for n in entry.host_names])


class TrainOneStepCell(Cell):
    """One training step: loss, gradients (scaled by sens), gradient reduction, optimizer update; returns the loss,
    or with return_grad=True (loss, {parameter name: reduced gradient}) as MindSpore's.

    Called directly it runs as one fused graph on the daemon; with return_grad, or in a subclass that overrides
    construct, the step is traced (graph mode) or run step by step (PYNATIVE_MODE) like any cell.
    """

    def __init__(self, network: Cell, optimizer, sens: float | None = None, return_grad: bool = False):
        super().__init__(auto_prefix=False)
        from tessel.autograd import GradOperation

        if not isinstance(return_grad, bool):
            raise ConfigurationError(f"TrainOneStepCell: return_grad must be a bool, got {return_grad!r}")
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = GradOperation(get_by_list=True, sens_param=True)
        self.sens = 1.0 if sens is None else float(sens)  # None is MindSpore 2.x's default: 1.0
        if self.sens == 0.0:  # MindSpore refuses it too: every gradient would be zero, training nothing
            raise ConfigurationError("TrainOneStepCell: sens can not be 0; use 1.0 (or the loss scale)")
        self.return_grad = return_grad
        self.grad_reducer = DistributedGradReducer(self.weights)
        python_step = (lambda *inputs: Cell.__call__(self, *inputs)) if type(self) is TrainOneStepCell else None
        object.__setattr__(self, "_fused", FusedTrainStep(network, optimizer, self.sens, python_step))

    def construct(self, *inputs):
        from tessel.autograd import value_and_grad

        network, micro = accumulated(self.network)  # as the fused step: the micro-batches' gradients / micro_size
        scale = self.sens / micro

        def scaled(*args):  # the loss and its gradient from one forward (in PYNATIVE_MODE too: one BatchNorm update)
            loss = network(*args)
            return loss * scale, loss

        (_, loss), grads = value_and_grad(scaled, None, self.weights, has_aux=True)(*inputs)
        grads = self.grad_reducer(grads)
        loss = F.depend(loss, self.optimizer(grads))
        if self.return_grad:
            return loss, {p.name: g for p, g in zip(self.weights, grads)}
        return loss

    def _runs_fused(self) -> bool:
        return type(self).construct is TrainOneStepCell.construct and not self.return_grad

    def __call__(self, *inputs: Any) -> Any:
        if current() is None and self._runs_fused():
            return self._fused(*inputs)
        return super().__call__(*inputs)

    def _compiled_entry(self, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        if self._runs_fused() and not kwargs:
            return self._fused.prepare(*args)
        return super()._compiled_entry(args, kwargs)


class WithGradCell(Cell):
    """The gradients of the network's loss with respect to its trainable parameters (MindSpore's WithGradCell): the
    network's own output is the loss, or with `loss_fn` WithLossCell(network, loss_fn) computes it; `sens` scales
    the gradients' seed.

        >>> grads = nn.WithGradCell(net, nn.MSELoss())(x, y)
    """

    def __init__(self, network: Cell, loss_fn: Any = None, sens: Any = None):
        super().__init__(auto_prefix=False)
        from tessel.autograd import GradOperation
        from tessel.common.parameter import ParameterTuple

        self.network, self.loss_fn, self.sens = network, loss_fn, sens
        self.weights = ParameterTuple(network.trainable_params())
        self.grad = GradOperation(get_by_list=True, sens_param=sens is not None)
        self.network_with_loss = network if loss_fn is None else WithLossCell(network, loss_fn)
        self.network_with_loss.set_train()

    def construct(self, *inputs):
        grad = self.grad(self.network_with_loss, self.weights)
        return grad(*inputs) if self.sens is None else grad(*inputs, self.sens)


class ForwardValueAndGrad(Cell):
    """The network's output and its gradients in one call (MindSpore's ForwardValueAndGrad): with respect to the
    first input, every input (get_all), the weights (get_by_list) or both, as GradOperation gives them; with
    sens_param the last input is the output's sensitivity.

        >>> loss, (input_grads, weight_grads) = nn.ForwardValueAndGrad(net_with_loss, weights, True, True)(x, y)
    """

    def __init__(
        self, network: Any, weights: Any = None, get_all: bool = False, get_by_list: bool = False, sens_param=False
    ):
        super().__init__(auto_prefix=False)
        import types

        from tessel.autograd import GradOperation

        if not isinstance(network, (Cell, types.FunctionType, types.MethodType)):
            raise TypeError(
                "For 'ForwardValueAndGrad', the argument 'network' must be cell, function type or method type, but "
                f"got '{type(network)}'"
            )
        for name, value in (("get_all", get_all), ("get_by_list", get_by_list)):
            if not isinstance(value, bool):
                raise TypeError(
                    f"For 'ForwardValueAndGrad', the type of '{name}' must be bool, but got '{type(value)}'"
                )
        if get_by_list and not isinstance(weights, (tuple, list)):
            raise TypeError(
                "For 'ForwardValueAndGrad', when 'get_by_list' is set to True, the argument 'weights' must be "
                f"Parameters array, but got '{type(weights)}'"
            )
        self.network, self.weights = network, weights
        if isinstance(network, Cell):
            network.set_grad()
        self.get_by_list, self.sens_param = get_by_list, sens_param
        self.grad = GradOperation(get_all=get_all, get_by_list=get_by_list, sens_param=sens_param)

    def construct(self, *inputs):
        loss = self.network(*(inputs[:-1] if self.sens_param else inputs))
        grad = self.grad(self.network, self.weights) if self.get_by_list else self.grad(self.network)
        return loss, grad(*inputs)


class DynamicLossScaleUpdateCell(Cell):
    """MindSpore's dynamic loss scale update, run by TrainOneStepWithLossScaleCell: called with the scale Parameter
    and the step's overflow flag, it divides the scale by `scale_factor` (at least 1) after an overflow and multiplies
    it by `scale_factor` once `scale_window` steps passed since the last overflow or increase. Returns `overflow`."""

    def __init__(self, loss_scale_value: float, scale_factor: int, scale_window: int):
        super().__init__()
        from tessel.common.parameter import Parameter

        self.scale_window = Tensor(np.int32(positive_int("DynamicLossScaleUpdateCell", "scale_window", scale_window)))
        self.scale_factor = Tensor(np.float32(scale_factor))
        self.loss_scale_value = loss_scale_value
        self.cur_iter = Parameter(Tensor(np.int32(1)), name="current_iterator_step")
        self.last_overflow_iter = Parameter(Tensor(np.int32(0)), name="last_overflow_iterator_step")

    def get_loss_scale(self) -> float:
        return self.loss_scale_value

    def construct(self, loss_scale, overflow):
        lowered = F.maximum(loss_scale * F.reciprocal(self.scale_factor), 1.0)
        on_overflow = F.select(overflow, lowered, loss_scale)
        should_inc = F.less_equal(self.scale_window, self.cur_iter - self.last_overflow_iter)
        last = F.select(F.logical_or(overflow, should_inc), self.cur_iter, self.last_overflow_iter)
        F.assign(self.last_overflow_iter, last)
        grow = F.logical_and(should_inc, F.logical_not(overflow))
        F.assign(loss_scale, F.select(grow, on_overflow * self.scale_factor, on_overflow))
        F.assign(self.cur_iter, self.cur_iter + 1)
        return overflow


class FixedLossScaleUpdateCell(Cell):
    """A fixed loss scale for TrainOneStepWithLossScaleCell: the scale never changes; returns `overflow`."""

    def __init__(self, loss_scale_value: float):
        super().__init__()
        self.loss_scale_value = loss_scale_value

    def get_loss_scale(self) -> float:
        return self.loss_scale_value

    def construct(self, loss_scale, overflow):
        return overflow


class TrainOneStepWithLossScaleCell(TrainOneStepCell):
    """A train step with loss scaling and overflow checks (MindSpore's): the gradients of loss * scale are divided
    by the scale and reduced; when any is not finite the step's update is skipped (the weights, the optimizer's state
    and its step count stay as they were), and `scale_sense` (an update cell such as DynamicLossScaleUpdateCell, or a
    Tensor of shape () or (1,) that set_sense_scale changes) gives and updates the scale. Returns (loss, overflow,
    the scale the step used). In a graph the skipped update is a select, so it runs as one program; MindSpore runs
    this cell on Ascend and GPU only."""

    def __init__(self, network: Cell, optimizer, scale_sense):
        super().__init__(network, optimizer, sens=None)
        from tessel.common.parameter import Parameter

        self.loss_scaling_manager = None
        if isinstance(scale_sense, Cell):
            self.loss_scaling_manager = scale_sense
            self.scale_sense = Parameter(Tensor(np.float32(scale_sense.get_loss_scale())), name="scale_sense")
        elif isinstance(scale_sense, Tensor):
            if tuple(scale_sense.shape) not in ((), (1,)):
                raise ConfigurationError(
                    f"TrainOneStepWithLossScaleCell: scale_sense must have shape () or (1,), got {scale_sense.shape}"
                )
            self.scale_sense = Parameter(scale_sense, name="scale_sense")
        else:
            raise ConfigurationError(
                "TrainOneStepWithLossScaleCell: scale_sense must be a Cell or a Tensor, got "
                f"{type(scale_sense).__name__}"
            )

    def construct(self, *inputs):
        from tessel.amp import all_finite
        from tessel.autograd import value_and_grad

        network, micro = accumulated(self.network)
        scaling_sens = self.scale_sense

        def scaled(*args):
            loss = network(*args)
            return loss * F.cast(scaling_sens, loss.dtype) / micro, loss

        (_, loss), grads = value_and_grad(scaled, None, self.weights, has_aux=True)(*inputs)
        inverse = F.reciprocal(scaling_sens)
        grads = self.grad_reducer(tuple(g * F.cast(inverse, g.dtype) for g in grads))
        cond = F.logical_not(all_finite(grads))  # the reduced gradients: every rank decides alike
        overflow = self.process_loss_scale(cond)
        trace = current()
        if trace is None:
            object.__setattr__(self, "_gated", False)
            if not overflow:
                self.optimizer(grads)
        else:  # one program: the update's assigns keep the old values where the step overflowed
            object.__setattr__(self, "_gated", True)
            gate, trace.update_gate = trace.update_gate, trace.to_symbolic(F.logical_not(overflow))
            try:
                self.optimizer(grads)
            finally:
                trace.update_gate = gate
        return loss, cond, scaling_sens

    def process_loss_scale(self, overflow):
        """The update cell's verdict on the step (it updates the scale), or `overflow` without one."""
        if self.loss_scaling_manager is None:
            return overflow
        return self.loss_scaling_manager(self.scale_sense, overflow)

    def set_sense_scale(self, sens: Tensor) -> None:
        """A new loss scale (a Tensor of the scale's shape)."""
        if not isinstance(sens, Tensor):
            raise ConfigurationError(f"TrainOneStepWithLossScaleCell: sens must be a Tensor, got {type(sens).__name__}")
        self.scale_sense.set_data(sens)

    def __call__(self, *inputs: Any) -> Any:
        out = super().__call__(*inputs)
        if current() is None and self.__dict__.get("_gated") and bool(out[1]):
            # the program counted the skipped update as a step (the count lives on the host): take it back
            self.optimizer.__dict__["_step"] -= 1
        return out


class DistributedGradReducer(Cell):
    """Sum (or average, mean=True) gradients over the data-parallel group; the identity on one device.

    Inside a traced step it adds one AllReduce per gradient; called on gradients held by the daemon (a custom
    loop: `grads = grad_reducer(grads)` after `value_and_grad`) it runs one compiled program that fuses them into
    buckets (see rank_step.bucket_bytes), so the gradients never come back to the client.
    """

    def __init__(
        self,
        parameters: Any,
        mean: bool | None = None,
        degree: int | None = None,
        fusion_type: int = 1,
        group: str = GlobalComm.WORLD_COMM_GROUP,
    ):
        super().__init__(auto_prefix=False)
        self.mean = context.get_auto_parallel_context("gradients_mean") if mean is None else mean
        if isinstance(fusion_type, bool) or not isinstance(fusion_type, int) or fusion_type < 0:
            raise ConfigurationError(
                f"DistributedGradReducer: fusion_type must be an int >= 0 (0: each gradient reduced alone, as "
                f"MindSpore's fusion attribute), got {fusion_type!r}"
            )
        self.degree, self.group, self.fusion_type = degree, group, fusion_type
        object.__setattr__(self, "_parameters", tuple(parameters))
        object.__setattr__(self, "_checked", set())
        object.__setattr__(
            self,
            "_compiled",
            CompiledFunction(
                lambda *grads: ((), self._reduce(grads)),
                "grad_reducer",
                device_result=True,
                symbolic_batch=False,
                arg_names=(),
                transform=lambda graph, trace: (bucket_allreduce(graph, rank_step.bucket_bytes()), ()),
            ),
        )

    def _reduce(self, grads: Any) -> tuple:
        from tessel.common.tracing import current as trace
        from tessel.ops.comm import group_ranks

        ranks = group_ranks(self.group)
        scale = 1.0 / (self.degree or len(ranks)) if self.mean else 1.0
        # As MindSpore's reducer: a layerwise_parallel parameter's gradient stays this rank's own.
        local = [getattr(p, "layerwise_parallel", False) for p in self._parameters]
        out = []
        for i, g in enumerate(grads):
            if i < len(local) and local[i]:
                out.append(g)
                continue
            symbolic = trace().to_symbolic(g)
            summed = apply("AllReduce", symbolic, reduce_op="sum", group=ranks, fusion=self.fusion_type)
            out.append(Tensor._wrap_symbolic(summed * scale if scale != 1.0 else summed))
        return tuple(out)

    def __call__(self, grads: Any) -> Any:
        from tessel.ops.comm import group_ranks

        grads = tuple(grads)
        if len(group_ranks(self.group)) == 1 or not grads:
            return grads
        if current() is not None:
            return self._reduce(grads)
        from tessel.common.engine import engine

        eng = engine()
        if eng.id not in self._checked:
            replicas = [p for p in self._parameters if not getattr(p, "layerwise_parallel", False)]
            rank_step.check_replicas([(p.name, p.asnumpy()) for p in replicas])
            self._checked.add(eng.id)
        return tuple(self._compiled(*grads)[1])


class MicroBatchInterleaved(Cell):
    """Multi-copy parallelism (MindSpore's `nn.MicroBatchInterleaved`): every input is split on dim 0 into
    `interleave_num` copies, the network runs on each copy independently, and the result is the **sum** of the
    copies' outputs (as MindSpore measures: twice the loss with two copies). The network must return one Tensor.

    Copy i takes rows i, i + k, i + 2k, ... (k = interleave_num), a StridedSlice on dim 0 in the traced graph. For
    the usual outputs (a mean loss) the sum equals that of MindSpore's contiguous split; ops that couple the rows
    of a copy (BatchNorm's batch statistics) see other rows than in MindSpore. What the interleaved split buys: any
    data-parallel cut of the batch cuts every copy in place: each rank's rows of a copy are its own rows' i-th of
    each k, so SEMI_AUTO/AUTO_PARALLEL partition each copy with no communication, DATA_PARALLEL splits each rank's
    batch the same way, and N ranks compute exactly what one device computes with the same k. The copies share no
    op until the final sum, forward and backward, so the rank program's schedule overlaps one copy's
    communication with another's computation.

        >>> net = nn.MicroBatchInterleaved(nn.WithLossCell(backbone, nn.CrossEntropyLoss()), 2)
        >>> ms.Model(net, optimizer=nn.SGD(backbone.trainable_params(), 1e-2)).train(10, dataset)
    """

    def __init__(self, network: Cell, interleave_num: int = 2):
        super().__init__(auto_prefix=False)
        name = f"MicroBatchInterleaved({getattr(network, 'cls_name', type(network).__name__)})"
        if not isinstance(network, Cell):
            raise ConfigurationError(f"{name}: network must be a Cell, got {type(network).__name__}")
        if isinstance(interleave_num, bool) or not isinstance(interleave_num, int):
            raise TypeError(f"{name}: interleave_num must be an int, got {type(interleave_num).__name__}")
        if interleave_num < 1:
            raise ConfigurationError(
                f"{name}: interleave_num must be an int >= 1 (the number of copies the batch is split into), got "
                f"{interleave_num!r}; use e.g. interleave_num=2"
            )
        self.network, self.interleave_num = network, interleave_num
        names = arg_names_of(network.construct)
        if names:  # the graph's inputs keep the network's argument names (explain, save_graphs, errors)
            object.__setattr__(self, "construct", _named(self._split_and_sum, names))

    def construct(self, *inputs):
        return self._split_and_sum(*inputs)

    def _split_and_sum(self, *inputs):
        k = self.interleave_num
        cuts = [_import_cut(x) for x in inputs]
        for index, (x, cut) in enumerate(zip(inputs, cuts)):
            _check_splits(self, index, x, k, cut)
        total = None
        for i in range(k):
            out = self.network(*(_copy(x, i, k, cut) for x, cut in zip(inputs, cuts)))
            if not isinstance(out, Tensor):
                raise ConfigurationError(
                    f"{self._name()}: the network returns {_describe_output(out)}, not a single Tensor; the copies' "
                    "outputs are summed, so the wrapped network must return one Tensor (wrap the backbone with its "
                    "loss: nn.MicroBatchInterleaved(nn.WithLossCell(net, loss_fn), k))"
                )
            total = out if total is None else total + out
        return total

    def _name(self) -> str:
        return f"MicroBatchInterleaved({self.network.cls_name})"


def _named(function: Any, names: list[str]) -> Any:
    """`function(*inputs)` with a signature naming its positional arguments `names`."""
    import inspect

    def construct(*inputs):
        return function(*inputs)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    construct.__signature__ = inspect.Signature([inspect.Parameter(n, kind) for n in names])
    return construct


def _check_splits(cell: MicroBatchInterleaved, index: int, x: Any, k: int, cut: tuple | None) -> None:
    if not isinstance(x, Tensor) or x.ndim == 0:
        return
    rows = x.shape[0]
    if not isinstance(rows, int):  # a symbolic batch: the trace is repeated with the real one
        raise ConfigurationError(f"{cell._name()}: needs the batch size to split the batch")
    parts = k * (cut[0] if cut else 1)
    if rows % parts == 0:
        return
    lower, upper = rows // parts * parts, -(-rows // parts) * parts
    suggestion = f"{lower} or {upper}" if lower else f"{upper}"
    where = f" on each of the {cut[0]} slices of the batch that dataset_strategy gives the ranks" if parts != k else ""
    raise ConfigurationError(
        f"{cell._name()}: input {index} has shape {tuple(x.shape)}; its batch dim {rows} does not split into "
        f"interleave_num={k} equal copies{where}. Use a batch size divisible by {parts} (e.g. {suggestion}), and "
        "dataset.batch(..., drop_remainder=True) so that the last batch is not smaller"
    )


def _copy(x: Any, i: int, k: int, cut: tuple | None) -> Any:
    """Rows i, i + k, ... of a Tensor (StridedSlice on dim 0); anything else as it is. Under SEMI_AUTO/AUTO
    parallelism a copy of a data input is cut as the dataset cuts it (`cut`): it stays on the ranks that read it."""
    if k == 1 or not isinstance(x, Tensor) or x.ndim == 0:
        return x
    from tessel.ops.primitive import StridedSlice

    rest = x.ndim - 1
    slicer = StridedSlice()
    if cut is not None:
        slicer.shard((cut,))
    return slicer(x, (i, *(None,) * rest), (None,) * (rest + 1), (k, *(1,) * rest))


def _import_cut(x: Any) -> tuple | None:
    """How the dataset import cuts `x` when `x` is a data input of a SEMI_AUTO/AUTO_PARALLEL trace: (1, ..., 1)
    with full_batch, that column's dataset_strategy, None otherwise (data_parallel import: dim 0 over every device,
    which is what an op without a strategy gets anyway)."""
    trace = current()
    if trace is None or not isinstance(x, Tensor) or x.ndim == 0:
        return None
    if context.get_auto_parallel_context("parallel_mode") not in (
        context.ParallelMode.SEMI_AUTO_PARALLEL,
        context.ParallelMode.AUTO_PARALLEL,
    ):
        return None
    from tessel.compiler import SymbolicTensor

    symbolic = trace.to_symbolic(x)
    if not isinstance(symbolic, SymbolicTensor):
        return None
    parameters = {sym.value for _, sym in trace.params.values()}
    data = [v for v in trace.builder.inputs if v not in parameters and v.name not in trace.feeders]
    if symbolic.value not in data:
        return None
    dataset = context.get_auto_parallel_context("dataset_strategy")
    if context.get_auto_parallel_context("full_batch") or dataset == "full_batch":
        return (1,) * x.ndim
    if isinstance(dataset, (tuple, list)):
        column = data.index(symbolic.value)
        return tuple(dataset[column]) if column < len(dataset) else None
    return None


def _describe_output(out: Any) -> str:
    if isinstance(out, (tuple, list)):
        shapes = ", ".join(str(tuple(o.shape)) if isinstance(o, Tensor) else type(o).__name__ for o in out)
        return f"a {type(out).__name__} of {len(out)} ({shapes})"
    return f"a {type(out).__name__}"


class PipelineCell(Cell):
    """Micro-batches for pipeline parallel (MindSpore's `nn.PipelineCell`; `mindspore.parallel.nn.Pipeline` is the
    same with its newer name): every input is split on dim 0 into `micro_size` micro-batches, the network runs on
    each, and the result is the **sum** of their outputs (MindSpore's `PipelineCell.construct` adds them), so the
    gradients are summed over the micro-batches too. Under `pipeline_stages` > 1 the micro-batches flow through
    the stages as the pipeline schedule says (see tessel.parallel.pipeline); on one stage it computes the same sum.

    Micro-batch i takes rows i, i + micro_size, ... (as MicroBatchInterleaved's copies: any data-parallel cut of
    the batch then cuts every micro-batch in place); for a loss that averages over rows the sum equals that of
    MindSpore's contiguous split. `stage_config` sets `pipeline_stage` on cells by their names in `network`.

        >>> net_with_loss = nn.PipelineCell(nn.WithLossCell(net, nn.CrossEntropyLoss()), 4)
        >>> net_with_loss = nn.PipelineCell(loss_net, 4, stage_config={"_backbone.layer1": 0, "_backbone.layer2": 1})
    """

    def __init__(self, network: Cell, micro_size: int, stage_config: dict | None = None, segment_config=None):
        super().__init__(auto_prefix=False)
        kind = type(self).__name__
        if not isinstance(network, Cell):
            raise TypeError(
                f"For '{kind}', the argument 'network' must cell type, but got the type : {type(network).__name__}."
            )
        if isinstance(micro_size, bool) or not isinstance(micro_size, int):
            raise TypeError(
                f"For '{kind}', the argument 'micro_size' must be integer, but got the type : "
                f"{type(micro_size).__name__}."
            )
        if micro_size <= 0:
            raise ValueError(f"For '{kind}', the argument 'micro_size' must be large than 0, but got {micro_size}.")
        self.network, self.micro_size = network, micro_size
        if stage_config:
            _apply_stage_config(kind, network, stage_config)
        if segment_config and any(segment_config.values()):
            from tessel.common.support import not_supported_yet

            raise not_supported_yet(
                f"{kind}(segment_config=...)",
                "segments belong to the zero_bubble_v scheduler; use pipeline_scheduler 'zero_bubble_h1'",
            )
        names = arg_names_of(network.construct)
        if names:  # the graph's inputs keep the network's argument names (explain, save_graphs, errors)
            object.__setattr__(self, "construct", _named(self._micro_batches, names))

    def construct(self, *inputs):
        return self._micro_batches(*inputs)

    def _micro_batches(self, *inputs):
        k, trace = self.micro_size, current()
        cuts = [_import_cut(x) for x in inputs]
        for index, (x, cut) in enumerate(zip(inputs, cuts)):
            self._check_split(index, x, cut)
        if trace is not None:
            for path, cell in self.network.cells_and_names():
                trace.cell_paths.setdefault(id(cell), path or self.network.cls_name)
        total = None
        for i in range(k):
            if trace is None:
                out = self.network(*(_copy(x, i, k, cut) for x, cut in zip(inputs, cuts)))
            else:
                with trace.micro_batch(i):
                    out = self.network(*(_copy(x, i, k, cut) for x, cut in zip(inputs, cuts)))
            if not isinstance(out, Tensor):
                raise ConfigurationError(
                    f"{type(self).__name__}({self.network.cls_name}): the network returns {_describe_output(out)}, "
                    "not a single Tensor; the micro-batches' outputs are summed, so wrap the backbone with its loss: "
                    f"nn.{type(self).__name__}(nn.WithLossCell(net, loss_fn), micro_size)"
                )
            total = out if total is None else total + out
        return total

    def _check_split(self, index: int, x: Any, cut: tuple | None) -> None:
        if not isinstance(x, Tensor) or x.ndim == 0:
            return
        rows, k = x.shape[0], self.micro_size
        if not isinstance(rows, int):
            raise ConfigurationError(f"{type(self).__name__}: needs the batch size to split the batch")
        parts = k * (cut[0] if cut else 1)
        if rows % parts == 0:
            return
        lower, upper = rows // parts * parts, -(-rows // parts) * parts
        where = f" on each of the {cut[0]} slices the dataset_strategy gives the ranks" if parts != k else ""
        raise ConfigurationError(
            f"{type(self).__name__}({self.network.cls_name}): input {index} has shape {tuple(x.shape)}; its batch "
            f"dim {rows} does not split into micro_size={k} equal micro-batches{where}. Fix: a batch size divisible "
            f"by {parts} (e.g. {f'{lower} or ' if lower else ''}{upper}), and dataset.batch(..., "
            "drop_remainder=True) so that the last batch is not smaller"
        )

    def shard(self, in_strategy=None, out_strategy=None, parameter_plan=None, device="Ascend", level=0):
        raise ValueError(f"For '{type(self).__name__}', no 'shard' on '{type(self).__name__}' is allowed.")


def _apply_stage_config(kind: str, network: Cell, stage_config: dict) -> None:
    """Set pipeline_stage on the cells stage_config names (paths in `network`, as cells_and_names gives them)."""
    left = dict(stage_config)
    for path, cell in network.cells_and_names():
        if path in left:
            cell.pipeline_stage = left.pop(path)
    if str(network) in left:
        network.pipeline_stage = left.pop(str(network))
    if left:
        names = [path for path, _ in network.cells_and_names() if path]
        raise KeyError(
            f"For '{kind}', the argument 'stage_config' : {left} is not found in 'network'; its cells are {names}"
        )


class PipelineGradReducer(Cell):
    """The gradients of a pipeline-parallel step, ready for the optimizer (MindSpore's `PipelineGradReducer`):
    tessel's pipeline step already sums every micro-batch's gradients and reduces them over the stage's data-
    parallel ranks (and over the stages sharing a parameter), so this divides them by `scale_sense` (loss scaling)
    and is the identity otherwise.

        >>> pp_grad_reducer = nn.PipelineGradReducer(optimizer.parameters)
        >>> grads = pp_grad_reducer(grads)
    """

    def __init__(self, parameters: Any, scale_sense: float = 1.0, opt_shard: bool | None = None):
        super().__init__(auto_prefix=False)
        if opt_shard:
            from tessel.common.support import not_supported_yet

            raise not_supported_yet(
                "PipelineGradReducer(opt_shard=True)", "pipeline stages do not shard their optimizer state yet"
            )
        object.__setattr__(self, "_parameters", tuple(parameters))
        self.scale_sense = float(scale_sense)

    def construct(self, grads):
        if self.scale_sense == 1.0:
            return tuple(grads)
        return tuple(g * (1.0 / self.scale_sense) for g in grads)

    def __call__(self, grads: Any) -> Any:
        if current() is None and self.scale_sense == 1.0:
            return tuple(grads)  # eagerly, on gradients held by the daemon: nothing to do
        return super().__call__(grads)


class GradAccumulation(Cell):
    """Split every input along dim 0 into `micro_size` micro-batches, run the network on each and return the sum
    of their losses (MindSpore's `mindspore.parallel.nn.GradAccumulation` / `nn.GradAccumulationCell`).

    A train step (Model.train, TrainOneStepCell) over it accumulates the micro-batches' gradients, each from its
    own backward pass, scales them by 1/micro_size (MindSpore's _TrainGradAccuStepCell) and then reduces them
    once and updates once: one step on the whole batch.

    >>> net = GradAccumulation(nn.WithLossCell(backbone, loss_fn), 4)
    """

    def __init__(self, network: Cell, micro_size: int):
        super().__init__(auto_prefix=False)
        if not isinstance(network, Cell):
            raise TypeError(
                f"For 'GradAccumulation', the argument 'network' must cell type, but got the type : {type(network)}."
            )
        if isinstance(micro_size, bool) or not isinstance(micro_size, int):
            raise TypeError(
                f"For 'GradAccumulation', the argument 'micro_size' must be integer, but got the type : "
                f"{type(micro_size)}."
            )
        if micro_size <= 0:
            raise ValueError(
                f"For 'GradAccumulation', the argument 'micro_size' must be large than 0, but got {micro_size}."
            )
        self.network, self.micro_size = network, micro_size

    def construct(self, *inputs):
        from tessel.common.tracing import apply_op

        k, total = self.micro_size, None
        for i in range(k):
            parts = []
            for x in inputs:
                if isinstance(x, Tensor) and x.ndim >= 1:
                    n = x.shape[0]
                    if isinstance(n, int) and n % k:
                        raise ConfigurationError(
                            f"GradAccumulation: the batch dim {n} does not split into micro_size={k} micro-batches"
                        )
                    x = x[i * (n // k) : (i + 1) * (n // k)]
                parts.append(x)
            out = self.network(*parts)
            if current() is not None and k > 1:
                out = apply_op("MicroBatchEnd", out, index=i, count=k)
            total = out if total is None else total + out
        return total


GradAccumulationCell = GradAccumulation
