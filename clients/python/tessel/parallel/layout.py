"""MindSpore's `Layout`: a device matrix with named axes; calling it maps each tensor dim to axes.

    >>> layout = Layout((2, 4), ("dp", "mp"))
    >>> x_layout = layout("dp", "mp")            # dim 0 over the axis of size 2, dim 1 over the axis of size 4
    >>> w_layout = layout("mp", "None")          # dim 0 over "mp", dim 1 whole
    >>> matmul = ops.MatMul().shard((x_layout, w_layout))

A dim may be cut over several axes, major first: `layout(("dp", "mp"), "None")` cuts dim 0 into 8 with "dp"
major. Ranks are row-major over the device matrix, its last axis fastest (MindSpore's `_rank_to_coordinate`).
The tensor map counts axes from the right, as MindSpore's does, so a tensor layout is exactly the compiler's
`tessel.compiler.parallel.Layout` (`TensorLayout.compiler_layout`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

from tessel.core.errors import ConfigurationError, NotSupportedYetError

_NONE = "None"
_INTERLEAVED = "interleaved_parallel"


class Layout:
    """`Layout(device_matrix, alias_name, rank_list=None)` (MindSpore `mindspore.parallel.Layout`)."""

    def __init__(self, device_matrix: Sequence[int], alias_name: Sequence[str], rank_list: Sequence[int] | None = None):
        if not isinstance(device_matrix, tuple) or not isinstance(alias_name, tuple):
            raise TypeError(
                f"Layout: device_matrix and alias_name must be tuples, got {type(device_matrix).__name__} and "
                f"{type(alias_name).__name__}"
            )
        if len(device_matrix) != len(alias_name):
            raise ValueError(
                f"Layout: device_matrix {device_matrix} and alias_name {alias_name} must have the same length"
            )
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in device_matrix):
            raise ValueError(f"Layout: device_matrix entries must be positive ints, got {device_matrix}")
        for name in alias_name:
            if not isinstance(name, str) or not name:
                raise TypeError(f"Layout: every alias must be a non-empty str, got {name!r}")
            if name == _NONE:
                raise ValueError('Layout: "None" is reserved (it means "not split"); name the axis otherwise')
        if len(set(alias_name)) != len(alias_name):
            raise ValueError(f"Layout: aliases must be unique, got {alias_name}")
        if _INTERLEAVED in alias_name:
            if alias_name[-1] != _INTERLEAVED:
                raise ValueError(f'Layout: "{_INTERLEAVED}" may only be the last alias, got {alias_name}')
            raise NotSupportedYetError(
                f"not supported yet: Layout alias {_INTERLEAVED!r} (an op split into interleaved copies); use "
                "nn.MicroBatchInterleaved for copies that overlap communication"
            )
        size = math.prod(device_matrix)
        if rank_list is not None:
            ranks = list(rank_list)
            if len(ranks) != size or not all(isinstance(r, int) for r in ranks):
                raise ValueError(f"Layout: rank_list must hold {size} ints (one per device), got {rank_list!r}")
            if ranks != list(range(size)):
                raise NotSupportedYetError(
                    f"not supported yet: Layout rank_list {ranks} (a device matrix over other ranks than 0..{size - 1})"
                )
        self._device_matrix, self._alias_name = tuple(device_matrix), tuple(alias_name)
        self._rank_list = list(range(size))

    def __call__(self, *tensor_map: str | tuple[str, ...]) -> TensorLayout:
        """The layout of one tensor: per dim an alias, "None" (not split) or a tuple of aliases (major first)."""
        used: set[str] = set()
        entries: list[int | tuple[int, ...]] = []
        for dim in tensor_map:
            names = dim if isinstance(dim, tuple) else (dim,)
            names = tuple(n for n in names if n != _NONE) or (_NONE,)  # "None" inside a tuple splits nothing
            if names == (_NONE,):
                entries.append(-1)
                continue
            axes = []
            for name in names:
                if name not in self._alias_name:
                    raise ValueError(f"Layout: {name!r} is not one of the aliases {self._alias_name}")
                if name in used:
                    raise ValueError(f"Layout: alias {name!r} is used twice in one tensor's layout {tensor_map}")
                used.add(name)
                axes.append(len(self._alias_name) - 1 - self._alias_name.index(name))
            entries.append(axes[0] if len(axes) == 1 else tuple(axes))
        return TensorLayout(self._device_matrix, self._alias_name, tuple(entries), list(self._rank_list))

    def to_dict(self) -> dict[str, Any]:
        return {"device_matrix": self._device_matrix, "alias_name": self._alias_name, "rank_list": self._rank_list}

    def __repr__(self) -> str:
        return f"Layout(device_matrix={self._device_matrix}, alias_name={self._alias_name})"


class TensorLayout(Layout):
    """A Layout applied to one tensor: what `Layout(...)(dims...)` returns."""

    def __init__(self, device_matrix, alias_name, tensor_map, rank_list):  # built by Layout.__call__ only
        self._device_matrix, self._alias_name = device_matrix, alias_name
        self._tensor_map, self._rank_list = tensor_map, rank_list

    def __call__(self, *tensor_map: Any) -> TensorLayout:
        raise ConfigurationError("this is already a tensor's layout; call the Layout itself: layout('dp', 'None')")

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_matrix": self._device_matrix,
            "tensor_map": self._tensor_map,
            "interleaved_parallel": False,
            "alias_name": self._alias_name,
            "rank_list": self._rank_list,
        }

    def compiler_layout(self) -> Any:
        """The same layout as the compiler's `tessel.compiler.parallel.Layout`."""
        from tessel.compiler.parallel import Layout as CompilerLayout

        return CompilerLayout(self._device_matrix, self._tensor_map)

    def __deepcopy__(self, memo: dict) -> TensorLayout:
        return TensorLayout(self._device_matrix, self._alias_name, self._tensor_map, copy.copy(self._rank_list))

    def __repr__(self) -> str:
        return (
            f"Layout(device_matrix={self._device_matrix}, alias_name={self._alias_name}, tensor_map={self._tensor_map})"
        )


def as_compiler_strategy(entries: Sequence[Any] | None) -> tuple | None:
    """A shard() strategy as the compiler takes it: tuples of cuts as they are, TensorLayouts as compiler Layouts.
    Mixing the two kinds in one strategy is an error, as in MindSpore."""
    if entries is None:
        return None
    kinds = {isinstance(e, TensorLayout) for e in entries if e is not None}
    if len(kinds) > 1:
        raise ConfigurationError(
            f"a strategy mixes tuples of cuts and Layouts: {entries}; give every input the same kind (all tuples or "
            "all layouts)"
        )
    if kinds == {True}:
        return tuple(None if e is None else e.compiler_layout() for e in entries)
    return tuple(entries)
