"""value_and_grad / grad / GradOperation with MindSpore's calling conventions, against analytic gradients."""

from __future__ import annotations

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
from tessel import nn, ops
from tessel.core.errors import ConfigurationError

X, Y = rand(3, 2), rand(3, 2, seed=1)


def f(x, y):
    return (x * x * y).sum()


def test_grad_position_selects_inputs():
    value, dx = ms.value_and_grad(f)(ms.Tensor(X), ms.Tensor(Y))
    np.testing.assert_allclose(value.asnumpy(), (X * X * Y).sum(), rtol=1e-5)
    np.testing.assert_allclose(dx.asnumpy(), 2 * X * Y, rtol=1e-5)
    _, (dx, dy) = ms.value_and_grad(f, grad_position=(0, 1))(ms.Tensor(X), ms.Tensor(Y))
    np.testing.assert_allclose(dy.asnumpy(), X * X, rtol=1e-5)
    dy = ms.grad(f, grad_position=1)(ms.Tensor(X), ms.Tensor(Y))
    np.testing.assert_allclose(dy.asnumpy(), X * X, rtol=1e-5)
    # MindSpore 2.7.0: a one-position tuple gives the Tensor itself, as the int does; get_all=True keeps a tuple
    dy = ms.grad(f, grad_position=(1,))(ms.Tensor(X), ms.Tensor(Y))
    assert isinstance(dy, ms.Tensor)
    w = ms.Parameter(ms.Tensor(np.float32(2.0)), name="w")
    dx, (_,) = ms.grad(lambda x, y: f(x, y) * w, grad_position=(0,), weights=[w])(ms.Tensor(X), ms.Tensor(Y))
    np.testing.assert_allclose(dx.asnumpy(), 4 * X * Y, rtol=1e-5)
    assert isinstance(ops.GradOperation(get_all=True)(lambda x: (x * x).sum())(ms.Tensor(X)), tuple)


def test_weights_and_has_aux():
    w = ms.Parameter(ms.Tensor(rand(2, 4, seed=2)), name="w")
    b = ms.Parameter(ms.Tensor(np.zeros(4, np.float32)), name="b")

    def forward(x):
        out = ops.matmul(x, w) + b
        return out.sum(), out

    (loss, out), (dw, db) = ms.value_and_grad(forward, None, [w, b], has_aux=True)(ms.Tensor(X))
    np.testing.assert_allclose(out.asnumpy(), X @ w.asnumpy(), rtol=1e-5)
    np.testing.assert_allclose(loss.asnumpy(), (X @ w.asnumpy()).sum(), rtol=1e-5)
    np.testing.assert_allclose(dw.asnumpy(), X.sum(0)[:, None].repeat(4, 1), rtol=1e-5)
    np.testing.assert_allclose(db.asnumpy(), np.full(4, 3.0), rtol=1e-5)
    _, (dx, (dw2,)) = ms.value_and_grad(forward, 0, (w,), has_aux=True)(ms.Tensor(X))
    np.testing.assert_allclose(dx.asnumpy(), np.broadcast_to(w.asnumpy().sum(1), X.shape), rtol=1e-5)
    np.testing.assert_allclose(dw2.asnumpy(), dw.asnumpy())
    grads, aux = ms.grad(forward, None, w, has_aux=True)(ms.Tensor(X))  # one Parameter: one gradient
    np.testing.assert_allclose(grads.asnumpy(), dw.asnumpy())
    assert len(aux) == 1 and aux[0].shape == (3, 4)


def test_several_outputs_without_aux_are_summed():
    _, dx = ms.value_and_grad(lambda x: (x * 2.0, (x * x).sum()))(ms.Tensor(X))
    np.testing.assert_allclose(dx.asnumpy(), 2 + 2 * X, rtol=1e-5)


def test_nested_outputs_are_all_summed():
    """MindSpore 2.7.0 gives ((a * b, a.sum()), b * 2.0) at a = [1, -2, 3], b = [0.5, 4, -1] the gradients
    a: [1.5, 5, 0], b: [3, 0, 5]; [[a * b], (a.sum(), [b * 3.0])] gives b: [4, 1, 6]."""
    a, b = ms.Tensor(np.array([[1.0, -2.0, 3.0]], np.float32)), ms.Tensor(np.array([[0.5, 4.0, -1.0]], np.float32))
    da, db = ms.grad(lambda a, b: ((a * b, a.sum()), b * 2.0), (0, 1))(a, b)
    assert da.asnumpy().tolist() == [[1.5, 5.0, 0.0]] and db.asnumpy().tolist() == [[3.0, 0.0, 5.0]]
    ((_, total), _), (da, db) = ms.value_and_grad(lambda a, b: ((a * b, a.sum()), b * 2.0), (0, 1))(a, b)
    assert total.asnumpy() == 2.0 and da.asnumpy().tolist() == [[1.5, 5.0, 0.0]]
    da, db = ms.grad(lambda a, b: [[a * b], (a.sum(), [b * 3.0])], (0, 1))(a, b)
    assert da.asnumpy().tolist() == [[1.5, 5.0, 0.0]] and db.asnumpy().tolist() == [[4.0, 1.0, 6.0]]


