"""Cell and Primitive APIs of MindSpore's samples: Symbol + Tensor(shape=...) placeholders + Cell.set_inputs,
Cell.set_comm_fusion / Parameter.comm_fusion, Cell.place / Primitive.place, Primitive.add_prim_attr / set_device,
ops.Print, nn.MAELoss and lazy_inline, each against MindSpore 2.7's documented behaviour and error paths."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.core.errors import ConfigurationError, NotSupportedYetError


@pytest.fixture(autouse=True)
def fresh_log_once(monkeypatch):
    from tessel.core import options as support

    monkeypatch.setattr(support, "_logged", set())


# --- Symbol and placeholders ----------------------------------------------------------------------------------------


def test_symbol_checks_its_arguments_like_mindspore():
    s = ms.Symbol(max=64, min=8, divisor=8, remainder=0, unique=True)
    assert s.to_dict() == {"max": 64, "divisor": 8, "id": id(s)}  # min 8 is implied by divisor 8 (N >= 1)
    assert ms.Symbol().to_dict() == {} and str(ms.Symbol(divisor=4, remainder=1)) == "{'divisor': 4, 'remainder': 1}"
    for kwargs, error in [
        ({"max": 1.5}, TypeError),
        ({"divisor": "8"}, TypeError),
        ({"unique": 1}, TypeError),
        ({"min": 0}, ValueError),
        ({"divisor": 0}, ValueError),
        ({"divisor": 4, "remainder": 4}, ValueError),
        ({"remainder": -1}, ValueError),
    ]:
        with pytest.raises(error):
            ms.Symbol(**kwargs)


def test_placeholder_tensor_has_mindspores_shape_and_no_value():
    s0 = ms.Symbol(divisor=8)
    x = ms.Tensor(shape=[s0, 1, 28, 28], dtype=ms.float32)
    assert isinstance(x, ms.Tensor)
    assert x.shape == (-1, 1, 28, 28) and x.ndim == 4 and x.dtype == ms.float32
    assert x.symbolic_shape == [{"divisor": 8}, 1, 28, 28]
    assert repr(x) == "Tensor(shape=[-1, 1, 28, 28], dtype=Float32, value= )"
    y = ms.Tensor(shape=[None, 3], dtype=ms.int32)
    assert y.shape == (-1, 3) and y.symbolic_shape is None
    assert ms.Tensor(shape=s0, dtype=ms.float32).shape == (-1,)
    with pytest.raises(ConfigurationError, match="holds no value"):
        x.asnumpy()
    with pytest.raises(ConfigurationError, match="needs dtype"):
        ms.Tensor(shape=[None, 3])
    with pytest.raises(ConfigurationError, match="take no init"):
        ms.Tensor(shape=[None, 3], dtype=ms.float32, init="zeros")
    with pytest.raises(ConfigurationError, match="each dim"):
        ms.Tensor(shape=[None, "3"], dtype=ms.float32)
    assert ms.Tensor(np.ones((2, 3), np.float32)).shape == (2, 3)  # ordinary tensors are unchanged


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 2)

    def construct(self, x):
        return self.dense(ops.reshape(x, (-1, 4)))


def batch(n: int, dtype=np.float32) -> ms.Tensor:
    return ms.Tensor(rand(n, 1, 2, 2).astype(dtype))


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_set_inputs_checks_each_call_against_the_declaration(mode):
    ms.set_context(mode=mode)
    net = Net()
    declared = ms.Tensor(shape=[ms.Symbol(divisor=8), 1, 2, 2], dtype=ms.float32)
    assert net.set_inputs(declared) is None
    assert net.get_inputs() == (declared,)
    want = rand(16, 1, 2, 2).reshape(16, 4) @ net.dense.weight.asnumpy().T + net.dense.bias.asnumpy()
    np.testing.assert_allclose(net(ms.Tensor(rand(16, 1, 2, 2))).asnumpy(), want, rtol=1e-5, atol=1e-6)
    assert net(batch(8)).shape == (8, 2)
    with pytest.raises(ConfigurationError, match=r"dim 0 is 12.*multiple of 8"):
        net(batch(12))
    with pytest.raises(TypeError, match="dtype"):
        net(batch(8, np.float64))
    with pytest.raises(ConfigurationError, match="rank 3"):
        net(ms.Tensor(rand(8, 2, 2)))
    with pytest.raises(ConfigurationError, match="dim 1 must be 1"):
        net(ms.Tensor(rand(8, 4, 1, 1)))


def test_symbol_bounds_and_unique_symbols():
    class Pair(nn.Cell):
        def construct(self, a, b):
            return a.sum() + b.sum()

    n = ms.Symbol(min=2, max=6, unique=True)
    pair = Pair()
    pair.set_inputs(ms.Tensor(shape=[n, 3], dtype=ms.float32), ms.Tensor(shape=[n], dtype=ms.float32))
    assert float(pair(ms.Tensor(np.ones((4, 3), np.float32)), ms.Tensor(np.ones(4, np.float32)))) == 16.0
    with pytest.raises(ConfigurationError, match="must be equal"):
        pair(ms.Tensor(np.ones((4, 3), np.float32)), ms.Tensor(np.ones(5, np.float32)))
    with pytest.raises(ConfigurationError, match="<= 6"):
        pair(ms.Tensor(np.ones((7, 3), np.float32)), ms.Tensor(np.ones(7, np.float32)))
    with pytest.raises(ConfigurationError, match=">= 2"):
        pair(ms.Tensor(np.ones((1, 3), np.float32)), ms.Tensor(np.ones(1, np.float32)))


def test_set_inputs_argument_errors_and_named_inputs():
    net = Net()
    with pytest.raises(TypeError, match="construct takes 1"):
        net.set_inputs(batch(8), batch(8))
    with pytest.raises(ConfigurationError, match="either by position or by name"):
        net.set_inputs(batch(8), x=batch(8))
    with pytest.raises(ConfigurationError, match=r"no inputs \['y'\]"):
        net.set_inputs(y=batch(8))
    net.set_inputs(x=ms.Tensor(shape=[None, 1, 2, 2], dtype=ms.float32))
    assert set(net.get_inputs()) == {"x"}
    assert net(batch(3)).shape == (3, 2)
    with pytest.raises(ConfigurationError, match="dim 2 must be 2"):
        net(x=ms.Tensor(rand(3, 1, 3, 2)))


def test_declarations_of_inner_cells_are_not_checked_inside_a_compiled_graph():
    # parallel_support_dynamic_shape/main.py declares the loss with the *network's* input shape; MindSpore only
    # checks the declarations of the cell it compiles, so Model.train runs. So does tessel's.
    data = rand(16, 1, 2, 2)
    labels = (data.reshape(16, 4)[:, 0] > 0).astype(np.int32)
    net, loss_fn = Net(), nn.SoftmaxCrossEntropyWithLogits(True)
    s0 = ms.Symbol(divisor=8)
    input_dyn = ms.Tensor(shape=[s0, 1, 2, 2], dtype=ms.float32)
    net.set_inputs(input_dyn)
    loss_fn.set_inputs(input_dyn, ms.Tensor(shape=[s0], dtype=ms.int32))
    model = ms.Model(net, loss_fn, nn.SGD(net.trainable_params(), 1e-2))
    dataset = ds.NumpySlicesDataset({"image": data, "label": labels}, shuffle=False).batch(8)
    model.train(1, dataset, dataset_sink_mode=False)
    assert net(ms.Tensor(data[:8])).shape == (8, 2)


# --- comm fusion --------------------------------------------------------------------------------------------------


class DenseLayer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.input_mapping = nn.Dense(10, 32)
        self.output_mapping = nn.Dense(32, 10)

    def construct(self, x):
        return self.output_mapping(self.input_mapping(x))


class FusionNet(nn.Cell):
    """distributed_comm_fusion/fusion_example_cell.py's network."""

    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.head = nn.Dense(28 * 28, 10)
        self.layer1, self.layer2, self.layer3 = DenseLayer(), DenseLayer(), DenseLayer()

    def construct(self, x):
        return self.layer3(self.layer2(self.layer1(self.head(self.flatten(x)))))


