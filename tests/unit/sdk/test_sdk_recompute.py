"""Cell.recompute, Primitive.recompute and ms.recompute as MindSpore documents them: the ops of a recomputed cell
(all but its output ops) are recomputed for the backward pass; gradients equal the run without recomputation and
float64 central differences; MindSpore's keyword arguments work or say not supported yet."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from sdk_testkit import finite_difference, rand, softmax

import tessel as ms
from tessel import nn, ops
from tessel.common.initializer import One, initializer
from tessel.compiler.ir import Recompute
from tessel.core.errors import NotSupportedYetError
from tessel.parallel import trace_network

BATCH, SEQ, HEADS, DIM, BLOCKS = 2, 8, 2, 4, 3
SCALE = 2.37891


class Block(nn.Cell):
    """The Block of MindSpore's recompute sample (tests/acceptance/mindspore_samples/recompute), smaller."""

    def __init__(self, keep_prob: float = 0.9):
        super().__init__()
        self.transpose1, self.transpose2 = ops.Transpose(), ops.Transpose()
        self.transpose3, self.transpose4 = ops.Transpose(), ops.Transpose()
        self.real_div1, self.real_div2 = ops.RealDiv(), ops.RealDiv()
        self.batch_matmul1, self.batch_matmul2 = ops.BatchMatMul(), ops.BatchMatMul()
        self.add, self.softmax, self.dropout = ops.Add(), ops.Softmax(-1), ops.Dropout(keep_prob)
        self.expand_dims, self.sub, self.mul = ops.ExpandDims(), ops.Sub(), ops.Mul()
        self.y = ms.Parameter(initializer(One(), [BATCH, SEQ, SEQ], ms.float32))

    def construct(self, x):
        real_div1 = self.real_div1(self.transpose1(x, (0, 2, 1, 3)), ms.Tensor(SCALE))
        real_div2 = self.real_div2(self.transpose2(x, (0, 2, 3, 1)), ms.Tensor(SCALE))
        batch_matmul1 = self.batch_matmul1(real_div1, real_div2)
        mul = self.mul(self.sub(ms.Tensor([1.0]), self.expand_dims(self.y, 1)), ms.Tensor([-0.0001]))
        dropout = self.dropout(self.softmax(self.add(mul, batch_matmul1)))
        batch_matmul2 = self.batch_matmul2(dropout[0], self.transpose3(x, (0, 2, 1, 3)))
        return self.transpose4(batch_matmul2, (0, 2, 1, 3))


