"""Top-level names the MindSpore samples reach through `import tessel as ms` (without importing submodules first),
the `tessel.nn.utils` home of `no_init_parameters`, and `ms.export` by file format."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sdk_testkit import rand

import tessel as ms
from tessel import nn
from tessel.core.errors import ConfigurationError, NotSupportedYetError

LAZY = {
    "ms.parallel": "tessel.parallel",
    "ms.mint": "tessel.mint",
    "ms.runtime": "tessel.runtime",
    "ms.nn.utils": "tessel.nn.utils",
    "ms.Symbol": "tessel.common.symbol",
    "ms.lazy_inline": "tessel.common.lazy_inline",
}


@pytest.mark.parametrize("expression", sorted(LAZY))
def test_name_resolves_on_a_fresh_import(expression):
    code = (
        "import sys, tessel as ms\n"
        f"value = {expression}\n"
        f"assert {LAZY[expression]!r} in sys.modules, sorted(m for m in sys.modules if m.startswith('tessel'))\n"
        "print(getattr(value, '__name__', type(value).__name__))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_lazy_names_are_listed():
    for name in ("parallel", "mint", "runtime", "Symbol", "lazy_inline"):
        assert name in dir(ms) and name in ms.__all__


def test_no_init_parameters_defers_drawing_and_draws_what_one_device_draws():
    from tessel.compiler.parallel import Layout
    from tessel.nn import utils

    assert ms.nn.utils is utils
    with pytest.raises(AttributeError):
        utils.something_else  # noqa: B018
    ms.set_seed(7)
    eager = nn.Dense(64, 48)
    ms.set_seed(7)
    with utils.no_init_parameters():
        lazy = nn.Dense(64, 48)
        optimizer = nn.Momentum(lazy.trainable_params(), 0.1, 0.9)
    assert lazy.weight.has_init and lazy.weight.shape == (48, 64) and lazy.weight._array is None
    assert optimizer.moments[0].has_init  # slots of a deferred parameter are deferred too
    rows = Layout.from_strategy((4, 1), 4)
    piece = lazy.weight._deferred.piece(rows.local_slices((48, 64), 2))
    np.testing.assert_array_equal(piece, eager.weight.asnumpy()[24:36])
    np.testing.assert_array_equal(lazy.weight.asnumpy(), eager.weight.asnumpy())
    assert not lazy.weight.has_init


class Small(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 3)

    def construct(self, x):
        return nn.ReLU()(self.dense(x))


def test_export_onnx_writes_a_model_that_computes_the_same(tmp_path):
    from onnx.reference import ReferenceEvaluator  # an independent evaluator, not the daemons' ONNX Runtime

    net, x = Small(), rand(2, 4)
    ms.export(net, ms.Tensor(x), file_name=str(tmp_path / "small"), file_format="ONNX")
    evaluator = ReferenceEvaluator(str(tmp_path / "small.onnx"))
    (got,) = evaluator.run(None, {evaluator.input_names[0]: x})
    np.testing.assert_allclose(got, net(ms.Tensor(x)).asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("file_format", ["MINDIR", "AIR"])
def test_export_mindir_and_air_are_clear_errors_naming_onnx(tmp_path, file_format):
    with pytest.raises((ConfigurationError, NotSupportedYetError), match="file_format='ONNX'"):
        ms.export(Small(), ms.Tensor(rand(2, 4)), file_name=str(tmp_path / "small"), file_format=file_format)
    assert list(tmp_path.iterdir()) == []
