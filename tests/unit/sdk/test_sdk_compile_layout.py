"""Cell.compile (compile without running; a later call compiles nothing), Cell.parameter_layout_dict and
Model.infer_train_layout / infer_predict_layout with MindSpore's checks and format, on a world of 1 (several ranks:
tests/integration/test_semi_layout_recompute.py)."""

from __future__ import annotations

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
import tessel.dataset as ds
from tessel import nn
from tessel.common.engine import engine
from tessel.parallel.auto_parallel import AutoParallel

X = rand(8, 6)
LABELS = (X[:, 0] > 0).astype(np.int32)


def network() -> nn.Cell:
    ms.set_seed(4)
    return nn.SequentialCell(nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 3))


def dataset(batch: int = 4):
    return ds.NumpySlicesDataset({"data": X, "label": LABELS}, shuffle=False).batch(batch)


@pytest.fixture
def compiles(monkeypatch):
    """The names of the programs compiled on the daemon from now on."""
    eng, made = engine(), []
    compile_program = eng.compile

    def counted(name, *args, **kwargs):
        made.append(name)
        return compile_program(name, *args, **kwargs)

    monkeypatch.setattr(eng, "compile", counted)
    return made


def semi_auto() -> None:
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)


def test_cell_compile_compiles_once_and_the_call_runs_it(compiles):
    net = network()
    assert net.parameter_layout_dict == {}
    assert net.compile(ms.Tensor(X)) is None
    assert len(compiles) == 1
    out = net(ms.Tensor(X)).asnumpy()
    assert len(compiles) == 1, "the call compiled again"
    entries = [e for found in net._compiled.entries.values() for e in found]
    assert len(entries) == 1
    w0, b0, w1, b1 = (p.asnumpy() for p in net.trainable_params())
    np.testing.assert_allclose(out, np.maximum(X @ w0.T + b0, 0) @ w1.T + b1, rtol=1e-5, atol=1e-6)
    whole = ([1], [-1, -1], [8, 6], 0, True, "", [8, 6], [8, 6], False, False, 0, 0)  # MindSpore's 12 fields
    assert net.parameter_layout_dict["0.weight"] == whole


def test_train_one_step_cell_compile_then_steps_compile_nothing(compiles):
    net = network()
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.CrossEntropyLoss()), optimizer)
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    step.compile(ms.Tensor(X), ms.Tensor(LABELS))
    for got, want in zip(net.trainable_params(), before):
        np.testing.assert_array_equal(got.asnumpy(), want)  # compiled, not run
    made = len(compiles)
    assert made == 1
    step(ms.Tensor(X), ms.Tensor(LABELS))
    assert len(compiles) == made
    assert {"moments.0.weight", "0.weight"} <= set(step.parameter_layout_dict)


def test_a_train_step_compiles_again_when_a_setting_its_graph_depends_on_changes(compiles):
    # The step's settings are read at every call, also on the fast path of a signature seen before.
    net = network()
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.CrossEntropyLoss()), nn.SGD(net.trainable_params(), 0.1))
    for _ in range(2):
        step(ms.Tensor(X), ms.Tensor(LABELS))
    assert len(compiles) == 1
    ms.set_auto_parallel_context(loss_repeated_mean=False)
    step(ms.Tensor(X), ms.Tensor(LABELS))
    assert len(compiles) == 2
    ms.set_auto_parallel_context(loss_repeated_mean=True)
    step(ms.Tensor(X), ms.Tensor(LABELS))
    assert len(compiles) == 2  # the first entry again


def test_infer_train_layout_compiles_the_step_train_then_runs(compiles):
    semi_auto()
    net = network()
    model = ms.Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    layout = model.infer_train_layout(dataset())
    assert set(layout) == {f"{m}{i}.{k}" for m in ("", "moments.") for i in (0, 2) for k in ("weight", "bias")}
    assert layout["2.weight"][:3] == ([1], [-1, -1], [3, 8])
    made = len(compiles)
    model.train(1, dataset(), dataset_sink_mode=True)
    assert len(compiles) == made, "training compiled again after infer_train_layout"


def test_infer_train_layout_checks_as_mindspore():
    net = network()
    model = ms.Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    with pytest.raises(RuntimeError, match="only supports 'semi_auto_parallel' and 'auto_parallel' mode, but got"):
        model.infer_train_layout(dataset())
    semi_auto()
    with pytest.raises(ValueError, match="Only dataset sink mode is supported for now"):
        model.infer_train_layout(dataset(), dataset_sink_mode=False)
    for bad in (0, -2):
        with pytest.raises(ValueError, match="'sink_size' must be -1 or positive"):
            model.infer_train_layout(dataset(), sink_size=bad)
    with pytest.raises(TypeError, match="takes 2 positional arguments but 3 were given"):
        ms.Model(network()).infer_train_layout(dataset())  # as MindSpore's: no optimizer, the network is compiled


def test_infer_predict_layout_checks_and_skips_the_backend_when_asked(compiles):
    model = ms.Model(network())
    with pytest.raises(RuntimeError, match="Infer predict layout only supports semi auto parallel"):
        model.infer_predict_layout(ms.Tensor(X))
    semi_auto()
    with pytest.raises(TypeError, match="predict_data must be"):
        model.infer_predict_layout([X])
    layout = model.infer_predict_layout(ms.Tensor(X), skip_backend_compile=True)
    assert set(layout) == {"0.weight", "0.bias", "2.weight", "2.bias"} and not compiles
    assert model.infer_predict_layout(ms.Tensor(X)) == layout and len(compiles) == 1
    model.predict(ms.Tensor(X))
    assert len(compiles) == 1


def test_an_auto_parallel_network_applies_its_configuration_to_compile():
    ms.reset_auto_parallel_context()
    parallel = AutoParallel(network(), parallel_mode="semi_auto")
    ms.reset_auto_parallel_context()  # the configuration lives in the wrapper: compiling applies it again
    layout = ms.Model(parallel).infer_predict_layout(ms.Tensor(X))
    assert layout["0.weight"][2] == [8, 6]
    assert ms.get_auto_parallel_context("parallel_mode") == ms.ParallelMode.SEMI_AUTO_PARALLEL