def test_stop_gradient_of_a_tuple_stops_each_tensor():
    """MindSpore 2.7.0: stop_gradient((x, y)) is a tuple of the two; a list (nested too) keeps its structure;
    grad of (stop_gradient((a * b, b))[0] * b + a * b).sum() is a: [0.5, 4, -1], b: [1.5, -10, 0]."""
    a, b = ms.Tensor(np.array([[1.0, -2.0, 3.0]], np.float32)), ms.Tensor(np.array([[0.5, 4.0, -1.0]], np.float32))
    stopped = ops.stop_gradient((a, b))
    assert isinstance(stopped, tuple) and stopped[1].asnumpy().tolist() == [[0.5, 4.0, -1.0]]
    nested = ops.stop_gradient([a, (b, 3.0)])
    assert isinstance(nested, list) and isinstance(nested[1], tuple) and nested[1][1] == 3.0
    da, db = ms.grad(lambda a, b: (ops.stop_gradient((a * b, b))[0] * b + a * b).sum(), (0, 1))(a, b)
    assert da.asnumpy().tolist() == [[0.5, 4.0, -1.0]] and db.asnumpy().tolist() == [[1.5, -10.0, 0.0]]


def test_a_tuple_sens_seeds_each_output():
    """MindSpore 2.7.0: GradOperation(get_all=True, sens_param=True) of (a * b, (a - b).sum()) with sens
    (ones, 2.0) gives a: [2.5, 6, 1], b: [-1, -4, 1]; nested outputs take nested sens alike."""
    a, b = ms.Tensor(np.array([[1.0, -2.0, 3.0]], np.float32)), ms.Tensor(np.array([[0.5, 4.0, -1.0]], np.float32))
    sens = (ms.Tensor(np.ones((1, 3), np.float32)), ms.Tensor(np.array(2.0, np.float32)))
    grad_op = ops.GradOperation(get_all=True, sens_param=True)
    da, db = grad_op(lambda a, b: (a * b, (a - b).sum()))(a, b, sens)
    assert da.asnumpy().tolist() == [[2.5, 6.0, 1.0]] and db.asnumpy().tolist() == [[-1.0, -4.0, 1.0]]
    third = ms.Tensor(np.array([[1.0, 2.0, 3.0]], np.float32))
    da, db = grad_op(lambda a, b: ((a * b, (a - b).sum()), b * 3.0))(a, b, (sens, third))
    assert da.asnumpy().tolist() == [[2.5, 6.0, 1.0]] and db.asnumpy().tolist() == [[2.0, 2.0, 10.0]]
    with pytest.raises(ConfigurationError, match="does not match the outputs"):
        grad_op(lambda a, b: (a * b, (a - b).sum()))(a, b, sens[:1])
    with pytest.raises(ConfigurationError, match="the sens must be a tuple"):
        grad_op(lambda a, b: (a * b, a - b))(a, b, sens[0])


def test_keyword_arguments_count_after_the_positional_ones():
    """MindSpore 2.7.0 numbers keyword arguments after the positional ones, in call order: for
    f(a, b, c) = (2ab + 3ca).sum() called f(x, c=z, b=y), position 1 is c (3x) and position 2 is b (2x)."""
    x, y, z = (ms.Tensor(np.array(v, np.float32)) for v in ([1.0, -2.0], [0.5, 4.0], [10.0, 20.0]))

    def f(a, b, c):
        return (a * b * 2.0 + c * 3.0 * a).sum()

    dx, dc, db = ms.grad(f, (0, 1, 2))(x, c=z, b=y)
    assert dx.asnumpy().tolist() == [31.0, 68.0] and dc.asnumpy().tolist() == [3.0, -6.0]
    assert db.asnumpy().tolist() == [2.0, -4.0]
    value, dc = ms.value_and_grad(f, 1)(x, c=z, b=y)
    assert value.asnumpy() == f(x, y, z).asnumpy() and dc.asnumpy().tolist() == [3.0, -6.0]
    assert ms.grad(f)(c=z, b=y, a=x).asnumpy().tolist() == [3.0, -6.0]  # position 0 is c, the first passed
    sens = ms.Tensor(np.ones(2, np.float32))
    da, db = ops.GradOperation(get_all=True, sens_param=True)(lambda a, b: a * b)(x, sens, b=y)
    assert da.asnumpy().tolist() == [0.5, 4.0] and db.asnumpy().tolist() == [1.0, -2.0]


