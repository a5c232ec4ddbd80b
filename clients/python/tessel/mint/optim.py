"""`tessel.mint.optim` — MindSpore's `mindspore.mint.optim`: each of its names raises NotSupportedYetError."""

from tessel.common.support import unsupported_names
from tessel.mint._names import MINT_OPTIM

__getattr__ = unsupported_names(
    "mindspore.mint.optim",
    MINT_OPTIM,
    "use tessel.nn.SGD, tessel.nn.Adam or tessel.nn.AdamWeightDecay (MindSpore-style optimizers)",
)
__all__: list[str] = []
