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

# MindSpore's vision transforms tessel does not map yet: each name raises NotSupportedYetError.
_NOT_YET = frozenset(
    {
        "AutoContrast", "CenterCrop", "ConvertColor", "CutMixBatch", "CutOut", "Decode", "Equalize", "GaussianBlur",
        "Grayscale", "HorizontalFlip", "Invert", "MixUpBatch", "Pad", "RandomAffine", "RandomColor",
        "RandomColorAdjust", "RandomCropDecodeResize", "RandomErasing", "RandomGrayscale", "RandomResizedCrop",
        "RandomRotation", "RandomSharpness", "RandomVerticalFlip", "Rotate", "ToPIL", "ToType", "UniformAugment",
        "VerticalFlip",
    }
)  # fmt: skip


def __getattr__(name: str):
    if name in _NOT_YET:
        from tessel.core.options import not_supported_yet

        raise not_supported_yet(
            f"mindspore.dataset.vision.{name}", f"tessel's vision transforms are {', '.join(sorted(__all__))}"
        )
    raise AttributeError(f"module 'tessel.dataset.vision' has no attribute {name!r}")
