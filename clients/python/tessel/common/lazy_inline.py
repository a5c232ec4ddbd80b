"""`lazy_inline` (MindSpore `mindspore.lazy_inline`): accepted, and a no-op in tessel.

MindSpore compiles a cell decorated so as a reusable subgraph instead of inlining every instance, which shortens
compile time of deep networks (Ascend only) and changes nothing the network computes. tessel traces and compiles
whole graphs, where a repeated block costs its trace once per instance, so the decorator has nothing to do: it
checks its arguments as MindSpore does and calls `__init__` unchanged.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from tessel.common.support import log_once


def lazy_inline(fn: Callable | None = None, attrs: list[str] | str | None = None, policy: str | None = None) -> Any:
    """Decorate a Cell's `__init__` so MindSpore compiles the cell as a reusable subgraph. In tessel: a no-op (it
    only affects compile time; tessel compiles whole graphs), logged once.

        >>> class Block(nn.Cell):
        ...     @ms.lazy_inline
        ...     def __init__(self, width):
        ...         super().__init__()
        ...         self.dense = nn.Dense(width, width)
    """
    if policy not in (None, "front"):
        raise ValueError(f"lazy_inline: policy must be None or 'front', got {policy!r}")
    if attrs is not None and not (
        isinstance(attrs, str) or (isinstance(attrs, list) and all(isinstance(a, str) for a in attrs))
    ):
        raise ValueError(f"lazy_inline: attrs must be a str or a list of str, got {attrs!r}")

    def wrap(init: Callable) -> Callable:
        if inspect.isclass(init):
            raise ValueError(f"lazy_inline decorates the __init__ function of a Cell, not the class {init.__name__}")
        if getattr(init, "__name__", "") != "__init__":
            raise ValueError(
                f"lazy_inline decorates the __init__ function of a Cell, not the function {init.__name__!r}"
            )

        @functools.wraps(init)
        def init_as_is(self: Any, *args: Any, **kwargs: Any) -> None:
            log_once(
                "lazy_inline",
                "lazy_inline: no effect in tessel (it only shortens MindSpore's compile time; tessel compiles whole "
                "graphs)",
                logging.INFO,
            )
            init(self, *args, **kwargs)

        return init_as_is

    return wrap if fn is None else wrap(fn)