class Net(nn.Cell):
    def __init__(self, recompute: bool, keep_prob: float = 0.9, **kwargs):
        super().__init__()
        self.blocks = nn.CellList()
        for _ in range(BLOCKS):
            block = Block(keep_prob)
            if recompute:
                block.recompute(**kwargs)
            self.blocks.append(block)

    def construct(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class Grad(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.grad, self.net = ops.GradOperation(), net

    def construct(self, x):
        return self.grad(self.net)(x)


def numpy_net(x: np.ndarray) -> float:
    """sum(Net(x)) in float64 without dropout (y = 1 in every block, as initialised)."""
    for _ in range(BLOCKS):
        scores = (x.transpose(0, 2, 1, 3) / SCALE) @ (x.transpose(0, 2, 3, 1) / SCALE)
        probs = softmax(scores + (1.0 - 1.0) * -0.0001)
        x = (probs @ x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    return float(x.sum())


X = rand(BATCH, SEQ, HEADS, DIM, seed=4)


def grads_of(net: nn.Cell, steps: int = 2) -> list[np.ndarray]:
    grad = Grad(net)
    return [grad(ms.Tensor(X)).asnumpy() for _ in range(steps)]


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
def test_recomputed_blocks_give_the_gradients_of_the_plain_network_dropout_included(mode):
    ms.set_context(mode=mode)
    ms.set_seed(1)
    plain = grads_of(Net(recompute=False))
    ms.set_seed(1)
    recomputed = grads_of(Net(recompute=True))
    for step, (got, want) in enumerate(zip(recomputed, plain)):
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")


def test_recomputed_gradients_equal_float64_central_differences():
    (got,) = grads_of(Net(recompute=True, keep_prob=1.0), steps=1)
    want = finite_difference(lambda: numpy_net(x64), x64 := X.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_every_op_of_a_recomputed_cell_but_its_output_is_marked():
    net = Net(recompute=True)
    graph, _ = trace_network(net, X)
    transposes = [n for n in graph.nodes if n.op == "Transpose"]
    outputs = transposes[3::4]  # transpose4 of each block
    assert len(outputs) == BLOCKS and all(n.recompute is None for n in outputs)
    inner = [n for n in graph.nodes if n not in outputs and n.inputs]
    assert inner and all(n.recompute is Recompute.WITH_COMM for n in inner), [n.op for n in inner if not n.recompute]
    plain, _ = trace_network(Net(recompute=False), X)
    assert all(n.recompute is None for n in plain.nodes)


def test_sub_cells_follow_the_parent_and_a_cell_is_configured_once(caplog):
    inner = nn.Dense(4, 4)
    outer = nn.SequentialCell(inner, nn.ReLU(), nn.Dense(4, 2))
    outer.recompute()
    assert inner._recompute_mode is True and inner._output_no_recompute is False  # a child recomputes its output
    assert outer._output_no_recompute is True
    with caplog.at_level(logging.WARNING, logger="tessel"):
        outer.recompute()
    assert "configured only once" in caplog.text


def test_mp_comm_recompute_false_keeps_collective_results():
    net = Net(recompute=True, mp_comm_recompute=False)
    graph, _ = trace_network(net, X)
    assert {n.recompute for n in graph.nodes if n.recompute} == {Recompute.WITHOUT_COMM}


def test_unknown_keywords_and_values_are_mindspore_errors():
    block = Block()
    with pytest.raises(ValueError, match="keyword 'slice' is not recognized"):
        block.recompute(slice=True)
    with pytest.raises(TypeError, match="mp_comm_recompute must be a bool"):
        block.recompute(mp_comm_recompute=1)
    with pytest.raises(NotSupportedYetError, match="parallel_optimizer_comm_recompute=True"):
        block.recompute(parallel_optimizer_comm_recompute=True)
    with pytest.raises(NotSupportedYetError, match="recompute_slice_activation=True"):
        block.recompute(recompute_slice_activation=True)
    block.recompute(parallel_optimizer_comm_recompute=False, recompute_slice_activation=False)
    assert block._recompute_mode is True


class TwoOps(nn.Cell):
    def __init__(self, relu: ops.Primitive):
        super().__init__()
        self.relu, self.sqrt = relu, ops.Sqrt()

    def construct(self, x):
        return self.sqrt(self.relu(x) + 1.0)


def test_primitive_recompute_marks_its_op_and_overrides_the_cell():
    graph, _ = trace_network(TwoOps(ops.ReLU().recompute()), X)
    assert {n.op: n.recompute for n in graph.nodes if n.inputs} == {
        "ReLU": Recompute.WITH_COMM,
        "Add": None,
        "Sqrt": None,
    }
    cell = TwoOps(ops.ReLU().recompute(False))
    cell.recompute()
    graph, _ = trace_network(cell, X)
    assert {n.op: n.recompute for n in graph.nodes if n.inputs} == {
        "ReLU": None,
        "Add": Recompute.WITH_COMM,
        "Sqrt": None,
    }
    with pytest.raises(TypeError, match="mode must be a bool"):
        ops.ReLU().recompute(1)
    # MindSpore's docstring example: the gradient of sqrt(relu(x)) at (-1, 1)
    net = TwoOps(ops.ReLU().recompute())
    grad = Grad(net)(ms.Tensor(np.array([-1.0, 1.0], np.float32))).asnumpy()
    np.testing.assert_allclose(grad, [0.0, 0.5 / np.sqrt(2.0)], rtol=1e-6)


def test_the_functional_form_recomputes_one_call():
    class Outer(nn.Cell):
        def __init__(self, recompute: bool):
            super().__init__()
            self.block, self.relu, self.use = Block(), ops.ReLU(), recompute

        def construct(self, x):
            y = ms.recompute(self.block, x) if self.use else self.block(x)
            return self.relu(y)

    ms.set_seed(2)
    plain = grads_of(Outer(False))
    ms.set_seed(2)
    outer = Outer(True)
    recomputed = grads_of(outer)
    for got, want in zip(recomputed, plain):
        np.testing.assert_array_equal(got, want)
    graph, _ = trace_network(outer, X)
    assert sum(n.recompute is not None for n in graph.nodes) > 5
    with pytest.raises(TypeError, match="only support block which inherited from Cell"):
        ms.recompute(lambda x: x, ms.Tensor(X))
    np.testing.assert_array_equal(ms.recompute(nn.ReLU(), ms.Tensor(X)).asnumpy(), np.maximum(X, 0))


def test_recompute_set_after_the_first_call_retraces():
    net = Net(recompute=False, keep_prob=1.0)
    grad = Grad(net)
    before = grad(ms.Tensor(X)).asnumpy()
    for block in net.blocks:
        block.recompute()
    after = grad(ms.Tensor(X)).asnumpy()
    np.testing.assert_array_equal(after, before)
    entries = [e for found in grad._compiled.entries.values() for e in found]
    assert len(entries) == 2


def test_model_train_with_recomputed_layers_trains_as_without():
    import tessel.dataset as ds
    from tessel import train

    data = rand(32, 6, seed=5)
    labels = (data[:, 0] > 0).astype(np.int32)

    class Losses(train.Callback):
        def __init__(self):
            self.values = []

        def on_train_step_end(self, rc):
            self.values.append(float(rc.original_args().net_outputs.asnumpy()))

    def run(recompute: bool):
        ms.set_seed(3)
        hidden = nn.SequentialCell(nn.Dense(6, 16), nn.ReLU(), nn.Dropout(p=0.2), nn.Dense(16, 16), nn.Tanh())
        if recompute:
            hidden.recompute()
        net = nn.SequentialCell(hidden, nn.Dense(16, 2))
        model = ms.Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
        losses = Losses()
        dataset = ds.NumpySlicesDataset({"data": data, "label": labels}, shuffle=False).batch(8)
        model.train(2, dataset, callbacks=[losses])
        return losses.values, [p.asnumpy() for p in net.trainable_params()]

    plain_losses, plain_params = run(False)
    losses, params = run(True)
    assert losses == plain_losses
    for got, want in zip(params, plain_params):
        np.testing.assert_array_equal(got, want)
