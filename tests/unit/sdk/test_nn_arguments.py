"""MindSpore constructor arguments of nn's activation, normalisation and optimizer cells and of mint.nn's activations:
each documented argument works (against float64 numpy) or raises at the call; an argument MindSpore does not have is
Python's TypeError, never swallowed."""

from __future__ import annotations

import inspect
import logging
import math

import numpy as np
import pytest
from sdk_testkit import log_softmax, rand, softmax

import tessel as ms
from tessel import mint, nn
from tessel.core.errors import ConfigurationError, NotSupportedYetError

X = rand(3, 4, 5).astype(np.float64)


@pytest.fixture(autouse=True)
def fresh_log_once(monkeypatch):
    from tessel.core import options

    monkeypatch.setattr(options, "_logged", set())


def run(cell, *arrays) -> np.ndarray:
    return cell(*(ms.Tensor(np.asarray(a, np.float32)) for a in arrays)).asnumpy()


def close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def signature(cls) -> str:
    sig = inspect.signature(cls)
    return str(sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()]))


def gelu_exact(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# --- 1. nn activation cells ------------------------------------------------------------------------------------------


def test_activation_cells_have_mindspores_signatures():
    assert {cls.__name__: signature(cls) for cls in (nn.ReLU, nn.GELU, nn.LeakyReLU, nn.Softmax, nn.LogSoftmax)} == {
        "ReLU": "()",
        "GELU": "(approximate=True)",
        "LeakyReLU": "(alpha=0.2)",
        "Softmax": "(axis=-1)",
        "LogSoftmax": "(axis=-1)",
    }


def test_activation_arguments_work_as_mindspore_documents():
    close(run(nn.Softmax(axis=0), X), softmax(X, 0))
    close(run(nn.Softmax(1), X), softmax(X, 1))
    close(run(nn.Softmax((1,)), X), softmax(X, 1))  # a one-axis tuple, as MindSpore's Union[int, tuple[int]]
    close(run(nn.LogSoftmax(axis=0), X), log_softmax(X, 0), atol=1e-5)
    close(run(nn.LogSoftmax(), X), log_softmax(X, -1), atol=1e-5)
    close(run(nn.GELU(), X), gelu_tanh(X), atol=1e-5)
    close(run(nn.GELU(approximate=False), X), gelu_exact(X), atol=1e-5)
    close(run(nn.LeakyReLU(alpha=0.5), X), np.where(X >= 0, X, 0.5 * X))
    close(run(nn.LeakyReLU(2), X), np.where(X >= 0, X, 2.0 * X))  # an int alpha, and one above 1
    close(run(nn.LeakyReLU(), X), np.where(X >= 0, X, 0.2 * X))
    close(run(nn.ReLU6(), X * 4), np.clip(X * 4, 0, 6))
    close(run(nn.SiLU(), X), X / (1 + np.exp(-X)))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: nn.Softmax(dim=0), r"Softmax\(\) got an unexpected keyword argument 'dim'; .* takes \(axis=-1\)"),
        (lambda: nn.LogSoftmax(dim=0), r"LogSoftmax\(\) got an unexpected keyword argument 'dim'"),
        (lambda: nn.ReLU(inplace=True), r"ReLU\(\) got an unexpected keyword argument 'inplace'; .* no arguments"),
        (lambda: nn.ReLU(True), r"ReLU\(\) too many positional arguments"),
        (lambda: nn.Sigmoid(1), r"Sigmoid\(\) too many positional arguments"),
        (lambda: nn.Tanh(inplace=False), r"Tanh\(\) got an unexpected keyword argument 'inplace'"),
        (lambda: nn.SiLU(inplace=False), r"SiLU\(\) got an unexpected keyword argument 'inplace'"),
        (lambda: nn.ReLU6(inplace=False), r"ReLU6\(\) got an unexpected keyword argument 'inplace'"),
        (lambda: nn.GELU(approximate="tanh"), r"GELU: approximate must be a bool"),
        (lambda: nn.GELU(True, False), r"GELU\(\) too many positional arguments"),
        (lambda: nn.LeakyReLU(negative_slope=0.1), r"LeakyReLU\(\) got an unexpected keyword argument"),
        (lambda: nn.LeakyReLU(alpha="0.1"), r"LeakyReLU: alpha must be an int or a float"),
        (lambda: nn.Softmax(0, axis=1), r"Softmax\(\) multiple values for argument 'axis'"),
        (lambda: nn.Softmax(axis=1.0), r"Softmax: axis must be an int"),
        (lambda: nn.LogSoftmax(axis=(0,)), r"LogSoftmax: axis must be an int"),
    ],
)
def test_activation_cells_refuse_what_mindspore_does_not_take(make, message):
    with pytest.raises(TypeError, match=message):
        make()


