"""Automatic differentiation with MindSpore's API: `value_and_grad`, `grad`, `GradOperation`.

    >>> grad_fn = ms.value_and_grad(forward_fn, None, net.trainable_params(), has_aux=True)
    >>> (loss, logits), grads = grad_fn(data, label)     # one Execute on the daemon
    >>> optimizer(grads)                                  # grads never leave the daemon

Called eagerly, the function is traced and differentiated once per input signature and compiled into one
daemon segment computing the value and the gradients; values come back, gradients stay on the daemon as handle
Tensors (fetched only if read). Called inside a trace (a cell's construct in graph mode, a custom train step,
an `@ms.jit` function), the gradients join that graph. Either way the trace records a GradientOf node, which
the compiler differentiates once the graph is final: under SEMI_AUTO/AUTO parallelism, after the parallel pass,
on each rank's slice of the network.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tessel import context
from tessel.common.compiled import CompiledFunction, arg_names_of
from tessel.common.parameter import Parameter
from tessel.common.tensor import Tensor
from tessel.common.tracing import current
from tessel.compiler import GradientError, SymbolicTensor, apply, apply_all
from tessel.core.errors import ConfigurationError


def _tensor_leaves(out: Any) -> list:
    """The tensors of an output, at any depth of tuples and lists."""
    if isinstance(out, (tuple, list)):
        return [leaf for part in out for leaf in _tensor_leaves(part)]
    return [out] if isinstance(out, Tensor) else []


def _sum_outputs(out: Any) -> Any:
    """The scalar whose gradient MindSpore takes for a function with several outputs: the sum of them all, nested
    ones included (MindSpore 2.7.0: ((a * b, a.sum()), b * 2.0) gives a the gradient b + 1)."""
    from tessel.ops import functional as F

    floats = [o for o in _tensor_leaves(out) if o.dtype.is_float]
    if not floats:
        raise GradientError("the function returns no float tensor to differentiate")
    total = F.sum(floats[0])
    for o in floats[1:]:
        total = total + F.sum(o)
    return total


def _weighted_outputs(out: Any, sens: Any) -> Any:
    """The scalar whose gradient is the gradient of `out` seeded with `sens`, a tuple or list shaped like `out`:
    the sum of each float output times its sensitivity (which itself takes no gradient)."""
    from tessel.ops import functional as F

    pairs = []

    def pair(o: Any, s: Any) -> None:
        if isinstance(o, (tuple, list)) and isinstance(s, (tuple, list)) and len(o) == len(s):
            for o_part, s_part in zip(o, s):
                pair(o_part, s_part)
        elif isinstance(o, Tensor) and isinstance(s, Tensor):
            pairs.append((o, s))
        else:
            raise ConfigurationError(
                f"GradOperation(sens_param=True): the sens {_structure(s)} does not match the outputs "
                f"{_structure(out)}; pass one sens Tensor per output, nested as the outputs are"
            )

    pair(out, sens)
    terms = [F.sum(o * F.stop_gradient(s)) for o, s in pairs if o.dtype.is_float]
    if not terms:
        raise GradientError("the function returns no float tensor to differentiate")
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _structure(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_structure(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return "Tensor" if isinstance(value, Tensor) else type(value).__name__


class _AllPositions(tuple):
    """grad_position meaning "every input" (GradOperation(get_all=True))."""

    def __new__(cls):
        return super().__new__(cls, ())


class _GradFunction:
    """fn with gradients: returns (value, grads), grads, or (grads, aux) depending on how it was made."""

    def __init__(
        self,
        fn: Callable,
        positions: Any,
        weights: Any,
        has_aux: bool,
        layout: Callable,
        sens_param: bool = False,
        return_ids: bool = False,
    ):
        if positions is None and weights is None:
            raise ConfigurationError("value_and_grad/grad: grad_position and weights cannot both be None")
        # MindSpore 2.7.0 refuses a negative position when the function is made, with a ValueError
        if isinstance(positions, int) and positions < 0:
            raise ValueError("grad_position must be >= 0.")
        if isinstance(positions, (tuple, list)) and any(p < 0 for p in positions):
            raise ValueError("The element in grad_position must be >= 0.")
        if not isinstance(return_ids, bool):
            raise ConfigurationError(f"value_and_grad/grad: return_ids must be a bool, got {return_ids!r}")
        self.return_ids = return_ids
        self.fn, self.positions, self.has_aux, self.layout, self.sens_param = fn, positions, has_aux, layout, sens_param
        self.single_weight = isinstance(weights, Parameter)
        self.weights = [weights] if self.single_weight else (None if weights is None else list(weights))
        bad = [type(w).__name__ for w in self.weights or () if not isinstance(w, Parameter)]
        if bad:
            raise ConfigurationError(f"weights must be Parameters (e.g. net.trainable_params()), got {bad}")
        from tessel.nn.cell import Cell

        names = arg_names_of(fn.construct if isinstance(fn, Cell) else fn)
        name = getattr(fn, "__name__", type(fn).__name__)
        self.compiled = CompiledFunction(
            self._emit, f"grad_{name}", device_result=True, arg_names=names, python_each_call=_pynative
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # keyword arguments travel as trailing positional values plus their names, in call order: MindSpore numbers
        # them after the positional arguments in that order for grad_position (f(x, c=z, b=y): position 1 is c)
        values = (*args, *kwargs.values())
        keywords = {"keywords": tuple(kwargs)} if kwargs else {}
        if current() is not None:
            value, grads = self._emit(*values, **keywords)
        else:
            value, grads = self.compiled(*values, **keywords)
        if self.return_ids:
            grads = self._with_ids(grads, len(values) - self.sens_param)
        return self.layout(value, grads)

    def _with_ids(self, grads: Any, count: int) -> Any:
        """return_ids=True: each gradient as (its input's position, grad) or (its weight's name, grad), in the
        same structure as without ids."""
        positions = self._positions(count)

        def inputs(found: Any) -> Any:
            return (positions[0], found) if isinstance(self.positions, int) else tuple(zip(positions, found))

        def weights(found: Any) -> Any:
            if self.single_weight:
                return (self.weights[0].name, found)
            return tuple((w.name, g) for w, g in zip(self.weights, found))

        if self.positions is None:
            return weights(grads)
        if self.weights is None:
            return inputs(grads)
        return inputs(grads[0]), weights(grads[1])

    def _positions(self, count: int) -> tuple[int, ...]:
        if self.positions is None:
            return ()
        if isinstance(self.positions, _AllPositions):
            return tuple(range(count))
        positions = (self.positions,) if isinstance(self.positions, int) else tuple(self.positions)
        for p in positions:
            if p >= count:
                raise ConfigurationError(f"grad_position {p} is out of range for a call with {count} argument(s)")
        return positions

    def _emit(self, *values: Any, keywords: tuple[str, ...] = ()) -> tuple[Any, Any]:
        """Trace fn and its gradients. `values` are the positional arguments (the sens last, with sens_param), then
        the values of the keyword arguments named by `keywords`."""
        trace = current()
        args = values[: len(values) - len(keywords)]
        named = dict(zip(keywords, values[len(args) :]))
        sens = None
        if self.sens_param:
            args, sens = args[:-1], args[-1]
        candidates = (*args, *named.values())
        positions = self._positions(len(candidates))
        inputs = [_symbolic(trace, candidates[i], f"argument {i}") for i in positions]
        # an integer or bool input (labels, indices) has a zero gradient of its own dtype, as in MindSpore
        differentiable = [x for x in inputs if x.dtype.is_float]
        # a weight this graph assigned already: its current value is what the forward reads and is differentiated
        wrt = differentiable + [_current(trace, w) for w in self.weights or ()]
        with trace.gradient_forward():
            out = self.fn(*args, **named)
        if self.has_aux:
            if not isinstance(out, (tuple, list)) or not out:
                raise ConfigurationError("has_aux=True: the function must return (loss, aux, ...)")
            loss = out[0]
        elif isinstance(sens, (tuple, list)):  # one sensitivity per output
            loss, sens = _weighted_outputs(out, sens), None
        elif sens is not None and not isinstance(out, Tensor):
            raise ConfigurationError(
                f"GradOperation(sens_param=True): the function returns {_structure(out)}, so the sens must be a "
                "tuple with one Tensor per output, nested as the outputs are, not one Tensor"
            )
        else:
            loss = out if isinstance(out, Tensor) else _sum_outputs(out)
        loss_sym = _symbolic(trace, loss, "the loss")
        seed = [] if sens is None else [_symbolic(trace, sens, "sens")]
        grads = list(apply_all("GradientOf", loss_sym, *wrt, *seed, seeded=bool(seed)) if wrt else ())
        found = iter(grads[: len(differentiable)])
        input_grads = tuple(
            Tensor._wrap_symbolic(next(found) if x.dtype.is_float else apply("ZerosLike", x)) for x in inputs
        )
        weight_grads = tuple(Tensor._wrap_symbolic(g) for g in grads[len(differentiable) :])
        if not isinstance(self.positions, _AllPositions) and len(input_grads) == 1:
            input_grads = input_grads[0]  # grad_position=0 and (0,) alike: MindSpore turns an int into (n,)
        if self.single_weight:
            weight_grads = weight_grads[0]
        if self.positions is None:
            structured = weight_grads
        elif self.weights is None:
            structured = input_grads
        else:
            structured = (input_grads, weight_grads)
        value = tuple(out) if isinstance(out, list) else out
        return value, structured


def _pynative() -> bool:
    """MindSpore's PYNATIVE_MODE runs a gradient function's Python at every call."""
    return context.get_context("mode") == context.PYNATIVE_MODE


def _current(trace, weight: Parameter) -> SymbolicTensor:
    assigned = trace.assigned.get(id(weight))
    return trace.param(weight) if assigned is None else assigned


def _symbolic(trace, x: Any, what: str) -> SymbolicTensor:
    sym = trace.to_symbolic(x)
    if isinstance(sym, SymbolicTensor):
        return sym
    if isinstance(sym, (int, float, np.ndarray, np.generic)):  # a constant: its gradient is still defined
        return apply("Identity", SymbolicTensor(trace.builder, trace.builder.constant(sym)))
    raise ConfigurationError(f"cannot differentiate with respect to {what}: {type(x).__name__} is not a tensor")


def value_and_grad(
    fn: Callable,
    grad_position: int | Sequence[int] | None = 0,
    weights: Any = None,
    has_aux: bool = False,
    return_ids: bool = False,
) -> Callable:
    """A function returning (fn's value, gradients) (MindSpore `value_and_grad`).

    Gradients: of the inputs at grad_position (a Tensor for an int, a tuple for a tuple), of `weights` (a tuple,
    or one Tensor for one Parameter), or (input grads, weight grads) when both are given. With has_aux=True fn
    returns (loss, aux...) and only loss is differentiated; otherwise every output contributes (summed). With
    return_ids=True each gradient comes as (input position, grad) or (parameter name, grad), in the same structure:

        >>> _, ((i, dx), ((name, dw),)) = ms.value_and_grad(net, 0, [net.w], return_ids=True)(x)   # i 0, name "w"
    """
    return _GradFunction(
        fn, grad_position, weights, has_aux, lambda value, grads: (value, grads), return_ids=return_ids
    )


def grad(
    fn: Callable,
    grad_position: int | Sequence[int] | None = 0,
    weights: Any = None,
    has_aux: bool = False,
    return_ids: bool = False,
) -> Callable:
    """A function returning fn's gradients (and the aux outputs, as (grads, aux), with has_aux=True); with
    return_ids=True each gradient comes as (input position, grad) or (parameter name, grad), as value_and_grad's."""

    def layout(value, grads):
        return (grads, tuple(value[1:])) if has_aux else grads

    return _GradFunction(fn, grad_position, weights, has_aux, layout, return_ids=return_ids)


class GradOperation:
    """MindSpore's GradOperation: `GradOperation(get_all, get_by_list, sens_param)(fn, weights)(*inputs)`.

    Returns the first input's gradient, all inputs' (get_all), the weights' (get_by_list) or both as a pair; with
    sens_param the last input is the output's cotangent (the sensitivity).
    """

    def __init__(self, get_all: bool = False, get_by_list: bool = False, sens_param: bool = False):
        self.get_all, self.get_by_list, self.sens_param = get_all, get_by_list, sens_param
        self._cache: dict[tuple, _GradFunction] = {}

    def __call__(self, fn: Callable, weights: Any = None) -> Callable:
        key = (id(fn), None if weights is None else tuple(map(id, weights)))
        made = self._cache.get(key)
        if made is None:
            if self.get_by_list and weights is None:
                raise ConfigurationError("GradOperation(get_by_list=True) needs weights: grad_op(fn, weights)")
            positions = _AllPositions() if self.get_all else (None if self.get_by_list else 0)
            made = _GradFunction(
                fn, positions, weights if self.get_by_list else None, False, lambda value, grads: grads, self.sens_param
            )
            self._cache[key] = made
        return made
