"""`Tensor`: MindSpore's tensor, backed by a host array, a name in the daemon's store, or a value being traced.

    >>> import tessel as ms
    >>> x = ms.Tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> (x @ x.T).sum()
    Tensor(shape=[], dtype=Float32, value= 30.)

Host tensors run their ops eagerly (one compiled op at a time). Handle tensors (gradients left on the daemon) are
fetched on first use. While a function is traced (graph mode, value_and_grad, Model.train) the tensors it sees
are symbolic: their values exist only when the compiled graph runs, so reading one is a clear TraceError.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from tessel.common.dtype import DType, default_dtype_of, ms_name, to_dtype
from tessel.common.support import keyword_options
from tessel.common.symbol import Symbol, is_dynamic_shape, split_shape
from tessel.common.tracing import apply_op, current
from tessel.compiler import AS_BOOL, SymbolicTensor, TraceError, as_dtype
from tessel.core.errors import ConfigurationError, NotSupportedYetError


class SymbolicDim(str):
    """A dim of a traced tensor's `.shape` that is not known while tracing: the batch dim of a graph compiled once
    for every batch size ("N"). Passing it on (reshape, broadcast) works; comparing it with a number or doing
    arithmetic on it raises, and the graph is then traced again with the call's own sizes, so user code that
    branches on a size sees the real one instead of a comparison that is silently False."""

    def _unknown(self, other: Any = None) -> Any:
        raise TraceError(f"dim {str(self)!r} is the batch size of a graph traced for any batch size; it has no value")

    def __eq__(self, other: Any) -> bool:
        return str.__eq__(self, other) if isinstance(other, str) else self._unknown(other)

    def __ne__(self, other: Any) -> bool:
        return str.__ne__(self, other) if isinstance(other, str) else self._unknown(other)

    __hash__ = str.__hash__
    __lt__ = __le__ = __gt__ = __ge__ = _unknown
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _unknown
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _unknown

    def __int__(self) -> int:
        return self._unknown()

    __index__ = __int__


def _printable(sym: SymbolicTensor) -> np.ndarray | None:
    """A traced tensor's value for print(), where its trace can compute it now (see SymbolicTensor.read)."""
    if sym.builder.reader is None:
        return None
    try:
        return sym.read("printed")
    except NotSupportedYetError:
        return None


def _user_shape(shape: tuple) -> tuple:
    return tuple(SymbolicDim(d) if isinstance(d, str) and not isinstance(d, SymbolicDim) else d for d in shape)


class DeviceRef:
    """A tensor living in the daemon's store under `name`. Under SEMI_AUTO/AUTO parallelism a handle may be
    sharded: `shape` is the global shape and the store holds this rank's piece of `layout` (a compiler Layout)."""

    __slots__ = ("dtype", "engine", "layout", "name", "shape")

    def __init__(self, engine, name: str, shape: tuple, dtype: DType, layout=None):
        self.engine, self.name, self.shape, self.dtype = engine, name, tuple(shape), dtype
        self.layout = layout


# MindSpore's other Tensor arguments: const_arg (the value is a constant of a compiled network: tessel compiles
# with it as an input, same results) and internal (MindSpore's own use); device= places a tensor in host memory
# ("CPU"), where tessel's client keeps every tensor's value anyway.
_TENSOR_HINTS = {
    "const_arg": "tessel passes a Tensor to a compiled network as an input (same results)",
    "internal": "it is MindSpore's internal flag",
}
_TENSOR_UNSUPPORTED = {
    "device": ((None, "CPU"), "tessel's client keeps tensor values in host memory; drop device= (or pass 'CPU')"),
}


