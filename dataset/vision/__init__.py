"""Image transforms, as `mindspore.dataset.vision`."""

from tessel.dataset.vision.transforms import (
    HWC2CHW,
    Border,
    Inter,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    Rescale,
    Resize,
    SliceMode,
    SlicePatches,
    ToTensor,
)

__all__ = [
    "HWC2CHW",
    "Border",
    "Inter",
    "Normalize",
    "RandomCrop",
    "RandomHorizontalFlip",
    "Rescale",
    "Resize",
    "SliceMode",
    "SlicePatches",
    "ToTensor",
]
