"""Primitive classes (`ops.MatMul()(x, w)`, `ops.ReduceSum(keep_dims=True)(x, 1)`, …) with `shard()`.

A Primitive is configured at construction and applied by calling it; each maps onto registered compiler ops.
`shard(in_strategy, out_strategy)` validates and stores the operator's parallel strategy for the parallel pass.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tessel.common.dtype import DType, to_dtype
from tessel.common.tracing import apply_op, created_by, current
from tessel.core.errors import ConfigurationError
from tessel.ops import functional as F
from tessel.ops.nn_functional import check_data_format, eager_dropout, seeded_stream, softmax_over


def _check_strategy(strategy: Any, what: str, name: str) -> tuple | None:
    """One entry per input (or output): a tuple of positive ints (splits per dim) or a `Layout` applied to the
    tensor (`layout("dp", "None")`), all of one kind."""
    from tessel.parallel.shard import check_in_strategy

    if strategy is None:
        return None
    try:
        return check_in_strategy(strategy, f"{name}.shard {what}")
    except ConfigurationError as err:
        raise ConfigurationError(
            f"{name}.shard: {what} must be a tuple with one tuple of positive ints per input (splits per dim) or one "
            f"Layout per input, all of one kind, e.g. ((1, 1), (1, 2)); got {strategy!r} ({err})"
        ) from None


def _is_layout(entry: Any) -> bool:
    return not isinstance(entry, tuple)


def _recorded(call: Callable) -> Callable:
    """`call` that, while tracing, tells the trace which Primitive created the ops it applies (so the parallel pass
    finds each op's shard() strategy)."""

    @functools.wraps(call)
    def wrapper(self: Primitive, *args: Any, **kwargs: Any) -> Any:
        amp = self.__dict__.get("_amp_dtype")
        if amp is not None:  # on tessel.amp's O1 white list: float inputs in `amp`, float outputs back in float32
            from tessel.nn.cell import cast_float_outputs

            args = cast_float_outputs(args, amp)
        if current() is None:
            out = call(self, *args, **kwargs)
        else:
            with created_by(self):
                out = call(self, *args, **kwargs)
        return out if amp is None else cast_float_outputs(out, DType.float32)

    wrapper._tessel_recorded = True  # type: ignore[attr-defined]
    return wrapper


class Primitive:
    """Base of every primitive: a name, attributes and an optional sharding strategy."""

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        call = cls.__dict__.get("__call__")
        if call is not None and not getattr(call, "_tessel_recorded", False):
            cls.__call__ = _recorded(call)

    def __init__(self, name: str | None = None):
        self.name = name or type(self).__name__
        self.attrs: dict[str, Any] = {}
        self.in_strategy: tuple | None = None
        self.out_strategy: tuple | None = None
        self.instance_name = ""

    @property
    def main_op(self) -> str:
        """The compiler op a shard() strategy applies to (a primitive may emit helper ops around it)."""
        return getattr(type(self), "_op", "") or self.name

    def shard(self, in_strategy: Sequence | None = None, out_strategy: Sequence | None = None) -> Primitive:
        """Set this operator's strategy: in_strategy[i][d] = how many parts input i is split into along dim d
        (SEMI_AUTO_PARALLEL / AUTO_PARALLEL; checked against the op and device_num when the network compiles).

            >>> matmul = ops.MatMul().shard(((1, 1), (1, 2)))   # the weight's dim 1 cut in two
        """
        in_checked = _check_strategy(in_strategy, "in_strategy", self.name)
        out_checked = _check_strategy(out_strategy, "out_strategy", self.name)
        if out_checked is not None and in_checked is None:  # MindSpore refuses it too
            raise ConfigurationError(
                f"{self.name}.shard: out_strategy {out_strategy!r} needs an in_strategy; give both, e.g. "
                "shard(((1, 1), (1, 2)), ((1, 2),))"
            )
        if in_checked and out_checked and _is_layout(in_checked[0]) != _is_layout(out_checked[0]):
            raise ConfigurationError(
                f"{self.name}.shard: in_strategy and out_strategy must be of one kind, tuples of split counts or "
                f"Layouts, got {in_strategy!r} and {out_strategy!r}"
            )
        self.in_strategy, self.out_strategy = in_checked, out_checked
        return self

    def add_prim_attr(self, name: str, value: Any) -> Primitive:
        """Set attribute `name` (kept in `attrs` and as `self.<name>`) and return self, as MindSpore. An attribute
        given at construction (MatMul's transpose_a, ReduceSum's keep_dims) changes the op; any other is a hint to
        MindSpore's backend that tessel's compiler does not read, which is logged once (see `_HINTS`)."""
        op_attrs = self.__dict__.get("op_attrs", self.attrs)
        if name in op_attrs:
            op_attrs[name] = value
        else:
            _note_hint(self, name, value)
        self.attrs[name] = value
        if not hasattr(type(self), name):
            self.__dict__[name] = value
        return self

    def recompute(self, mode: bool = True) -> Primitive:
        """Recompute this operator for the backward pass (MindSpore `Primitive.recompute`): its outputs are not kept
        between forward and backward; the backward computes them again just before it needs them (from kept
        values: recomputed inputs are recomputed in turn). Overrides the setting of a recomputed cell around it
        (`recompute(False)` keeps an op of a recomputed cell). Set it before the first call that compiles the
        network. Returns the primitive.

            >>> self.relu = ops.ReLU().recompute()
        """
        if not isinstance(mode, bool):
            raise TypeError(f"{self.name}.recompute: mode must be a bool, got {type(mode).__name__}")
        return self.add_prim_attr("recompute", mode)

    def set_device(self, device_target: str) -> Primitive:
        """Run this operator on `device_target` ("Ascend", "GPU" or "CPU"): `add_prim_attr("primitive_target", ...)`.

        A tessel daemon runs the whole graph on its own device: on a CPU target the op runs on the CPU as asked; on a
        GPU or Ascend daemon it runs there (same result, no host offload), which is logged once."""
        if device_target not in _DEVICE_TARGETS:
            raise ConfigurationError(
                f"{self.name}.set_device: device_target must be one of {list(_DEVICE_TARGETS)}, got {device_target!r}"
            )
        return self.add_prim_attr("primitive_target", device_target)

    def place(self, role: str, rank_id: int) -> Primitive:
        """MindSpore runs this operator on process (role, rank_id) of a dynamic cluster. tessel validates the
        arguments as MindSpore does, then raises NotSupportedYetError: each rank runs its whole graph on its own
        daemon. Split a network across ranks with `Cell.pipeline_stage` and `pipeline_stages` instead."""
        check_place(f"{self.name}.place", role, rank_id)
        return self

    def set_prim_instance_name(self, instance_name: str) -> Primitive:
        self.instance_name = instance_name
        return self

    def __call__(self, *args: Any) -> Any:
        raise NotImplementedError(f"{self.name} does not define how it is applied")

    def __repr__(self) -> str:
        shown = dict(self.attrs, **({"in_strategy": self.in_strategy} if self.in_strategy else {}))
        return f"Prim[{self.name}]" + (f"<{', '.join(f'{k}={v}' for k, v in shown.items())}>" if shown else "")


_DEVICE_TARGETS = ("Ascend", "GPU", "CPU")
_PLACE_WHY = (
    "tessel runs each rank's whole graph on that rank's daemon and cannot move part of it to another process; "
    "split a network across ranks with Cell.pipeline_stage and set_auto_parallel_context(pipeline_stages=...)"
)


def check_place(where: str, role: Any, rank_id: Any) -> None:
    """MindSpore's checks of `place(role, rank_id)`, then NotSupportedYetError."""
    from tessel import context
    from tessel.common.support import not_supported_yet

    if isinstance(rank_id, bool) or not isinstance(rank_id, int):
        raise TypeError(f"{where}: rank_id must be an int >= 0, got {type(rank_id).__name__}")
    if rank_id < 0:
        raise ConfigurationError(f"{where}: rank_id must be an int >= 0, got {rank_id}")
    if role != "MS_WORKER":
        raise ConfigurationError(f"{where}: role must be 'MS_WORKER' (the only role MindSpore supports), got {role!r}")
    mode = context.get_auto_parallel_context("parallel_mode")
    if mode != context.ParallelMode.STAND_ALONE:
        raise not_supported_yet(
            f"{where} with parallel_mode={mode!r}", "MindSpore does not support it together with parallel modes either"
        )
    raise not_supported_yet(f"{where} (MindSpore's placement of operators on other processes)", _PLACE_WHY)


# add_prim_attr names MindSpore's backend reads and tessel's compiler does not: why each changes nothing here.
_HINTS = {
    "enable_nd_tp": "tessel's parallel pass derives the collectives from the shard() strategy; the result is the same",
}
# add_prim_attr names tessel's tracer reads (tessel.common.tracing.SdkTrace.recompute_mark).
_TRACED = frozenset({"recompute", "recompute_comm_op"})


def _note_hint(primitive: Primitive, name: str, value: Any) -> None:
    import logging

    from tessel import context
    from tessel.common.support import log_once

    if name in _TRACED:
        return
    if name == "primitive_target":
        target = context.get_context("device_target")
        if value != target:
            log_once(
                f"set_device:{value}:{target}",
                f"{primitive.name}.set_device({value!r}): tessel runs every op of a graph on its daemon's device "
                f"({target}); the op runs there with the same result",
            )
        return
    why = _HINTS.get(name, "tessel's compiler does not read it")
    log_once(
        f"add_prim_attr:{name}", f"add_prim_attr({name!r}, ...): kept on the primitive, no effect: {why}", logging.INFO
    )


class _Op(Primitive):
    """A primitive applying one registered op (`_op`) to its inputs, with the attributes given at construction."""

    _op = ""

    def __init__(self, **attrs: Any):
        super().__init__()
        self.op_attrs = dict(attrs)  # what the compiler op takes; add_prim_attr hints are not passed on
        self.attrs.update(attrs)

    def __call__(self, *inputs: Any) -> Any:
        return apply_op(self._op, *inputs, **self.op_attrs)


def _op_class(name: str, op: str | None = None) -> type:
    return type(name, (_Op,), {"_op": op or name, "__doc__": f"MindSpore `ops.{name}`: compiler op {op or name}."})


Add = _op_class("Add")
TensorAdd = Add
Sub = _op_class("Sub")
Mul = _op_class("Mul")
Pow = _op_class("Pow")
Maximum = _op_class("Maximum")
Minimum = _op_class("Minimum")
Equal = _op_class("Equal")
NotEqual = _op_class("NotEqual")
Greater = _op_class("Greater")
GreaterEqual = _op_class("GreaterEqual")
Less = _op_class("Less")
LessEqual = _op_class("LessEqual")
LogicalAnd = _op_class("LogicalAnd")
LogicalOr = _op_class("LogicalOr")
LogicalNot = _op_class("LogicalNot")
Neg = _op_class("Neg")
Exp = _op_class("Exp")
Log = _op_class("Log")
Sqrt = _op_class("Sqrt")
Rsqrt = _op_class("Rsqrt")
Square = _op_class("Square")
Abs = _op_class("Abs")
Sin = _op_class("Sin")
Cos = _op_class("Cos")
Erf = _op_class("Erf")
Floor = _op_class("Floor")
Ceil = _op_class("Ceil")
Round = _op_class("Round")
Sign = _op_class("Sign")
Reciprocal = _op_class("Reciprocal")
ReLU = _op_class("ReLU")
Sigmoid = _op_class("Sigmoid")
Tanh = _op_class("Tanh")
StopGradient = _op_class("StopGradient")
ZerosLike = _op_class("ZerosLike")
OnesLike = _op_class("OnesLike")
Identity = _op_class("Identity")
BiasAdd = _op_class("BiasAdd")
Select = _op_class("Select")
Flatten = _op_class("Flatten")


class Div(Primitive):
    def __call__(self, x, y):
        return F.div(x, y)


RealDiv = Div


class MatMul(_Op):
    _op = "MatMul"

    def __init__(self, transpose_a: bool = False, transpose_b: bool = False):
        super().__init__(transpose_a=transpose_a, transpose_b=transpose_b)


class BatchMatMul(MatMul):
    _op = "BatchMatMul"


class _Reduce(Primitive):
    _op = ""

    def __init__(self, keep_dims: bool = False):
        super().__init__()
        self.attrs["keep_dims"] = keep_dims

    def __call__(self, x, axis=()):
        return apply_op(self._op, x, axis=F._axis(axis), keep_dims=self.attrs["keep_dims"])


ReduceSum = type("ReduceSum", (_Reduce,), {"_op": "ReduceSum"})
ReduceMean = type("ReduceMean", (_Reduce,), {"_op": "ReduceMean"})
ReduceMax = type("ReduceMax", (_Reduce,), {"_op": "ReduceMax"})
ReduceMin = type("ReduceMin", (_Reduce,), {"_op": "ReduceMin"})


class Softmax(_Op):
    """Softmax over `axis`: an int or a tuple of ints (the softmax over those dims jointly, as MindSpore)."""

    _op = "Softmax"

    def __init__(self, axis: Any = -1):
        axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        if not axes or any(isinstance(a, bool) or not isinstance(a, int) for a in axes):
            raise ConfigurationError(f"Softmax: axis must be an int or a non-empty tuple of ints, got {axis!r}")
        super().__init__(axis=axes[0] if len(axes) == 1 else axes)

    def __call__(self, x):
        return softmax_over(x, self.op_attrs["axis"], self.name)


class LogSoftmax(_Op):
    _op = "LogSoftmax"

    def __init__(self, axis: int = -1):
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ConfigurationError(f"LogSoftmax: axis must be an int (one dim), got {axis!r}; e.g. axis=-1")
        super().__init__(axis=axis)


class GeLU(_Op):
    _op = "GELU"

    def __init__(self):
        super().__init__(approximate="tanh")


class Argmax(_Op):
    _op = "Argmax"

    def __init__(self, axis: int = -1, output_type: Any = DType.int32):
        super().__init__(axis=axis, keep_dims=False, output_type=to_dtype(output_type))


class Reshape(Primitive):
    def __call__(self, x, shape):
        return F.reshape(x, shape)


class Transpose(Primitive):
    def __call__(self, x, perm):
        return F.transpose(x, perm)


class ExpandDims(Primitive):
    def __call__(self, x, axis):
        return F.expand_dims(x, axis)


class Squeeze(Primitive):
    def __init__(self, axis: Any = ()):
        super().__init__()
        self.attrs["axis"] = axis

    def __call__(self, x):
        axis = self.attrs["axis"]  # () squeezes every size-1 dim; axis 0 is one dim, not "all"
        return F.squeeze(x, None if isinstance(axis, (tuple, list)) and not axis else axis)


class Concat(Primitive):
    def __init__(self, axis: int = 0):
        super().__init__()
        self.attrs["axis"] = axis

    def __call__(self, tensors):
        return F.concat(tensors, self.attrs["axis"])


class Stack(Concat):
    def __call__(self, tensors):
        return F.stack(tensors, self.attrs["axis"])


class Split(Primitive):
    def __init__(self, axis: int = 0, output_num: int = 1):
        super().__init__()
        self.attrs.update(axis=axis, output_num=output_num)

    def __call__(self, x):
        out = apply_op("Split", x, axis=self.attrs["axis"], output_num=self.attrs["output_num"])
        return out if isinstance(out, tuple) else (out,)


class Cast(Primitive):
    def __call__(self, x, dtype):
        return F.cast(x, dtype)


class Gather(Primitive):
    def __call__(self, input_params, input_indices, axis, batch_dims=0):
        return F.gather(input_params, input_indices, axis, batch_dims)


class OneHot(Primitive):
    def __init__(self, axis: int = -1):
        super().__init__()
        self.attrs["axis"] = axis

    def __call__(self, indices, depth, on_value, off_value):
        return F.one_hot(indices, depth, on_value, off_value, self.attrs["axis"])


class Conv2D(_Op):
    _op = "Conv2D"

    def __init__(
        self,
        out_channel: int,
        kernel_size: Any,
        mode: int = 1,  # MindSpore documents it as unused
        pad_mode: str = "valid",
        pad: Any = 0,
        stride: Any = 1,
        dilation: Any = 1,
        group: int = 1,
        data_format: str = "NCHW",
    ):
        check_data_format("ops.Conv2D", data_format)
        super().__init__(stride=stride, dilation=dilation, pad_mode=pad_mode.lower(), pad=pad, group=group)
        kernel = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        self.out_channel, self.kernel_size = int(out_channel), tuple(int(k) for k in kernel)

    def __call__(self, x, weight):
        # MindSpore checks the weight (out_channel, in_channel / group, kh, kw) against the construction arguments.
        shape = tuple(weight.shape)
        if len(shape) != 4 or shape[0] != self.out_channel or shape[2:] != self.kernel_size:
            raise ConfigurationError(
                f"Conv2D: the weight's shape {shape} must be (out_channel={self.out_channel}, in_channel / group, "
                f"*kernel_size={self.kernel_size}); build Conv2D with out_channel={shape[0] if shape else '?'} and "
                f"kernel_size={shape[2:]} or pass a matching weight"
            )
        return apply_op(self._op, x, weight, **self.op_attrs)


class MaxPool(_Op):
    _op = "MaxPool"

    def __init__(self, kernel_size: Any = 1, strides: Any = 1, pad_mode: str = "valid", data_format: str = "NCHW"):
        check_data_format(f"ops.{type(self).__name__}", data_format)
        super().__init__(kernel_size=kernel_size, strides=strides, pad_mode=pad_mode.lower())


class AvgPool(MaxPool):
    _op = "AvgPool"


class SoftmaxCrossEntropyWithLogits(Primitive):
    """(per-sample loss, gradient softmax(logits) - labels) for probability labels. As MindSpore's bprop: the loss
    differentiates through the logits only (the labels get no gradient), the second output not at all."""

    _op = "SoftmaxCrossEntropy"

    def __call__(self, logits, labels):
        labels = F.stop_gradient(labels)
        return apply_op("SoftmaxCrossEntropy", logits, labels), F.stop_gradient(F.softmax(logits, -1) - labels)


class SparseSoftmaxCrossEntropyWithLogits(Primitive):
    """Mean cross-entropy of logits at class indices (is_grad=False)."""

    _op = "SparseSoftmaxCrossEntropy"

    def __init__(self, is_grad: bool = False):
        super().__init__()
        if is_grad:
            raise ConfigurationError("SparseSoftmaxCrossEntropyWithLogits(is_grad=True) is not supported")

    def __call__(self, logits, labels):
        return F.mean(apply_op("SparseSoftmaxCrossEntropy", logits, labels))


class Depend(Primitive):
    def __call__(self, value, expr):
        return F.depend(value, expr)


class Assign(Primitive):
    def __call__(self, variable, value):
        return F.assign(variable, value)


class AssignAdd(Primitive):
    def __call__(self, variable, value):
        return F.assign_add(variable, value)


class AssignSub(Primitive):
    def __call__(self, variable, value):
        return F.assign_sub(variable, value)


class Zeros(Primitive):
    def __call__(self, size, type=None):
        return F.zeros(size, type)


class Ones(Primitive):
    def __call__(self, size, type=None):
        return F.ones(size, type)


class Fill(Primitive):
    def __call__(self, type, shape, value):
        return F.fill(type, shape, value)


class Shape(Primitive):
    def __call__(self, x):
        return tuple(x.shape)


class Rank(Primitive):
    def __call__(self, x):
        return len(x.shape)


class StridedSlice(Primitive):
    def __init__(self, begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0):
        super().__init__()
        if any((begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_axis_mask)):
            raise ConfigurationError("StridedSlice masks are not supported; index with x[a:b:c] instead")

    def __call__(self, x, begin, end, strides):
        # One StridedSlice node (None = an open end), created by this primitive so that its shard() applies.
        return apply_op("StridedSlice", x, begin=tuple(begin), end=tuple(end), strides=tuple(strides))


class Dropout(Primitive):
    """(x with elements zeroed with probability 1 - keep_prob and the rest scaled by 1 / keep_prob, mask).

    Seed0 = Seed1 = 0 draws each call from the streams of `set_seed`; otherwise the pair (with the global seed)
    seeds this primitive's own stream: each instance draws the same sequence of masks, in every run."""

    def __init__(self, keep_prob: float = 0.5, Seed0: int = 0, Seed1: int = 0):
        super().__init__()
        for name, value in (("Seed0", Seed0), ("Seed1", Seed1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"Dropout: {name} must be an int >= 0, got {value!r}; e.g. {name}=1")
        self.attrs.update(keep_prob=keep_prob, Seed0=Seed0, Seed1=Seed1)
        # F.dropout takes one seed: the pair maps onto one, the same for the same pair (in [1, 2**31 - 1), as the
        # seeds of the compiled Dropout op).
        self.seed = None if Seed0 == Seed1 == 0 else int(np.random.default_rng((Seed0, Seed1)).integers(1, 2**31 - 1))
        self._stream: np.random.Generator | None = None  # eager draws of a seeded instance

    def __call__(self, x):
        p = 1.0 - self.attrs["keep_prob"]
        # One draw gives both outputs: the kept elements' scale (0 or 1 / keep_prob) times x, and where it is
        # nonzero. (The mask is not out != 0: a kept element of x may itself be 0.)
        ones = F.ones_like(x)
        if self.seed is not None and current() is None and 0.0 < p < 1.0:
            if self._stream is None:
                self._stream = seeded_stream(self.seed, shared=False)
            scale = eager_dropout(ones, p, self._stream)
        else:
            scale = F.dropout(ones, p, training=True, seed=self.seed)
        return x * scale, F.cast(F.not_equal(scale, 0.0), scale.dtype)  # MindSpore CPU/GPU: the mask has x dtype


class LayerNorm(Primitive):
    """(y, mean, rstd) over dims begin_norm_axis..; gamma/beta shaped like x.shape[begin_params_axis:]. rstd is
    1 / sqrt(variance + epsilon), MindSpore's third output since 2.3 (2.2 and before gave the variance)."""

    def __init__(self, begin_norm_axis: int = 1, begin_params_axis: int = 1, epsilon: float = 1e-7):
        super().__init__()
        self.attrs.update(begin_norm_axis=begin_norm_axis, begin_params_axis=begin_params_axis, epsilon=epsilon)

    def __call__(self, x, gamma, beta):
        return apply_op("LayerNorm", x, gamma, beta, **self.attrs)


class Print(Primitive):
    """Print the inputs (strings, numbers, Tensors; one line each, Tensors as their repr) and return None.

    In PYNATIVE_MODE and outside compiled functions it prints at the call. Inside a compiled graph (a GRAPH_MODE
    cell, `jit`, `value_and_grad`, a TrainOneStepCell) the printed tensors become outputs of the graph, and the rank
    prints them (in call order) once each run returns: a rank prints what it computed (its slice of a sliced
    tensor; under pipeline parallel, only on the stage that runs the op). Model.train's sink mode, which runs many
    steps per call, refuses it (NotSupportedYetError); use dataset_sink_mode=False. Python's print() of traced
    tensors inside a graph runs as this op does (MindSpore's graph mode); in sink mode it prints nothing, said once.

        >>> ops.Print()("out is:", ms.Tensor([1.0, 2.0]))
        out is:
        Tensor(shape=[2], dtype=Float32, value= [1., 2.])
    """

    def __init__(self):
        super().__init__()
        self.attrs["side_effect_io"] = True

    def __call__(self, *args: Any) -> None:
        trace = current()
        if trace is not None:
            trace.print_call(args)
            return None
        from tessel.common.tensor import Tensor

        for arg in args:
            print(Tensor.__repr__(arg) if isinstance(arg, Tensor) else arg)


def print_(*input_x: Any) -> None:
    """`ops.print_`: `ops.Print()(*input_x)`."""
    return Print()(*input_x)


def _composed() -> Any:
    from tessel.ops import composed  # composed builds on Tensor, which imports this module

    return composed


class TopK(Primitive):
    """TopK(sorted=True)(x, k): (values, int32 indices) of the k largest along the last axis, in order."""

    _op = "TopK"

    def __init__(self, sorted: bool = True):
        super().__init__()
        if not isinstance(sorted, bool):
            raise ConfigurationError(f"TopK: sorted must be a bool, got {sorted!r}")
        self.attrs["sorted"] = sorted  # unsorted may come in any order: tessel's always come sorted

    def __call__(self, input_x, k):
        return _composed().topk(input_x, k)


class Sort(Primitive):
    """Sort(axis=-1, descending=False)(x): (sorted values, int32 indices), equal elements in their order."""

    _op = "TopK"

    def __init__(self, axis: int = -1, descending: bool = False):
        super().__init__()
        self.attrs.update(axis=axis, descending=descending)

    def __call__(self, x):
        return _composed().sort(x, self.attrs["axis"], self.attrs["descending"])


class ArgMaxWithValue(Primitive):
    """ArgMaxWithValue(axis=0, keep_dims=False)(x): (int64 index of the maximum, the maximum) along axis."""

    _op = "Argmax"

    def __init__(self, axis: int = 0, keep_dims: bool = False):
        super().__init__()
        self.attrs.update(axis=axis, keep_dims=keep_dims)

    def __call__(self, x):
        values, index = _composed().max(x, self.attrs["axis"], self.attrs["keep_dims"])
        return index, values


class ArgMinWithValue(ArgMaxWithValue):
    """ArgMinWithValue(axis=0, keep_dims=False)(x): (int64 index of the minimum, the minimum) along axis."""

    _op = "Argmin"

    def __call__(self, x):
        values, index = _composed().min(x, self.attrs["axis"], self.attrs["keep_dims"])
        return index, values