def test_set_comm_fusion_sets_every_trainable_parameter_as_the_sample_prints():
    net = FusionNet()
    assert net.head.set_comm_fusion(0) is net.head
    for i, layer in enumerate((net.layer1, net.layer2, net.layer3), start=1):
        layer.set_comm_fusion(i)
    lines = [f"The parameter {p.name}'s fusion id is {p.comm_fusion}" for p in net.trainable_params()]
    assert lines[:3] == [
        "The parameter head.weight's fusion id is 0",
        "The parameter head.bias's fusion id is 0",
        "The parameter layer1.input_mapping.weight's fusion id is 1",
    ]
    assert lines[-1] == "The parameter layer3.output_mapping.bias's fusion id is 3" and len(lines) == 14


def test_set_comm_fusion_recurse_false_and_bad_values():
    layer = DenseLayer()
    layer.output_mapping.set_comm_fusion(5)
    layer.set_comm_fusion(2, recurse=False)  # DenseLayer holds no parameters itself
    assert layer.output_mapping.weight.comm_fusion == 5
    layer.set_comm_fusion(2)
    assert {p.comm_fusion for p in layer.trainable_params()} == {2}
    for bad in (-1, 1.0, True, "1"):
        with pytest.raises(ConfigurationError, match="fusion_type"):
            layer.set_comm_fusion(bad)


