"""`tessel.nn.utils` — MindSpore's `mindspore.nn.utils`.

>>> from tessel.nn.utils import no_init_parameters
>>> with no_init_parameters():
...     net = Network()          # weights drawn when first needed; a rank draws only its slice
"""

from tessel.common.initializer import no_init_parameters

__all__ = ["no_init_parameters"]
