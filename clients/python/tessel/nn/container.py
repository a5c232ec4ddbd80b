"""Containers: SequentialCell (cells applied in order), CellList (a list of cells) and CellDict (cells by key)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from tessel.core.errors import ConfigurationError
from tessel.nn.cell import Cell


def _check(cell: Any, where: str) -> Cell:
    if not isinstance(cell, Cell):
        raise ConfigurationError(f"{where}: expected a Cell, got {type(cell).__name__}")
    return cell


def _add(container: Cell, key: str, cell: Cell) -> None:
    """A child appended to a container is named under the container's own prefix ("layers.3.weight" where the
    container is a network's "layers"): MindSpore finds that prefix from the names of the children already there
    (and renames all by their paths on the first call when names repeat); tessel knows it."""
    container.insert_child_to_cell(key, cell)
    if container._auto_prefix:
        cell.update_parameters_name(container.__dict__.get("_name_prefix", "") + key + ".")


def _renumber(container: Cell, cells: list[Cell]) -> None:
    """Children "0", "1", … again after an insertion."""
    container._cells.clear()
    for i, cell in enumerate(cells):
        _add(container, str(i), cell)


def _index(container: Cell, index: Any) -> int:
    """An int index into the container's cells, checked as MindSpore checks it."""
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"{type(container).__name__} indices must be an int or a slice, got {type(index).__name__}")
    if not -len(container._cells) <= index < len(container._cells):
        raise IndexError(f"{type(container).__name__} index {index} is out of range for {len(container._cells)} cells")
    return index % len(container._cells)


class SequentialCell(Cell):
    """Cells applied one after the other; children are named "0", "1", … (or by an OrderedDict's keys).

    >>> from tessel import nn
    >>> net = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2))
    """

    def __init__(self, *args: Any):
        super().__init__()
        cells = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple, OrderedDict, dict)) else args
        items = cells.items() if isinstance(cells, dict) else ((str(i), c) for i, c in enumerate(cells))
        for name, cell in items:
            _add(self, name, _check(cell, "SequentialCell"))

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):  # MindSpore's: a SequentialCell of the same keys (its cells renamed by them)
            return SequentialCell(OrderedDict(list(self._cells.items())[index]))
        return list(self._cells.values())[_index(self, index)]

    def __setitem__(self, index: int, cell: Cell) -> None:
        key = list(self._cells)[_index(self, index)]
        _add(self, key, _check(cell, "SequentialCell[index] = cell"))

    def __delitem__(self, index: int | slice) -> None:
        cells = list(self._cells.values())
        del cells[index if isinstance(index, slice) else _index(self, index)]
        # MindSpore renumbers the rest "0", "1", ... too (and renames their parameters; its names lose the
        # attribute after the index, 'seq.1.', which tessel does not copy: 'seq.1.weight')
        _renumber(self, cells)

    def __len__(self) -> int:
        return len(self._cells)

    def __iter__(self):
        return iter(self._cells.values())

    def append(self, cell: Cell) -> SequentialCell:
        _add(self, str(len(self._cells)), _check(cell, "SequentialCell.append"))
        return self

    def insert(self, index: int, cell: Cell) -> SequentialCell:
        cells = list(self._cells.values())
        cells.insert(index, _check(cell, "SequentialCell.insert"))
        _renumber(self, cells)
        return self

    def construct(self, x):
        for cell in self._cells.values():
            x = cell(x)
        return x


class CellList(Cell):
    """A list of cells, registered as children "0", "1", …"""

    def __init__(self, args: Iterable[Cell] | None = None):
        super().__init__()
        for cell in args or ():
            self.append(cell)

    def __getitem__(self, index: int | slice) -> Any:
        cells = list(self._cells.values())
        return CellList(cells[index]) if isinstance(index, slice) else cells[_index(self, index)]

    def __setitem__(self, index: int, cell: Cell) -> None:
        _add(self, list(self._cells)[_index(self, index)], _check(cell, "CellList[index] = cell"))

    def __delitem__(self, index: int | slice) -> None:
        cells = list(self._cells.values())
        del cells[index if isinstance(index, slice) else _index(self, index)]
        _renumber(self, cells)  # MindSpore renumbers the rest "0", "1", ... and renames their parameters

    def __iadd__(self, cells: Iterable[Cell]) -> CellList:
        return self.extend(cells)

    def __len__(self) -> int:
        return len(self._cells)

    def __iter__(self):
        return iter(self._cells.values())

    def append(self, cell: Cell) -> CellList:
        _add(self, str(len(self._cells)), _check(cell, "CellList.append"))
        return self

    def extend(self, cells: Iterable[Cell]) -> CellList:
        for cell in cells:
            self.append(cell)
        return self

    def insert(self, index: int, cell: Cell) -> CellList:
        cells = list(self._cells.values())
        cells.insert(index, _check(cell, "CellList.insert"))
        _renumber(self, cells)
        return self

    def construct(self, *inputs):
        raise ConfigurationError("CellList is a container; call its cells, e.g. for cell in self.layers: x = cell(x)")


