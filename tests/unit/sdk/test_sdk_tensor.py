"""Tensor, Parameter, dtypes and initializers: MindSpore's semantics against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tessel as ms
from tessel import nn, ops
from tessel.compiler import TraceError
from tessel.core.errors import ConfigurationError


def test_default_dtypes_follow_mindspore():
    assert ms.Tensor(1.5).dtype == ms.float32
    assert ms.Tensor(3).dtype == ms.int64
    assert ms.Tensor(True).dtype == ms.bool_
    assert ms.Tensor([1.0, 2.0]).dtype == ms.float32
    assert ms.Tensor(np.zeros(2, np.float64)).dtype == ms.float64  # arrays keep their dtype
    assert ms.Tensor([1, 2], dtype=ms.float16).dtype == ms.float16
    assert ms.dtype_to_nptype(ms.int32) is np.int32


def test_repr_and_str_match_mindspore_layout():
    assert repr(ms.Tensor([1, 2, 3])) == "Tensor(shape=[3], dtype=Int64, value= [1, 2, 3])"
    assert repr(ms.Tensor(np.float32(2.5))) == "Tensor(shape=[], dtype=Float32, value= 2.5)"
    assert repr(ms.Tensor(np.eye(2, dtype=np.float32))).startswith(
        "Tensor(shape=[2, 2], dtype=Float32, value=\n[[1., 0.],"
    )
    assert str(ms.Tensor(np.float32(2.3026438))) == "2.3026438"  # print(loss) shows the value, as MindSpore


def test_arithmetic_and_comparison_match_numpy():
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.linspace(1, 2, 3, dtype=np.float32)
    x, y = ms.Tensor(a), ms.Tensor(b)
    for got, want in [
        (x + y, a + b), (x - y, a - b), (x * y, a * b), (x / y, a / b), (2 - x, 2 - a), (x ** 2, a**2),
        (-x, -a), (abs(-x), a), (x @ x.T, a @ a.T), (x // 2, a // 2), (x % 2, a % 2), (1 / y, 1 / b),
    ]:  # fmt: skip
        assert got.dtype == ms.float32
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-6)
    np.testing.assert_array_equal((x > 2).asnumpy(), a > 2)
    np.testing.assert_array_equal((x == 1).asnumpy(), a == 1)
    assert (x * 2.5).dtype == ms.float32  # Python scalars are weak
    assert (ms.Tensor([7, -7]) // 2).tolist() == [3, -4]  # integer floor division keeps the int dtype
    assert ms.Tensor([1, 2]).__truediv__(2).dtype == ms.float32  # int / int is true division


def test_indexing_methods_and_reductions():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = ms.Tensor(a)
    np.testing.assert_array_equal(x[1, :, 1:3].asnumpy(), a[1, :, 1:3])
    np.testing.assert_array_equal(x[ms.Tensor(np.array([1, 0]))].asnumpy(), a[[1, 0]])
    assert x.shape == (2, 3, 4) and x.ndim == 3 and x.size == 24 and x.nbytes == 96
    np.testing.assert_array_equal(x.reshape(6, 4).asnumpy(), a.reshape(6, 4))
    np.testing.assert_array_equal(x.transpose(2, 0, 1).asnumpy(), a.transpose(2, 0, 1))
    np.testing.assert_allclose(x.sum(axis=1).asnumpy(), a.sum(axis=1))
    np.testing.assert_allclose(x.mean().asnumpy(), a.mean())
    np.testing.assert_allclose(x.max(axis=-1, keepdims=True).asnumpy(), a.max(-1, keepdims=True))
    assert x.argmax().item() == 23 and x.astype(ms.int32).dtype == ms.int32
    assert x.flatten().shape == (24,) and x[0].unsqueeze(0).shape == (1, 3, 4)
    y = ms.Tensor(np.zeros(3, np.float32))
    y[1] = 5.0
    assert y.tolist() == [0.0, 5.0, 0.0]


def test_unsupported_data_is_a_clear_error():
    with pytest.raises(ConfigurationError, match="cannot make a Tensor of numpy dtype"):
        ms.Tensor(np.array(["a"]))
    with pytest.raises(ConfigurationError, match="needs input_data"):
        ms.Tensor()


def test_parameters_are_named_by_their_cell_path():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.flatten = nn.Flatten()
            self.dense_relu_sequential = nn.SequentialCell(nn.Dense(4, 3), nn.ReLU(), nn.Dense(3, 2))
            self.scale = ms.Parameter(ms.Tensor(np.ones(2, np.float32)))

    net = Net()
    names = [p.name for p in net.trainable_params()]
    assert names == [
        "scale",
        "dense_relu_sequential.0.weight",
        "dense_relu_sequential.0.bias",
        "dense_relu_sequential.2.weight",
        "dense_relu_sequential.2.bias",
    ]
    assert [n for n, _ in net.parameters_and_names()] == names
    assert list(net.name_cells()) == ["flatten", "dense_relu_sequential"]
    assert [n for n, _ in net.cells_and_names()][:3] == ["", "flatten", "dense_relu_sequential"]
    assert "Dense<input_channels=4, output_channels=3, has_bias=True>" in repr(net)


def test_parameter_set_data_checks_shape_and_reaches_compiled_graphs():
    dense = nn.Dense(2, 1, weight_init="ones", bias_init="zeros")
    x = ms.Tensor(np.array([[1.0, 2.0]], np.float32))
    assert dense(x).item() == 3.0
    dense.weight.set_data(np.array([[2.0, 0.0]], np.float32))
    assert dense(x).item() == 2.0  # the new host value is put on the daemon before the next run
    with pytest.raises(ConfigurationError, match=r"has shape \(1, 2\), the new value \(3,\)"):
        dense.weight.set_data(np.zeros(3, np.float32))
    assert repr(dense.weight) == "Parameter (name=weight, shape=(1, 2), dtype=Float32, requires_grad=True)"


def test_initializers_follow_mindspore_formulas_and_the_seed():
    ms.set_seed(3)
    first = [nn.Dense(300, 200).weight.asnumpy().copy() for _ in range(2)]
    ms.set_seed(3)
    again = [nn.Dense(300, 200).weight.asnumpy().copy() for _ in range(2)]
    np.testing.assert_array_equal(first[0], again[0])  # same seed, same creation order: same values
    assert not np.array_equal(first[0], first[1])
    bound = 1 / math.sqrt(300)  # Dense's default HeUniform(sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert np.abs(first[0]).max() <= bound and np.abs(first[0]).max() > 0.95 * bound
    normal = ms.common.initializer.initializer("normal", (400, 400)).asnumpy()
    assert abs(normal.std() - 0.01) < 5e-4 and abs(normal.mean()) < 5e-4
    xavier = ms.common.initializer.initializer(ms.common.initializer.XavierUniform(), (100, 300)).asnumpy()
    assert np.abs(xavier).max() <= math.sqrt(6 / 400)
    truncated = ms.common.initializer.initializer(ms.common.initializer.TruncatedNormal(1.0), (1000,)).asnumpy()
    assert np.abs(truncated).max() <= 2.0
    with pytest.raises(ConfigurationError, match="unknown initializer 'gaussian'"):
        nn.Dense(2, 2, weight_init="gaussian")


def test_reading_a_traced_tensor_names_the_line():
    def branchy(x):
        if x.sum() > 0:  # data-dependent control flow
            return x
        return -x

    with pytest.raises(TraceError, match=r"test_sdk_tensor.py:\d+ \(`if x.sum\(\) > 0:"):
        ms.jit(branchy)(ms.Tensor(np.ones(3, np.float32)))


def test_jit_compiles_once_per_signature():
    @ms.jit
    def affine(x, w):
        return ops.matmul(x, w) + 1.0

    a, w = np.ones((4, 3), np.float32), np.full((3, 2), 2.0, np.float32)
    np.testing.assert_allclose(affine(ms.Tensor(a), ms.Tensor(w)).asnumpy(), a @ w + 1)
    np.testing.assert_allclose(affine(ms.Tensor(a[:2]), ms.Tensor(w)).asnumpy(), a[:2] @ w + 1)


def test_a_deep_copied_network_has_its_own_parameters():
    import copy

    net = nn.SequentialCell(nn.Dense(3, 2), nn.ReLU())
    x = ms.Tensor(np.ones((1, 3), np.float32))
    before = net(x).asnumpy()
    twin = copy.deepcopy(net)
    twin[0].weight.set_data(np.zeros((2, 3), np.float32))
    twin[0].bias.set_data(np.zeros(2, np.float32))
    assert twin[0].weight.key != net[0].weight.key and twin[0].weight.name == "0.weight"
    assert twin(x).asnumpy().tolist() == [[0.0, 0.0]]
    np.testing.assert_array_equal(net(x).asnumpy(), before)


def test_parameter_values_change_only_through_set_data():
    p = ms.Parameter(ms.Tensor(np.zeros(2, np.float32)), name="p")
    with pytest.raises(ValueError, match="read-only"):
        p.asnumpy()[0] = 1.0
    p[0] = 2.0  # item assignment goes through set_data
    assert p.asnumpy().tolist() == [2.0, 0.0]


def test_tensor_methods_as_mindspore_defines_them():
    from tessel.core.errors import ConfigurationError, NotSupportedYetError

    x = ms.Tensor(np.zeros((2, 3), np.float32))
    x[0][1] = 5  # MindSpore writes through an indexed part into its tensor
    row = x[1]
    row[2] = 7
    assert x.asnumpy().tolist() == [[0, 5, 0], [0, 0, 7]]
    assert (x == None) is False and (x != None) is True and x not in [None, "a"]  # noqa: E711
    copy = x.astype(ms.float32)  # a new tensor unless copy=False
    copy[0, 0] = 99
    assert x.asnumpy()[0, 0] == 0
    assert float(ms.Tensor([2.5])) == 2.5 and int(ms.Tensor(np.array([3]))) == 3
    with pytest.raises(ConfigurationError, match="Float32 tensor is no index"):
        [10, 20][ms.Tensor(1.7)]
    a, b = ms.Tensor(np.array([True, False])), ms.Tensor(np.array([True, True]))
    assert (a ^ b).asnumpy().tolist() == [False, True] and (a & b).asnumpy().tolist() == [True, False]
    with pytest.raises(NotSupportedYetError, match="the bitwise & of Int64 and Int64 tensors"):
        ms.Tensor(np.array([1, 2])) & ms.Tensor(np.array([3, 1]))


def test_small_integer_tensors_sum_as_int64_counts():
    pixels = ms.Tensor(np.array([[200, 100], [255, 1]], np.uint8))
    total = pixels.sum()
    assert total.dtype == ms.int64 and int(total) == 556  # not wrapped in uint8, not an ONNX Runtime error


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_integer_powers_stay_integers(mode):
    class Powers(nn.Cell):
        def construct(self, x):
            return x**2, 2**x

    ms.set_context(mode=mode)
    squares, twos = Powers()(ms.Tensor(np.array([1, 2, 3], np.int32)))
    assert (
        squares.dtype == ms.int32 and squares.asnumpy().tolist() == [1, 4, 9] and twos.asnumpy().tolist() == [2, 4, 8]
    )


def test_tensor_method_names_of_mindspore():
    from tessel.core.errors import NotSupportedYetError

    t = ms.Tensor(np.array([1.0, -2.0, 3.0], np.float32))
    assert t.clip(min=0).asnumpy().tolist() == [1, 0, 3] and t.clamp(max=0).asnumpy().tolist() == [0, -2, 0]
    assert t.add(1).asnumpy().tolist() == [2, -1, 4] and [c.shape for c in t.chunk(3)] == [(1,)] * 3
    assert not hasattr(t, "cumprod")  # a MindSpore method tessel lacks: an AttributeError to hasattr ...
    with pytest.raises(NotSupportedYetError, match=r"not supported yet: Tensor\.cumprod"):  # ... saying so
        t.cumprod(0)


def test_list_and_array_indices_inside_a_graph_gather_as_in_pynative():
    """x[[0, 2]], x[:, [0, -1]], a numpy index and a constant bool list, traced (they raised 'int() argument must
    be ... not list'); the gradient scatters back, repeated rows adding up."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    keys = [[0, 2], (slice(None), [0, -1]), np.array([2, 0]), [True, False, True], (Ellipsis, [1])]
    ms.set_context(mode=ms.GRAPH_MODE)
    for key in keys:
        eager = ms.Tensor(x)[key]
        traced = ms.jit(lambda t, k=key: t[k])(ms.Tensor(x))
        np.testing.assert_array_equal(traced.asnumpy(), eager.asnumpy(), err_msg=str(key))
        np.testing.assert_array_equal(traced.asnumpy(), x[key])
    grad = ms.grad(ms.jit(lambda t: t[[0, 0, 2]].sum()))(ms.Tensor(x)).asnumpy()
    np.testing.assert_array_equal(grad, np.array([[2.0] * 4, [0.0] * 4, [1.0] * 4]))


def test_item_assignment_inside_a_graph_writes_a_new_value():
    """t[0] = 5, t[1:, ::2] = v, t[..., -1] = tensor in a jit function equal PYNATIVE's; the gradient reaches the
    untouched elements of t and every copy of v; a traced mask or a Parameter slice is a clear TraceError."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = np.array([[10.0, 20.0]], np.float32)

    def write(t, value):
        t = t * 1.0
        t[0] = 5.0
        t[1:, ::2] = value
        t[..., -1] = ops.ones((3,), ms.float32) * 7
        return t

    eager = write(ms.Tensor(x), ms.Tensor(v)).asnumpy()
    assert eager.tolist() == [[5, 5, 5, 7], [10, 5, 20, 7], [10, 9, 20, 7]]
    ms.set_context(mode=ms.GRAPH_MODE)
    np.testing.assert_array_equal(ms.jit(write)(ms.Tensor(x), ms.Tensor(v)).asnumpy(), eager)
    weights = ms.Tensor(x)  # 0..11: the gradient reads the weight of each position a value landed on
    gx, gv = ms.grad(ms.jit(lambda t, value: (write(t, value) * weights).sum()), grad_position=(0, 1))(
        ms.Tensor(x), ms.Tensor(v)
    )
    assert gx.asnumpy().tolist() == [[0, 0, 0, 0], [0, 5, 0, 0], [0, 9, 0, 0]] and gv.asnumpy().tolist() == [[12, 16]]

    def masked(t):
        t = t * 1.0
        t[t > 3] = 0.0
        return t

    with pytest.raises(ConfigurationError, match=r"ops\.masked_fill\(x, mask, value\)"):
        ms.jit(masked)(ms.Tensor(x))
