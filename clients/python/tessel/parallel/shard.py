"""Functional sharding: `mindspore.parallel.shard(fn, in_strategy, ...)` and `Cell.shard(...)`.

The strategies say how the *inputs* of the function or cell are cut (tuples of cuts or `Layout`s); each input
goes through a layout constraint (an Identity the parallel pass places with that layout, redistributing into it),
and the ops inside are planned from there, as MindSpore's sharding propagation does for shard functions.
`parameter_plan` fixes the layout of parameters by name (`{"self.dense.weight": (2, 1)}`).

    >>> matmul = ms.parallel.shard(mint.matmul, in_strategy=((2, 4), (4, 1)))
    >>> y = matmul(x, w)                      # x cut 2 x 4, w cut 4 x 1; outside SEMI_AUTO/AUTO: plain matmul
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tessel.core.errors import ConfigurationError
from tessel.parallel.layout import TensorLayout

log = logging.getLogger("tessel.parallel")


class _InputLayout:
    """What the trace records as the creator of a layout constraint: shard()'s strategy for one input."""

    main_op = "Identity"
    out_strategy = None

    def __init__(self, strategy: tuple[int, ...] | TensorLayout):
        self.in_strategy = (strategy,)


def check_in_strategy(in_strategy: Any, where: str) -> tuple:
    """One entry per input: a tuple of positive ints, a Layout applied to the tensor, or None; all of one kind."""
    if not isinstance(in_strategy, (tuple, list)):
        raise ConfigurationError(f"{where}: in_strategy must be a tuple with one entry per input, got {in_strategy!r}")
    kinds = set()
    for entry in in_strategy:
        if entry is None:
            continue
        if isinstance(entry, TensorLayout):
            kinds.add("layout")
        elif isinstance(entry, (tuple, list)) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in entry
        ):
            kinds.add("tuple")
        else:
            raise ConfigurationError(
                f"{where}: each in_strategy entry must be a tuple of positive ints (cuts per dim) or a Layout "
                f"applied to the tensor (layout('dp', 'None')), got {entry!r}"
            )
    if len(kinds) > 1:
        raise ConfigurationError(f"{where}: in_strategy mixes tuples and Layouts: {in_strategy}; use one kind")
    return tuple(e if e is None or isinstance(e, TensorLayout) else tuple(e) for e in in_strategy)


def constrain(x: Any, strategy: Any) -> Any:
    """`x` laid out as `strategy` says (inside a trace under SEMI_AUTO/AUTO; otherwise `x` itself)."""
    from tessel.common.tensor import Tensor
    from tessel.common.tracing import apply_op, created_by, current

    if strategy is None or current() is None or not isinstance(x, Tensor) or not _partitioning():
        return x
    if not isinstance(strategy, TensorLayout) and len(strategy) != x.ndim:
        raise ConfigurationError(
            f"shard: the strategy {strategy} has {len(strategy)} cuts for an input of shape {tuple(x.shape)}; the "
            "rule: one cut per dim"
        )
    with created_by(_InputLayout(strategy)):
        return apply_op("Identity", x)


def _partitioning() -> bool:
    from tessel.common import partition

    return partition.active()


def check_device_and_level(device: Any, level: Any, where: str) -> None:
    """MindSpore's checks of shard's backend hints: device a str, level an int."""
    if not isinstance(device, str):
        raise ConfigurationError(f"{where}: device must be a str (e.g. 'Ascend'), got {device!r}")
    if isinstance(level, bool) or not isinstance(level, int):
        raise ConfigurationError(f"{where}: level must be an int (e.g. 0), got {level!r}")


def plan_parameters(cell: Any, parameter_plan: dict | None, where: str) -> None:
    """Give the cell's parameters named in `parameter_plan` their strategy (MindSpore strips "self." and matches
    the rest against the parameter names; unknown names are warned about and ignored, as in MindSpore)."""
    if not parameter_plan:
        return
    if not isinstance(parameter_plan, dict):
        raise ConfigurationError(f"{where}: parameter_plan must be a dict of parameter name -> strategy")
    params = {p.name: p for p in cell.trainable_params()}
    for name, strategy in parameter_plan.items():
        key = name[len("self.") :] if isinstance(name, str) and name.startswith("self.") else name
        found = params.get(key)
        if found is None:
            log.warning("%s: parameter_plan names %r, which is not a parameter of the cell; ignored", where, name)
            continue
        (checked,) = check_in_strategy((strategy,), where)
        cuts = not isinstance(checked, TensorLayout)
        if cuts and (len(checked) != len(found.shape) or any(s % c for s, c in zip(found.shape, checked))):
            raise ConfigurationError(
                f"{where}: parameter_plan strategy {checked} for {name!r} of shape {found.shape}: one cut per dim, "
                "each dividing its dim"
            )
        earlier = getattr(found, "_requested", None)
        if earlier is not None and earlier != checked:  # MindSpore keeps the first and warns
            log.warning("%s: parameter %r already has strategy %s; %s is ignored", where, name, earlier, checked)
            continue
        found._requested = checked


def shard(
    fn: Callable,
    in_strategy: Sequence,
    out_strategy: Sequence | None = None,
    parameter_plan: dict | None = None,
    device: str = "Ascend",
    level: int = 0,
) -> Callable:
    """`fn` with its inputs laid out as `in_strategy` says (MindSpore `mindspore.parallel.shard`); a Cell is
    sharded in place (`Cell.shard`). Outside SEMI_AUTO/AUTO_PARALLEL over several ranks it is `fn` itself."""
    from tessel.nn.cell import Cell

    if isinstance(fn, Cell):
        return fn.shard(in_strategy, out_strategy, parameter_plan, device, level)
    check_device_and_level(device, level, "shard")
    if not callable(fn):
        raise ConfigurationError(f"shard: fn must be a function or a Cell, got {type(fn).__name__}")
    strategies = check_in_strategy(in_strategy, "shard")
    if out_strategy is not None:
        log.warning("shard: out_strategy is not in use yet (MindSpore ignores it too); outputs follow the plan")
    if parameter_plan:
        raise ConfigurationError("shard: parameter_plan needs a Cell (a function holds no parameters)")

    @functools.wraps(fn)
    def sharded(*args: Any, **kwargs: Any) -> Any:
        if len(args) < len(strategies):
            raise ConfigurationError(
                f"shard: in_strategy has {len(strategies)} entries but {getattr(fn, '__name__', 'fn')} got "
                f"{len(args)} positional inputs"
            )
        args = tuple(constrain(a, s) for a, s in zip(args, strategies)) + args[len(strategies) :]
        return fn(*args, **kwargs)

    return sharded