def test_softmax_over_several_axes_is_refused():
    with pytest.raises(NotSupportedYetError, match=r"mindspore.nn.Softmax\(axis=\(0, 1\)\), .*one axis"):
        nn.Softmax(axis=(0, 1))


def test_get_activation_takes_mindspores_names_exactly():
    """MindSpore 2.7.0: get_activation('ReLU'), 'softplus', 'swish' and 'leaky_relu' are KeyErrors "The 'name' must be
    in [...], but got ReLU." ("For 'Dense', the" with prim_name; Dense(activation=...) passes none);
    get_activation('threshold') is a TypeError (nn.Threshold needs arguments); 'prelu' and 'softmax2d' give PReLU()
    and Softmax2d(); 'rrelu', 'fast_gelu' and the like are activations tessel lacks."""
    assert nn.get_activation(None) is None
    assert isinstance(nn.get_activation("leakyrelu"), nn.LeakyReLU)
    for name in ("ReLU", "softplus", "swish", "leaky_relu", "reluu"):
        with pytest.raises(
            KeyError, match=rf"^\"The 'name' must be in \['softmin', 'softmax', .*, but got {name}\.\"$"
        ):
            nn.get_activation(name)
    with pytest.raises(KeyError, match=r"For 'Dense', the 'name' must be in .*, but got swishy\."):
        nn.get_activation("swishy", prim_name="Dense")
    with pytest.raises(KeyError, match=r"^\"The 'name' must be in .*, but got ReLU\.\"$"):
        nn.Dense(3, 2, activation="ReLU")
    with pytest.raises(TypeError, match=r"get_activation\('threshold'\) fails in MindSpore 2.7.0 as well"):
        nn.get_activation("threshold")
    assert isinstance(nn.get_activation("prelu"), nn.PReLU) and isinstance(nn.get_activation("softmax2d"), nn.Softmax2d)
    for name in ("preluExt", "rrelu", "fast_gelu", "logsoftmaxExt"):
        with pytest.raises(NotSupportedYetError, match=rf"activation '{name}' .*pass one of \['softmin', "):
            nn.Dense(3, 2, activation=name)


@pytest.mark.parametrize(
    "cell, want, want_grad",
    [
        (
            nn.get_activation("softsign"),
            [-0.666667, -0.5, -0.333333, 0.0, 0.230769, 0.333333, 0.5, 0.6],
            [0.111111, 0.5, 1.333333, 4.0, 2.95858, 2.666667, 1.75, 1.28],
        ),
        (
            nn.get_activation("tanhshrink"),
            [-1.035972, -0.238406, -0.037883, 0.0, 0.008687, 0.037883, 0.238406, 0.594852],
            [0.929349, 1.160051, 0.640657, 0.0, 0.424315, 1.281314, 4.06018, 6.554347],
        ),
        (
            nn.get_activation("hardtanh"),
            [-1.0, -1.0, -0.5, 0.0, 0.3, 0.5, 1.0, 1.0],
            [0.0, 1.0, 3.0, 4.0, 5.0, 6.0, 3.5, 0.0],
        ),
        (
            nn.get_activation("softshrink"),
            [-1.5, -0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0],
            [1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 7.0, 8.0],
        ),
        (
            nn.get_activation("hshrink"),
            [-2.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.5],
            [1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 7.0, 8.0],
        ),
        (
            nn.get_activation("logsigmoid"),
            [-2.126928, -1.313261, -0.974077, -0.693147, -0.554355, -0.474077, -0.313261, -0.201413],
            [0.880797, 1.462117, 1.867378, 2.0, 2.127786, 2.265244, 1.882588, 1.459404],
        ),
        (
            nn.get_activation("softmin"),
            [0.502848, 0.184987, 0.112201, 0.068053, 0.050415, 0.041276, 0.025035, 0.015185],
            [0.642687, 0.051444, -0.080998, -0.117181, -0.137225, -0.153626, -0.118214, -0.086885],
        ),
        (nn.Hardtanh(-0.5, 1.5), [-0.5, -0.5, -0.5, 0.0, 0.3, 0.5, 1.0, 1.5], [0.0, 0.0, 1.5, 4.0, 5.0, 6.0, 7.0, 4.0]),
        (nn.SoftShrink(1.0), [-1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 8.0]),
        (nn.HShrink(0.3), [-2.0, -1.0, -0.5, 0.0, 0.0, 0.5, 1.0, 1.5], [1.0, 2.0, 3.0, 0.0, 0.0, 6.0, 7.0, 8.0]),
        (
            nn.Softmin(0),
            [0.502848, 0.184987, 0.112201, 0.068053, 0.050415, 0.041276, 0.025035, 0.015185],
            [0.642687, 0.051444, -0.080998, -0.117181, -0.137225, -0.153626, -0.118214, -0.086885],
        ),
    ],
)
def test_shrink_sign_and_hardtanh_activations_match_mindspore(cell, want, want_grad):
    """MindSpore 2.7.0's outputs and gradients of sum(cell(x) * [1..8]) on x = [-2, -1, -0.5, 0, 0.3, 0.5, 1, 1.5]:
    the bounds of Hardtanh take half the slope, those of SoftShrink and HShrink none."""
    x = ms.Tensor(np.array([-2, -1, -0.5, 0, 0.3, 0.5, 1, 1.5], np.float32))
    weights = ms.Tensor(np.arange(1, 9, dtype=np.float32))
    close(cell(x).asnumpy(), want, atol=3e-6)
    close(ms.grad(lambda t: (cell(t) * weights).sum())(x).asnumpy(), want_grad, atol=3e-6)


