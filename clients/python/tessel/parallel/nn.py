"""MindSpore's `mindspore.parallel.nn`: the parallel training wrappers, the same cells as `tessel.nn`'s.

>>> from tessel.parallel.nn import GradAccumulation, MicroBatchInterleaved
>>> net = GradAccumulation(nn.WithLossCell(backbone, loss_fn), 4)   # sums 4 micro-batches' losses
"""

from tessel.nn.wrap import GradAccumulation, MicroBatchInterleaved

__all__ = ["GradAccumulation", "MicroBatchInterleaved"]
