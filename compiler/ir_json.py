"""The IR on the wire: a Graph as deterministic JSON bytes, and back. No pickle: what a rank sends the coordinator
(the traced forward graph the strategy planner plans) is plain data that any reader can check.

    >>> data = graph_to_json(graph)                   # the same graph gives the same bytes
    >>> again = graph_from_json(data)                 # a Graph of new Values, node for node the same
    >>> again.hash == graph.hash
    True

The document, `{"format": "tessel.graph/1", "name", "inputs", "nodes", "outputs"}`: values are numbered in order of
definition (the graph inputs, then every node's outputs), and each node lists its op, input value numbers,
attributes (in Attrs order), output types and, when it is recomputed for the backward pass, its `recompute`
mark. Attribute values are JSON numbers, strings, booleans, null and lists (tuples), plus three tagged objects:
`{"dtype": "float32"}`, `{"array": {"dtype", "shape", "data"}}` (a ConstArray, its bytes in base64) and
`{"float": "nan" | "inf" | "-inf"}` (JSON has no such numbers). A value's layout, when the parallel pass set one,
is `{"device_matrix", "tensor_map", "partial", "partial_op"}`.

Decoding trusts nothing: every op must be registered, every attribute known to it, every input defined before use,
and (unless check_types=False) every node's output types what the op's shape inference gives; anything else is a
GraphDecodeError naming the node and what is wrong.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Sequence
from typing import Any

from tessel.compiler import registry
from tessel.compiler.dtypes import DType
from tessel.compiler.errors import ShapeInferenceError
from tessel.compiler.ir import Attrs, ConstArray, Graph, Node, Recompute, TensorType, Value
from tessel.compiler.shapes import as_shape
from tessel.core.errors import ConfigurationError

FORMAT = "tessel.graph/1"
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class GraphDecodeError(ConfigurationError):
    """Bytes that are not a graph this tessel can rebuild; the message names the node and the rule broken."""


def dumps(document: Any) -> bytes:
    """Canonical JSON: sorted keys, no spaces, ASCII only, no NaN literals (the same value gives the same bytes)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


# --- encoding -----------------------------------------------------------------------------------------------------


def graph_to_json(graph: Graph) -> bytes:
    """The graph as canonical JSON bytes (see the module docstring); `graph_from_json` rebuilds it."""
    ids: dict[Value, int] = {}
    inputs = []
    for v in graph.inputs:
        ids[v] = len(ids)
        inputs.append(_value(v))
    nodes = []
    for index, node in enumerate(graph.nodes):
        args = []
        for v in node.inputs:
            if v not in ids:
                raise ConfigurationError(
                    f"graph {graph.name!r}: node {index} ({node.op}) reads {v!r}, which neither a graph input nor an "
                    "earlier node defines; only self-contained graphs in topological order can be encoded"
                )
            args.append(ids[v])
        outputs = []
        for v in node.outputs:
            ids[v] = len(ids)
            outputs.append(_value(v))
        where = f"node {index} ({node.op}) attribute"
        attrs = [[name, _attr(value, f"{where} {name!r}")] for name, value in node.attrs.items()]
        entry = {"op": node.op, "inputs": args, "attrs": attrs, "outputs": outputs, "source": node.source}
        if node.recompute is not None:
            entry["recompute"] = node.recompute.value
        nodes.append(entry)
    missing = [v for v in graph.outputs if v not in ids]
    if missing:
        raise ConfigurationError(f"graph {graph.name!r} returns {missing}, which no input or node defines")
    outputs = [{"value": ids[v], "name": v.name} for v in graph.outputs]
    return dumps({"format": FORMAT, "name": graph.name, "inputs": inputs, "nodes": nodes, "outputs": outputs})


def _value(v: Value) -> dict[str, Any]:
    out: dict[str, Any] = {"dtype": v.dtype.value, "shape": list(v.shape)}
    if v.name is not None:
        out["name"] = v.name
    if v.layout is not None:
        out["layout"] = layout_to_dict(v.layout)
    return out


def _attr(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, tuple):
        return [_attr(v, where) for v in value]
    if isinstance(value, DType):
        return {"dtype": value.value}
    if isinstance(value, ConstArray):
        data = base64.b64encode(value.data).decode("ascii")
        return {"array": {"dtype": value.dtype.value, "shape": list(value.shape), "data": data}}
    raise ConfigurationError(f"{where}: {value!r} of type {type(value).__name__} has no JSON form")


