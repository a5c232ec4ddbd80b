"""General transforms, as `mindspore.dataset.transforms`: TypeCast, OneHot, Compose (plus the transform contract)."""

from tessel.dataset.transforms.base import PyFunc, Transform, register
from tessel.dataset.transforms.transforms import Compose, OneHot, TypeCast

__all__ = ["Compose", "OneHot", "PyFunc", "Transform", "TypeCast", "register"]
