"""`nn.Cell`: MindSpore's module base class, with MindSpore's parameter naming and its two execution modes.

GRAPH_MODE (the default): calling a cell traces `construct` once per input signature, compiles the graph into a
daemon segment and runs it with one Execute per call. PYNATIVE_MODE: `construct` runs in Python, op by op.
Inside a trace (value_and_grad, Model.train, an outer cell) cells simply add their ops to the graph.

Parameter names follow MindSpore: assigning a child cell prefixes its parameters with the attribute name, so
`self.dense_relu_sequential = nn.SequentialCell(nn.Dense(...))` names the weight
"dense_relu_sequential.0.weight". Errors raised while a cell runs name the cell by that path.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from tessel import context
from tessel.common.compiled import CompiledFunction, arg_names_of, captured_changed
from tessel.common.parameter import DEFAULT_NAME, Parameter, ParameterTuple
from tessel.common.tensor import Tensor
from tessel.common.tracing import compute_in, current
from tessel.compiler import GradientError, ShapeInferenceError, TraceError
from tessel.core.errors import ConfigurationError

_calls = threading.local()
log = logging.getLogger("tessel")
_NAMED_ERRORS = (ShapeInferenceError, TraceError, GradientError, ConfigurationError)


class Cell:
    """Base class of networks, layers, losses and optimizers (MindSpore `nn.Cell`)."""

    def __init__(self, auto_prefix: bool = True, flags: dict | None = None):
        object.__setattr__(self, "_params", OrderedDict())
        object.__setattr__(self, "_cells", OrderedDict())
        object.__setattr__(self, "_auto_prefix", auto_prefix)
        object.__setattr__(self, "training", False)
        object.__setattr__(self, "requires_grad", False)
        object.__setattr__(self, "_float_dtype", None)
        object.__setattr__(self, "_output_dtype", None)  # set by tessel.amp: float outputs cast to it on return
        object.__setattr__(self, "_compiled", None)
        object.__setattr__(self, "_pipeline_stage", -1)
        object.__setattr__(self, "_shard", None)

    # --- attributes: parameters and child cells are registered, MindSpore style -------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        params, cells = self.__dict__.get("_params"), self.__dict__.get("_cells")
        if params is None:
            raise ConfigurationError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        if isinstance(value, Parameter):
            if value.name == DEFAULT_NAME:
                value.name = name
            params[name] = value
            cells.pop(name, None)
            self.__dict__.pop(name, None)
        elif isinstance(value, Cell):
            if self._auto_prefix:
                value.update_parameters_name(name + ".")
            cells[name] = value
            params.pop(name, None)
            self.__dict__.pop(name, None)
        elif value is None and (name in params or name in cells):
            (params if name in params else cells)[name] = None
        elif name in params and params[name] is not None:
            # MindSpore: a Tensor assigned to a parameter's attribute sets its data; anything else is an error
            if not isinstance(value, Tensor):
                raise ConfigurationError(
                    f"{type(self).__name__}.{name} is a Parameter: assign a Parameter, a Tensor (which sets its data) "
                    f"or None, not a {type(value).__name__}"
                )
            if value._sym is not None:  # inside a traced construct (self.w = expr, self.w += x): an Assign
                from tessel.ops import functional as F

                F.assign(params[name], value)
            else:
                params[name].set_data(value)
        elif name in cells and cells[name] is not None:
            raise ConfigurationError(
                f"{type(self).__name__}.{name} is a child cell: assign a Cell or None, not a {type(value).__name__}"
            )
        else:
            if isinstance(value, ParameterTuple):
                self._register_tuple(value)
            object.__setattr__(self, name, value)

    def _register_tuple(self, value: ParameterTuple) -> None:
        """MindSpore's ParameterTuple attribute: each parameter registered under its name; unnamed ones become
        "Parameter$N", and two different parameters of one name are an error."""
        params, seen, names = self._params, set(), set()
        for p in value:
            if id(p) in seen:
                continue
            seen.add(id(p))
            if p.name == DEFAULT_NAME:
                serial = self.__dict__.get("_tuple_serial", 0)
                object.__setattr__(self, "_tuple_serial", serial + 1)
                p.name = f"{DEFAULT_NAME}${serial}"
            if p.name in names or (params.get(p.name) is not None and params[p.name] is not p):
                raise ConfigurationError(
                    f"{type(self).__name__}: two parameters of a ParameterTuple are named {p.name!r}; give each "
                    "parameter a unique name"
                )
            names.add(p.name)
            params[p.name] = p

    def __getattr__(self, name: str) -> Any:
        for store in ("_params", "_cells"):
            found = self.__dict__.get(store)
            if found is not None and name in found:
                return found[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for store in (self._params, self._cells):
            if name in store:
                del store[name]
                return
        object.__delattr__(self, name)

    def insert_child_to_cell(self, child_name: str, child_cell: Cell) -> None:
        if not isinstance(child_name, str) or not child_name or "." in child_name:
            raise ConfigurationError(
                f"insert_child_to_cell: child_name must be a non-empty str without '.', got {child_name!r}"
            )
        if not isinstance(child_cell, Cell):
            raise ConfigurationError(f"insert_child_to_cell: {child_name!r} must be a Cell, got {type(child_cell)}")
        # MindSpore's: the child is registered as it is, its parameters keep their names (no prefix, unlike setattr)
        self._cells[child_name] = child_cell
        self._params.pop(child_name, None)
        self.__dict__.pop(child_name, None)

    def insert_param_to_cell(self, param_name: str, param: Parameter, check_name_contain_dot: bool = True) -> None:
        if check_name_contain_dot and "." in param_name:
            raise ConfigurationError(f"parameter name {param_name!r} must not contain '.'")
        setattr(self, param_name, param)

    def update_parameters_name(self, prefix: str = "", recurse: bool = True) -> None:
        """Name every parameter prefix + its attribute path in this cell, as MindSpore does (what assigning this
        cell to a parent's attribute does, with the parent's prefix and the attribute's name). Each cell keeps its
        prefix, so a cell appended to a container later is named under it too."""
        if not isinstance(prefix, str):
            raise ConfigurationError(f"update_parameters_name: prefix must be a str, got {prefix!r}")
        for path, cell in self.cells_and_names() if recurse else [("", self)]:
            object.__setattr__(cell, "_name_prefix", prefix + (path + "." if path else ""))
        for path, p in self.parameters_and_names(expand=recurse):
            p.name = prefix + path

    def check_names_and_refresh_name(self) -> None:
        """Where two parameters share a name, name every parameter by its attribute path (MindSpore's)."""
        names = [p.name for p in self.get_parameters()]
        if len(set(names)) < len(names):
            self.update_parameters_name()

    # --- traversal ----------------------------------------------------------------------------------------------------
    def cells_and_names(self, cells: set | None = None, name_prefix: str = "") -> Iterator[tuple[str, Cell]]:
        """(name, cell) for this cell and every descendant, each once; names are attribute paths."""
        seen = cells if cells is not None else set()
        if id(self) in seen:
            return
        seen.add(id(self))
        yield name_prefix, self
        for name, cell in self._cells.items():
            if cell is not None:
                yield from cell.cells_and_names(seen, f"{name_prefix}.{name}" if name_prefix else name)

    def name_cells(self) -> OrderedDict:
        return OrderedDict((k, v) for k, v in self._cells.items() if v is not None)

    def cells(self):
        return self.name_cells().values()

    def parameters_and_names(self, name_prefix: str = "", expand: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(attribute path, parameter) for every parameter, each once."""
        cells = self.cells_and_names(name_prefix=name_prefix) if expand else [(name_prefix, self)]
        seen = set()
        for cell_name, cell in cells:
            for name, p in cell._params.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{cell_name}.{name}" if cell_name else name), p

    def get_parameters(self, expand: bool = True) -> Iterator[Parameter]:
        for _, p in self.parameters_and_names(expand=expand):
            yield p

    def trainable_params(self, recurse: bool = True) -> list[Parameter]:
        return [p for p in self.get_parameters(recurse) if p.requires_grad]

    def untrainable_params(self, recurse: bool = True) -> list[Parameter]:
        return [p for p in self.get_parameters(recurse) if not p.requires_grad]

    def parameters_dict(self, recurse: bool = True) -> OrderedDict:
        return OrderedDict((p.name, p) for p in self.get_parameters(recurse))

    # --- modes ----------------------------------------------------------------------------------------------------
    def set_train(self, mode: bool = True) -> Cell:
        """Training mode (Dropout active, BatchNorm batch statistics) for this cell and its descendants."""
        for _, cell in self.cells_and_names():
            object.__setattr__(cell, "training", bool(mode))
        return self

    def set_grad(self, requires_grad: bool = True) -> Cell:
        object.__setattr__(self, "requires_grad", requires_grad)
        return self

    def to_float(self, dst_type: Any) -> Cell:
        """Run this cell (and its children) in `dst_type`, float16 or float32 (MindSpore also takes bfloat16, which
        tessel has no dtype for): floating inputs are cast on entry."""
        from tessel.common.dtype import DType, ms_name, to_dtype

        dtype = to_dtype(dst_type)
        if dtype not in (DType.float16, DType.float32):
            raise ConfigurationError(
                f"{self.cls_name}.to_float: dst_type must be float16 or float32 (MindSpore's float16, bfloat16 or "
                f"float32; tessel has no bfloat16), got {ms_name(dtype)}"
            )
        for _, cell in self.cells_and_names():
            object.__setattr__(cell, "_float_dtype", dtype)
        return self

    def set_data_parallel(self) -> Cell:
        """Every op of this cell (and of the cells inside it) without a shard() strategy runs data parallel under
        SEMI_AUTO_PARALLEL / AUTO_PARALLEL (its batch dim cut over all devices), instead of being searched."""
        object.__setattr__(self, "_shard", "data_parallel")
        return self

    def shard(self, in_strategy=None, out_strategy=None, parameter_plan=None, device="Ascend", level=0) -> Cell:
        """Lay this cell's inputs out as `in_strategy` says (one tuple of cuts or one Layout per input) and its
        parameters named in `parameter_plan` as given, under SEMI_AUTO/AUTO_PARALLEL (MindSpore `Cell.shard`);
        the ops inside are planned from there. The cell then always runs compiled (in PYNATIVE_MODE too, as in
        MindSpore). Returns the cell.

            >>> block.shard(in_strategy=((2, 1),), parameter_plan={"self.dense.weight": (2, 1)})
        """
        from tessel.parallel.shard import check_device_and_level, check_in_strategy, log, plan_parameters

        check_device_and_level(device, level, f"{self.cls_name}.shard")
        if device != "Ascend" or level != 0:
            log.info(
                "%s.shard: device=%r and level=%r are MindSpore backend hints; tessel plans every device alike",
                self.cls_name,
                device,
                level,
            )
        strategies = None if in_strategy is None else check_in_strategy(in_strategy, f"{self.cls_name}.shard")
        if out_strategy is not None:
            log.warning("%s.shard: out_strategy is not in use yet (MindSpore ignores it too)", self.cls_name)
        if isinstance(self._shard, dict):
            log.warning("%s.shard: the cell is configured more than once; the last configuration wins", self.cls_name)
        plan_parameters(self, parameter_plan, f"{self.cls_name}.shard")
        object.__setattr__(self, "_shard", {"in_strategy": strategies, "out_strategy": out_strategy})
        return self

    def recompute(self, **kwargs: Any) -> Cell:
        """Recompute this cell for the backward pass (MindSpore `Cell.recompute`): the activations of the ops inside
        it (and inside its sub-cells) are not kept between forward and backward; the backward computes them again
        from the cell's inputs, just before it needs them. The ops producing the cell's outputs are kept, so
        consecutive recomputed cells hold only what passes between them. Gradients are unchanged (the same ops on
        the same values; Dropout draws the same masks); memory goes down, compute up by about one forward pass.

        A cell is configured once: when a parent is configured, children configured before keep their own
        setting. `Primitive.recompute(mode)` on an op inside overrides the cell. Keyword arguments (MindSpore's):
        `mp_comm_recompute=True` also recomputes the collectives the parallel pass inserts for the cell's ops
        (False keeps their results); `parallel_optimizer_comm_recompute` and `recompute_slice_activation` are
        accepted at their defaults (False) only. Changing it after a call compiles the network again. Returns
        the cell (MindSpore returns None).

            >>> for block in net.blocks:
            ...     block.recompute()
        """
        from tessel.common.support import not_supported_yet

        known = ("mp_comm_recompute", "parallel_optimizer_comm_recompute", "recompute_slice_activation")
        for key, value in kwargs.items():
            if key not in known:
                raise ValueError(
                    f"For 'recompute', keyword '{key}' is not recognized! the key kwargs must be 'mp_comm_recompute', "
                    "'parallel_optimizer_comm_recompute', 'recompute_slice_activation'"
                )
            if not isinstance(value, bool):
                raise TypeError(f"{self.cls_name}.recompute: {key} must be a bool, got {type(value).__name__}")
        if kwargs.get("parallel_optimizer_comm_recompute"):
            raise not_supported_yet(
                f"{self.cls_name}.recompute(parallel_optimizer_comm_recompute=True)",
                "the AllGathers of optimizer-sharded weights (enable_parallel_optimizer) are not recomputed; "
                "leave it False",
            )
        if kwargs.get("recompute_slice_activation"):
            raise not_supported_yet(
                f"{self.cls_name}.recompute(recompute_slice_activation=True)",
                "the outputs a recomputed cell keeps are not sliced across model-parallel ranks; leave it False",
            )
        self._recompute()
        if "mp_comm_recompute" in kwargs:
            self._mp_comm_recompute(kwargs["mp_comm_recompute"])
        return self

    def _recompute(self, mode: bool = True, output_recompute: bool = False) -> None:
        """MindSpore's Cell._recompute: configure this cell (once) and its sub-cells not configured yet; the cell
        `recompute()` is called on keeps its output ops, its sub-cells recompute theirs."""
        if self.__dict__.get("_recompute_mode") is not None:
            log.warning(
                "%s.recompute: the recompute interface can be configured only once; when the parent cell is "
                "configured, the child cell should not be configured (this call changes nothing)",
                self.cls_name,
            )
            return
        object.__setattr__(self, "_recompute_mode", bool(mode))
        object.__setattr__(self, "_output_no_recompute", bool(mode) and not output_recompute)
        for cell in self.cells():
            if cell.__dict__.get("_recompute_mode") is None:
                cell._recompute(mode, True)

    def _mp_comm_recompute(self, mp_comm_recompute: bool = True) -> None:
        for _, cell in self.cells_and_names():
            object.__setattr__(cell, "_recompute_comm", bool(mp_comm_recompute))

    def graph_modes(self) -> tuple:
        """What this cell's compiled graph depends on besides its inputs: train/eval mode, the float dtype it runs in
        and its recompute configuration (a change retraces)."""
        state = self.__dict__
        return (
            self.training,
            self._float_dtype,
            state.get("_recompute_mode"),
            state.get("_output_no_recompute"),
            state.get("_recompute_comm", True),
        )

    def set_comm_fusion(self, fusion_type: int, recurse: bool = True) -> Cell:
        """Set `comm_fusion` of this cell's trainable parameters (and its children's, with recurse): the fusion
        group of the collectives that reduce their gradients (0 = not fused). Returns self.

            >>> net.head.set_comm_fusion(0)
        """
        if isinstance(fusion_type, bool) or not isinstance(fusion_type, int) or fusion_type < 0:
            raise ConfigurationError(
                f"{self.cls_name}.set_comm_fusion: fusion_type must be an int >= 0, got {fusion_type!r}"
            )
        for param in self.trainable_params(recurse):
            param.comm_fusion = fusion_type
        return self

    def place(self, role: str, rank_id: int) -> Cell:
        """MindSpore runs this cell's operators on process (role, rank_id); tessel validates the arguments as
        MindSpore does, then raises NotSupportedYetError (see Primitive.place)."""
        from tessel.ops.primitive import check_place

        check_place(f"{self.cls_name}.place", role, rank_id)
        return self

    # --- pipeline parallel ----------------------------------------------------------------------------------------
    @property
    def pipeline_stage(self) -> int:
        """The pipeline stage this cell's operators run on (set_auto_parallel_context(pipeline_stages=S): 0 .. S-1);
        -1 (the default) when not set: they run where the data flow puts them. The innermost cell with a stage
        decides; with pipeline_config {"pipeline_interleave": True} a stage number that comes round again in the
        network's order starts its next chunk.

            >>> net.layer1.pipeline_stage = 0
            >>> net.layer2.pipeline_stage = 1
        """
        return self.__dict__["_pipeline_stage"]

    @pipeline_stage.setter
    def pipeline_stage(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"For 'Cell', the property 'pipeline_stage' must be int type, but got type : {type(value)}")
        if value < 0:
            raise ValueError(f"For 'Cell', the property 'pipeline_stage' can not be less than 0, but got {value}")
        object.__setattr__(self, "_pipeline_stage", value)

    @property
    def pipeline_segment(self) -> int:
        """MindSpore's segment of a cell for the zero_bubble_v scheduler; tessel's zero-bubble schedule
        (zero_bubble_h1) needs none, so only 0 is accepted."""
        return 0

    @pipeline_segment.setter
    def pipeline_segment(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"For 'Cell', the property 'pipeline_segment' must be an int >= 0, got {value!r}")
        if value:
            from tessel.common.support import not_supported_yet

            raise not_supported_yet(
                f"{self.cls_name}.pipeline_segment={value}",
                "segments belong to the zero_bubble_v scheduler; use pipeline_scheduler 'zero_bubble_h1'",
            )

    # --- declared inputs (dynamic shapes) -------------------------------------------------------------------------
    def set_inputs(self, *inputs: Any, **kwargs: Any) -> None:
        """Declare this cell's inputs: Tensors or placeholders `Tensor(shape=[Symbol(...) | None, ...], dtype=...)`.
        Calls of this cell are then checked against them (dtype, rank, fixed dims, each Symbol's rule). tessel
        compiles one graph with a symbolic batch dim for all batch sizes, with or without a declaration.

            >>> net.set_inputs(ms.Tensor(shape=[ms.Symbol(divisor=8), 1, 28, 28], dtype=ms.float32))
        """
        from tessel.common.symbol import check_construct_args

        if inputs and kwargs:
            raise ConfigurationError(f"{self.cls_name}.set_inputs: give the inputs either by position or by name")
        if kwargs:
            names = arg_names_of(self.construct)
            unknown = sorted(set(kwargs) - set(names))
            if unknown:
                raise ConfigurationError(
                    f"{self.cls_name}.set_inputs: construct has no inputs {unknown}; it takes {names}"
                )
            declared = [kwargs.get(name) for name in names]
        else:
            check_construct_args(self.cls_name, self.construct, len(inputs))
            declared = list(inputs)
        object.__setattr__(self, "_declared_inputs", (declared, kwargs or inputs))

    def get_inputs(self) -> Any:
        """What set_inputs declared (the positional tuple, or the dict of named inputs), else None."""
        declared = self.__dict__.get("_declared_inputs")
        return None if declared is None else declared[1]

    @property
    def cls_name(self) -> str:
        return type(self).__name__

    # --- running ----------------------------------------------------------------------------------------------------
    def construct(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self.cls_name} must define construct()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.__dict__.get("_names_checked"):
            # MindSpore's _self_check on a cell's first call: parameters that share a name (cells built with
            # auto_prefix=False, two Parameter(name='x')) are renamed by their attribute paths
            self.check_names_and_refresh_name()
            object.__setattr__(self, "_names_checked", True)
        stack = _calls.__dict__.setdefault("stack", [])
        stack.append(self)
        try:
            trace = current()
            if trace is not None:
                if trace.differentiated and "bprop" in type(self).__dict__:
                    from tessel.common.support import not_supported_yet

                    raise not_supported_yet(
                        f"{self.cls_name}.bprop (a custom backward of a Cell)",
                        "tessel differentiates construct itself and would not call bprop; write the backward as "
                        "ops in construct (e.g. x + ops.stop_gradient(f(x) - x) for a straight-through estimator)",
                    )
                return trace.call_cell(self, self._construct, *args, **kwargs)
            declared = self.__dict__.get("_declared_inputs")
            if declared is not None:  # checked on the outermost call only, as MindSpore checks the compiled cell
                _check_declared(self, declared[0], args, kwargs)
            if context.get_context("mode") == context.PYNATIVE_MODE and not isinstance(self._shard, dict):
                return self._construct(*args, **kwargs)
            return self._graph_call(*args, **kwargs)
        except _NAMED_ERRORS as err:
            raise _named(err, self, stack) from None
        finally:
            stack.pop()

    def _construct(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self._shard, dict) and self._shard["in_strategy"]:
            from tessel.parallel.shard import constrain

            strategies = self._shard["in_strategy"]
            if len(strategies) > len(args):
                raise ConfigurationError(
                    f"{self.cls_name}.shard: in_strategy has {len(strategies)} entries but the cell got {len(args)} "
                    "positional inputs; give one entry per input"
                )
            args = tuple(constrain(a, s) for a, s in zip(args, strategies)) + args[len(strategies) :]
        hooks = self.__dict__.get("_hooks")
        if hooks is not None:
            args, kwargs = hooks.before(self, args, kwargs)
        if self._float_dtype is None:
            out = self.construct(*args, **kwargs)
        else:
            args = tuple(_cast_float(a, self._float_dtype) for a in args)
            with compute_in(self._float_dtype):
                out = self.construct(*args, **kwargs)
        output_dtype = self.__dict__.get("_output_dtype")
        out = out if output_dtype is None else cast_float_outputs(out, output_dtype)
        return out if hooks is None else hooks.after(self, args, kwargs, out)

    # --- hooks (MindSpore's forward hooks; in GRAPH_MODE they run while the network is traced) ---------------------
    def register_forward_pre_hook(self, hook_fn: Callable, with_kwargs: bool = False) -> HookHandle:
        """hook_fn(cell, args) (with_kwargs: (cell, args, kwargs)) runs before construct; a value it returns
        replaces the inputs (a non-tuple is one input; with_kwargs: (new_args, new_kwargs)). Returns a handle
        whose remove() takes the hook off."""
        return self._hook_table().add("pre", hook_fn, with_kwargs)

    def register_forward_hook(self, hook_fn: Callable, with_kwargs: bool = False) -> HookHandle:
        """hook_fn(cell, args, output) (with_kwargs: (cell, args, kwargs, output)) runs after construct; a value it
        returns replaces the output."""
        return self._hook_table().add("post", hook_fn, with_kwargs)

    def register_backward_hook(self, hook_fn: Callable) -> None:
        self._no_backward_hooks("register_backward_hook")

    def register_backward_pre_hook(self, hook_fn: Callable) -> None:
        self._no_backward_hooks("register_backward_pre_hook")

    def _no_backward_hooks(self, method: str) -> None:
        from tessel.common.support import not_supported_yet

        raise not_supported_yet(
            f"{self.cls_name}.{method}", "tessel's backward pass is compiled and calls no Python hook"
        )

    def _hook_table(self) -> _Hooks:
        if self.__dict__.get("_hooks") is None:
            object.__setattr__(self, "_hooks", _Hooks())
        return self._hooks

    def apply(self, fn: Callable[[Cell], Any]) -> Cell:
        """fn(cell) on every child cell (depth first), then on this one (MindSpore's Cell.apply); returns self."""
        for cell in self.cells():
            cell.apply(fn)
        fn(self)
        return self

    def _graph_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled_function()(*args, **kwargs)

    def _compiled_function(self) -> CompiledFunction:
        if self._compiled is None:
            compiled = CompiledFunction(self._traced, self.cls_name, arg_names=arg_names_of(self.construct))
            object.__setattr__(self, "_compiled", compiled)
        return self._compiled

    # --- compiling without running ------------------------------------------------------------------------------
    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Compile this cell's graph for inputs like `args` without running it (MindSpore `Cell.compile`): trace,
        plan and partition it under SEMI_AUTO/AUTO_PARALLEL (parameters take their layouts), and compile the rank
        program on the daemon. A later call with inputs of the same shapes runs it without compiling again.
        Afterwards `parameter_layout_dict` gives the parameters' layouts.

            >>> net.compile(ms.Tensor(np.zeros((32, 784), np.float32)))
        """
        self._compile(args, kwargs)

    def _compile(self, args: tuple, kwargs: dict, backend: bool = True) -> Any:
        """The compiled entry for these inputs (its daemon program too, with `backend`); records the layouts."""
        from tessel.common.engine import engine
        from tessel.parallel.parameter_layout import parameter_layout_dict

        declared = self.__dict__.get("_declared_inputs")
        if declared is not None:
            _check_declared(self, declared[0], args, kwargs)
        entry, call = self._compiled_entry(args, kwargs)
        if backend:
            entry.program(engine(), call.batch_size())
        object.__setattr__(self, "_parameter_layout_dict", parameter_layout_dict(entry.params))
        return entry

    def _compiled_entry(self, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        """(Entry, Call) of what calling this cell with `args` runs (a subclass that runs otherwise says so)."""
        return self._compiled_function().entry(args, kwargs)

    @property
    def parameter_layout_dict(self) -> dict:
        """The layout of each parameter of the last compiled graph of this cell, in MindSpore's format (see
        tessel.parallel.parameter_layout); empty before `compile` (MindSpore `Cell.parameter_layout_dict`)."""
        return self.__dict__.get("_parameter_layout_dict") or {}

    def _traced(self, *args: Any, **kwargs: Any) -> Any:
        return current().call_cell(self, self._construct, *args, **kwargs)

    # --- repr -------------------------------------------------------------------------------------------------------
    def extend_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"  ({name}): " + repr(cell).replace("\n", "\n  ") for name, cell in self.name_cells().items()]
        head = f"{self.cls_name}<{self.extend_repr()}"
        return head + (">" if not lines else "\n" + "\n".join(lines) + "\n  >")


def _check_declared(cell: Cell, declared: list, args: tuple, kwargs: dict) -> None:
    from tessel.common.symbol import check_inputs

    names = arg_names_of(cell.construct)
    values = list(args) + [kwargs.get(name) for name in names[len(args) :]]
    check_inputs(f"{cell.cls_name} (inputs declared by set_inputs)", declared, values)


def _cast_float(value: Any, dtype) -> Any:
    if isinstance(value, Tensor) and value.dtype.is_float and value.dtype != dtype:
        return value.astype(dtype)
    return value


def cast_float_outputs(value: Any, dtype) -> Any:
    """Every float Tensor in `value` (a Tensor, or tuples and lists of them) cast to `dtype`; the rest as it is
    (MindSpore's mixed_precision_cast)."""
    if isinstance(value, (tuple, list)):
        return type(value)(cast_float_outputs(v, dtype) for v in value)
    return _cast_float(value, dtype)


def _named(err: Exception, cell: Cell, stack: list) -> Exception:
    """Name the innermost failing cell by its path from the outermost cell of this call (once)."""
    if getattr(err, "_tessel_cell", None) is None:
        err._tessel_cell = cell
    if len(stack) > 1 or getattr(err, "_tessel_named", False):
        return err
    failing = err._tessel_cell
    path = next((name for name, c in cell.cells_and_names() if c is failing), "")
    where = f"{failing.cls_name} '{path}'" if path else f"{failing.cls_name}"
    named = type(err)(f"in cell {where}: {err}")
    named._tessel_named = True
    return named.with_traceback(err.__traceback__)


class HookHandle:
    """What register_forward_(pre_)hook returns: remove() takes the hook off its cell."""

    def __init__(self, table: dict, key: int):
        self._table, self.handle_id = table, key

    def remove(self) -> None:
        if self._table.pop(self.handle_id, None) is not None:
            captured_changed()


class _Hooks:
    """A cell's forward hooks, run in the order they were registered."""

    def __init__(self):
        self.pre: dict[int, tuple[Callable, bool]] = {}
        self.post: dict[int, tuple[Callable, bool]] = {}
        self._next = 0

    def add(self, kind: str, hook_fn: Callable, with_kwargs: bool) -> HookHandle:
        if not callable(hook_fn):
            raise TypeError(f"a hook must be a function, got {type(hook_fn).__name__}")
        self._next += 1
        table = getattr(self, kind)
        table[self._next] = (hook_fn, bool(with_kwargs))
        captured_changed()
        return HookHandle(table, self._next)

    def before(self, cell: Cell, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        for hook_fn, with_kwargs in list(self.pre.values()):
            if with_kwargs:
                got = hook_fn(cell, args, kwargs)
                if got is not None:
                    if not (isinstance(got, tuple) and len(got) == 2):
                        raise ConfigurationError(
                            f"{cell.cls_name}: a forward pre hook with kwargs must return None or (args, kwargs)"
                        )
                    args, kwargs = got
            else:
                got = hook_fn(cell, args)
                if got is not None:
                    args = got if isinstance(got, tuple) else (got,)
        return args, kwargs

    def after(self, cell: Cell, args: tuple, kwargs: dict, out: Any) -> Any:
        for hook_fn, with_kwargs in list(self.post.values()):
            got = hook_fn(cell, args, kwargs, out) if with_kwargs else hook_fn(cell, args, out)
            if got is not None:
                out = got
        return out
