"""General transforms (MindSpore `mindspore.dataset.transforms`): TypeCast, OneHot, Compose.

>>> import numpy as np
>>> TypeCast("int32")(np.uint32(7)).dtype
dtype('int32')
>>> OneHot(3)(np.int32(1))
array([0, 1, 0], dtype=int32)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError
from tessel.core.options import check_type
from tessel.dataset.sampling import RowRandom
from tessel.dataset.transforms.base import Transform, as_operations, register, resolve_dtype


@register
class TypeCast(Transform):
    """Cast every element to `data_type` (a numpy dtype, a name, or a tessel/MindSpore dtype such as `ms.int32`)."""

    def __init__(self, data_type: Any):
        self.dtype = resolve_dtype(data_type, "transforms.TypeCast")
        self._params = {"data_type": self.dtype.name}

    def apply_rows(self, x: np.ndarray, rng: RowRandom) -> np.ndarray:
        if x.dtype.kind in "USO":
            raise self.reject(x, "numeric rows", "decode strings to numbers before casting")
        return x.astype(self.dtype, copy=False)


@register
class OneHot(Transform):
    """One-hot encode integer labels of any shape into (..., num_classes); optional label smoothing.

    With smoothing_rate s the hot entry is 1 - s + s/num_classes and the others s/num_classes (float64 output, as
    MindSpore 2.7.0 gives); without smoothing the output keeps the label dtype, like MindSpore.
    """

    def __init__(self, num_classes: int, smoothing_rate: float = 0.0):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ConfigurationError(f"transforms.OneHot: num_classes must be an int >= 1, got {num_classes!r}")
        if not 0.0 <= float(smoothing_rate) <= 1.0:
            raise ConfigurationError(f"transforms.OneHot: smoothing_rate must be in [0, 1], got {smoothing_rate!r}")
        self.num_classes, self.smoothing_rate = num_classes, float(smoothing_rate)
        self._params = {"num_classes": num_classes, "smoothing_rate": self.smoothing_rate}

    def apply_rows(self, x: np.ndarray, rng: RowRandom) -> np.ndarray:
        if x.dtype.kind not in "iu":
            raise self.reject(x, "integer class labels", "cast the labels with transforms.TypeCast(ms.int32) first")
        if x.size and (x.min() < 0 or x.max() >= self.num_classes):
            raise self.reject(
                x,
                f"labels in [0, {self.num_classes - 1}] (found {x.min()}..{x.max()})",
                "raise num_classes or fix the labels",
            )
        hot = np.arange(self.num_classes) == x[..., None]
        if self.smoothing_rate:
            off = self.smoothing_rate / self.num_classes
            return np.where(hot, 1.0 - self.smoothing_rate + off, off)  # float64
        return hot.astype(x.dtype)


class Compose(Transform):
    """Apply transforms in order; inside `map` it is the same as passing the list (it is flattened there)."""

    def __init__(self, transforms: list[Any]):
        # MindSpore 2.7.0's TypeErrors: a list (not a tuple, not one transform) of transforms or callables
        check_type(transforms, list, "transforms.Compose", "transforms")
        for i, op in enumerate(transforms):
            if not callable(op):
                raise TypeError(f"transforms.Compose: transforms[{i}] = {op!r} is neither a transform nor a callable")
        self.transforms = as_operations(transforms, "transforms.Compose")
        self._params = {"transforms": self.transforms}

    def apply(self, arrays, rng):
        for transform in self.transforms:
            arrays = transform.apply(arrays, rng)
        return tuple(arrays)