def test_parameter_comm_fusion_defaults_to_one():
    assert nn.Dense(2, 2).weight.comm_fusion == 1
    with pytest.raises(ConfigurationError, match="must be an int >= 0"):
        nn.Dense(2, 2).weight.comm_fusion = -1


def test_parameter_attributes_the_samples_read():
    p = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="w")
    assert (p.name, p.requires_grad, p.layerwise_parallel, p.parallel_optimizer) == ("w", True, False, True)


# --- placement -------------------------------------------------------------------------------------------------------


def test_place_validates_then_is_not_supported_yet():
    net = Net()
    with pytest.raises(NotSupportedYetError, match=r"not supported yet: Net\.place .*pipeline_stage"):
        net.place("MS_WORKER", 0)
    with pytest.raises(NotSupportedYetError, match=r"MatMul\.place"):
        ops.MatMul().place("MS_WORKER", 1)
    with pytest.raises(ValueError, match="MS_WORKER"):
        net.place("MS_SCHED", 0)
    with pytest.raises(ValueError, match=">= 0"):
        net.place("MS_WORKER", -1)
    with pytest.raises(TypeError):
        net.place("MS_WORKER", "0")
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL)
    with pytest.raises(NotSupportedYetError, match="parallel_mode='data_parallel'"):
        net.place("MS_WORKER", 0)


# --- primitive attributes ---------------------------------------------------------------------------------------------


def test_add_prim_attr_keeps_hints_off_the_op_and_returns_self(caplog):
    x, w = rand(2, 3), rand(3, 4)
    matmul = ops.MatMul()
    with caplog.at_level(logging.INFO, logger="tessel"):
        assert matmul.add_prim_attr("enable_nd_tp", True) is matmul
    assert matmul.attrs["enable_nd_tp"] is True and matmul.enable_nd_tp is True
    assert "enable_nd_tp" in caplog.text
    np.testing.assert_allclose(matmul(ms.Tensor(x), ms.Tensor(w)).asnumpy(), x @ w, rtol=1e-5)
    # An attribute the op takes changes the op.
    transposed = ops.MatMul().add_prim_attr("transpose_b", True)
    np.testing.assert_allclose(transposed(ms.Tensor(x), ms.Tensor(w.T)).asnumpy(), x @ w, rtol=1e-5)
    keep = ops.ReduceSum().add_prim_attr("keep_dims", True)
    assert keep(ms.Tensor(x), 1).shape == (2, 1)


