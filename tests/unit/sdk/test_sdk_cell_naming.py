"""Parameter names through containers and first calls, as MindSpore 2.7.0 gives them (measured with the same
scripts), and the Parameter / dtype printing users see."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import tessel as ms
from tessel import nn


def names(cell: nn.Cell) -> list[str]:
    return [p.name for p in cell.get_parameters()]


@pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
def test_parameters_sharing_a_name_are_renamed_by_path_on_the_first_call(mode):
    ms.set_context(mode=getattr(ms, mode))

    class Net(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.a, self.b = nn.Dense(2, 2), nn.Dense(2, 2)

        def construct(self, x):
            return self.b(self.a(x))

    net = Net()
    assert names(net) == ["weight", "bias", "weight", "bias"]
    net(ms.Tensor(np.ones((1, 2), np.float32)))
    assert names(net) == ["a.weight", "a.bias", "b.weight", "b.bias"]
    nn.SGD(net.trainable_params(), 0.1)  # raised 'two parameters named weight' before the renaming


def test_insert_child_to_cell_keeps_the_childs_names():
    relu = nn.ReLU()
    relu.insert_child_to_cell("child", nn.Dense(2, 2))
    assert names(relu) == ["weight", "bias"]


def test_container_indexing_as_mindspore():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.seq = nn.SequentialCell([nn.Dense(2, 2), nn.ReLU(), nn.Dense(2, 3)])
            self.lst = nn.CellList([nn.Dense(2, 2), nn.Dense(2, 2), nn.Dense(2, 2)])

    net = Net()
    lst = ["lst.0.weight", "lst.0.bias", "lst.1.weight", "lst.1.bias", "lst.2.weight", "lst.2.bias"]
    assert names(net) == ["seq.0.weight", "seq.0.bias", "seq.2.weight", "seq.2.bias", *lst]
    tail = net.seq[1:]  # MindSpore: the same keys, and the sliced cells renamed by them
    assert list(tail._cells) == ["1", "2"] and names(tail) == ["2.weight", "2.bias"]
    net.seq[0] = nn.Dense(2, 2)
    assert names(net)[:2] == ["seq.0.weight", "seq.0.bias"]
    del net.seq[1]  # the rest renumbered (MindSpore's names become 'seq.1.'; tessel keeps the attribute)
    assert list(net.seq._cells) == ["0", "1"] and names(net)[2:4] == ["seq.1.weight", "seq.1.bias"]
    net.lst[1] = nn.Dense(2, 5)
    assert net.lst[1].weight.shape == (5, 2) and names(net)[4:] == lst
    del net.lst[0]
    assert list(net.lst._cells) == ["0", "1"] and names(net)[4:] == lst[:4]
    net.lst += [nn.Dense(2, 7)]
    assert list(net.lst._cells) == ["0", "1", "2"] and names(net)[4:] == lst
    keyed = nn.SequentialCell(OrderedDict([("fc1", nn.Dense(2, 2)), ("act", nn.ReLU()), ("fc2", nn.Dense(2, 2))]))
    assert list(keyed[1:]._cells) == ["act", "fc2"] and names(keyed) == ["fc1.weight", "fc1.bias", *names(keyed[2:])]
    with pytest.raises(IndexError, match="SequentialCell index 5 is out of range for 3 cells"):
        keyed[5]
    with pytest.raises(TypeError, match="indices must be an int or a slice"):
        net.lst["0"] = nn.Dense(2, 2)


def test_parameter_copy_and_printing():
    p = ms.Parameter(ms.Tensor(np.array([1.0, 2.0], np.float32)), name="w")
    copied = p.copy()
    assert isinstance(copied, ms.Parameter) and copied.name == "w" and copied is not p
    assert str(p) == "Parameter (name=w, shape=(2,), dtype=Float32, requires_grad=True)"  # MindSpore's text
    assert (str(ms.float32), str(ms.bool_), str(ms.uint8), f"{ms.int64}") == ("Float32", "Bool", "UInt8", "int64")
