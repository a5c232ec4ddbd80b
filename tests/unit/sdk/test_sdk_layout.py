"""MindSpore's Layout (named device axes), shard() strategies given as Layouts, Cell.shard and ms.parallel.shard:
checked against MindSpore 2.7's own slicing (the table below was computed with MindSpore's TensorTransform)."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import nn, ops
from tessel.compiler.parallel import piece
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.parallel import Layout, shard


def test_layout_to_dict_is_mindsporess():
    layout = Layout((2, 2, 2), ("dp", "sp", "mp"))
    assert layout("mp", ("sp", "dp")).to_dict() == {
        "device_matrix": (2, 2, 2),
        "tensor_map": (0, (1, 2)),
        "interleaved_parallel": False,
        "alias_name": ("dp", "sp", "mp"),
        "rank_list": list(range(8)),
    }


# rank -> (x rows, x cols) of x (32, 784) under layout("mp", ("sp", "dp")): MindSpore 2.7's TensorTransform.
MINDSPORE_SLICES = {
    0: ((0, 16), (0, 196)),
    1: ((16, 32), (0, 196)),
    2: ((0, 16), (392, 588)),
    3: ((16, 32), (392, 588)),
    4: ((0, 16), (196, 392)),
    5: ((16, 32), (196, 392)),
    6: ((0, 16), (588, 784)),
    7: ((16, 32), (588, 784)),
}


@pytest.mark.parametrize("rank", range(8))
def test_a_dim_over_two_axes_is_sliced_as_mindspore_slices_it(rank):
    x = np.arange(32 * 784, dtype=np.float32).reshape(32, 784)
    layout = Layout((2, 2, 2), ("dp", "sp", "mp"))("mp", ("sp", "dp")).compiler_layout()
    (r0, r1), (c0, c1) = MINDSPORE_SLICES[rank]
    np.testing.assert_array_equal(piece(x, layout, rank), x[r0:r1, c0:c1])


def test_layout_errors_name_the_rule():
    with pytest.raises(ValueError, match="same length"):
        Layout((2, 2), ("dp",))
    with pytest.raises(ValueError, match="unique"):
        Layout((2, 2), ("dp", "dp"))
    with pytest.raises(ValueError, match='"None" is reserved'):
        Layout((2, 2), ("dp", "None"))
    with pytest.raises(ValueError, match="used twice"):
        Layout((2, 2), ("dp", "mp"))("dp", "dp")
    with pytest.raises(ValueError, match="not one of the aliases"):
        Layout((2, 2), ("dp", "mp"))("tp", "None")
    with pytest.raises(NotSupportedYetError, match="rank_list"):
        Layout((2, 2), ("dp", "mp"), rank_list=[3, 2, 1, 0])


def test_shard_strategies_take_layouts_but_not_mixed_with_tuples():
    layout = Layout((2, 2), ("dp", "mp"))
    matmul = ops.MatMul().shard((layout("dp", "None"), layout("None", "mp")))
    assert matmul.in_strategy[0].to_dict()["tensor_map"] == (1, -1)
    with pytest.raises(ConfigurationError, match="all of one kind"):
        ops.MatMul().shard((layout("dp", "None"), (1, 2)))


def test_cell_shard_checks_and_plans_parameters():
    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(4, 6)

        def construct(self, x):
            return self.dense(x)

    block = Block()
    assert block.shard(in_strategy=((2, 1),), parameter_plan={"self.dense.weight": (2, 1)}) is block
    assert block.dense.weight._requested == (2, 1)
    with pytest.raises(ConfigurationError, match="one cut per dim, each dividing"):
        Block().shard(in_strategy=((2, 1),), parameter_plan={"self.dense.weight": (4, 1)})
    with pytest.raises(ConfigurationError, match="tuple of positive ints"):
        Block().shard(in_strategy=((0, 1),))


def test_shard_outside_parallel_modes_is_the_function_itself():
    matmul = shard(ops.matmul, in_strategy=((2, 1), (1, 2)))
    x, w = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(matmul(ms.Tensor(x), ms.Tensor(w)).asnumpy(), x @ w)
    with pytest.raises(ConfigurationError, match="needs a Cell"):
        shard(ops.matmul, in_strategy=((2, 1), (1, 2)), parameter_plan={"self.w": (2, 1)})


def test_shard_arguments_are_checked_as_mindspore_checks_them(caplog):
    layout = Layout((2, 4), ("dp", "mp"))
    with pytest.raises(ConfigurationError, match="in_strategy and out_strategy must be of one kind"):
        ops.MatMul().shard(((2, 1), (1, 4)), (layout("dp", "mp"),))
    with pytest.raises(ConfigurationError, match=r"out_strategy .* needs an in_strategy"):
        ops.MatMul().shard(None, ((2, 1),))
    assert layout(("dp", "None"), "mp").to_dict()["tensor_map"] == (1, 0)  # "None" in a tuple splits nothing
    with pytest.raises(ConfigurationError, match="device must be a str"):
        shard(ops.matmul, in_strategy=((2, 1), (1, 2)), device=3)
    with pytest.raises(ConfigurationError, match="level must be an int"):
        nn.Dense(4, 4).shard(in_strategy=((2, 1),), level="a")
    dense = nn.Dense(4, 6)
    dense.shard(in_strategy=((2, 1),), parameter_plan={"weight": (2, 1)})
    dense.shard(in_strategy=((2, 1),), parameter_plan={"weight": (1, 2)})  # MindSpore keeps the first, warns
    assert dense.weight._requested == (2, 1) and "already has strategy (2, 1)" in caplog.text