def test_new_activation_cells_check_their_arguments_as_mindspore():
    """MindSpore 2.7.0: Hardtanh(1.0, -1.0) and Hardtanh(1.0, 1.0) are ValueErrors, SoftShrink(-1.0) an error (a
    RuntimeError at the call), HShrink(-0.5) the identity, Softmin((0,)) Softmin(0), Softmin(1.5) a TypeError."""
    for low, high in ((1.0, -1.0), (1.0, 1.0)):
        with pytest.raises(
            ConfigurationError, match=f"Hardtanh: min_val must be less than max_val, got {low} and {high}"
        ):
            nn.Hardtanh(low, high)
    with pytest.raises(ConfigurationError, match=r"SoftShrink: lambd must be >= 0, got -1\.0"):
        nn.SoftShrink(-1.0)
    x = np.array([-2.0, -0.7, 0.3, 1.5])
    close(run(nn.HShrink(-0.5), x), x)
    close(run(nn.Softmin((0,)), x), softmax(-x, 0))
    with pytest.raises(TypeError, match="Softmin: axis must be an int"):
        nn.Softmin(1.5)
    with pytest.raises(NotSupportedYetError, match=r"Softmin\(axis=\(0, 1\)\)"):
        nn.Softmin((0, 1))


def test_identity_takes_and_ignores_any_argument_as_mindspore_documents():
    cell = nn.Identity(3, "anything", auto_prefix=False)
    assert cell._auto_prefix is True  # not passed on to Cell
    close(run(cell, X), X)


def test_dropout_dtype_is_logged_once_as_having_no_effect(caplog):
    with caplog.at_level(logging.INFO, logger="tessel"):
        nn.Dropout(p=0.1, dtype=ms.float16)
        nn.Dropout(p=0.1, dtype=ms.float16)
        nn.Dropout(p=0.1)
    assert [r.getMessage() for r in caplog.records] == [
        "Dropout: dtype=Float16 has no effect (MindSpore deprecates the argument); the output has the input's dtype"
    ]


