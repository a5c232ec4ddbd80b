"""General transforms, as `mindspore.dataset.transforms`: TypeCast, OneHot, Compose (plus the transform contract)."""

from tessel.dataset.transforms.base import PyFunc, Transform, register
from tessel.dataset.transforms.transforms import Compose, OneHot, TypeCast

__all__ = ["Compose", "OneHot", "PyFunc", "Transform", "TypeCast", "register"]

# MindSpore's general transforms tessel does not map yet: each name raises NotSupportedYetError.
_NOT_YET = frozenset(
    {
        "Concatenate", "Duplicate", "Fill", "Mask", "PadEnd", "Plugin", "RandomApply", "RandomChoice", "RandomOrder",
        "Relational", "Slice", "Unique",
    }
)  # fmt: skip


def __getattr__(name: str):
    if name in _NOT_YET:
        from tessel.core.options import not_supported_yet

        raise not_supported_yet(
            f"mindspore.dataset.transforms.{name}", "tessel's general transforms are Compose, OneHot and TypeCast"
        )
    raise AttributeError(f"module 'tessel.dataset.transforms' has no attribute {name!r}")
