"""MindSpore 2.6's `mindspore.parallel.nn`: the parallel training wrappers under their newer names.

>>> from tessel.parallel.nn import MicroBatchInterleaved
>>> net = MicroBatchInterleaved(nn.WithLossCell(backbone, loss_fn), interleave_num=2)
"""

from tessel.nn.wrap import MicroBatchInterleaved

__all__ = ["MicroBatchInterleaved"]