def test_dropout_keep_prob_and_p_as_mindspore():
    """MindSpore 2.7.0: p wins over keep_prob (Dropout(keep_prob=0.8, p=0.3) zeroes 30%); .p is None when only
    keep_prob was given and .keep_prob keeps its value (0.5 by default); the repr shows whichever decides; keep_prob=1
    makes it the identity even with p given; keep_prob must be a float and p a float or an int, bools refused."""
    x = ms.Tensor(np.ones((400, 500), np.float32))

    def zero_fraction(cell):
        return float((cell.set_train(True)(x).asnumpy() == 0).mean())

    cases = [
        (nn.Dropout(), None, 0.5, "keep_prob=0.5", 0.5),
        (nn.Dropout(0.9), None, 0.9, "keep_prob=0.9", 0.1),
        (nn.Dropout(p=0.3), 0.3, 0.5, "p=0.3", 0.3),
        (nn.Dropout(keep_prob=0.8, p=0.3), 0.3, 0.8, "p=0.3", 0.3),
        (nn.Dropout(keep_prob=1.0, p=0.3), 0.3, 1.0, "p=0.3", 0.0),
        (nn.Dropout(keep_prob=0.8, p=0), 0, 0.8, "p=0", 0.0),
    ]
    for cell, p, keep_prob, shown, zeros in cases:
        assert (cell.p, cell.keep_prob, cell.extend_repr()) == (p, keep_prob, shown)
        assert zero_fraction(cell) == pytest.approx(zeros, abs=0.01), shown
    with pytest.raises(TypeError, match="keep_prob must be a float, got 1"):
        nn.Dropout(keep_prob=1)
    with pytest.raises(TypeError, match="p must be a float or an int, got True"):
        nn.Dropout(p=True)
    with pytest.raises(ConfigurationError, match=r"keep_prob must be in \(0, 1\], got 0.0"):
        nn.Dropout(keep_prob=0.0)
    with pytest.raises(ConfigurationError, match=r"p must be in \[0, 1\), got 1.0"):
        nn.Dropout(keep_prob=0.5, p=1.0)


# --- 2. mint.nn activations ------------------------------------------------------------------------------------------


def test_mint_activations_have_mints_signatures():
    assert {cls.__name__: signature(cls) for cls in (mint.nn.ReLU, mint.nn.Sigmoid, mint.nn.Tanh)} == {
        "ReLU": "()",
        "Sigmoid": "()",
        "Tanh": "()",
    }
    assert signature(mint.nn.ReLU6) == signature(mint.nn.SiLU) == "(inplace=False)"
    assert signature(mint.nn.Dropout) == "(p=0.5, inplace=False)"
    assert signature(mint.nn.GELU) == "(approximate='none')"
    assert signature(mint.nn.Softmax) == signature(mint.nn.LogSoftmax) == "(dim=None)"


def test_mint_relu_sigmoid_tanh_take_no_inplace_as_mindspores():
    for cls in (mint.nn.ReLU, mint.nn.Sigmoid, mint.nn.Tanh):
        for value in (True, False):
            with pytest.raises(TypeError, match=rf"{cls.__name__}\(\) got an unexpected keyword argument 'inplace'"):
                cls(inplace=value)
    close(run(mint.nn.ReLU(), X), np.maximum(X, 0))
    close(run(mint.nn.Sigmoid(), X), 1 / (1 + np.exp(-X)))
    close(run(mint.nn.Tanh(), X), np.tanh(X))


@pytest.mark.parametrize(("name", "make"), [("ReLU6", mint.nn.ReLU6), ("SiLU", mint.nn.SiLU), ("Dropout", None)])
def test_mint_inplace_true_is_refused_at_the_call(name, make):
    make = make or (lambda inplace: mint.nn.Dropout(0.5, inplace=inplace))
    with pytest.raises(NotSupportedYetError, match=rf"mindspore.mint.nn.{name}\(inplace=True\), tessel does not"):
        make(inplace=True)
    make(inplace=False)


def test_mint_activation_arguments_work():
    close(run(mint.nn.ReLU6(inplace=False), X * 4), np.clip(X * 4, 0, 6))
    close(run(mint.nn.SiLU(inplace=False), X), X / (1 + np.exp(-X)))
    close(run(mint.nn.GELU(), X), gelu_exact(X), atol=1e-5)
    close(run(mint.nn.GELU(approximate="tanh"), X), gelu_tanh(X), atol=1e-5)
    close(run(mint.nn.Softmax(dim=0), X), softmax(X, 0))
    close(run(mint.nn.LogSoftmax(dim=1), X), log_softmax(X, 1), atol=1e-5)
    dropout = mint.nn.Dropout(p=0.5, inplace=False)
    close(run(dropout, X), X)  # not training: the identity
    with pytest.raises(ConfigurationError, match="approximate must be 'none' or 'tanh', got 'exact'"):
        mint.nn.GELU("exact")
    with pytest.raises(TypeError, match=r"dim must be an int or None, got 1\.5"):
        mint.nn.Softmax(dim=1.5)


