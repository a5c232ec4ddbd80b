"""`mindspore.parallel.function`: `reshard(tensor, layout)`, a layout constraint inside a graph.

>>> layout = Layout((2, 4), ("dp", "mp"))
>>> x = reshard(x, layout("dp", "mp"))    # x cut 2 x 4 from here on; the parallel pass redistributes into it
"""

from __future__ import annotations

from typing import Any

__all__ = ["reshard"]


def reshard(tensor: Any, layout: Any) -> Any:
    """`tensor`, laid out as `layout` (a Layout applied to the tensor's dims) from here on, under SEMI_AUTO/AUTO
    parallelism: the parallel pass redistributes it into that layout and plans what follows from there (MindSpore
    `reshard`). On one device, and outside a compiled graph, it is `tensor` itself (the value never changes)."""
    from tessel.common.engine import engine
    from tessel.common.tensor import Tensor
    from tessel.parallel.layout import TensorLayout
    from tessel.parallel.shard import constrain

    if engine().world_size == 1:
        return tensor
    if not isinstance(tensor, Tensor):
        raise TypeError(f"Reshard takes in Tensor type as the first input param, but got: {type(tensor)}.")
    if not isinstance(layout, TensorLayout):
        raise TypeError(
            f"Reshard only support type mindspore.parallel.Layout (applied to the tensor's dims, "
            f"layout('dp', 'mp')), but got: {type(layout)}."
        )
    return constrain(tensor, layout)
