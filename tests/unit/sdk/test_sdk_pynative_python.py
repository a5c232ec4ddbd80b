"""PYNATIVE_MODE gradient functions run their Python at every call, as MindSpore's do: control flow on tensor
values, print() and .item() of traced values, attributes and globals changed between calls, Python side effects.

Expected numbers are MindSpore 2.7.0's (CPU, PYNATIVE_MODE) printed output for the same script.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import nn, ops
from tessel.compiler import TraceError
from tessel.core.errors import NotSupportedYetError

W = np.array([[0.5, -1.0], [0.25, 2.0], [-0.75, 0.5]], np.float32)
X1 = np.array([[1.0, 0.5, 0.25], [0.1, -0.2, 0.3]], np.float32)
X2 = np.array([[-1.0, -0.5, 0.25], [0.1, -0.2, -0.3]], np.float32)


class Branchy(nn.Cell):
    """A branch and a loop whose conditions are tensor values, and a plain Python attribute."""

    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(W), name="w")
        self.scale = 1.0

    def construct(self, x):
        y = ops.matmul(x, self.w) * self.scale
        if y.sum() > 0:  # noqa: SIM108 - an if statement, as the MindSpore script this mirrors has
            y = y * 2
        else:
            y = y - 1
        n = 0
        while y.max() < 3 and n < 4:
            y = y * 1.5 + 0.5
            n += 1
        return (y * y).sum()


@pytest.fixture
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.GRAPH_MODE)


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got.asnumpy() if hasattr(got, "asnumpy") else got), want, rtol=2e-6)


def test_branches_and_loops_on_tensor_values_take_this_calls_path(pynative):
    net = Branchy()
    g = ms.value_and_grad(net, 0, net.trainable_params())
    value, (gx, (gw,)) = g(ms.Tensor(X1))  # MindSpore 2.7.0: the `if` branch, then two loop turns
    _close(value, 13.869552612304688)
    _close(
        gx,
        [
            [9.867919921875, -4.3604736328125, -11.0841064453125],
            [17.236230850219727, -61.54497146606445, 2.2108898162841797],
        ],
    )
    _close(
        gw,
        [
            [10.134491920471191, -6.524296760559082],
            [10.481748580932617, 3.7541604042053223],
            [-3.4223294258117676, -9.349014282226562],
        ],
    )
    value, (gx, (gw,)) = g(ms.Tensor(X2))  # the `else` branch: same shapes, another graph
    _close(value, 44.70927047729492)
    _close(
        gx,
        [
            [-22.168212890625, -20.3785400390625, 36.9700927734375],
            [44.146583557128906, -86.53314971923828, -22.777297973632812],
        ],
    )
    _close(
        gw,
        [
            [51.91277313232422, -0.6264843940734863],
            [25.60438346862793, 10.547402381896973],
            [-13.365396499633789, 12.103330612182617],
        ],
    )


def test_an_attribute_changed_between_calls_is_seen(pynative):
    net = Branchy()
    g = ms.value_and_grad(net, 0, net.trainable_params())
    g(ms.Tensor(X1))
    net.scale = 3.0  # a float attribute, no Parameter: a graph traced once would keep 1.0
    value, (_, (gw,)) = g(ms.Tensor(X1))
    _close(value, 43.225074768066406)
    _close(
        gw,
        [
            [62.81296920776367, -3.8221874237060547],
            [48.001991271972656, 21.09164047241211],
            [-2.5518131256103516, -26.258554458618164],
        ],
    )


def test_print_item_and_side_effects_of_the_python_happen_at_every_call(pynative, capsys):
    net = Branchy()
    net.scale = 3.0
    calls = []

    def forward(x):
        loss = net(x)
        calls.append(float(loss.asnumpy()))
        if loss.item() > 100:
            loss = loss / 10
        print("loss", loss, x.shape)
        return loss

    g = ms.value_and_grad(forward, 0, net.trainable_params())
    values = [float(g(ms.Tensor(x))[0].asnumpy()) for x in (X1, X2)]
    np.testing.assert_allclose(values, [43.225074768066406, 30.2799072265625], rtol=2e-6)
    np.testing.assert_allclose(calls, [43.225074768066406, 302.799072265625], rtol=2e-6)
    _, (_, (gw,)) = g(ms.Tensor(X2))
    _close(
        gw,
        [
            [41.253997802734375, -6.031335830688477],
            [18.791446685791016, 5.240161418914795],
            [-12.332606315612793, 10.589245796203613],
        ],
    )
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "loss 43.225075 (2, 3)"  # MindSpore 2.7.0 prints the value and the exact shape
    assert printed[1].startswith("loss 30.2799") and len(printed) == 3


def test_reading_a_value_writes_no_state_the_graph_writes_once(pynative):
    bn = nn.BatchNorm1d(2, momentum=0.9)
    bn.set_train(True)
    x = np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)

    def forward(x):
        y = bn(x)
        if y.sum() > -1.0:  # read after the moving statistics' update: the readout must not apply it
            y = y * 2.0
        return y.sum()

    ms.grad(forward, None, bn.trainable_params())(ms.Tensor(x))
    np.testing.assert_allclose(bn.moving_mean.asnumpy(), 0.1 * x.mean(axis=0), rtol=1e-6)


def test_a_random_value_read_in_python_is_refused_and_unread_randomness_runs(pynative):
    dense, drop = nn.Dense(3, 2), nn.Dropout(p=0.5)
    drop.set_train(True)

    def forward(x):
        y = drop(dense(x))
        if y.sum() > 0:
            y = y * 2.0
        return y.sum()

    with pytest.raises(NotSupportedYetError, match=r"random op \(Dropout\).*has_aux=True"):
        ms.grad(forward, None, dense.trainable_params())(ms.Tensor(X1))
    (gw, _) = ms.grad(lambda x: drop(dense(x)).sum(), None, dense.trainable_params())(ms.Tensor(X1))
    assert gw.shape == (2, 3)


def test_graph_mode_and_jit_still_compile_once_and_name_the_line(pynative):
    net = Branchy()
    jitted = ms.jit(lambda x: net(x))
    with pytest.raises(TraceError, match=r"`if y.sum\(\) > 0:.*run in PYNATIVE_MODE.*ms.jit compiles once"):
        jitted(ms.Tensor(X1))
    ms.set_context(mode=ms.GRAPH_MODE)
    with pytest.raises(TraceError, match=r"`if y.sum\(\) > 0:"):
        ms.value_and_grad(net, 0, net.trainable_params())(ms.Tensor(X1))


def test_a_python_number_new_at_every_call_is_seen_and_named_once_graphs_pile_up(pynative, caplog):
    dense = nn.Dense(3, 2)
    x = ms.Tensor(X1)
    g = ms.grad(lambda x, k: (dense(x) * k).sum())
    with caplog.at_level("WARNING", logger="tessel"):
        grads = [g(x, 0.5 * i).asnumpy() for i in range(18)]
    np.testing.assert_allclose(grads[4], 4 * grads[1], rtol=1e-6)  # each call's own number, not the first's
    warned = [r.getMessage() for r in caplog.records if "different graphs" in r.getMessage()]
    assert len(warned) == 1 and "Pass it as a Tensor argument" in warned[0]
    grads = [g(x, ms.Tensor(np.float32(0.5 * i))).asnumpy() for i in range(3)]  # the fix: one graph
    np.testing.assert_allclose(grads[2], 2 * grads[1], rtol=1e-6)


class Gated(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.array([[0.5, -1.0, 0.25], [0.2, 0.3, -0.4]], np.float32)), name="w")

    def construct(self, x):
        y = ops.matmul(x, self.w.T)
        if y.sum() > 0:
            y = y * 2
        return y


def _gated_data():
    rng = np.random.default_rng(1)
    return rng.standard_normal((8, 3)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)


def test_train_one_step_cell_and_model_train_run_a_branching_network_step_by_step(pynative):
    import tessel.dataset as ds

    x, t = _gated_data()
    net = Gated()
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    losses = [float(step(ms.Tensor(x[:4]), ms.Tensor(t[:4])).asnumpy()) for _ in range(3)]
    # MindSpore 2.7.0 (PYNATIVE_MODE, the same script)
    np.testing.assert_allclose(losses, [1.9999467134475708, 1.92373788356781, 1.7923805713653564], rtol=2e-6)
    want = [[0.184628, -1.01083, 0.416456], [0.081428, 0.059183, -0.564281]]  # MindSpore's, rounded to 6 places
    np.testing.assert_allclose(net.w.asnumpy(), want, atol=1e-6)
    net = Gated()
    model = ms.Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    data = ds.NumpySlicesDataset({"x": x, "t": t}, shuffle=False).batch(4)
    model.train(2, data, dataset_sink_mode=False)
    want = [[0.236273, -0.851826, 0.510117], [0.074123, 0.114014, -0.62804]]
    np.testing.assert_allclose(net.w.asnumpy(), want, atol=1e-6)
    with pytest.raises(TraceError, match=r"if y.sum\(\) > 0:.*TrainOneStepCell / Model.train steps in feed mode"):
        ms.Model(Gated(), nn.MSELoss(), nn.SGD(Gated().trainable_params(), 0.1)).train(1, data, dataset_sink_mode=True)
