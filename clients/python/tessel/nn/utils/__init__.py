"""`tessel.nn.utils` — MindSpore's `mindspore.nn.utils`.

`no_init_parameters()` (MindSpore: a context manager deferring the initialisation of the parameters created inside
it until the network compiles, so that each rank initialises only its own slices) belongs here.

    >>> from tessel.nn.utils import no_init_parameters
    >>> with no_init_parameters():
    ...     net = Network()
"""

from tessel.common.support import unsupported_names

# ---- no_init_parameters: being built by the AutoParallel work; define it here and list it in __all__. ----
# Until it exists, `from tessel.nn.utils import no_init_parameters` raises NotSupportedYetError (not ImportError).
__getattr__ = unsupported_names(
    "mindspore.nn.utils",
    ["no_init_parameters"],
    "deferred parameter initialisation is being built; create the network without it for now",
)

__all__: list[str] = []