# --- 3. normalisation cells ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [nn.BatchNorm1d, nn.BatchNorm2d])
def test_batch_norm_refuses_channels_last(cls):
    with pytest.raises(NotSupportedYetError, match=rf"nn.{cls.__name__}\(data_format='NHWC'\).*NCHW.*transpose"):
        cls(3, data_format="NHWC")
    cls(3, data_format="NCHW")
    with pytest.raises(ConfigurationError, match=r"use_batch_statistics must be None .* got 'yes'"):
        cls(3, use_batch_statistics="yes")


def test_batch_norm_initial_values_and_use_batch_statistics_are_honoured():
    x = rand(4, 3, 2, 2) * 2 + 1
    mean0, var0 = np.array([0.5, -1.0, 2.0]), np.array([4.0, 0.25, 1.0])
    gamma, beta = np.array([1.5, 0.5, 2.0]), np.array([0.1, -0.2, 0.3])
    make = lambda **kw: nn.BatchNorm2d(  # noqa: E731
        3,
        eps=1e-3,
        gamma_init=ms.Tensor(gamma.astype(np.float32)),
        beta_init=ms.Tensor(beta.astype(np.float32)),
        moving_mean_init=ms.Tensor(mean0.astype(np.float32)),
        moving_var_init=ms.Tensor(var0.astype(np.float32)),
        **kw,
    )
    per_channel = lambda v: v[None, :, None, None]  # noqa: E731

    def normalised(mean, var):
        return (x - per_channel(mean)) / np.sqrt(per_channel(var) + 1e-3) * per_channel(gamma) + per_channel(beta)

    # use_batch_statistics=False: the moving statistics even while training, and they stay as they were.
    frozen = make(use_batch_statistics=False).set_train(True)
    close(run(frozen, x), normalised(mean0, var0), rtol=1e-4, atol=1e-5)
    close(frozen.moving_mean.asnumpy(), mean0)
    # use_batch_statistics=True: this batch's statistics even in eval mode, tracked into the moving ones.
    batch = make(use_batch_statistics=True).set_train(False)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    close(run(batch, x), normalised(mean, var), rtol=1e-4, atol=1e-5)
    close(batch.moving_mean.asnumpy(), 0.9 * mean0 + 0.1 * mean, rtol=1e-5)
    # None follows set_train: eval uses the moving statistics.
    close(run(make(), x), normalised(mean0, var0), rtol=1e-4, atol=1e-5)


def test_batch_norm_affine_false_freezes_gamma_and_beta():
    bn = nn.BatchNorm1d(3, affine=False)
    assert not bn.gamma.requires_grad and not bn.beta.requires_grad
    assert bn.trainable_params() == []
    assert all(p.requires_grad for p in nn.BatchNorm1d(3).trainable_params())


def test_batch_norm_parameter_names_as_mindspore(tmp_path):
    """MindSpore 2.7.0 names a top-level BatchNorm's statistics by their Parameter names, 'mean' and 'variance', and
    nested ones by attribute path ('bn.moving_mean'), in get_parameters, parameters_and_names, parameters_dict and a
    checkpoint alike."""

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(2)

    for cls in (nn.BatchNorm1d, nn.BatchNorm2d):
        top = cls(2)
        assert [p.name for p in top.get_parameters()] == ["mean", "variance", "gamma", "beta"]
        assert [(n, p.name) for n, p in top.parameters_and_names()][:2] == [
            ("moving_mean", "mean"),
            ("moving_variance", "variance"),
        ]
        ms.save_checkpoint(top, str(tmp_path / "top.ckpt"))
        assert list(ms.load_checkpoint(str(tmp_path / "top.ckpt"))) == ["mean", "variance", "gamma", "beta"]
    nested = ["bn.moving_mean", "bn.moving_variance", "bn.gamma", "bn.beta"]
    assert list(Net().parameters_dict()) == nested
    assert [p.name for p in nn.SequentialCell([nn.BatchNorm2d(2)]).get_parameters()] == ["0." + n[3:] for n in nested]


