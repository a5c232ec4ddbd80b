"""What the pipeline pass knows about the nodes it emitted, for the lowering that comes later (by then the graph
has been renamed and extended, but its Values are the pass's): each node's phase, so the lowering keeps the
schedule's order (`phases_of`), and the order of the transfers the schedule check ran, so the rank program that
runs is checked to move tensors in that very order (`check_lowered`); and the schedule's action behind each phase
(`actions_of`), so that the timeline names each segment by the action it runs ("F(v=1,m=3)", "W(v=0,m=2)")."""

from __future__ import annotations

import weakref
from collections.abc import Mapping

from tessel.compiler import registry
from tessel.compiler.ir import Graph, Node, Value
from tessel.compiler.rank_program import RankProgram
from tessel.core.errors import ConfigurationError
from tessel.v1 import collective_pb2

_POINT_TO_POINT = (collective_pb2.SEND, collective_pb2.RECV)

_PHASES: weakref.WeakKeyDictionary[Value, int] = weakref.WeakKeyDictionary()
_TRANSFERS: weakref.WeakKeyDictionary[Value, tuple[str, tuple[int, ...]]] = weakref.WeakKeyDictionary()
_ACTIONS: weakref.WeakKeyDictionary[Value, str] = weakref.WeakKeyDictionary()


def record(phases: Mapping[Value, int], nodes: list[Node], actions: Mapping[int, str] | None = None) -> None:
    """Remember the phases of a pipelined graph's nodes, its transfers (Send/Receive nodes, in order) and, from
    `actions` (phase -> the action's name), the action each node belongs to."""
    _PHASES.update(phases)
    for value, phase in (actions is not None and phases.items()) or ():
        if phase in actions:
            _ACTIONS[value] = actions[phase]
    for node in nodes:
        collective = registry.get(node.op).collective
        if collective is not None and collective.kind in _POINT_TO_POINT:
            _TRANSFERS[node.outputs[0]] = (
                collective_pb2.CollectiveKind.Name(collective.kind),
                tuple(node.attrs["group"]),
            )


def phases_of(graph: Graph) -> dict[Value, int] | None:
    """The phases the pipeline pass gave `graph`'s nodes (keyed by first output), or None: not a pipeline's."""
    found = {n.outputs[0]: _PHASES[n.outputs[0]] for n in graph.nodes if n.outputs and n.outputs[0] in _PHASES}
    return found or None


def actions_of(graph: Graph) -> dict[int, str]:
    """Phase -> the schedule action it runs ("F(v=0,m=1)", ...) for `graph`'s nodes (empty: not a pipeline's)."""
    return {_PHASES[v]: _ACTIONS[v] for n in graph.nodes if n.outputs for v in n.outputs[:1] if v in _ACTIONS}


def check_lowered(program: RankProgram, graph: Graph, world_size: int) -> None:
    """Raise unless `program` (lowered from `graph`) sends and receives in the order the pass emitted them, the
    order the schedule check simulated."""
    expected = [_TRANSFERS[n.outputs[0]] for n in graph.nodes if n.outputs and n.outputs[0] in _TRANSFERS]
    got = []
    for ins in program.program.instructions:
        if ins.WhichOneof("op") != "collective":
            continue
        op = ins.collective
        if op.kind in _POINT_TO_POINT:
            group = tuple(program.groups[op.group]) if op.group else tuple(range(world_size))
            got.append((collective_pb2.CollectiveKind.Name(op.kind), group))
    if got != expected:
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        raise ConfigurationError(
            f"rank program {program.name!r} moves tensors in another order than the pipeline schedule that was "
            f"checked: transfer {first} is {got[first : first + 1]}, the schedule's {expected[first : first + 1]} "
            "(an internal error of the lowering: please report it)"
        )