def test_grad_operation_forms_and_sens():
    net = nn.Dense(2, 3, weight_init="ones", bias_init="zeros")
    x = ms.Tensor(X)
    dx = ms.GradOperation()(net)(x)
    np.testing.assert_allclose(dx.asnumpy(), np.full((3, 2), 3.0))
    (dx_all,), (_, db) = ms.GradOperation(get_all=True, get_by_list=True)(net, net.trainable_params())(x)
    np.testing.assert_allclose(dx_all.asnumpy(), dx.asnumpy())
    np.testing.assert_allclose(db.asnumpy(), np.full(3, 3.0))
    sens = rand(3, 3, seed=4)
    dw_sens, _ = ms.GradOperation(get_by_list=True, sens_param=True)(net, net.trainable_params())(x, ms.Tensor(sens))
    np.testing.assert_allclose(dw_sens.asnumpy(), sens.T @ X, rtol=1e-5)


def test_gradient_handles_keep_their_values_across_calls():
    grad_fn = ms.grad(f)
    results = [grad_fn(ms.Tensor(X * k), ms.Tensor(Y)) for k in (1.0, 2.0, 3.0, 4.0)]
    for k, dx in zip((1.0, 2.0, 3.0, 4.0), results):  # all four alive at once: two share each store name
        np.testing.assert_allclose(dx.asnumpy(), 2 * (X * k) * Y, rtol=1e-5)


def test_gradients_inside_a_traced_cell():
    class Step(nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = nn.Dense(2, 1, weight_init="ones", bias_init="zeros")
            self.grad = ms.value_and_grad(lambda x: self.net(x).sum(), None, self.net.trainable_params())

        def construct(self, x):
            loss, (dw, _) = self.grad(x)
            return loss, dw

    loss, dw = Step()(ms.Tensor(X))  # graph mode: forward and backward are one compiled graph
    np.testing.assert_allclose(loss.asnumpy(), X.sum(), rtol=1e-5)
    np.testing.assert_allclose(dw.asnumpy(), X.sum(0, keepdims=True), rtol=1e-5)


def test_bad_requests_are_clear_errors():
    with pytest.raises(ConfigurationError, match="cannot both be None"):
        ms.value_and_grad(f, None, None)
    with pytest.raises(ConfigurationError, match="grad_position 5 is out of range"):
        ms.grad(f, grad_position=5)(ms.Tensor(X), ms.Tensor(Y))
    with pytest.raises(ConfigurationError, match="weights must be Parameters"):
        ms.value_and_grad(f, None, [ms.Tensor(X)])
    # MindSpore 2.7.0 refuses a negative position when the function is made, with these ValueErrors
    with pytest.raises(ValueError, match=r"^grad_position must be >= 0\.$"):
        ms.grad(f, -1)
    with pytest.raises(ValueError, match=r"^The element in grad_position must be >= 0\.$"):
        ms.value_and_grad(f, (0, -1))


def test_integer_inputs_have_zero_gradients():
    # MindArmour's pattern: GradOperation(get_all=True)(net_with_loss)(inputs, int labels)[0]
    dense = nn.Dense(2, 3)
    net = nn.WithLossCell(dense, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum"))
    labels = np.array([0, 2, 1], np.int32)
    dx, dlabels = ops.GradOperation(get_all=True)(net)(ms.Tensor(X), ms.Tensor(labels))
    assert dlabels.dtype == ms.int32 and dlabels.asnumpy().tolist() == [0, 0, 0]
    logits = X @ dense.weight.asnumpy().T + dense.bias.asnumpy()
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    expected = (p - np.eye(3)[labels]) @ dense.weight.asnumpy()
    np.testing.assert_allclose(dx.asnumpy(), expected, rtol=1e-5, atol=1e-6)
    assert ms.grad(lambda x, n: (x * x).sum(), grad_position=1)(ms.Tensor(X), ms.Tensor(labels)).asnumpy().any() == 0


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_a_cells_custom_bprop_is_refused_where_it_would_be_skipped(mode):
    from tessel.core.errors import NotSupportedYetError

    class Custom(nn.Cell):
        def construct(self, x):
            return x * 3.0

        def bprop(self, x, out, dout):  # MindSpore calls it for the gradient; tessel would differentiate construct
            return (dout * 100.0,)

    ms.set_context(mode=mode)
    x = ms.Tensor(np.ones(2, np.float32))
    assert Custom()(x).asnumpy().tolist() == [3.0, 3.0]  # the forward alone is fine
    with pytest.raises(NotSupportedYetError, match=r"Custom\.bprop \(a custom backward of a Cell\)"):
        ms.grad(Custom())(x)
    net = nn.SequentialCell(nn.Dense(2, 2), Custom())
    with pytest.raises(NotSupportedYetError, match="custom backward"):
        nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params()))(x[None], x[None])