class Tensor:
    """A tensor (MindSpore `Tensor(input_data=None, dtype=None, shape=None, init=None)`)."""

    __slots__ = ("__weakref__", "_array", "_parent", "_ref", "_sym")
    __array_ufunc__ = None  # `ndarray + Tensor` uses our reflected operators

    def __new__(cls, input_data: Any = None, dtype: Any = None, shape: Any = None, init: Any = None, **_: Any):
        # Tensor(shape=[Symbol(...) or None, ...], dtype=...) declares an input (Cell.set_inputs): no value.
        if cls is Tensor and input_data is None and init is None and is_dynamic_shape(shape):
            return object.__new__(DynamicShapeTensor)
        return object.__new__(cls)

    def __init__(self, input_data: Any = None, dtype: Any = None, shape: Any = None, init: Any = None, **options: Any):
        if options:
            keyword_options("Tensor", options, _TENSOR_HINTS, _TENSOR_UNSUPPORTED)
        if input_data is not None and (shape is not None or init is not None):
            given = "shape" if shape is not None else "init"
            raise ConfigurationError(
                f"Tensor(input_data, {given}=...): a tensor is given either its data or a shape and an init, as in "
                f"MindSpore; drop {given}= (reshape the data with .reshape(...), cast it with dtype=)"
            )
        if init is not None:
            from tessel.common.initializer import init_array

            if shape is None:
                raise ConfigurationError("Tensor(init=...) needs shape=; e.g. Tensor(shape=(2, 3), init='normal')")
            if is_dynamic_shape(shape):
                raise ConfigurationError(
                    f"Tensor(shape={shape!r}, init=...): dims that are None or a Symbol declare an input and take no "
                    "init; give every dim a length, or drop init"
                )
            array = init_array(init, (shape,) if isinstance(shape, int) else shape, dtype or DType.float32)
        elif input_data is None:
            raise ConfigurationError(
                "Tensor() needs input_data, or shape= and init= (e.g. init=One()); a shape with None or Symbol dims "
                "and a dtype declares an input for Cell.set_inputs"
            )
        elif isinstance(input_data, Tensor):
            array = np.array(input_data.asnumpy())
        else:
            array = np.array(input_data, dtype=default_dtype_of(input_data))
        if dtype is not None:
            array = array.astype(to_dtype(dtype).numpy)
        _check_dtype(array)
        self._array, self._ref, self._sym = array, None, None

    # --- construction without copies (SDK internals) ---------------------------------------------------------------
    @classmethod
    def _wrap(cls, array: np.ndarray) -> Tensor:
        t = object.__new__(Tensor)
        t._array, t._ref, t._sym = array, None, None
        return t

    @classmethod
    def _wrap_symbolic(cls, sym: SymbolicTensor) -> Tensor:
        t = object.__new__(Tensor)
        t._array, t._ref, t._sym = None, None, sym
        return t

    @classmethod
    def _wrap_ref(cls, ref: DeviceRef) -> Tensor:
        t = object.__new__(Tensor)
        t._array, t._ref, t._sym = None, ref, None
        return t

    @staticmethod
    def from_numpy(array: np.ndarray) -> Tensor:
        """A Tensor sharing `array`'s memory."""
        array = np.asarray(array)
        _check_dtype(array)
        return Tensor._wrap(array)

    def _materialize(self, array: np.ndarray) -> None:
        self._array, self._ref = array, None

    # --- metadata -------------------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        if self._sym is not None:
            return _user_shape(self._sym.shape)
        return self._array.shape if self._array is not None else self._ref.shape

    @property
    def dtype(self) -> DType:
        if self._sym is not None:
            return self._sym.dtype
        return as_dtype(self._array.dtype) if self._array is not None else self._ref.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        shape = self.shape
        if any(isinstance(d, str) for d in shape):
            raise TraceError(f"size of a traced tensor with symbolic shape {shape} is known only when it runs")
        return int(np.prod(shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def T(self) -> Tensor:
        return self.transpose()

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return self.size

    def has_init(self) -> bool:
        return False

    def init_data(self) -> Tensor:
        return self

    # --- values ---------------------------------------------------------------------------------------------------
    def asnumpy(self) -> np.ndarray:
        """The value as a numpy array (fetched from the daemon for handle tensors)."""
        if self._array is not None:
            return self._array
        if self._ref is not None:
            ref = self._ref
            value = ref.engine.get([ref.name])[ref.name]
            if ref.layout is not None:  # this rank's piece of a sharded tensor: the handle stays what it is
                return value
            self._materialize(value)
            return self._array
        return self._sym.asnumpy()  # computed now in a PYNATIVE gradient function's trace; a graph's raises

    numpy = asnumpy

    def item(self) -> Any:
        return self._host("read with .item()").item()

    def tolist(self) -> Any:
        return self.asnumpy().tolist()

    def copy(self) -> Tensor:
        return Tensor._wrap(np.array(self.asnumpy())) if self._sym is None else self

    def __array__(self, dtype=None, copy=None):
        array = self._host("converted to a numpy array")
        return array if dtype is None else array.astype(dtype)

    def __bool__(self) -> bool:
        return bool(self._host(AS_BOOL))

    def __int__(self) -> int:
        return int(self._one_value("int"))

    def __float__(self) -> float:
        return float(self._one_value("float"))

    def __index__(self) -> int:
        value = self._one_value("index")
        if value.dtype.kind not in "iub":  # MindSpore: only an integer tensor is an index
            raise ConfigurationError(f"a {ms_name(self.dtype)} tensor is no index; only integer tensors are")
        return int(value)

    def _host(self, what: str) -> np.ndarray:
        """The value, for Python code that reads it; `what` says how, for the error where a graph is traced."""
        return self.asnumpy() if self._sym is None else self._sym.read(what)

    def _one_value(self, what: str) -> np.ndarray:
        """The value of a tensor of one element (shape () or (1,), ...), as MindSpore's scalar conversions take."""
        array = self._host(f"converted with {what}()" if what != "index" else "used as a Python index")
        if array.size != 1:
            raise ConfigurationError(
                f"{what}() of a tensor of shape {array.shape}: only a tensor of one element has one"
            )
        return array.reshape(())

    def __len__(self) -> int:
        if self._sym is not None:
            return len(self._sym)
        if not self.shape:
            raise TypeError("len() of a 0-d Tensor")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        head = f"Tensor(shape={list(self.shape)}, dtype={ms_name(self.dtype)}, value="
        value = self.asnumpy() if self._sym is None else _printable(self._sym)
        if value is None:
            return head + " <traced>)"
        text = np.array2string(value, separator=", ")
        return head + (f" {text})" if self.ndim <= 1 else f"\n{text})")

    def __str__(self) -> str:
        value = self.asnumpy() if self._sym is None else _printable(self._sym)
        return repr(self) if value is None else str(value)

    __hash__ = object.__hash__

    # --- indexing -------------------------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Tensor:
        trace = current()
        if trace is not None:
            sym = trace.to_symbolic(self)
            if not isinstance(sym, SymbolicTensor):
                sym = SymbolicTensor(trace.builder, trace.builder.constant(sym))
            return Tensor._wrap_symbolic(sym[_map_key(key, lambda k: _traced_index(trace, k))])
        part = Tensor._wrap(np.array(self.asnumpy()[_map_key(key, _as_index)]))
        part._parent = (weakref.ref(self), key)  # a write into the part writes through into self, as MindSpore's
        return part

    def __getstate__(self) -> Any:  # an indexed part pickles without its link to the tensor it came from
        state = object.__getstate__(self)
        if isinstance(state, tuple) and state[1] and "_parent" in state[1]:
            state = (state[0], {k: v for k, v in state[1].items() if k != "_parent"})
        return state

    def __setitem__(self, key: Any, value: Any) -> None:
        trace = current()
        if self._sym is not None or trace is not None:
            self._set_traced(trace, key, value)
            return
        array = np.array(self.asnumpy())
        array[_map_key(key, _as_index)] = value.asnumpy() if isinstance(value, Tensor) else value
        self._set_host(array)
        parent = getattr(self, "_parent", None)  # self is x[i] of a tensor x: x[i][j] = v writes into x as well
        owner = parent[0]() if parent is not None else None
        if owner is not None:
            owner[parent[1]] = self

    def _set_traced(self, trace: Any, key: Any, value: Any) -> None:
        """x[key] = value in a traced construct: this tensor now stands for the written copy (a Parameter's slice
        is a state write, which the graph cannot express this way)."""
        from tessel.common.parameter import Parameter
        from tessel.compiler.indexing import setitem

        if trace is None or isinstance(self, Parameter):
            raise TraceError(
                "x[key] = value on a Parameter (or outside its trace) cannot be traced; build the new value "
                "(ops.select, ops.concat) and ops.assign it, or run in PYNATIVE_MODE"
            )
        sym = trace.to_symbolic(self)
        if not isinstance(sym, SymbolicTensor):
            sym = SymbolicTensor(trace.builder, trace.builder.constant(sym))
        if isinstance(value, Tensor):
            value = trace.to_symbolic(value)
            if not isinstance(value, SymbolicTensor):
                value = SymbolicTensor(trace.builder, trace.builder.constant(value))
        key = _map_key(key, lambda k: k.asnumpy() if k._sym is None else trace.to_symbolic(k))
        self._sym, self._array, self._ref = setitem(sym, key, value), None, None

    def _set_host(self, array: np.ndarray) -> None:
        self._array, self._ref = array, None

    # --- arithmetic and comparison (MindSpore semantics: scalars are weak, comparisons give bool) --------------------
    def __add__(self, o):
        return apply_op("Add", self, o)

    def __radd__(self, o):
        return apply_op("Add", o, self)

    def __sub__(self, o):
        return apply_op("Sub", self, o)

    def __rsub__(self, o):
        return apply_op("Sub", o, self)

    def __mul__(self, o):
        return apply_op("Mul", self, o)

    def __rmul__(self, o):
        return apply_op("Mul", o, self)

    def __truediv__(self, o):
        return F.div(self, o)

    def __rtruediv__(self, o):
        return F.div(o, self)

    def __floordiv__(self, o):
        return F.floor_divide(self, o)

    def __rfloordiv__(self, o):
        return F.floor_divide(o, self)

    def __mod__(self, o):
        return F.floor_mod(self, o)

    def __rmod__(self, o):
        return F.floor_mod(o, self)

    def __pow__(self, o):
        return F.pow(self, o)

    def __rpow__(self, o):
        return F.pow(o, self)

    def __matmul__(self, o):
        return F.matmul(self, o)

    def __rmatmul__(self, o):
        return F.matmul(o, self)

    def __neg__(self):
        return apply_op("Neg", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return apply_op("Abs", self)

    def __lt__(self, o):
        return apply_op("Less", self, o)

    def __le__(self, o):
        return apply_op("LessEqual", self, o)

    def __gt__(self, o):
        return apply_op("Greater", self, o)

    def __ge__(self, o):
        return apply_op("GreaterEqual", self, o)

    def __eq__(self, o):  # type: ignore[override]
        if not _comparable(o):  # MindSpore: a Tensor equals no None, str or other object
            return False
        return apply_op("Equal", self, o)

    def __ne__(self, o):  # type: ignore[override]
        if not _comparable(o):
            return True
        return apply_op("NotEqual", self, o)

    def __and__(self, o):
        return apply_op("LogicalAnd", *_bool_operands("&", self, o))

    def __rand__(self, o):
        return apply_op("LogicalAnd", *_bool_operands("&", o, self))

    def __or__(self, o):
        return apply_op("LogicalOr", *_bool_operands("|", self, o))

    def __ror__(self, o):
        return apply_op("LogicalOr", *_bool_operands("|", o, self))

    def __xor__(self, o):
        return apply_op("NotEqual", *_bool_operands("^", self, o))

    def __rxor__(self, o):
        return apply_op("NotEqual", *_bool_operands("^", o, self))

    def __invert__(self):
        return F.logical_not(self)  # MindSpore 2.7: ~ of a number tensor is its logical not too (bool)

    # --- methods (each one functional op) ----------------------------------------------------------------------------
    def astype(self, dtype: Any, copy: bool = True) -> Tensor:
        out = F.cast(self, dtype)
        if out is self and copy and current() is None:  # MindSpore: a new tensor unless copy=False
            return Tensor._wrap(np.array(self.asnumpy()))
        return out

    def to(self, dtype: Any) -> Tensor:
        return F.cast(self, dtype)

    def float(self) -> Tensor:
        return F.cast(self, DType.float32)

    def half(self) -> Tensor:
        return F.cast(self, DType.float16)

    def int(self) -> Tensor:
        return F.cast(self, DType.int32)

    def long(self) -> Tensor:
        return F.cast(self, DType.int64)

    def bool(self) -> Tensor:
        return F.cast(self, DType.bool_)

    def double(self) -> Tensor:
        return F.cast(self, DType.float64)

    def fill(self, value: Any) -> Tensor:
        """A tensor of this one's shape and dtype holding `value` (an int tensor truncates 2.5 to 2, as MindSpore)."""
        if isinstance(value, Tensor):
            return F.cast(F.broadcast_to(value, self.shape), self.dtype)
        return F.fill(self.dtype, self.shape, value)

    def reshape(self, *dims, shape: Any = None) -> Tensor:
        """reshape(*shape), reshape(shape) or reshape(shape=shape)."""
        target = _either("reshape", shape=shape, dims=_varargs(dims) if dims else None)  # x.reshape(()): 0-d
        if target is None:
            raise TypeError("Tensor.reshape() missing its shape: give x.reshape(2, 3), x.reshape((2, 3)) or shape=")
        return F.reshape(self, target)

    view = reshape

    def transpose(self, *perm, dim0: Any = None, dim1: Any = None) -> Tensor:
        """MindSpore 2.7's two forms: two ints (or dim0=, dim1=) swap those two dims, whatever the rank (a 2-D
        x.transpose(0, 1) is its transpose); otherwise the arguments are the full permutation (x.transpose(0, 2, 1),
        x.transpose((0, 2, 1))), and none reverses the dims."""
        if dim0 is not None or dim1 is not None:
            if perm or dim0 is None or dim1 is None:
                raise TypeError(
                    "Tensor.transpose: give both dim0= and dim1= and nothing else, e.g. x.transpose(dim0=0, dim1=1)"
                )
            perm = (dim0, dim1)
        if len(perm) == 2 and all(_is_int(d) for d in perm):
            if not all(-self.ndim <= d < self.ndim for d in perm):
                raise ConfigurationError(f"Tensor.transpose{tuple(perm)}: dims must lie in [-{self.ndim}, {self.ndim})")
            order = list(range(self.ndim))
            order[perm[0]], order[perm[1]] = order[perm[1]], order[perm[0]]
            return F.transpose(self, order)
        perm = _varargs(perm)
        return F.transpose(self, perm or tuple(reversed(range(self.ndim))))

    def permute(self, *perm) -> Tensor:
        return F.transpose(self, _varargs(perm))

    def flatten(self, *order_or_dims: Any, order: str = "C", start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """MindSpore 2.7's two forms: flatten(start_dim=0, end_dim=-1) (x.flatten(1), x.flatten(1, 2)) and
        flatten(order='C', *, start_dim=0, end_dim=-1) (x.flatten('F'))."""
        if order_or_dims and isinstance(order_or_dims[0], str):
            if len(order_or_dims) > 1:
                raise TypeError("Tensor.flatten(order): give start_dim= and end_dim= by keyword after the order")
            order = order_or_dims[0]
        elif order_or_dims:
            if len(order_or_dims) > 2:
                raise TypeError(f"Tensor.flatten(start_dim, end_dim) takes at most 2 dims, got {order_or_dims}")
            start_dim, end_dim = (*order_or_dims, end_dim)[:2]
        return F.flatten(self, order, start_dim=start_dim, end_dim=end_dim)

    def squeeze(self, axis=None) -> Tensor:
        return F.squeeze(self, axis)

    def expand_dims(self, axis: int) -> Tensor:
        return F.expand_dims(self, axis)

    def unsqueeze(self, dim: int) -> Tensor:
        return F.expand_dims(self, dim)

    def sum(self, axis=None, dtype=None, keepdims: bool = False, *, dim=None, keepdim: bool = False) -> Tensor:
        """MindSpore 2.7's two forms: sum(dim=None, keepdim=False, *, dtype=None) and sum(axis=None, dtype=None,
        keepdims=False); a bool second argument is keepdim (a.sum(1, True)), a dtype the dtype (a.sum(1, ms.int8))."""
        if isinstance(dtype, bool):
            dtype, keepdim = None, dtype
        return F.sum(self, _either("sum", axis=axis, dim=dim), keepdims or keepdim, dtype=dtype)

    def mean(self, axis=None, keep_dims: bool = False, *, dim=None, keepdim: bool = False, dtype=None) -> Tensor:
        """mean(dim=None, keepdim=False, *, dtype=None) or mean(axis=None, keep_dims=False); with dtype the input
        is cast first."""
        source = self if dtype is None else F.cast(self, dtype)
        return F.mean(source, _either("mean", axis=axis, dim=dim), keep_dims or keepdim)

    def max(self, *dim_keepdim: Any, axis: Any = None, keepdims: bool = False, dim=None, keepdim: bool = False) -> Any:
        """MindSpore 2.7's two forms: t.max(), t.max(axis=a, keepdims=k) give the values; t.max(dim[, keepdim])
        and t.max(dim=d, keepdim=k) give (values, int64 indices). Along one dim the gradient goes to the returned
        index only, as MindSpore's ArgMaxWithValue (ties are not shared)."""
        return _extremum(self, "max", dim_keepdim, axis, keepdims, dim, keepdim)

    def min(self, *dim_keepdim: Any, axis: Any = None, keepdims: bool = False, dim=None, keepdim: bool = False) -> Any:
        """As max: t.min(dim[, keepdim]) gives (values, int64 indices), the axis= form the values."""
        return _extremum(self, "min", dim_keepdim, axis, keepdims, dim, keepdim)

    def all(self, axis=None, keep_dims: bool = False, *, dim=None, keepdim: bool = False) -> Tensor:
        return F.all(self, _either("all", axis=axis, dim=dim), keep_dims or keepdim)

    def any(self, axis=None, keep_dims: bool = False, *, dim=None, keepdim: bool = False) -> Tensor:
        return F.any(self, _either("any", axis=axis, dim=dim), keep_dims or keepdim)

    def argmax(self, axis=None, keepdims: bool = False, *, dim=None, keepdim: bool = False) -> Tensor:
        return F.argmax(self, _either("argmax", axis=axis, dim=dim), keepdims or keepdim)

    def argmin(self, axis=None, keepdims: bool = False, *, dim=None, keepdim: bool = False) -> Tensor:
        """int32, in both forms (MindSpore 2.7 measured: a.argmin(dim=1) is int32 too)."""
        return F.argmin(self, _either("argmin", axis=axis, dim=dim), keepdims or keepdim)

    def abs(self) -> Tensor:
        return apply_op("Abs", self)

    def exp(self) -> Tensor:
        return apply_op("Exp", self)

    def log(self) -> Tensor:
        return apply_op("Log", self)

    def sqrt(self) -> Tensor:
        """An int or bool tensor's square root is float32, as MindSpore 2.7's."""
        return apply_op("Sqrt", self if self.dtype.is_float else F.cast(self, DType.float32))

    def square(self) -> Tensor:
        return apply_op("Square", self)

    def neg(self) -> Tensor:
        return apply_op("Neg", self)

    def matmul(self, tensor2) -> Tensor:
        return F.matmul(self, tensor2)

    def clip(self, min=None, max=None) -> Tensor:
        return F.clamp(self, min, max)

    def clamp(self, min=None, max=None) -> Tensor:
        return F.clamp(self, min, max)

    def add(self, other) -> Tensor:
        return F.add(self, other)

    def sub(self, other) -> Tensor:
        return F.sub(self, other)

    def mul(self, value) -> Tensor:
        return F.mul(self, value)

    def div(self, value, rounding_mode=None) -> Tensor:
        return F.div(self, value, rounding_mode=rounding_mode)

    def pow(self, exponent) -> Tensor:
        return F.pow(self, exponent)

    def gather(self, input_indices=None, axis=None, batch_dims: int = 0, *, dim=None, index=None) -> Tensor:
        """MindSpore 2.7's two forms: gather(dim, index) (an int then a Tensor, or dim=, index=) picks
        input[..., index[i][j], ...] along dim (torch.gather); gather(input_indices, axis, batch_dims=0) takes
        whole slices along axis."""
        if dim is None and index is None and _is_int(input_indices) and isinstance(axis, Tensor):
            return F.gather_elements(self, int(input_indices), axis)
        if dim is None and index is not None and _is_int(input_indices) and axis is None:  # gather(1, index=...)
            return F.gather_elements(self, int(input_indices), index)
        if dim is not None or index is not None:
            if dim is None or index is None or input_indices is not None or axis is not None:
                raise TypeError("Tensor.gather: give gather(dim, index) or gather(input_indices, axis), not a mix")
            return F.gather_elements(self, int(dim), index)
        return F.gather(self, input_indices, axis, batch_dims)

    def chunk(self, chunks: int, axis: int = 0) -> tuple:
        return F.chunk(self, chunks, axis)

    def split(self, split_size_or_sections, axis: int = 0) -> tuple:
        return F.split(self, split_size_or_sections, axis)

    def sigmoid(self) -> Tensor:
        return F.sigmoid(self)

    def tanh(self) -> Tensor:
        return F.tanh(self)

    def round(self) -> Tensor:
        return F.round(self)

    def floor(self) -> Tensor:
        return F.floor(self)

    def ceil(self) -> Tensor:
        return F.ceil(self)

    def sign(self) -> Tensor:
        return F.sign(self)

    def isnan(self) -> Tensor:
        return F.isnan(self)

    def isfinite(self) -> Tensor:
        return F.isfinite(self)

    # --- composed ops (tessel/ops/composed.py), with MindSpore's Tensor-method signatures ---------------------------
    def topk(self, k: int, dim: Any = None, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]:
        return C.topk(self, k, dim, largest, sorted)

    def sort(self, axis=None, descending: bool = False, *, dim=None, stable: bool = False) -> tuple[Tensor, Tensor]:
        """sort(dim=-1, descending=False, stable=False) or sort(axis=-1, descending=False); the sort is always
        stable, which stable=False allows."""
        return C.sort(self, _dim_or_last("sort", axis, dim, stable), descending)

    def argsort(self, axis=None, descending: bool = False, *, dim=None, stable: bool = False) -> Tensor:
        return C.argsort(self, _dim_or_last("argsort", axis, dim, stable), descending)

    def masked_fill(self, mask: Any, value: Any) -> Tensor:
        return C.masked_fill(self, mask, value)

    def cumsum(self, axis: int | None = None, dtype: Any = None, *, dim: int | None = None) -> Tensor:
        """Running sums along `axis` (or dim=); over the flattened tensor when both are None. bool, uint8, int8 and
        int16 inputs sum as int32 unless dtype says otherwise (MindSpore 2.7.0 measured)."""
        axis = _either("cumsum", axis=axis, dim=dim)
        if dtype is None and self.dtype in (DType.bool_, DType.uint8, DType.int8, DType.int16):
            dtype = DType.int32
        return C.cumsum(F.reshape(self, (-1,)) if axis is None else self, 0 if axis is None else axis, dtype)

    def tile(self, reps: Any = None, *, dims: Any = None) -> Tensor:
        """tile(dims) or tile(reps): MindSpore 2.7 takes both names."""
        return C.tile(self, _either("tile", reps=reps, dims=dims))

    def flip(self, dims: Any) -> Tensor:
        return C.flip(self, dims)

    def roll(self, shifts: Any, dims: Any = None) -> Tensor:
        return C.roll(self, shifts, dims)

    def tril(self, diagonal: int = 0) -> Tensor:
        return C.tril(self, diagonal)

    def triu(self, diagonal: int = 0) -> Tensor:
        return C.triu(self, diagonal)

    def narrow(self, axis: int, start: int, length: int) -> Tensor:
        return C.narrow(self, axis, start, length)

    def index_select(self, axis: int | None = None, index: Any = None, *, dim: int | None = None) -> Tensor:
        """index_select(dim, index) or index_select(axis, index), also by keyword."""
        axis = _either("index_select", axis=axis, dim=dim)
        if axis is None or index is None:
            raise TypeError("Tensor.index_select needs a dim and an index, e.g. x.index_select(0, index)")
        return C.index_select(self, axis, index)

    def lerp(self, end: Any, weight: Any) -> Tensor:
        return C.lerp(self, end, weight)

    def logsumexp(self, axis: Any, keepdims: bool = False) -> Tensor:
        return C.logsumexp(self, axis, keepdims)

    def trace(self) -> Tensor:
        return C.trace(self)

    def outer(self, vec2: Any) -> Tensor:
        return C.outer(self, vec2)

    def log1p(self) -> Tensor:
        return C.log1p(self)

    def std(self, axis=None, ddof=0, keepdims: bool = False, *, dim=None, correction=None, keepdim=False) -> Tensor:
        """std(dim=None, *, correction=0, keepdim=False) or std(axis=None, ddof=0, keepdims=False): MindSpore
        2.7's std divides by N - correction with correction 0 unless given (a.std(dim=1) measured so)."""
        if correction is not None:
            ddof = correction
        return C.std(self, _either("std", axis=axis, dim=dim), ddof, keepdims or keepdim)

    def var(self, axis=None, ddof=0, keepdims: bool = False, *, dim=None, correction=None, keepdim=False) -> Tensor:
        """var(dim=None, *, correction=1, keepdim=False) or var(axis=None, ddof=0, keepdims=False): the new form
        (any of dim=, correction=, keepdim=) divides by N - 1 by default, the old one by N."""
        if correction is not None or dim is not None or keepdim:
            ddof = 1 if correction is None else correction
        return C.var(self, _either("var", axis=axis, dim=dim), ddof, keepdims or keepdim)

    def norm(self, ord: Any = None, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
        return C.norm(self, ord, dim, keepdim, dtype=dtype)

    def expm1(self) -> Tensor:
        return C.expm1(self)

    def __getattr__(self, name: str) -> Any:
        if name in _MINDSPORE_METHODS_NOT_YET:
            raise _MissingMethod(
                f"not supported yet: Tensor.{name} (a MindSpore Tensor method tessel lacks); use the ops function "
                f"or numpy on x.asnumpy() meanwhile"
            )
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def broadcast_to(self, shape) -> Tensor:
        return F.broadcast_to(self, shape)


class DynamicShapeTensor(Tensor):
    """`Tensor(shape=[Symbol(divisor=8), 1, 28, 28], dtype=ms.float32)`: a placeholder declaring an input of
    `Cell.set_inputs`. Its dynamic dims read as -1 (MindSpore's shape); it holds no value."""

    __slots__ = ("_declared_dtype", "_declared_shape", "dim_symbols", "symbolic_shape")

    def __init__(self, input_data: Any = None, dtype: Any = None, shape: Any = None, init: Any = None, **options: Any):
        if options:
            keyword_options("Tensor", options, _TENSOR_HINTS, _TENSOR_UNSUPPORTED)
        if dtype is None:
            raise ConfigurationError(
                f"Tensor(shape={shape!r}): a shape with dynamic dims (None or Symbol) needs dtype=, e.g. "
                "Tensor(shape=[None, 10], dtype=ms.float32)"
            )
        self._array, self._ref, self._sym = None, None, None
        self._declared_shape, self.dim_symbols = split_shape(shape)
        self._declared_dtype = to_dtype(dtype)
        items = [shape] if isinstance(shape, Symbol) else list(shape)
        self.symbolic_shape = (
            [d.to_dict() if isinstance(d, Symbol) else d for d in items]
            if any(isinstance(d, Symbol) for d in items)
            else None
        )

    @property
    def shape(self) -> tuple:
        return self._declared_shape

    @property
    def dtype(self) -> DType:
        return self._declared_dtype

    def asnumpy(self) -> np.ndarray:
        raise ConfigurationError(
            f"{self!r} declares an input for Cell.set_inputs and holds no value; pass a Tensor with data instead"
        )

    numpy = asnumpy

    def __repr__(self) -> str:
        return f"Tensor(shape={list(self.shape)}, dtype={ms_name(self.dtype)}, value= )"

    __str__ = __repr__


def _varargs(args: tuple) -> tuple:
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def _as_index(x: Any) -> Any:
    return x.asnumpy() if isinstance(x, Tensor) else x


def _traced_index(trace: Any, key: Tensor) -> Any:
    """A Tensor index inside a trace: its symbol, or a constant one for a Tensor made outside (a 0-d one stays a
    number, a slice position)."""
    index = trace.to_symbolic(key)
    if isinstance(index, np.ndarray) and index.ndim > 0:
        return SymbolicTensor(trace.builder, trace.builder.constant(index))
    return index


# MindSpore Tensor methods tessel has not yet: asking for one says so, where a bare AttributeError would not
_MINDSPORE_METHODS_NOT_YET = frozenset(
    [
        "cumprod",
        "clone",
        "expand",
        "expand_as",
        "repeat",
        "isinf",
        "softmax",
        "log_softmax",
        "where",
        "relu",
        "sort",
        "topk",
        "unique",
        "nonzero",
        "scatter",
        "index_add",
        "diag",
        "inverse",
        "det",
        "addmm",
        "addmv",
        "cross",
        "bincount",
        "histc",
    ]
)


class _MissingMethod(NotSupportedYetError, AttributeError):
    """A MindSpore Tensor method tessel lacks: not supported yet, and an AttributeError to hasattr()."""


def _bool_operands(symbol: str, a: Any, b: Any) -> tuple[Any, Any]:
    """&, | and ^ of bool tensors (MindSpore's bitwise ops on bools are the logical ones); of integers, bitwise,
    which tessel has not yet."""
    if all(F.dtype_of(v) == DType.bool_ for v in (a, b)):
        return a, b
    from tessel.common.support import not_supported_yet

    raise not_supported_yet(
        f"the bitwise {symbol} of {ms_name(F.dtype_of(a))} and {ms_name(F.dtype_of(b))} tensors",
        "tessel computes &, | and ^ of bool tensors (logical) only; compare first, e.g. (x > 0) & (y > 0)",
    )


def _comparable(other: Any) -> bool:
    return (
        other is not None
        and not isinstance(other, str)
        and (isinstance(other, (Tensor, bool, int, float, np.ndarray, np.generic, list, tuple)))
    )


def _map_key(key: Any, convert) -> Any:
    if isinstance(key, tuple):
        return tuple(convert(k) if isinstance(k, Tensor) else k for k in key)
    return convert(key) if isinstance(key, Tensor) else key


def _check_dtype(array: np.ndarray) -> None:
    try:
        as_dtype(array.dtype)
    except TypeError:
        raise ConfigurationError(
            f"cannot make a Tensor of numpy dtype {array.dtype}; use bool, int8/16/32/64, uint8 or float16/32/64"
        ) from None


def dataset_tensor(array: np.ndarray) -> Tensor:
    """A dataset iterator's column (output_numpy=False) as the Tensor MindSpore's iterators yield."""
    return Tensor._wrap(array)


from tessel.ops import composed as C  # noqa: E402 - the functional ops need Tensor defined first
from tessel.ops import functional as F  # noqa: E402


def tensor(input_data: Any = None, dtype: Any = None, shape: Any = None, init: Any = None, const_arg: bool = False):
    """MindSpore 2.x's `ms.tensor(...)`: a Tensor, from the same arguments (also inside a compiled construct)."""
    options = {"const_arg": const_arg} if const_arg else {}
    return Tensor(input_data, dtype, shape, init, **options)


def from_numpy(array: np.ndarray) -> Tensor:
    """MindSpore's `ms.from_numpy`: a Tensor sharing the memory of `array`."""
    return Tensor.from_numpy(array)


def is_tensor(obj: Any) -> bool:
    """MindSpore's `ms.is_tensor`: whether `obj` is a Tensor (a Parameter is one)."""
    return isinstance(obj, Tensor)


def _no_keepdim(method: str, keepdim: bool) -> None:
    if keepdim:
        raise TypeError(
            f"Tensor.{method}: keepdim goes with a dim (t.{method}(1, keepdim=True) or t.{method}(dim=1, "
            "keepdim=True)); with axis= write keepdims="
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _dim_or_last(method: str, axis: Any, dim: Any, stable: bool) -> Any:
    if not isinstance(stable, bool):
        raise TypeError(f"Tensor.{method}: stable must be a bool, got {stable!r}")
    given = _either(method, axis=axis, dim=dim)
    return -1 if given is None else given


def _extremum(x: Tensor, method: str, dim_keepdim: tuple, axis: Any, keepdims: bool, dim: Any, keepdim: bool) -> Any:
    """Tensor.max / Tensor.min: (values, int64 indices) along a dim given positionally or as dim=; the values
    along an int axis= read at the returned index (C.max), so the gradient goes there as in MindSpore."""
    reduce = C.max if method == "max" else C.min
    if dim_keepdim or dim is not None:
        if dim is not None:
            dim_keepdim = (dim, *dim_keepdim)
        if axis is not None:
            raise TypeError(f"Tensor.{method}: give dim or axis=, not both")
        return reduce(x, *_dim_keepdim(method, dim_keepdim, keepdim))
    _no_keepdim(method, keepdim)
    if _is_int(axis) and x.ndim:
        return reduce(x, int(axis), keepdims)[0]
    return (F.amax if method == "max" else F.amin)(x, axis, keepdims)


def _either(method: str, **named: Any) -> Any:
    """The one of MindSpore 2.7's two spellings of an argument (dim= or axis=, ...) that was given, or None."""
    given = {name: value for name, value in named.items() if value is not None}
    if len(given) > 1:
        raise TypeError(f"Tensor.{method}: give one of {' or '.join(f'{n}=' for n in given)}, not both")
    return next(iter(given.values()), None)


def _dim_keepdim(method: str, given: tuple, keepdim: bool) -> tuple[Any, bool]:
    if len(given) > 2:
        raise TypeError(f"Tensor.{method}(dim, keepdim) takes at most 2 positional arguments, got {len(given)}")
    return given[0], bool(given[1]) if len(given) == 2 else bool(keepdim)
