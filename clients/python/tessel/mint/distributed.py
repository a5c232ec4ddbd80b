"""`tessel.mint.distributed` — MindSpore's `mindspore.mint.distributed`: each name raises NotSupportedYetError."""

from tessel.common.support import unsupported_names
from tessel.mint._names import MINT_DISTRIBUTED

__getattr__ = unsupported_names(
    "mindspore.mint.distributed",
    MINT_DISTRIBUTED,
    "use tessel.communication (init, get_rank, get_group_size, create_group) and the tessel.ops collectives",
)
__all__: list[str] = []