def test_set_device_is_add_prim_attr_primitive_target(caplog, monkeypatch):
    from tessel import context

    add = ops.Add().set_device("CPU")
    assert add.primitive_target == "CPU" and add.attrs["primitive_target"] == "CPU"
    with caplog.at_level(logging.INFO, logger="tessel"):
        np.testing.assert_allclose(add(ms.Tensor(np.ones(2, np.float32)), 1.0).asnumpy(), [2.0, 2.0])
    assert caplog.text == ""  # on a CPU target the op runs on the CPU, as asked
    monkeypatch.setitem(context._context, "device_target", "GPU")
    with caplog.at_level(logging.INFO, logger="tessel"):
        ops.MatMul().set_device("CPU")
    assert "runs every op of a graph on its daemon's device" in caplog.text
    with pytest.raises(ConfigurationError, match="device_target must be one of"):
        ops.Add().set_device("TPU")


# --- ops.Print -------------------------------------------------------------------------------------------------------


def test_print_prints_each_argument_on_its_own_line_in_pynative(capsys):
    ms.set_context(mode=ms.PYNATIVE_MODE)

    class PrintDemo(nn.Cell):
        def __init__(self):
            super().__init__()
            self.print = ops.Print()

        def construct(self, x, y):
            self.print("Print Tensor x and Tensor y:", x, y)
            return x

    x = ms.Tensor(np.ones([2, 1]).astype(np.int32))
    y = ms.Tensor(np.ones([2, 2]).astype(np.int32))
    PrintDemo()(x, y)
    assert capsys.readouterr().out == (
        "Print Tensor x and Tensor y:\n"
        "Tensor(shape=[2, 1], dtype=Int32, value=\n[[1],\n [1]])\n"
        "Tensor(shape=[2, 2], dtype=Int32, value=\n[[1, 1],\n [1, 1]])\n"
    )
    param = ms.Parameter(ms.Tensor(np.zeros(2, np.float32)), name="p")
    assert ops.print_("p:", param, 3) is None
    assert capsys.readouterr().out == "p:\nTensor(shape=[2], dtype=Float32, value= [0., 0.])\n3\n"


def test_print_inside_a_compiled_graph_prints_after_each_run(capsys):
    class Printing(nn.Cell):
        def __init__(self):
            super().__init__()
            self.print = ops.Print()

        def construct(self, x):
            self.print("out is:", x * 3)
            return x * 2

    net = Printing()
    for step in range(2):
        got = net(ms.Tensor(np.full(2, step + 1, np.float32)))
        np.testing.assert_array_equal(got.asnumpy(), [2.0 * (step + 1)] * 2)
        shown = f"{3 * (step + 1)}."
        assert capsys.readouterr().out == f"out is:\nTensor(shape=[2], dtype=Float32, value= [{shown}, {shown}])\n"


def test_print_in_a_value_and_grad_step_prints_the_value_it_was_given(capsys):
    class Printing(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), "w")
            self.print = ops.Print()

        def construct(self, x):
            y = x * self.w
            self.print("y", y)
            return y.sum()

    net = Printing()
    loss, grads = ms.value_and_grad(net, None, net.trainable_params())(ms.Tensor(np.array([1.0, 2.0], np.float32)))
    assert float(loss.asnumpy()) == 3.0 and grads[0].asnumpy().tolist() == [1.0, 2.0]
    assert capsys.readouterr().out == "y\nTensor(shape=[2], dtype=Float32, value= [1., 2.])\n"


