"""Functions a higher layer installs for a lower one to call: the layers import only downwards (DESIGN.md, Layers),
so where a lower part must hand something up, the part above puts its function here when it is imported.

    >>> from tessel.core import hooks
    >>> hooks.dataset_output(array)   # what a dataset iterator yields for a column (output_numpy=False)
"""

from __future__ import annotations

from typing import Any


def _as_is(array: Any) -> Any:
    return array


# A dataset iterator's column when output_numpy=False: the numpy array itself, until the SDK (`import tessel`)
# installs the maker of its Tensor, MindSpore's iterators yielding Tensors.
dataset_output = _as_is