def test_layer_norm_begin_axes_and_epsilon_are_honoured():
    x = rand(2, 3, 4) * 3
    norm = nn.LayerNorm((4,), begin_norm_axis=1, begin_params_axis=-1, epsilon=1e-2)
    gamma, beta = rand(4, seed=1), rand(4, seed=2)
    norm.gamma.set_data(ms.Tensor(gamma))
    norm.beta.set_data(ms.Tensor(beta))
    x64 = x.astype(np.float64)
    mean, var = x64.mean((1, 2), keepdims=True), x64.var((1, 2), keepdims=True)
    close(run(norm, x), (x64 - mean) / np.sqrt(var + 1e-2) * gamma + beta, rtol=1e-4, atol=1e-5)
    both = nn.LayerNorm((3, 4), begin_norm_axis=1, begin_params_axis=1)
    close(run(both, x), (x64 - mean) / np.sqrt(var + 1e-7), rtol=1e-4, atol=1e-5)


def _group_norm_float64(x: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """GroupNorm without affine in float64, and 1/sqrt(var + 1e-5) per group."""
    g = x.astype(np.float64).reshape(x.shape[0], groups, -1)
    centered = g - g.mean(2, keepdims=True)
    rstd = 1 / np.sqrt((centered**2).mean(2, keepdims=True) + 1e-5)
    return (centered * rstd).reshape(x.shape), rstd


def test_group_norm_is_exact_on_a_large_mean_with_a_small_spread():
    """MindSpore 2.7.0 is within 1.2e-7 of float64 here (its CPU kernel accumulates in float64); a float32 mean of
    1000 + 0.01 * noise is off by an ulp of 1000, which once divided by the spread was an error of 1.2e-2."""
    x = (np.random.RandomState(0).randn(2, 4, 4096) * 0.01 + 1000).astype(np.float32)
    weights = np.random.RandomState(1).randn(*x.shape)
    cell = nn.GroupNorm(2, 4)
    _, (dx, (dgamma, dbeta)) = ms.value_and_grad(
        lambda t: (cell(t) * ms.Tensor(weights.astype(np.float32))).sum(), 0, cell.trainable_params()
    )(ms.Tensor(x))
    normed, rstd = _group_norm_float64(x, 2)
    np.testing.assert_allclose(cell(ms.Tensor(x)).asnumpy(), normed, atol=2e-6)
    w = weights.reshape(2, 2, -1)
    xhat = normed.reshape(w.shape)
    want_dx = rstd * (w - w.mean(2, keepdims=True) - xhat * (w * xhat).mean(2, keepdims=True))
    np.testing.assert_allclose(dx.asnumpy(), want_dx.reshape(x.shape), rtol=1e-4, atol=1e-3)  # |dx| up to ~400
    np.testing.assert_allclose(dgamma.asnumpy(), (weights * normed).sum((0, 2)), atol=1e-3)
    np.testing.assert_allclose(dbeta.asnumpy(), weights.sum((0, 2)), atol=1e-3)


def test_norm_cells_take_float16_inputs_with_float32_parameters():
    """MindSpore 2.7.0: LayerNorm((3,)), GroupNorm(2, 4) and BatchNorm2d(4) (train and eval) on a float16 input with
    their default float32 parameters give Float16 outputs, and float32 gradients for the parameters (LayerNorm and
    GroupNorm cast gamma and beta to the input's dtype); the values are float16 roundings of the float64 ones."""
    x16 = np.random.RandomState(0).randn(2, 4, 3, 3).astype(np.float16)
    x = x16.astype(np.float64)
    ln_mean, ln_var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    bn_mean, bn_var = x.mean((0, 2, 3), keepdims=True), x.var((0, 2, 3), keepdims=True)
    train_bn, eval_bn = nn.BatchNorm2d(4).set_train(True), nn.BatchNorm2d(4).set_train(False)
    cases = [
        (nn.LayerNorm((3,)), (x - ln_mean) / np.sqrt(ln_var + 1e-7)),
        (nn.GroupNorm(2, 4), _group_norm_float64(x, 2)[0]),
        (train_bn, (x - bn_mean) / np.sqrt(bn_var + 1e-5)),
        (eval_bn, x / np.sqrt(1 + 1e-5)),
    ]
    for cell, want in cases:
        got = cell(ms.Tensor(x16))
        assert got.dtype == ms.float16, cell
        np.testing.assert_allclose(got.asnumpy().astype(np.float64), want, rtol=2e-3, atol=2e-3, err_msg=repr(cell))
        grads = ms.grad(lambda t, c=cell: c(t).astype(ms.float32).sum(), None, cell.trainable_params())(ms.Tensor(x16))
        assert [g.dtype for g in grads] == [ms.float32, ms.float32], cell
    assert train_bn.moving_mean.dtype == ms.float32  # two training calls: 0.9 * (0.1 * mean) + 0.1 * mean
    np.testing.assert_allclose(train_bn.moving_mean.asnumpy(), 0.19 * bn_mean.ravel(), atol=1e-6)


# --- 4. optimizers ---------------------------------------------------------------------------------------------------


def _params():
    return [ms.Parameter(ms.Tensor(rand(3, 2)), name="w"), ms.Parameter(ms.Tensor(rand(2, seed=1)), name="b")]


def test_adam_keyword_options_are_checked():
    Adam = nn.Adam
    Adam(_params(), use_lazy=False, use_offload=False)
    for option in ("use_lazy", "use_offload"):
        with pytest.raises(NotSupportedYetError, match=rf"not supported yet: Adam\({option}=True\), tessel "):
            Adam(_params(), **{option: True})
    with pytest.raises(TypeError, match=r"Adam\(\) got an unexpected keyword argument 'use_lazzy'; its keyword"):
        Adam(_params(), use_lazzy=True)
    with pytest.raises(NotSupportedYetError, match=r"mindspore.nn.Adam\(use_amsgrad=True\), .*running maximum"):
        Adam(_params(), use_amsgrad=True)
    with pytest.raises(ConfigurationError, match="Adam: eps must be > 0, got 0"):
        Adam(_params(), eps=0)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: nn.Adam(p, use_nesterov=1), "Adam: use_nesterov must be a bool, got 1"),
        (lambda p: nn.Adam(p, use_locking="yes"), "Adam: use_locking must be a bool"),
        (lambda p: nn.SGD(p, momentum=0.9, nesterov=1), "SGD: nesterov must be a bool"),
        (lambda p: nn.Momentum(p, 0.1, 0.9, use_nesterov=None), "Momentum: use_nesterov must be a bool"),
    ],
)
def test_optimizer_flags_must_be_bools(make, message):
    with pytest.raises(TypeError, match=message):
        make(_params())


