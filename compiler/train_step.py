"""The fused train step: forward, backward and optimizer update compiled into one graph, run with no copies.

`build_train_step(forward, params, optimizer)` extends a traced forward graph (output 0 = the loss) with its
gradient and the optimizer's update, written as `Assign`s to the parameters and optimizer slots. The learning
rate is an input, so schedules never recompile.

`TrainStep` runs it on a CpuCompute: every parameter and slot lives in two numpy buffers; one IOBinding reads
buffer A and writes the new values into B, the other reads B and writes A, and each step flips between them.
So updates land in place, in memory the caller can read (`step.state[name]`), with no copy and no Python-side
arithmetic.

    >>> program = build_train_step(traced.graph, ["w1", "b1"], SGD(learning_rate=0.1))
    >>> step = TrainStep(program, CpuCompute(2), {"w1": w1, "b1": b1})
    >>> loss = step(x=batch_x, y=batch_y)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tessel.compiler import registry
from tessel.compiler.autodiff import gradients
from tessel.compiler.builder import GraphBuilder, SymbolicTensor, apply, apply_all
from tessel.compiler.dtypes import DType
from tessel.compiler.errors import ShapeInferenceError
from tessel.compiler.ir import Graph, Value
from tessel.compiler.lower_onnx import assign_output_name, model_bytes, output_names
from tessel.compiler.optimizer_parallel import (
    ParamShard,
    gather_block,
    local_block,
    mirror_of,
    read_value,
    reduce_gradient,
    regather_for_backward,
    start_reductions_early,
)
from tessel.compiler.optimizers import UNGROUPED, Optimizer, ParameterGroups
from tessel.core.errors import ConfigurationError, NotSupportedYetError

LEARNING_RATE = "learning_rate"


@dataclass(frozen=True)
class StateSpec:
    """A buffer the train step keeps between steps: a parameter or an optimizer slot (with its initial value)."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    init: float | None  # None for parameters (the caller supplies them)


@dataclass(frozen=True)
class TrainProgram:
    """A compiled-once train step: the graph plus which inputs are data, state and the learning rate."""

    graph: Graph
    data: tuple[str, ...]
    state: tuple[StateSpec, ...]
    outputs: tuple[str, ...]  # loss first, then the forward graph's other outputs
    optimizer: Optimizer


