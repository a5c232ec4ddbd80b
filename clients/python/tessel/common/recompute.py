"""`mindspore.recompute(block, *args)`: run a cell once, recomputed for the backward pass.

MindSpore offers it in PYNATIVE_MODE only (Cell.recompute is the graph-mode form). tessel differentiates traced
graphs in both modes, so it works in both: inside a traced gradient (value_and_grad, GradOperation, Model.train)
the block's ops are recomputed as `Cell.recompute` recomputes them, for this call only; called with no gradient
being traced it simply runs the block.

    >>> class MyCell(nn.Cell):
    ...     def construct(self, x):
    ...         y = ms.recompute(self.conv, x)
    ...         return self.relu(y)
"""

from __future__ import annotations

from typing import Any

__all__ = ["recompute"]


def recompute(block: Any, *args: Any, **kwargs: Any) -> Any:
    """`block(*args, **kwargs)` with the activations inside `block` recomputed for the backward pass (see module)."""
    from tessel.common.tracing import current
    from tessel.nn.cell import Cell

    if not isinstance(block, Cell):
        raise TypeError("Recompute function now only support block which inherited from Cell!")
    trace = current()
    if trace is None:
        return block(*args, **kwargs)
    return trace.call_cell(_recompute_scope(block), block, *args, **kwargs)


def _recompute_scope(block: Any) -> Any:
    """A cell standing for one recomputed call of `block` (it owns nothing; `block` keeps its parameters)."""
    from tessel.nn.cell import Cell

    scope = Cell(auto_prefix=False)
    object.__setattr__(scope, "_recompute_mode", True)
    object.__setattr__(scope, "_output_no_recompute", True)
    object.__setattr__(scope, "training", block.training)
    return scope
