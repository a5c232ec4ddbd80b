"""Running every rank's graph in one process, before any lowering: the reference executor of the parallel pass's
tests (and a debugging aid: "what does rank 3 hold after node 12?").

The rank graphs of one plan have the same nodes in the same order (only slice offsets and groups differ), so
they run in lockstep: a local op runs on each rank (data-movement ops in numpy, the rest through the compiler's
eager executor on ONNX Runtime), a collective combines the inputs of each group's members in numpy.

    outputs = run_ranks([plan.rank_graph(r) for r in range(4)], [plan.local_feeds(feeds, r) for r in range(4)])
    y = assemble([out[0] for out in outputs], plan.output_layouts[0], graph.outputs[0].shape)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tessel.compiler.eager import EagerExecutor
from tessel.compiler.ir import Graph, Node
from tessel.compiler.ops.collective import collective
from tessel.compiler.ops.index import slice_specs
from tessel.errors import CollectiveMismatchError, ConfigurationError

_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
_EAGER: EagerExecutor | None = None


def _eager() -> EagerExecutor:
    global _EAGER
    if _EAGER is None:
        from tessel.plugins.cpu.compute import CpuCompute

        _EAGER = EagerExecutor(CpuCompute(threads=1))
    return _EAGER


def run_ranks(
    graphs: Sequence[Graph], feeds: Sequence[Mapping[str, np.ndarray]], eager: EagerExecutor | None = None
) -> list[list[np.ndarray]]:
    """Run graphs[r] on feeds[r] for every rank r, collectives across ranks; returns each rank's outputs."""
    eager = eager or _eager()
    count = len(graphs[0].nodes)
    if any(len(g.nodes) != count for g in graphs):
        raise ConfigurationError(f"rank graphs differ in length: {[len(g.nodes) for g in graphs]} nodes")
    envs: list[dict[Any, np.ndarray]] = []
    for rank, (graph, feed) in enumerate(zip(graphs, feeds)):
        missing = [v.name for v in graph.inputs if v.name not in feed]
        if missing:
            raise ConfigurationError(f"rank {rank}: no value for input(s) {missing}")
        envs.append({v: np.asarray(feed[v.name]) for v in graph.inputs})
    for k in range(count):
        nodes = [g.nodes[k] for g in graphs]
        ops = {n.op for n in nodes}
        if len(ops) > 1:
            raise CollectiveMismatchError(f"node {k} differs between ranks: {sorted(ops)}", -1, "kind")
        if collective(nodes[0].op) is not None:
            results = _collective(nodes, [[env[v] for v in n.inputs] for n, env in zip(nodes, envs)])
        else:
            results = [_local(n, [env[v] for v in n.inputs], eager) for n, env in zip(nodes, envs)]
        for node, env, outs in zip(nodes, envs, results):
            for value, array in zip(node.outputs, outs):
                env[value] = array
    return [[env[v] for v in g.outputs] for g, env in zip(graphs, envs)]


def _local(node: Node, inputs: list[np.ndarray], eager: EagerExecutor) -> list[np.ndarray]:
    if node.op in ("Identity", "Mirror", "VirtualDiv", "StopGradient", "Depend"):
        return [inputs[0]]
    if node.op == "Constant":
        return [node.attrs["value"].numpy()]
    if node.op in ("Reshape", "ExpandDims", "Squeeze", "Flatten"):
        return [inputs[0].reshape(node.outputs[0].shape)]
    if node.op == "StridedSlice":
        return [inputs[0][_slices(node)]]
    result = eager.run(node.op, *inputs, **dict(node.attrs))
    return list(result) if isinstance(result, tuple) else [result]


def _slices(node: Node) -> tuple[slice, ...]:
    out = []
    for spec in slice_specs(node.inputs[0].type, node.attrs):
        if spec is None:
            out.append(slice(None))
        else:
            start, stop, step, _ = spec
            out.append(slice(start, stop if stop >= 0 else None, step))
    return tuple(out)


def _collective(nodes: list[Node], inputs: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Each rank's outputs of one collective node (each rank belongs to exactly one group)."""
    results: list[list[np.ndarray] | None] = [None] * len(nodes)
    for rank, node in enumerate(nodes):
        if results[rank] is not None:
            continue
        group = tuple(node.attrs["group"])
        if rank not in group:
            raise CollectiveMismatchError(
                f"rank {rank} issues {node.op} on group {group}, which lacks it", rank, "group"
            )
        for member in group:
            if tuple(nodes[member].attrs["group"]) != group or nodes[member].attrs != node.attrs:
                raise CollectiveMismatchError(
                    f"ranks {rank} and {member} disagree on {node.op}: {node.attrs} vs {nodes[member].attrs}",
                    member,
                    "attrs",
                )
        outs = _combine(node, [inputs[m][0] for m in group])
        for member, out in zip(group, outs):
            results[member] = [out]
    return results  # type: ignore[return-value]


def _combine(node: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    """The collective's result for each group member (group order), numpy semantics of compiler/ops/collective."""
    n, op, attrs = len(xs), node.op, node.attrs
    if op in ("AllReduce", "ReduceScatter"):
        total = xs[0]
        for x in xs[1:]:
            total = _REDUCE[attrs["reduce_op"]](total, x)
        if op == "AllReduce":
            return [total.copy() for _ in xs]
        return list(np.split(total, n, axis=attrs["axis"]))
    if op == "AllGather":
        whole = np.concatenate(xs, axis=attrs["axis"])
        return [whole.copy() for _ in xs]
    if op == "AlltoAll":
        blocks = [np.split(x, n, axis=attrs["split_dim"]) for x in xs]
        return [np.concatenate([blocks[j][i] for j in range(n)], axis=attrs["concat_dim"]) for i in range(n)]
    if op == "Broadcast":
        return [xs[attrs["root"]].copy() for _ in xs]
    raise ConfigurationError(f"the parallel simulator does not run {op}")
