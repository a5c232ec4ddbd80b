"""MindSpore's parameter layout dictionary (`Cell.parameter_layout_dict`, `Model.infer_train_layout`,
`Model.infer_predict_layout`): how the plan a compile made lays each parameter out over the ranks.

Each entry is the 12-tuple MindSpore's graph executor returns, in its order: (device_matrix, tensor_map,
slice_shape, field_size, uniform_split, opt_shard_group, full_shape, slice_shape_after_reshape, pipeline_shared,
is_send, peer_rank, sr_tag). The first six are what MindSpore documents (device arrangement, tensor map in its
numbering, counted from the right of the device matrix, -1 = not split, the shape of this rank's slice, the
embedding field size, whether the cut is uniform, the optimizer-shard group); the rest are what its checkpoint
code reads. tessel has no embedding fields, cuts uniformly, does not shard optimizer state and has no pipeline
stages, so those are 0, True, "", and False/0.

    >>> layout = model.infer_train_layout(dataset)
    >>> layout["fc1.weight"][2]          # the slice of fc1.weight this rank holds
    [128, 784]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def parameter_layout_dict(params: Iterable[Any]) -> dict[str, tuple]:
    """name -> MindSpore's layout tuple for each parameter (replicated over the world where no plan cut it)."""
    from tessel.common.engine import engine
    from tessel.compiler.parallel import Layout

    eng = engine()
    out = {}
    for p in params:
        layout = p.layout if p._layout_engine == eng.id else None
        full = tuple(int(d) for d in p.shape)
        if layout is None:
            layout = Layout.replicated(len(full), eng.world_size)
        local = [int(d) for d in layout.local_shape(full)]
        tensor_map = [list(e) if isinstance(e, tuple) else e for e in layout.tensor_map]
        matrix = list(layout.device_matrix)
        out[p.name] = (matrix, tensor_map, local, 0, True, "", list(full), local, False, False, 0, 0)
    return out
