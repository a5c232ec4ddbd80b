"""`tessel.mint.special` — MindSpore's `mindspore.mint.special`: each of its names raises NotSupportedYetError."""

from tessel.common.support import unsupported_names
from tessel.mint._names import MINT_SPECIAL

__getattr__ = unsupported_names(
    "mindspore.mint.special",
    MINT_SPECIAL,
    "tessel has no mapping for it yet; use the tessel.ops equivalent if there is one",
)
__all__: list[str] = []
