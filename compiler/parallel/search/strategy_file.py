"""Strategy files: every op's strategy as readable JSON, tied to the net it was planned for by the graph's hash
(MindSpore's strategy_ckpt_save_file / strategy_ckpt_load_file, in JSON).

    >>> save_strategy_file(plan, "strategy.json")                     # a ParallelPlan, or strategies + graph
    >>> strategies = load_strategy_file("strategy.json", graph)       # the same net: the same plan again
    >>> plan = parallelize(graph, strategies, 8, parameters=["w"])

One entry per node, in graph order: its index, op, the node as the IR dump prints it (sources left out), the
user's file:line, the strategy (a list of cuts per input, or "data_parallel"), any out_strategy, and where it
came from. Loading into another net fails on the first op that differs, naming both and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from tessel.compiler import registry
from tessel.compiler.ir import ConstArray, Graph, Node
from tessel.compiler.parallel.partition import ParallelPlan
from tessel.compiler.parallel.search.planner import SearchResult
from tessel.compiler.parallel.strategy import DATA_PARALLEL, Strategy
from tessel.core.errors import ConfigurationError

FORMAT = "tessel.strategy/1"


def save_strategy_file(
    plan_or_strategies: ParallelPlan | SearchResult | Mapping[Node | int, Any],
    path: str | os.PathLike,
    graph: Graph | None = None,
    device_num: int | None = None,
) -> None:
    """Write every op's strategy to `path` (JSON, written atomically). A ParallelPlan carries its graph and
    device count; strategies (a mapping, or a SearchResult) need `graph`, and may say `device_num`."""
    document = strategy_document(plan_or_strategies, graph, device_num)
    temporary = f"{os.fspath(path)}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    os.replace(temporary, path)


def strategy_document(
    plan_or_strategies: ParallelPlan | SearchResult | Mapping[Node | int, Any],
    graph: Graph | None = None,
    device_num: int | None = None,
) -> dict:
    """The JSON document save_strategy_file writes (for files that hold several graphs' strategies)."""
    if isinstance(plan_or_strategies, ParallelPlan):
        plan = plan_or_strategies
        graph, device_num = plan.graph, plan.device_num
        entries = [_from_placement(plan, node) for node in graph.nodes]
    else:
        if graph is None:
            raise ConfigurationError("save_strategy_file needs graph= when given strategies rather than a plan")
        given = plan_or_strategies
        if isinstance(given, SearchResult):
            given = given.strategies
        by_node = {graph.nodes[k] if isinstance(k, int) else k: v for k, v in given.items()}
        entries = [_from_strategy(node, by_node.get(node)) for node in graph.nodes]
    lines = _node_lines(graph)
    ops = []
    for index, (node, line, (strategy, out, origin)) in enumerate(zip(graph.nodes, lines, entries)):
        ops.append(
            {
                "index": index,
                "op": node.op,
                "node": line,
                "source": node.source,
                "strategy": strategy,
                "out_strategy": out,
                "origin": origin,
            }
        )
    return {
        "format": FORMAT,
        "graph": {
            "name": graph.name,
            "hash": graph.hash,
            "portable_hash": portable_hash(graph),
            "inputs": _input_lines(graph),
            "nodes": len(graph.nodes),
        },
        "device_num": device_num,
        "ops": ops,
    }


def load_strategy_file(path: str | os.PathLike, graph: Graph) -> dict[Node, Any]:
    """The strategies saved in `path`, keyed by the nodes of `graph`, which must be the net they were saved for."""
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    return strategies_of_document(document, graph, path)


def strategies_of_document(document: dict, graph: Graph, path: Any = "the strategy file") -> dict[Node, Any]:
    """The strategies of a document `strategy_document` made, keyed by the nodes of `graph` (the same net)."""
    if document.get("format") != FORMAT:
        raise ConfigurationError(f"{path} is not a tessel strategy file (format {document.get('format')!r})")
    saved = document["graph"]
    if saved["hash"] != graph.hash and saved.get("portable_hash") != portable_hash(graph):
        raise ConfigurationError(_mismatch(path, document, graph))
    out: dict[Node, Any] = {}
    for entry, node in zip(document["ops"], graph.nodes):
        strategy = entry["strategy"]
        if strategy is None:
            continue
        if strategy == DATA_PARALLEL:
            out[node] = DATA_PARALLEL
        elif entry["out_strategy"] is not None:
            out[node] = Strategy(_tuples(strategy), _tuples(entry["out_strategy"]))
        else:
            out[node] = _tuples(strategy)
    return out


def _mismatch(path, document: dict, graph: Graph) -> str:
    saved = document["graph"]
    fix = (
        "Fix: plan the strategies for this net again (AUTO_PARALLEL's search) and save a new file, or load the "
        "file saved for this net"
    )
    head = f"strategy file {path} was saved for another net (graph {saved['name']!r}, hash {saved['hash'][:12]}; "
    head += f"this net: {graph.name!r}, hash {graph.hash[:12]})"
    inputs = _input_lines(graph)
    if saved["inputs"] != inputs:
        return f"{head}: its inputs are {saved['inputs']}, this net's are {inputs}. {fix}"
    lines = _node_lines(graph)
    for entry, line, node in zip(document["ops"], lines, graph.nodes):
        if entry["node"] != line:
            where = f" (at {node.source})" if node.source else ""
            return (
                f"{head}: the first op that differs is #{entry['index']}, `{entry['node']}` in the file but "
                f"`{line}` in this net{where}. {fix}"
            )
    if len(document["ops"]) != len(lines):
        k = min(len(document["ops"]), len(lines))
        if k < len(lines):
            extra = f"`{lines[k]}` is not in the file"
        else:
            extra = f"`{document['ops'][k]['node']}` is not in this net"
        return f"{head}: the file has {len(document['ops'])} ops and this net {len(lines)}; op #{k} {extra}. {fix}"
    return f"{head}: the ops agree but constants differ. {fix}"


def _node_lines(graph: Graph) -> list[str]:
    return [line.strip() for line in graph.dump(sources=False).splitlines()[1 : 1 + len(graph.nodes)]]


def portable_hash(graph: Graph) -> str:
    """The graph's hash without the process's parameter serials ("w1#0" is "w1#3" in a process that made three
    Parameters first): the same net hashes alike in another run or script."""
    constants = "".join(
        f"\n{v!r}={v.digest}" for n in graph.nodes for v in n.attrs.values() if isinstance(v, ConstArray)
    )
    text = re.sub(r"#\d+\b", "#", graph.dump(sources=False)) + constants
    return hashlib.sha256(text.encode()).hexdigest()


def _input_lines(graph: Graph) -> list[str]:
    return [f"{v.name}: {v.type!r}" for v in graph.inputs]


def _from_placement(plan: ParallelPlan, node: Node) -> tuple[Any, Any, str]:
    placement = plan.placements[node]
    if registry.written(node) is not None:
        return None, None, placement.origin
    out = None
    if placement.out_targets is not None:
        out = [list(layout.splits) for layout in placement.out_targets]
    return _lists(placement.strategy), out, placement.origin


def _from_strategy(node: Node, given: Any) -> tuple[Any, Any, str]:
    if registry.written(node) is not None:
        return None, None, "parameter"
    if given is None or given == DATA_PARALLEL:
        return DATA_PARALLEL, None, "data parallel"
    strategy = Strategy.of(given)
    return _lists(strategy.in_strategy), _lists(strategy.out_strategy), "strategy"


def _lists(splits) -> list | None:
    return None if splits is None else [None if s is None else list(s) for s in splits]


def _tuples(splits) -> tuple:
    return tuple(None if s is None else tuple(int(d) for d in s) for s in splits)