class CellDict(Cell):
    """Cells held by string keys, as MindSpore's nn.CellDict: children are named by their keys (a network's
    "blocks" CellDict names its "conv" cell's weight "blocks.conv.weight"). Keys must be strings without "." that
    are not an attribute of Cell; values must be Cells other than CellDict, CellList or SequentialCell.

    >>> from tessel import nn
    >>> heads = nn.CellDict({"cls": nn.Dense(8, 10), "box": nn.Dense(8, 4)})
    """

    def __init__(self, *args: Any, **kwargs: Any):
        if "auto_prefix" in kwargs:  # MindSpore 2.7.0 then reads kwargs["auto_preifx"] (sic) and fails so
            raise KeyError("auto_preifx")
        if kwargs:  # MindSpore ignores other keywords ("reserved"); tessel refuses them rather than drop them
            raise TypeError(f"CellDict takes no keyword arguments, got {sorted(kwargs)}")
        super().__init__()
        if len(args) == 1:
            self.update(args[0])

    def __getitem__(self, key: str) -> Cell:
        return self._cells[key]

    def __setitem__(self, key: str, cell: Cell) -> None:
        self._validate_key(key)
        self._validate_cell_type(cell)
        _add(self, key, cell)

    def __delitem__(self, key: str) -> None:
        del self._cells[key]

    def __len__(self) -> int:
        return len(self._cells)

    def __iter__(self):
        return iter(self._cells)

    def __contains__(self, key: str) -> bool:
        return key in self._cells

    def _validate_key(self, key: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"For 'CellDict', the type of key should be string but got {type(key).__name__}.")
        if hasattr(self, key) and key not in self._cells:
            raise KeyError(f"For 'CellDict', the key can not be same with the attributes of Cell, but got key {key}.")
        if "." in key:
            raise KeyError(f"For 'CellDict', key can not contain \".\", but got key {key}")
        if key == "":
            raise KeyError("For 'CellDict', key can not be empty string \"\", but got key ")

    def _validate_cell_type(self, cell: Any) -> None:
        if cell is None:
            raise TypeError("For 'CellDict', cell can not be None.")
        if not isinstance(cell, Cell):
            raise TypeError(f"For 'CellDict', the type of cell should be Cell, but got {type(cell).__name__}.")
        if isinstance(cell, (CellDict, CellList, SequentialCell)):
            raise TypeError(
                "For 'CellDict', the type of cell can not be CellDict, CellList or SequentialCell, "
                f"but got {type(cell).__name__}."
            )

    def clear(self) -> None:
        self._cells.clear()

    def pop(self, key: str) -> Cell:
        value = self[key]
        del self[key]
        return value

    def keys(self):
        return self._cells.keys()

    def values(self):
        return self._cells.values()

    def items(self):
        return self._cells.items()

    def update(self, cells: Any) -> None:
        """Add or replace cells from a mapping or an iterable of (key, cell) pairs, in their order."""
        if not isinstance(cells, Iterable):
            raise TypeError(
                f"CellDict.update() should be called with an iterable of key-value pairs, got {type(cells).__name__}"
            )
        if isinstance(cells, (Mapping, CellDict)):
            for key, cell in cells.items():
                self[key] = cell
            return
        for index, pair in enumerate(cells):
            if not isinstance(pair, Iterable):
                raise TypeError(
                    f"CellDict update sequence element #{index} should be Iterable; but got {type(pair).__name__}"
                )
            if len(pair) != 2:
                raise ValueError(
                    f"CellDict update sequence element #{index}, length should be 2; but has length {len(pair)}"
                )
            self[pair[0]] = pair[1]

    def construct(self, *inputs):
        raise NotImplementedError("CellDict is a container; call its cells, e.g. x = self.heads['cls'](x)")
