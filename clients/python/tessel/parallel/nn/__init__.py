"""`tessel.parallel.nn` — MindSpore 2.6's `mindspore.parallel.nn`: the micro-batch wrappers.

`MicroBatchInterleaved` is `tessel.nn.MicroBatchInterleaved`; `Pipeline` is `tessel.nn.PipelineCell` under its
newer name, `PipelineGradReducer` is `tessel.nn.PipelineGradReducer`. Gradient accumulation is not supported yet:
`GradAccumulation` raises NotSupportedYetError naming itself when imported or used.
"""

from tessel.common.support import unsupported_names
from tessel.nn.wrap import MicroBatchInterleaved, PipelineCell, PipelineGradReducer


class Pipeline(PipelineCell):
    """MindSpore's `mindspore.parallel.nn.Pipeline(network, micro_size, stage_config=None, segment_config=None)`:
    tessel.nn.PipelineCell (micro-batches summed; stage_config sets pipeline_stage by cell name).

        >>> net_with_loss = Pipeline(nn.WithLossCell(net, loss_fn), 4, stage_config={"_backbone.layer1": 0})
    """


__getattr__ = unsupported_names(
    "mindspore.parallel.nn", ["GradAccumulation"], "gradient accumulation is not implemented yet"
)

__all__ = ["MicroBatchInterleaved", "Pipeline", "PipelineCell", "PipelineGradReducer"]
