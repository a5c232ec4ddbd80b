"""`tessel.parallel.nn` — MindSpore 2.6's `mindspore.parallel.nn`: the micro-batch wrappers.

`MicroBatchInterleaved` and `GradAccumulation` are `tessel.nn`'s cells (GradAccumulation sums its micro-batches'
losses; a train step over it accumulates their gradients before one reduction and one update). `Pipeline` is
`tessel.nn.PipelineCell` under its newer name, `PipelineGradReducer` is `tessel.nn.PipelineGradReducer`.

>>> from tessel.parallel.nn import GradAccumulation, MicroBatchInterleaved
>>> net = GradAccumulation(nn.WithLossCell(backbone, loss_fn), 4)   # sums 4 micro-batches' losses
"""

from tessel.nn.wrap import GradAccumulation, MicroBatchInterleaved, PipelineCell, PipelineGradReducer


class Pipeline(PipelineCell):
    """MindSpore's `mindspore.parallel.nn.Pipeline(network, micro_size, stage_config=None, segment_config=None)`:
    tessel.nn.PipelineCell (micro-batches summed; stage_config sets pipeline_stage by cell name).

        >>> net_with_loss = Pipeline(nn.WithLossCell(net, loss_fn), 4, stage_config={"_backbone.layer1": 0})
    """


__all__ = ["GradAccumulation", "MicroBatchInterleaved", "Pipeline", "PipelineCell", "PipelineGradReducer"]
