"""Cell.register_forward_pre_hook / register_forward_hook / apply as MindSpore 2.7's: hooks see (cell, args[,
kwargs], output), a returned value replaces the inputs or the output, remove() takes a hook off (a traced graph
is rebuilt); backward hooks are refused as not supported yet."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import nn
from tessel.core.errors import NotSupportedYetError


@pytest.mark.parametrize("mode", ["PYNATIVE_MODE", "GRAPH_MODE"])
def test_forward_hooks_replace_inputs_and_outputs_until_removed(mode):
    ms.set_context(mode=getattr(ms, mode))
    net = nn.SequentialCell(nn.Dense(2, 3), nn.ReLU())
    x = ms.Tensor(np.array([[1.0, -2.0]], np.float32))
    plain = net(x).asnumpy()
    calls = []

    def double_input(cell, args):
        calls.append(("pre", type(cell).__name__, len(args)))
        return args[0] * 2  # one value: the new (only) input

    def shift_output(cell, args, output):
        calls.append(("post", type(cell).__name__))
        return output + 100

    pre = net[0].register_forward_pre_hook(double_input)
    post = net.register_forward_hook(shift_output)
    doubled = nn.SequentialCell(net[0], nn.ReLU())  # the same Dense, so the pre hook runs in it too
    np.testing.assert_allclose(net(x).asnumpy(), doubled(x).asnumpy() + 100, rtol=1e-6)
    assert ("pre", "Dense", 1) in calls and ("post", "SequentialCell") in calls
    pre.remove()
    post.remove()
    np.testing.assert_array_equal(net(x).asnumpy(), plain)


def test_hooks_with_kwargs_and_apply():
    ms.set_context(mode=ms.PYNATIVE_MODE)  # the hook reads a shape: a graph traced for any batch has N there
    net = nn.Dense(2, 2)
    seen = {}
    net.register_forward_pre_hook(lambda cell, args, kwargs: seen.update(kwargs=kwargs), with_kwargs=True)
    net.register_forward_hook(lambda cell, args, kwargs, out: seen.update(out=out.shape), with_kwargs=True)
    net(ms.Tensor(np.ones((1, 2), np.float32)))
    assert seen == {"kwargs": {}, "out": (1, 2)}
    order = []
    model = nn.SequentialCell(nn.Dense(2, 2), nn.SequentialCell(nn.ReLU()))
    assert model.apply(lambda cell: order.append(type(cell).__name__)) is model
    assert order == ["Dense", "ReLU", "SequentialCell", "SequentialCell"]  # children first, as MindSpore
    with pytest.raises(NotSupportedYetError, match=r"Dense\.register_backward_hook"):
        net.register_backward_hook(lambda *args: None)
    with pytest.raises(TypeError, match="a hook must be a function"):
        net.register_forward_hook(3)
