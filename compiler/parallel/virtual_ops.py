"""The virtual ops the parallel pass inserts so that plain autodiff of a rank's graph gives the right gradients
(MindSpore's `_MirrorOperator` and `_VirtualDiv`). Both are the identity forward; they only act backward:

- `Mirror(w, group)` (registered with the collectives, compiler/ops/collective.py) sits on a parameter held
  whole by several ranks (replicated over some device-matrix axes): each rank's gradient covers only the part of
  the computation it ran, so the backward all-reduces (sum) the gradient over exactly the ranks holding the same
  piece;
- `VirtualDiv(y, divisor)` sits on a graph output held by `divisor` ranks: autodiff of a rank program
  differentiates the sum of every rank's outputs, where a replicated output counts `divisor` times, so its
  cotangent is divided by `divisor`.

With these, and collectives whose gradients are their exact adjoints (AllReduce' = AllReduce, AllGather' =
ReduceScatter, AlltoAll' = the reverse AlltoAll, StridedSlice' = Pad), `grad_graph(rank_graph, params)` on every
rank equals the single-device gradient of the parameter's piece.
"""

from __future__ import annotations

from tessel.compiler.ops.common import free, infer_same, lower_as
from tessel.compiler.registry import REQUIRED, register

register(
    "VirtualDiv",
    infer=infer_same,
    lower=lower_as("Identity"),
    grad=lambda c: (c.g * (1.0 / c.attrs["divisor"]),),
    cost=free,
    attrs={"divisor": REQUIRED},
    num_inputs=1,
    doc="VirtualDiv(y, divisor): identity; its gradient is divided by `divisor` (an output held by that many ranks).",
)
