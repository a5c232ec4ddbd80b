"""`tessel.parallel.nn` — MindSpore 2.6's `mindspore.parallel.nn`: the micro-batch wrappers.

`MicroBatchInterleaved` is `tessel.nn.MicroBatchInterleaved`. The pipeline wrappers and gradient accumulation
are not supported yet: each raises NotSupportedYetError naming itself when imported or used.
"""

from tessel.common.support import unsupported_names
from tessel.nn.wrap import MicroBatchInterleaved

__getattr__ = unsupported_names(
    "mindspore.parallel.nn",
    ["Pipeline", "PipelineCell", "PipelineGradReducer", "GradAccumulation"],
    "pipeline parallelism and gradient accumulation are not implemented yet",
)

__all__ = ["MicroBatchInterleaved"]
