"""What a placement costs: the groundwork for AUTO_PARALLEL's strategy search (SEMI_AUTO_PARALLEL does not use it).

A candidate strategy for a node is a cut per label of its rule (`candidates`); its cost is the op's own cost on
the local shapes it would run on (the registry's `cost`, so an op's cost stays in its one definition) plus the
redistribution of each input from the layout it arrives in (the table in redistribution.py):

    best = min(candidates(node, spec, 8), key=lambda cuts: placement_cost(node, spec, place(...), arriving))
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

from tessel.compiler import registry
from tessel.compiler.ir import Attrs, Node, TensorType, Value
from tessel.compiler.parallel.layout import Layout
from tessel.compiler.parallel.mesh import divisors
from tessel.compiler.parallel.redistribution import redistribution_cost
from tessel.compiler.parallel.strategy import Placement, label_sizes, uncombinable
from tessel.compiler.sharding import ShardingSpec

BYTES_PER_FLOP = 0.25  # how many bytes moved cost as much as one flop (a device doing ~4 flops per byte moved)


def candidates(node: Node, spec: ShardingSpec, device_num: int) -> Iterator[dict[str, int]]:
    """Every legal assignment of cuts to the node's input labels whose product divides device_num."""
    sizes = label_sizes(node, spec)
    blocked = spec.fixed | uncombinable(spec)
    labels = [label for labels in spec.inputs if labels for label in labels]
    labels = [label for label in dict.fromkeys(labels) if label not in blocked]
    options = [[d for d in divisors(device_num) if all(s % d == 0 for s in sizes[label])] for label in labels]
    for cuts in itertools.product(*options):
        if device_num % math.prod(cuts) == 0:
            yield {label: cut for label, cut in zip(labels, cuts) if cut > 1}


def local_cost(node: Node, spec: ShardingSpec, placement: Placement) -> registry.Cost:
    """The registry's cost of the node run on one rank's pieces."""

    def local(value: Value, layout: Layout | None) -> Value:
        shape = value.shape if layout is None else layout.local_shape(value.shape)
        return Value(TensorType(shape, value.dtype))

    inputs = tuple(local(v, layout) for v, layout in zip(node.inputs, placement.inputs))
    outputs = tuple(local(v, layout) for v, layout in zip(node.outputs, placement.outputs))
    attrs = node.attrs
    if spec.shape_attr is not None:
        attrs = Attrs({**dict(attrs), spec.shape_attr: outputs[0].shape})
    return registry.get(node.op).cost(Node(node.op, inputs, attrs, outputs), {})


def placement_cost(node: Node, spec: ShardingSpec, placement: Placement, arriving: Sequence[Layout]) -> float:
    """Bytes-equivalent cost of running `node` under `placement` when its inputs arrive in `arriving`."""
    own = local_cost(node, spec, placement)
    moves = sum(
        redistribution_cost(have, want, tuple(v.shape), v.dtype.itemsize)
        for v, have, want in zip(node.inputs, arriving, placement.inputs)
        if want is not None
    )
    return own.flops * BYTES_PER_FLOP + own.bytes + moves
