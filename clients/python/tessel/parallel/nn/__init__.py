"""`tessel.parallel.nn` — MindSpore 2.6's `mindspore.parallel.nn`: the micro-batch wrappers.

`MicroBatchInterleaved` and `GradAccumulation` are `tessel.nn`'s cells (GradAccumulation sums its micro-batches'
losses; a train step over it accumulates their gradients before one reduction and one update). The pipeline
wrappers are not supported yet: each raises NotSupportedYetError naming itself when imported or used.

>>> from tessel.parallel.nn import GradAccumulation, MicroBatchInterleaved
>>> net = GradAccumulation(nn.WithLossCell(backbone, loss_fn), 4)   # sums 4 micro-batches' losses
"""

from tessel.common.support import unsupported_names
from tessel.nn.wrap import GradAccumulation, MicroBatchInterleaved

__getattr__ = unsupported_names(
    "mindspore.parallel.nn",
    ["Pipeline", "PipelineCell", "PipelineGradReducer"],
    "pipeline parallelism is not implemented yet",
)

__all__ = ["GradAccumulation", "MicroBatchInterleaved"]
