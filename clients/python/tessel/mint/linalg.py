"""`tessel.mint.linalg` — MindSpore's `mindspore.mint.linalg`: each of its names raises NotSupportedYetError."""

from tessel.common.support import unsupported_names
from tessel.mint._names import MINT_LINALG

__getattr__ = unsupported_names(
    "mindspore.mint.linalg",
    MINT_LINALG,
    "tessel has no linear-algebra decompositions yet",
)
__all__: list[str] = []
