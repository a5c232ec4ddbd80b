"""Strategies on the wire: `{node: strategy}` as deterministic JSON keyed by node index, tied to the graph by its hash
(what the coordinator's planner receives as the user's fixed strategies and sends back as the plan).

    >>> data = strategies_to_json(graph, {matmul: ((1, 1), (1, 2)), relu: "data_parallel"})
    >>> strategies_from_json(graph, data)             # keyed by the nodes of `graph`
    {matmul: ((1, 1), (1, 2)), relu: 'data_parallel'}

Every strategy form the planner and `parallelize` take travels: a tuple of cuts per input (None entries kept),
"data_parallel", a `Strategy` (in/out strategies, or in/out Layouts: MindSpore's Layout form of shard()), a
tuple of Layouts, or anything with `in_strategy` (a Primitive after .shard(); it arrives as the equal Strategy).
The value codec (`value_to_json` / `value_from_json`) also carries a dataset_strategy: lists for tuples,
`{"layout": ...}`, `{"strategy": ...}`, and `{"map": [[key, value], ...]}` for a mapping by column name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tessel.compiler.ir import Graph, Node
from tessel.compiler.ir_json import GraphDecodeError, dumps, layout_from_dict, layout_to_dict
from tessel.compiler.parallel.layout import Layout
from tessel.compiler.parallel.partition import by_node
from tessel.compiler.parallel.strategy import Strategy
from tessel.core.errors import ConfigurationError

FORMAT = "tessel.strategies/1"
_STRATEGY_FIELDS = ("in_strategy", "out_strategy", "in_layouts", "out_layouts")


def strategies_to_json(graph: Graph, strategies: Mapping[Node | int, Any]) -> bytes:
    """The strategies of `graph`'s nodes (keyed by Node or node index) as canonical JSON bytes."""
    by_index = {node: index for index, node in enumerate(graph.nodes)}
    entries = sorted((by_index[node], value_to_json(value)) for node, value in by_node(graph, strategies).items())
    return dumps({"format": FORMAT, "graph": graph.hash, "nodes": len(graph.nodes), "strategies": entries})


def strategies_from_json(graph: Graph, data: bytes | str) -> dict[Node, Any]:
    """The strategies `strategies_to_json` wrote for `graph` (the same net: its hash must match), keyed by the nodes
    of `graph`. Errors are GraphDecodeError naming what does not fit."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GraphDecodeError(f"the strategies are not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise GraphDecodeError(f"not a strategies document (format {FORMAT!r} expected)")
    if document.get("graph") != graph.hash:
        raise GraphDecodeError(
            f"the strategies were planned for graph hash {str(document.get('graph'))[:12]}, not for graph "
            f"{graph.name!r} (hash {graph.hash[:12]}); decode them with the graph that was planned"
        )
    entries = document.get("strategies")
    if not isinstance(entries, list):
        raise GraphDecodeError("the strategies document has no list of strategies")
    out: dict[Node, Any] = {}
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int):
            raise GraphDecodeError(f"strategy entry {entry!r} is not [node index, strategy]")
        index, value = entry
        if not 0 <= index < len(graph.nodes):
            raise GraphDecodeError(f"strategy for node {index}, but graph {graph.name!r} has {len(graph.nodes)} nodes")
        out[graph.nodes[index]] = value_from_json(value, f"the strategy of node {index} ({graph.nodes[index].op})")
    return out


def value_to_json(value: Any) -> Any:
    """A strategy or dataset_strategy value as plain JSON data (see the module docstring)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, Layout):
        return {"layout": layout_to_dict(value)}
    if isinstance(value, Strategy) or hasattr(value, "in_strategy"):
        strategy = Strategy.of(value)
        return {"strategy": {name: value_to_json(getattr(strategy, name)) for name in _STRATEGY_FIELDS}}
    if isinstance(value, Mapping):
        return {"map": sorted([str(k), value_to_json(v)] for k, v in value.items())}
    if isinstance(value, (tuple, list)):
        return [value_to_json(v) for v in value]
    if hasattr(value, "__index__"):  # numpy integers
        return int(value)
    raise ConfigurationError(f"strategy value {value!r} of type {type(value).__name__} has no JSON form")


def value_from_json(value: Any, where: str = "strategy") -> Any:
    """The value `value_to_json` wrote: lists become tuples, tagged objects Layouts, Strategies and dicts."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, list):
        return tuple(value_from_json(v, where) for v in value)
    if not (isinstance(value, dict) and len(value) == 1):
        raise GraphDecodeError(f"{where}: {value!r} is not a strategy value")
    ((tag, body),) = value.items()
    if tag == "layout":
        return layout_from_dict(body, f"{where} layout")
    if tag == "map":
        if not (isinstance(body, list) and all(isinstance(e, list) and len(e) == 2 for e in body)):
            raise GraphDecodeError(f"{where}: map {body!r} is not a list of [key, value]")
        return {str(k): value_from_json(v, where) for k, v in body}
    if tag == "strategy":
        if not (isinstance(body, dict) and set(body) <= set(_STRATEGY_FIELDS)):
            raise GraphDecodeError(f"{where}: strategy {body!r} has fields other than {_STRATEGY_FIELDS}")
        fields = {name: value_from_json(body.get(name), where) for name in _STRATEGY_FIELDS}
        return Strategy(**fields)
    raise GraphDecodeError(f"{where}: unknown tagged value {tag!r}; known: layout, map, strategy")