def layout_to_dict(layout: Any) -> dict[str, Any]:
    """A Layout as plain data (tensor_map entries: ints, or lists for a dim split over several axes)."""
    from tessel.compiler.parallel.layout import Layout

    if not isinstance(layout, Layout):
        raise ConfigurationError(f"{layout!r} is not a Layout; only Layouts travel as JSON")
    return {
        "device_matrix": list(layout.device_matrix),
        "tensor_map": [list(e) if isinstance(e, tuple) else e for e in layout.tensor_map],
        "partial": list(layout.partial),
        "partial_op": layout.partial_op,
    }


# --- decoding -----------------------------------------------------------------------------------------------------


def graph_from_json(data: bytes | str, *, check_types: bool = True, max_nodes: int | None = None) -> Graph:
    """The Graph `graph_to_json` wrote. `check_types`: re-run every op's shape inference and require the types the
    document states; `max_nodes`: refuse larger graphs before building them. Errors are GraphDecodeError."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GraphDecodeError(f"the graph is not JSON: {exc}") from None
    _expect(isinstance(document, dict), "the graph document is not a JSON object")
    _expect(
        document.get("format") == FORMAT,
        f"the document's format is {document.get('format')!r}, not {FORMAT!r}; encode graphs with "
        "tessel.compiler.ir_json.graph_to_json of the same tessel version",
    )
    nodes = _list(document, "nodes", "the graph")
    if max_nodes is not None and len(nodes) > max_nodes:
        raise GraphDecodeError(
            f"the graph has {len(nodes)} nodes, more than the {max_nodes} accepted here; plan a smaller graph "
            "(or raise the limit where the planner runs)"
        )
    name = document.get("name")
    _expect(isinstance(name, str), "the graph's name is not a string")
    values: list[Value] = [_decode_value(v, f"input {i}") for i, v in enumerate(_list(document, "inputs", "the graph"))]
    graph_inputs = tuple(values)
    built = [_decode_node(entry, index, values, check_types) for index, entry in enumerate(nodes)]
    outputs = []
    for k, entry in enumerate(_list(document, "outputs", "the graph")):
        _expect(isinstance(entry, dict), f"output {k} is not an object")
        value = _value_ref(values, entry.get("value"), f"output {k}")
        wanted = entry.get("name")
        _expect(wanted is None or isinstance(wanted, str), f"output {k}: name is not a string")
        _expect(wanted == value.name, f"output {k}: named {wanted!r} but the value it returns is named {value.name!r}")
        outputs.append(value)
    try:
        return Graph(graph_inputs, tuple(built), tuple(outputs), name)
    except ValueError as exc:
        raise GraphDecodeError(str(exc)) from None


def _decode_node(entry: Any, index: int, values: list[Value], check_types: bool) -> Node:
    where = f"node {index}"
    _expect(isinstance(entry, dict), f"{where} is not an object")
    op = entry.get("op")
    _expect(isinstance(op, str), f"{where}: op is not a string")
    where = f"node {index} ({op})"
    try:
        opdef = registry.get(op)
    except ShapeInferenceError as exc:
        raise GraphDecodeError(f"{where}: {exc}") from None
    inputs = tuple(_value_ref(values, ref, f"{where} input {k}") for k, ref in enumerate(_list(entry, "inputs", where)))
    pairs = []
    for item in _list(entry, "attrs", where):
        _expect(isinstance(item, list) and len(item) == 2 and isinstance(item[0], str), f"{where}: malformed attribute")
        _expect(item[0] in opdef.attrs, f"{where}: {op} has no attribute {item[0]!r}; it takes {sorted(opdef.attrs)}")
        pairs.append((item[0], _decode_attr(item[1], f"{where} attribute {item[0]!r}")))
    try:
        attrs = Attrs(pairs)
    except TypeError as exc:
        raise GraphDecodeError(f"{where}: {exc}") from None
    outputs = tuple(_decode_value(v, f"{where} output {k}") for k, v in enumerate(_list(entry, "outputs", where)))
    if check_types:
        _check_types(opdef, where, inputs, attrs, outputs)
    source = entry.get("source")
    _expect(source is None or isinstance(source, str), f"{where}: source is not a string")
    marks = {m.value: m for m in Recompute}
    recompute = entry.get("recompute")
    _expect(recompute is None or recompute in marks, f"{where}: recompute must be one of {sorted(marks)}")
    values.extend(outputs)
    return Node(op, inputs, attrs, outputs, source, None if recompute is None else marks[recompute])


def _check_types(opdef, where: str, inputs: tuple[Value, ...], attrs: Attrs, outputs: tuple[Value, ...]) -> None:
    missing = sorted(k for k in opdef.attrs if k not in attrs)
    _expect(not missing, f"{where}: attribute(s) {missing} are missing")
    try:
        opdef.check_arity(len(inputs))
        inferred = tuple(opdef.infer(tuple(v.type for v in inputs), attrs))
    except ShapeInferenceError as exc:
        raise GraphDecodeError(f"{where}: {exc}") from None
    stated = tuple(v.type for v in outputs)
    _expect(
        inferred == stated,
        f"{where}: the document says its outputs are {list(stated)}, but {opdef.name}'s shape inference gives "
        f"{list(inferred)}; the graph was edited or comes from another tessel version",
    )


def _decode_value(entry: Any, where: str) -> Value:
    _expect(isinstance(entry, dict), f"{where} is not an object")
    shape = entry.get("shape")
    _expect(
        isinstance(shape, list) and all(isinstance(d, str) or (type(d) is int and d >= 0) for d in shape),
        f"{where}: shape {shape!r} is not a list of non-negative ints and symbols",
    )
    name = entry.get("name")
    _expect(name is None or isinstance(name, str), f"{where}: name is not a string")
    layout = entry.get("layout")
    return Value(
        TensorType(as_shape(shape), _dtype(entry.get("dtype"), where)),
        name,
        None if layout is None else layout_from_dict(layout, f"{where} layout"),
    )


def _value_ref(values: list[Value], ref: Any, where: str) -> Value:
    _expect(
        type(ref) is int and 0 <= ref < len(values),
        f"{where} refers to value {ref!r}, which is not defined before it (values 0..{len(values) - 1} are)",
    )
    return values[ref]


def _decode_attr(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return tuple(_decode_attr(v, where) for v in value)
    _expect(isinstance(value, dict) and len(value) == 1, f"{where}: {value!r} is not an attribute value")
    ((tag, body),) = value.items()
    if tag == "dtype":
        return _dtype(body, where)
    if tag == "float":
        _expect(body in _NON_FINITE, f"{where}: float {body!r} is not one of {sorted(_NON_FINITE)}")
        return _NON_FINITE[body]
    if tag == "array":
        _expect(isinstance(body, dict), f"{where}: array is not an object")
        dtype = _dtype(body.get("dtype"), where)
        shape = body.get("shape")
        _expect(
            isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape),
            f"{where}: array shape {shape!r} is not a list of non-negative ints",
        )
        try:
            data = base64.b64decode(body.get("data", ""), validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise GraphDecodeError(f"{where}: array data is not base64") from None
        want = math.prod(shape) * dtype.itemsize
        _expect(len(data) == want, f"{where}: array of shape {shape} {dtype.value} needs {want} bytes, got {len(data)}")
        return ConstArray(dtype, tuple(shape), data)
    raise GraphDecodeError(f"{where}: unknown tagged value {tag!r}; known: dtype, float, array")


def _dtype(name: Any, where: str) -> DType:
    try:
        return DType(name)
    except ValueError:
        raise GraphDecodeError(f"{where}: {name!r} is not a dtype; known: {[d.value for d in DType]}") from None


def layout_from_dict(entry: Any, where: str = "layout") -> Any:
    """The Layout `layout_to_dict` wrote; a malformed one is a GraphDecodeError naming `where`."""
    from tessel.compiler.parallel.layout import Layout

    _expect(isinstance(entry, dict), f"{where} is not an object")
    matrix, tensor_map = entry.get("device_matrix"), entry.get("tensor_map")
    partial, partial_op = entry.get("partial", []), entry.get("partial_op", "sum")
    _expect(_ints(matrix), f"{where}: device_matrix {matrix!r} is not a list of ints")
    _expect(
        isinstance(tensor_map, list) and all(type(e) is int or _ints(e) for e in tensor_map),
        f"{where}: tensor_map {tensor_map!r} is not a list of ints and lists of ints",
    )
    _expect(_ints(partial) and isinstance(partial_op, str), f"{where}: partial {partial!r} / {partial_op!r} malformed")
    try:
        return Layout(
            tuple(matrix), tuple(tuple(e) if isinstance(e, list) else e for e in tensor_map), tuple(partial), partial_op
        )
    except ValueError as exc:
        raise GraphDecodeError(f"{where}: {exc}") from None


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is int for v in value)


def _list(entry: dict, key: str, where: str) -> Sequence:
    value = entry.get(key)
    _expect(isinstance(value, list), f"{where}: {key!r} is not a list")
    return value


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise GraphDecodeError(message)
