"""`ms.run_check()` and `ms.set_deterministic()`, MindSpore 2.7's top-level helpers."""

from __future__ import annotations

from typing import Any

import numpy as np


def run_check() -> None:
    """Check the installation as MindSpore's run_check does: multiply two tensors on the configured device (a daemon
    of this host when none is running) and print the version and the result, or that the check failed and why.

        >>> import tessel as ms
        >>> ms.run_check()
        tessel version:  0.1.0 (MindSpore 2.7.0 API)
        The result of multiplication calculation is correct, tessel has been installed on platform [CPU] successfully!
    """
    import tessel as ms
    from tessel.common.mindspore_names import MINDSPORE_VERSION

    try:
        print(f"tessel version:  {ms.__version__} (MindSpore {MINDSPORE_VERSION} API)")
        product = ms.ops.Mul()(ms.Tensor(np.array([1.0, 2.0, 3.0]), ms.float32), ms.Tensor([4.0, 5.0, 6.0], ms.float32))
        if product.asnumpy().tolist() != [4.0, 10.0, 18.0]:
            raise RuntimeError(f"[1, 2, 3] * [4, 5, 6] gave {product.asnumpy().tolist()}, not [4, 10, 18]")
        print(
            "The result of multiplication calculation is correct, tessel has been installed on platform "
            f"[{ms.get_context('device_target')}] successfully!"
        )
    except Exception as err:  # MindSpore's run_check reports any failure instead of raising it
        print("tessel running check failed.")
        print(str(err))


def set_deterministic(deterministic: Any) -> None:
    """MindSpore's set_deterministic: set_context(deterministic="ON" or "OFF"); "ON" is not supported yet."""
    from tessel import context

    if not isinstance(deterministic, bool):
        raise TypeError(f"For 'set_deterministic', 'deterministic' must be a bool, but got {type(deterministic)}")
    context.set_context(deterministic="ON" if deterministic else "OFF")