def build_train_step(
    forward: Graph,
    params: Sequence[str],
    optimizer: Optimizer,
    groups: ParameterGroups = UNGROUPED,
    deferred_gradients: bool = False,
    shards: Mapping[str, ParamShard] | None = None,
) -> TrainProgram:
    """Extend `forward` (loss = output 0) with gradients of `params` and the optimizer update.

    Inputs that `forward` assigns itself (BatchNorm moving statistics) become state too, kept but not trained.
    With `deferred_gradients` the gradients are one GradientOf node, for a later pass to differentiate (a
    pipeline stage differentiates each micro-batch on its own); it takes no `shards` and no MicroBatchEnd marks.
    `shards` (optimizer parallel, see compiler/optimizer_parallel.py) names the parameters whose gradient this
    rank reduce-scatters and whose block of the update (and optimizer state) it owns; level3 parameters are
    already blocks in `forward` (shard_forward).

    A graph whose loss sums micro-batch losses marked by MicroBatchEnd (GradAccumulation), or that shards
    parameters, takes each gradient with respect to what the computation reads (a Mirror's output) and reduces
    it explicitly, once per step, after the micro-batches' gradients are summed (each micro-batch's separately
    for level2 shards).
    """
    shards = dict(shards or {})
    builder = GraphBuilder.extend(forward)
    lr = builder.add_input(LEARNING_RATE, groups.rate_shape, DType.float32)
    values = [forward.input(n) for n in params]
    loss = SymbolicTensor(builder, forward.outputs[0])
    # one rate for all: plain SGD seeds the backward pass with it (see compiler/optimizers.py)
    fold = optimizer.folds_learning_rate() and _full_precision(forward) and not groups.rate_count
    sens = apply("OnesLike", loss) * lr.astype(loss.dtype) if fold else None
    reductions: set[Value] = set()
    if deferred_gradients:
        if shards or micro_batch_ends(forward):
            raise NotSupportedYetError(
                "not supported yet: pipeline parallel with optimizer parallel (enable_parallel_optimizer) or "
                "GradAccumulation, the pipeline stages do not shard their optimizer state or accumulate micro-batches "
                "of their own yet; PipelineCell already sums its micro-batches' gradients"
            )
        seed = [] if sens is None else [sens]
        wrt = [SymbolicTensor(builder, v) for v in values]
        grads = [g.value for g in apply_all("GradientOf", loss, *wrt, *seed, seeded=bool(seed))]
    elif shards or micro_batch_ends(forward):
        seed = None if sens is None else sens.value
        grads = _reduced_gradients(builder, forward, params, loss.value, seed, shards, reductions)
    else:
        grads = gradients(builder, loss.value, values, sens=None if sens is None else sens.value)
    # State = trained parameters, plus inputs the forward graph itself assigns (BatchNorm's moving statistics).
    written = (registry.written(n) for n in forward.nodes)
    assigned = list(dict.fromkeys(v.name for v in written if v is not None and v.name not in params))
    state = [StateSpec(n, _static(v.shape, n), v.dtype, None) for n, v in zip(params, values)]
    state += [StateSpec(n, _static(forward.input(n).shape, n), forward.input(n).dtype, None) for n in assigned]

    glob = {}
    for slot in optimizer.global_slots():
        name = f"optimizer/{slot.name}"
        glob[slot.name] = builder.add_input(name, (), DType.float32)
        state.append(StateSpec(name, (), DType.float32, slot.init))
    for name, value, grad in zip(params, values, grads):
        whole, g = SymbolicTensor(builder, value), SymbolicTensor(builder, grad)
        shard = shards.get(name)
        p = whole if shard is None or shard.weights_sharded else local_block(whole, shard)
        slots = {}
        for slot in optimizer.slots():
            shape, dtype = ((), DType.float32) if slot.scalar else (p.shape, value.dtype)
            slots[slot.name] = builder.add_input(f"{name}/{slot.name}", shape, dtype)
            state.append(StateSpec(f"{name}/{slot.name}", _static(shape, name), dtype, slot.init))
        rate, decay = groups.rate(lr, name).astype(value.dtype), groups.decay(name, optimizer.weight_decay)
        if fold:
            new_p, new_slots = optimizer.update_scaled(p, g, rate, decay), {}
        else:
            new_p, new_slots = optimizer.update(p, g, slots, glob, rate, decay)
        if shard is not None and not shard.weights_sharded:
            new_p = gather_block(new_p, shard)
        apply("Assign", whole, new_p)
        for slot_name, new in new_slots.items():
            apply("Assign", slots[slot_name], new)
    for slot_name, new in optimizer.update_globals(glob).items():
        apply("Assign", glob[slot_name], new)

    graph = builder.build(forward.outputs, f"{forward.name}_train")
    if shards:
        graph = regather_for_backward(graph, len(forward.nodes), shards)
        graph = start_reductions_early(graph, reductions)
    state_names = {s.name for s in state} | {LEARNING_RATE}
    data = tuple(v.name for v in graph.inputs if v.name not in state_names)
    outputs = tuple(output_names(graph)[: len(forward.outputs)])
    return TrainProgram(graph, data, tuple(state), outputs, optimizer)


def micro_batch_ends(forward: Graph) -> list[Value]:
    """The micro-batch losses (MicroBatchEnd outputs) the loss is summed from, in micro-batch order."""
    ends = [n for n in forward.nodes if n.op == "MicroBatchEnd"]
    return [n.outputs[0] for n in sorted(ends, key=lambda n: n.attrs["index"])]


def _reduced_gradients(builder, forward: Graph, params, loss: Value, sens: Value | None, shards, reductions) -> list:
    """Each parameter's gradient, reduced: with respect to what the computation reads of it (read_value), summed
    over the micro-batches, then reduce-scattered (a shard: reduce_gradient) or all-reduced over its Mirror's group
    (what the Mirror's own gradient would do, marked for bucketing). The reduce-scatters' outputs (and the
    all-reduces after them) are added to `reductions`."""
    reads = [read_value(forward, n, shards.get(n)) for n in params]
    ends = micro_batch_ends(forward)
    if ends:
        # Each micro-batch's cotangent, then its own backward pass: the micro-batches' gradients meet only here.
        seeds = gradients(builder, loss, ends, sens)
        per_micro = [gradients(builder, end, reads, seed) for end, seed in zip(ends, seeds)]
    else:
        per_micro = [gradients(builder, loss, reads, sens)]
    out = []
    for i, name in enumerate(params):
        shard, parts = shards.get(name), [SymbolicTensor(builder, grads[i]) for grads in per_micro]
        if shard is not None:
            each = parts if shard.level == "level2" else [_sum(parts)]
            blocks = [reduce_gradient(g, shard, reductions) for g in each]
            out.append(_sum(blocks).value)
            continue
        total = _sum(parts)
        mirror = mirror_of(forward, name)
        if mirror is not None and len(mirror.attrs["group"]) > 1:
            reduce = "mean" if mirror.attrs["mean"] else "sum"
            group, fusion = mirror.attrs["group"], mirror.attrs["fusion"]
            if mirror.attrs["fp32_sync"] and total.dtype == DType.float16:
                total = apply("AllReduce", total.astype(DType.float32), reduce_op=reduce, group=group)
                total = total.astype(DType.float16)
            else:
                total = apply("AllReduce", total, reduce_op=reduce, group=group, fusion=fusion)
        out.append(total.value)
    return out