def test_python_print_of_traced_tensors_runs_at_every_run_as_mindspores_graph_mode(capsys):
    # MindSpore 2.7.0 GRAPH_MODE, print("y is", y, "shape", y.shape) in construct, called with 0s then 1s:
    # y is / Tensor(shape=[3], ... [0 0 0]) / shape / (3) at every call, each item on its own line.
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(np.ones(3, np.float32)), "w")

        def construct(self, x):
            y = x * 2
            print("y is", y, "shape", y.shape)
            print("w", self.w)  # a Parameter prints the value it holds when the graph runs
            print("to stderr", file=sys.stderr)  # not stdout: Python's print, when traced
            return (y * self.w).sum()

    net = Net()
    for step in range(2):
        net(ms.Tensor(np.full(3, step, np.float32)))
        assert capsys.readouterr().out == (
            f"y is\nTensor(shape=[3], dtype=Float32, value= [{2 * step}., {2 * step}., {2 * step}.])\nshape\n(3,)\n"
            "w\nTensor(shape=[3], dtype=Float32, value= [1., 1., 1.])\n"
        )
    net.w.set_data(np.full(3, 5.0, np.float32))
    net(ms.Tensor(np.zeros(3, np.float32)))
    assert "w\nTensor(shape=[3], dtype=Float32, value= [5., 5., 5.])\n" in capsys.readouterr().out


def test_python_print_in_a_sink_mode_network_is_named_once_and_ops_print_refused(caplog):
    class Net(nn.Cell):
        def __init__(self, use_ops_print):
            super().__init__()
            self.dense, self.use_ops_print = nn.Dense(2, 1), use_ops_print

        def construct(self, x):
            y = self.dense(x)
            (ops.Print() if self.use_ops_print else print)("y", y)
            return y

    data = ds.NumpySlicesDataset(
        {"x": np.ones((4, 2), np.float32), "y": np.zeros((4, 1), np.float32)}, shuffle=False
    ).batch(2)
    with caplog.at_level(logging.WARNING, logger="tessel"):
        net = Net(use_ops_print=False)
        ms.Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1)).train(1, data, dataset_sink_mode=True)
    assert any("prints nothing in sink mode" in r.getMessage() for r in caplog.records)
    net = Net(use_ops_print=True)
    with pytest.raises(NotSupportedYetError, match=r"ops\.Print in a network Model\.train runs in sink mode"):
        ms.Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1)).train(1, data, dataset_sink_mode=True)


# --- losses -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mae_loss_matches_mindspores_example(reduction):
    # MindSpore's docstring example: logits [1, 2, 3] against labels [[1, 1, 1], [1, 2, 2]].
    logits = ms.Tensor(np.array([1, 2, 3], np.float32))
    labels = ms.Tensor(np.array([[1, 1, 1], [1, 2, 2]], np.float32))
    per = np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 1.0]])
    want = {"mean": per.mean(), "sum": per.sum(), "none": per}[reduction]
    np.testing.assert_allclose(nn.MAELoss(reduction)(logits, labels).asnumpy(), want, rtol=1e-6)


def test_mae_loss_broadcasts_int_labels_as_the_sapp_sample():
    # sapp/train.py: logits (32, 1) against int32 labels (32,) -> |x_i - y_j| over a (32, 32) grid.
    logits, labels = rand(32, 1), np.arange(32, dtype=np.int32) % 10
    got = nn.MAELoss()(ms.Tensor(logits), ms.Tensor(labels)).asnumpy()
    np.testing.assert_allclose(got, np.abs(logits - labels[None, :]).mean(), rtol=1e-5)
    with pytest.raises(ConfigurationError, match="reduction"):
        nn.MAELoss("average")


def test_the_losses_the_samples_use_exist():
    for name in ("CrossEntropyLoss", "SoftmaxCrossEntropyWithLogits", "MAELoss", "MSELoss", "L1Loss"):
        assert issubclass(getattr(nn, name), nn.Cell)


# --- lazy_inline ------------------------------------------------------------------------------------------------------