def numpy_adam(start, grads, lr, nesterov, b1=0.9, b2=0.999, eps=1e-8):
    """MindSpore's Adam (ops.Adam) in float64; with use_nesterov, beta1 * m + (1 - beta1) * g in place of m."""
    params = [p.astype(np.float64) for p in start]
    state = [(np.zeros_like(p), np.zeros_like(p)) for p in params]
    for t, step in enumerate(grads, start=1):
        for i, (p, g) in enumerate(zip(params, step)):
            g = g.astype(np.float64)
            m, v = state[i]
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            state[i] = (m, v)
            direction = b1 * m + (1 - b1) * g if nesterov else m
            p -= lr * math.sqrt(1 - b2**t) / (1 - b1**t) * direction / (np.sqrt(v) + eps)
    return params


@pytest.mark.parametrize("use_nesterov", [False, True])
def test_adam_use_nesterov_and_use_locking_match_mindspores_formula(use_nesterov, caplog):
    grads = [[rand(3, 2, seed=10 + s), rand(2, seed=20 + s)] for s in range(3)]
    params = _params()
    start = [p.asnumpy().copy() for p in params]
    with caplog.at_level(logging.INFO, logger="tessel"):
        optimizer = nn.Adam(params, learning_rate=0.05, use_nesterov=use_nesterov, use_locking=True)
        nn.Adam(_params(), use_locking=True)
    assert [r.getMessage() for r in caplog.records if "use_locking" in r.getMessage()] == [
        "Adam: use_locking=True has no effect in tessel; each update is one compiled step that alone writes the "
        "parameters and moments, so they are never updated concurrently"
    ]
    for step in grads:
        optimizer(tuple(ms.Tensor(g) for g in step))
    want = numpy_adam(start, grads, 0.05, use_nesterov)
    for param, expected in zip(params, want):
        close(param.asnumpy(), expected, rtol=1e-5, atol=1e-6)
    if use_nesterov:  # the two forms differ, so the flag is read
        assert not np.allclose(numpy_adam(start, grads, 0.05, False)[0], want[0], atol=1e-6)