def _sum(parts: list[SymbolicTensor]) -> SymbolicTensor:
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _full_precision(graph: Graph) -> bool:
    """No half-precision value anywhere: gradients pre-scaled by a small learning rate could underflow in one."""
    return not any(v.dtype == DType.float16 for n in graph.nodes for v in (*n.inputs, *n.outputs))


def _static(shape, name: str) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in shape):
        raise ShapeInferenceError(f"parameter {name!r} has symbolic shape {shape}; parameters need static shapes")
    return tuple(shape)


class TrainStep:
    """Runs a TrainProgram step after step on one compute plugin, keeping state in double-buffered numpy arrays."""

    def __init__(self, program: TrainProgram, compute, params: Mapping[str, np.ndarray], learning_rate=None):
        self.program, self.compute = program, compute
        self.executable = compute.compile(model_bytes(program.graph))
        outputs = set(self.executable.output_names)
        self._buffers: dict[str, list[np.ndarray]] = {}
        for spec in program.state:
            first = self._initial(spec, params)
            written = assign_output_name(spec.name) in outputs
            self._buffers[spec.name] = [first, first.copy()] if written else [first]
        rate = program.optimizer.learning_rate if learning_rate is None else learning_rate
        self._learning_rate = np.array(rate, dtype=np.float32)
        self._loss = np.zeros((), dtype=self.executable.outputs[0].dtype)
        self._bindings = [self._bind(parity) for parity in (0, 1)]
        self._parity = 0

    @staticmethod
    def _initial(spec: StateSpec, params: Mapping[str, np.ndarray]) -> np.ndarray:
        if spec.init is not None:
            return np.full(spec.shape, spec.init, dtype=spec.dtype.numpy)
        if spec.name not in params:
            raise ConfigurationError(f"no initial value for parameter {spec.name!r}; pass it in params")
        value = np.asarray(params[spec.name])
        if value.shape != spec.shape or value.dtype != spec.dtype.numpy:
            raise ConfigurationError(
                f"parameter {spec.name!r} must be {spec.dtype.value}{spec.shape}, got {value.dtype}{value.shape}"
            )
        return np.array(value, order="C", copy=True)

    def _bind(self, parity: int):
        binding = self.compute.bind(self.executable)
        for name, buffers in self._buffers.items():
            binding.input(name, buffers[parity % len(buffers)])
            if len(buffers) == 2:
                binding.output(assign_output_name(name), buffers[1 - parity])
        binding.input(LEARNING_RATE, self._learning_rate)
        loss_shape = self.program.graph.outputs[0].shape
        binding.output(self.program.outputs[0], self._loss if loss_shape == () else None)
        for name in self.program.outputs[1:]:
            binding.output(name)
        return binding

    @property
    def state(self) -> dict[str, np.ndarray]:
        """Current parameters and optimizer slots (views of the live buffers; copy to keep a snapshot)."""
        return {name: bufs[self._parity % len(bufs)] for name, bufs in self._buffers.items()}

    @property
    def learning_rate(self) -> float:
        return float(self._learning_rate)

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self._learning_rate[...] = value  # the bound buffer itself: no rebinding

    def load(self, name: str, value: np.ndarray) -> None:
        """Overwrite parameter or slot `name` in place."""
        np.copyto(self.state[name], value, casting="same_kind")

    def __call__(self, **data: np.ndarray):
        """One step on a batch (keyword per data input); returns the loss, or (loss, *other outputs)."""
        missing = set(self.program.data) - set(data)
        if missing:
            raise ConfigurationError(
                f"missing data input(s) {sorted(missing)}; the step takes {list(self.program.data)}"
            )
        binding = self._bindings[self._parity]
        for name, array in data.items():
            binding.input(name, np.ascontiguousarray(array))
        others = binding.run()
        self._parity = 1 - self._parity
        loss = self._loss.copy() if self.program.graph.outputs[0].shape == () else others.pop(0)
        return (loss, *others) if len(self.program.outputs) > 1 else loss