def test_lazy_inline_is_an_accepted_no_op(caplog):
    class Block(nn.Cell):
        @ms.lazy_inline
        def __init__(self, width, scale=2.0):
            """Block docstring."""
            super().__init__()
            self.dense, self.scale = nn.Dense(width, width), scale

        def construct(self, x):
            return self.dense(x) * self.scale

    class Front(nn.Cell):
        @ms.lazy_inline(policy="front", attrs=["width"])
        def __init__(self, width):
            super().__init__()
            self.width = width

    with caplog.at_level(logging.INFO, logger="tessel"):
        block = Block(3, scale=0.5)
        Block(3)
    assert Block.__init__.__doc__ == "Block docstring." and block.scale == 0.5
    assert caplog.text.count("lazy_inline: no effect") == 1
    x = rand(2, 3)
    want = (x @ block.dense.weight.asnumpy().T + block.dense.bias.asnumpy()) * 0.5
    np.testing.assert_allclose(block(ms.Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-6)
    assert Front(4).width == 4


def test_lazy_inline_rejects_what_mindspore_rejects():
    with pytest.raises(ValueError, match="not the class"):
        ms.lazy_inline(Net)
    with pytest.raises(ValueError, match="not the function 'construct'"):

        @ms.lazy_inline
        def construct(self, x):
            return x

    with pytest.raises(ValueError, match="policy"):
        ms.lazy_inline(policy="back")
    with pytest.raises(ValueError, match="attrs"):
        ms.lazy_inline(attrs=3)


def test_parameter_names_are_attribute_paths_as_mindspore_names_them(tmp_path):
    class EncoderDecoder(nn.Cell):
        def __init__(self):
            super().__init__()
            self.enc, self.dec = nn.CellList(), nn.CellList()  # filled after assignment: named under their prefixes
            for _ in range(2):
                self.enc.append(nn.Dense(2, 2))
                self.dec.append(nn.Dense(2, 2))
            self.head = nn.SequentialCell(nn.Dense(2, 2))
            self.head.insert(0, nn.Dense(2, 2))

    net = EncoderDecoder()
    names = [p.name for p in net.get_parameters()]
    assert names == [path for path, _ in net.parameters_and_names()]
    assert names[:2] == ["enc.0.weight", "enc.0.bias"] and "dec.1.bias" in names and "head.1.weight" in names
    ms.save_checkpoint(net, str(tmp_path / "net.ckpt"))  # used to fail: both lists named their weights "0.weight"
    wrapped = nn.SequentialCell(nn.SequentialCell(nn.Dense(2, 2)))  # paths, not prefixes piled up per assignment
    assert [p.name for p in wrapped.get_parameters()] == ["0.0.weight", "0.0.bias"]


def test_assigning_to_a_parameter_attribute_sets_its_data_or_is_an_error():
    dense = nn.Dense(2, 2)
    weight = dense.weight
    dense.weight = ms.Tensor(np.eye(2, dtype=np.float32))  # MindSpore: set_data, the Parameter stays trained
    assert dense.weight is weight and np.array_equal(weight.asnumpy(), np.eye(2))
    np.testing.assert_allclose(dense(ms.Tensor(np.ones((1, 2), np.float32))).asnumpy()[0], 1 + dense.bias.asnumpy())
    with pytest.raises(ConfigurationError, match=r"Dense\.bias is a Parameter: assign a Parameter, a Tensor"):
        dense.bias = 3
    with pytest.raises(ConfigurationError, match=r"child_name must be a non-empty str without '\.'"):
        nn.SequentialCell().insert_child_to_cell("a.b", nn.ReLU())


def test_a_parameter_tuple_names_unnamed_parameters_and_refuses_repeated_names():
    class Holder(nn.Cell):
        def __init__(self, *params):
            super().__init__()
            self.ps = ms.ParameterTuple(params)

    unnamed = Holder(ms.Parameter(ms.Tensor(np.ones(2, np.float32))), ms.Parameter(ms.Tensor(np.ones(3, np.float32))))
    assert [p.name for p in unnamed.get_parameters()] == ["Parameter$0", "Parameter$1"]
    w = np.ones(2, np.float32)
    with pytest.raises(ConfigurationError, match="two parameters of a ParameterTuple are named 'w'"):
        Holder(ms.Parameter(ms.Tensor(w), name="w"), ms.Parameter(ms.Tensor(w), name="w"))


def test_bool_tensors_count_and_combine_as_numpy_and_mindspore_do():
    pred, labels = ms.Tensor(np.array([1, 2, 3, 4])), ms.Tensor(np.array([1, 0, 3, 0]))
    hits = pred == labels
    assert hits.sum().asnumpy() == 2 and hits.sum().dtype == ms.int64  # the accuracy idiom: a count
    a, b = ms.Tensor(np.array([True, False, True])), ms.Tensor(np.array([True, True, False]))
    assert (a + b).asnumpy().tolist() == [True, True, True] and (a * b).asnumpy().tolist() == [True, False, False]
    assert bool(a.max().asnumpy()) and not bool(a.min().asnumpy())
    with pytest.raises(ms.compiler.ShapeInferenceError, match="Sub of bool tensors is not defined"):
        a - b


def test_embedding_takes_mindspores_dtype_and_pads_a_table_drawn_later():
    from tessel.common.initializer import no_init_parameters

    table = nn.Embedding(5, 3, use_one_hot=True, dtype=ms.float32)  # MindSpore's default dtype
    ids = ms.Tensor(np.array([[1, 4]], np.int32))
    np.testing.assert_allclose(table(ids).asnumpy()[0], table.embedding_table.asnumpy()[[1, 4]], rtol=1e-6)
    with no_init_parameters():
        padded = nn.Embedding(5, 3, padding_idx=2)
    assert padded.embedding_table.asnumpy()[2].tolist() == [0.0, 0.0, 0.0]


def test_forward_value_and_grad_gives_mindspores_docstring_result():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = ms.Parameter(ms.Tensor(np.ones([2, 2]).astype(np.float32)), name="weight")
            self.matmul = ops.MatMul()

        def construct(self, x):
            return self.matmul(x, self.weight)

    net = Net()
    with_loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits())
    train = nn.ForwardValueAndGrad(with_loss, ms.ParameterTuple(net.trainable_params()), get_all=True, get_by_list=True)
    ones = ms.Tensor(np.ones([1, 2]).astype(np.float32))
    loss, ((dx, dlabels), (dweight,)) = train(ones, ones)
    # MindSpore 2.7.0's docstring: 1.38629436, [[-1, -1]], [[0, 0]], [[-0.5, -0.5], [-0.5, -0.5]]
    np.testing.assert_allclose(loss.asnumpy(), [1.38629436], rtol=1e-6)
    np.testing.assert_allclose(dx.asnumpy(), [[-1.0, -1.0]], rtol=1e-6)
    np.testing.assert_allclose(dlabels.asnumpy(), [[0.0, 0.0]])
    np.testing.assert_allclose(dweight.asnumpy(), np.full((2, 2), -0.5), rtol=1e-6)
    with pytest.raises(TypeError, match="'weights' must be Parameters array"):
        nn.ForwardValueAndGrad(with_loss, get_by_list=True)


def test_with_grad_cell_gives_the_loss_gradients_of_the_trainable_parameters():
    net = nn.Dense(3, 2)
    x, y = ms.Tensor(rand(4, 3)), ms.Tensor(rand(4, 2))
    grads = nn.WithGradCell(net, nn.MSELoss())(x, y)
    want = ms.grad(lambda a, b: nn.MSELoss()(net(a), b), None, net.trainable_params())(x, y)
    assert len(grads) == 2
    for got, expected in zip(grads, want):
        np.testing.assert_allclose(got.asnumpy(), expected.asnumpy(), rtol=1e-6)
    scaled = nn.WithGradCell(net, nn.MSELoss(), sens=ms.Tensor(np.float32(2.0)))(x, y)
    np.testing.assert_allclose(scaled[0].asnumpy(), 2 * want[0].asnumpy(), rtol=1e-6)
