"""Every public name of MindSpore's `mindspore`, `mindspore.ops`, `mindspore.nn` and `mindspore.train` (2.7's
`__all__`, in tessel.common.mindspore_names) resolves through `import tessel as ms` to what tessel maps, or raises
NotSupportedYetError naming it at the access — never a bare AttributeError. It is not an AttributeError, which
`from module import name` would turn into a bare "cannot import name"."""

from __future__ import annotations

import numpy as np
import pytest

import tessel as ms
from tessel import nn, ops, train
from tessel.common.mindspore_names import MINDSPORE, MINDSPORE_VERSION, NN, OPS, TRAIN
from tessel.core.errors import NotSupportedYetError

MODULES = [("mindspore", ms, MINDSPORE), ("mindspore.ops", ops, OPS), ("mindspore.nn", nn, NN)]
MODULES.append(("mindspore.train", train, TRAIN))


@pytest.mark.parametrize(("module_name", "module", "names"), MODULES, ids=[m[0] for m in MODULES])
def test_each_mindspore_name_resolves_or_says_it_is_not_supported_yet(module_name, module, names):
    resolved = 0
    for name in sorted(names):
        try:
            getattr(module, name)
            resolved += 1
        except NotSupportedYetError as exc:
            assert str(exc).startswith(f"not supported yet: {module_name}.{name}, "), exc
            assert not isinstance(exc, AttributeError)
    assert resolved >= 20, f"only {resolved} of MindSpore {MINDSPORE_VERSION}'s {module_name} names resolve"
    with pytest.raises(AttributeError) as raised:
        _ = module.no_such_name_in_mindspore
    assert not isinstance(raised.value, NotSupportedYetError)


def test_from_import_of_a_name_tessel_lacks_keeps_the_message():
    with pytest.raises(NotSupportedYetError, match=r"not supported yet: mindspore\.nn\.LPPool1d, "):
        from tessel.nn import LPPool1d  # noqa: F401


def test_top_level_reexports_are_the_submodules_objects():
    """MindSpore's top level re-exports mindspore.train (`from mindspore.train import *`), mindspore.runtime and
    amp's build_train_network; tessel's resolve to the same objects."""
    assert ms.LossMonitor is train.LossMonitor and ms.Accuracy is train.Accuracy and ms.Callback is train.Callback
    assert ms.set_memory is ms.runtime.set_memory and ms.empty_cache is ms.runtime.empty_cache
    assert ms.build_train_network is ms.amp.build_train_network is train.build_train_network
    assert train.merge_sliced_parameter is ms.parallel.merge_sliced_parameter


def test_tensor_from_numpy_and_is_tensor():
    t = ms.tensor([1.0, 2.0], ms.float32)
    assert isinstance(t, ms.Tensor) and t.dtype == ms.float32 and t.asnumpy().tolist() == [1.0, 2.0]
    assert ms.tensor(shape=(2, 3), dtype=ms.float32, init="ones").asnumpy().sum() == 6
    array = np.arange(3, dtype=np.float32)
    shared = ms.from_numpy(array)
    array[0] = 7
    assert shared.asnumpy()[0] == 7  # the memory is shared, as MindSpore's from_numpy
    assert ms.is_tensor(shared) and ms.is_tensor(ms.Parameter(shared, "p")) and not ms.is_tensor(array)


def test_mindsporess_other_dtype_names():
    """MindSpore 2.7.0: ms.bool is Bool, ms.int Int32, ms.float Float32, ms.long / ms.intp Int64, ms.short Int16,
    ms.byte Int8, ms.ubyte UInt8, ms.intc Int32 (not in its __all__, but scripts write them)."""
    want = {"bool": ms.bool_, "int": ms.int32, "float": ms.float32, "long": ms.int64, "intp": ms.int64}
    want |= {"short": ms.int16, "byte": ms.int8, "ubyte": ms.uint8, "intc": ms.int32}
    assert {name: getattr(ms, name) for name in want} == want
    assert ms.Tensor([1, 2], ms.int).dtype == ms.int32 and "bool" in dir(ms)


def test_mindsporess_subpackages_tessel_lacks_say_so_at_import():
    import subprocess
    import sys

    code = (
        "import tessel as ms\n"
        "from tessel.core.errors import NotSupportedYetError\n"
        "for line in ('import tessel.numpy as mnp', 'from tessel import mindrecord', 'import tessel.scipy.linalg'):\n"
        "    try:\n"
        "        exec(line)\n"
        "    except NotSupportedYetError as exc:\n"
        "        print(exc)\n"
        "try:\n"
        "    import tessel.no_such_module\n"
        "except ModuleNotFoundError:\n"
        "    print('plain')\n"
        "print(ms.__version__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "not supported yet: mindspore.numpy, " in out and "not supported yet: mindspore.mindrecord, " in out
    assert "not supported yet: mindspore.scipy, " in out and "plain" in out
    from importlib.metadata import version

    assert out.strip().endswith(version("tessel"))
