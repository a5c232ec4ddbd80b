"""The op registry: every op is defined once, in one `OpDef`, and everything else is generic over it.

An `OpDef` says
- `infer(types, attrs) -> output types`: shape/dtype inference; raises ShapeInferenceError with the rule broken;
- `lower(ctx, node, inputs, outputs)`: emits ONNX nodes writing the named outputs (see lower_onnx.LoweringContext);
- `grad(ctx) -> input cotangents`: the reverse rule, written with other registered ops (see autodiff.GradContext);
  `grad=None` means "no gradient" (an error if one is needed), `ZERO_GRAD` means "gradient is zero" (Sign, Floor);
- `sharding(node) -> ShardingSpec`: which input dims may split, the output layout and any partial sums (see
  compiler/sharding.py for the generators that make most rules one line; `replicated` = the op runs whole).
  Collectives declare none; `sharding_spec(node)` falls back to `replicated` for them;
- `cost(node, sizes) -> Cost`: flops and bytes moved, for the planner (default: one flop per output element);
- `collective`: for ops that move data between ranks, how a daemon runs them (`Collective`: the wire kind and
  fields); None for local ops. Rank-program lowering cuts graphs at these ops;
- `writes`: the index of the input the op writes in place (Assign writes its parameter, input 0); such a node is
  kept by graph building even when no output is used;
- `differentiates`: the op's outputs are the gradients of input 0 with respect to its other inputs (GradientOf):
  autodiff expands it once the graph is final, which for a parallel graph is after the parallel pass;
- `rewrite(graph, context) -> graph`: an algebraic identity of the op applied to every rank graph before lowering
  (MatMul's: a sum of row-contracted products becomes one product of the stacked rows); `context` (RewriteContext)
  says what is known of where the graph runs;
- `orders`: the op exists to order the graph (After): a model holding one asks the runtime to follow the node
  order it was written in (lower_onnx.EXECUTION_ORDER);
- `random`: the op draws random numbers (Dropout): rank-graph rewrites neither merge two of its nodes nor move
  it from parts of a tensor to the whole;
- `identity`: the op's result is its one input, unchanged (Identity, and ops whose meaning is all in their gradient,
  as Mirror): rank-program lowering has its readers read the input itself (rank_rewrite.read_through_identities);
- `selects`: the result only rearranges or selects its one input's elements (Reshape, Transpose, StridedSlice):
  where that input is the graph's own, each segment reading the result computes it itself (rank_plan).

Ops register themselves at import of `tessel.compiler.ops`; `get(name)` looks one up. Adding an op is one
`register(...)` call in the op family's file, and nothing else: every pass is generic over these fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessel.compiler.errors import ShapeInferenceError
from tessel.compiler.ir import Attrs, Node, TensorType
from tessel.compiler.shapes import numel
from tessel.compiler.sharding import Rule, ShardingSpec, replicated


@dataclass(frozen=True)
class Cost:
    """What running one node costs: floating-point operations and bytes read plus written."""

    flops: int
    bytes: int

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


# An attribute without a default: the caller must give it.
REQUIRED: Any = _Required()


class _ZeroGrad:
    def __repr__(self) -> str:
        return "ZERO_GRAD"


# The gradient of every input is zero (piecewise-constant ops); autodiff stops here without an error.
ZERO_GRAD: Any = _ZeroGrad()

InferFn = Callable[[tuple[TensorType, ...], Attrs], tuple[TensorType, ...]]
LowerFn = Callable[[Any, Node, list[str], list[str]], None]
GradFn = Callable[[Any], tuple[Any, ...]]
CostFn = Callable[[Node, Mapping[str, int]], Cost]


def io_bytes(node: Node, sizes: Mapping[str, int]) -> int:
    """Bytes of every input and output of a node (symbols valued by `sizes`)."""
    return sum(numel(v.shape, sizes) * v.dtype.itemsize for v in (*node.inputs, *node.outputs))


def elementwise_cost(node: Node, sizes: Mapping[str, int]) -> Cost:
    return Cost(sum(numel(o.shape, sizes) for o in node.outputs), io_bytes(node, sizes))


@dataclass(frozen=True)
class Collective:
    """How a collective op runs on a daemon.

    `kind` is the CollectiveOp kind; `fields(node)` the CollectiveOp fields besides group, inputs, outputs and
    handle; `expand(rewriter, node)` (when set and `needs_expand(node)`) rewrites the node into wire form with
    local ops around it (AllGather along dim 1 = ExpandDims, gather on dim 0, Transpose, Reshape);
    `wire_inputs` says whether the node's inputs travel (Receive's input only orders it); `alias` says its
    outputs are its inputs (Send: the daemon stores nothing).
    """

    kind: int
    fields: Callable[[Node], dict[str, Any]] = field(default=lambda node: {})
    needs_expand: Callable[[Node], bool] = field(default=lambda node: False)
    expand: Callable[[Any, Node], None] | None = None
    wire_inputs: bool = True
    alias: bool = False


@dataclass(frozen=True)
class OpDef:
    """Everything tessel knows about one op. See the module docstring for each field's contract."""

    name: str
    infer: InferFn
    lower: LowerFn
    grad: GradFn | None
    attrs: Mapping[str, Any] = field(default_factory=dict)  # attribute name -> default (or REQUIRED)
    cost: CostFn = elementwise_cost
    sharding: Rule | None = None
    collective: Collective | None = None
    writes: int | None = None
    differentiates: bool = False
    orders: bool = False
    num_inputs: int | None = None  # None = variadic
    doc: str = ""
    # A rewrite of whole rank graphs this op's definition brings ((graph, RewriteContext) -> graph, the same values
    # out), applied to every rank graph before lowering (rank_rewrite.op_rewrites); an algebraic identity of the op.
    rewrite: Callable[[Any, RewriteContext], Any] | None = None
    # The op draws random numbers (Dropout): two nodes of it alike in every input are still different results, and
    # one on the whole of a tensor is not its nodes on the parts, so rewrites neither merge nor split it.
    random: bool = False
    # The result is the one input, unchanged: rank-program lowering has its readers read the input itself.
    identity: bool = False
    # The result rearranges or selects the one input's elements: a segment computes it from a graph input itself.
    selects: bool = False

    def sharding_spec(self, node: Node) -> ShardingSpec:
        """The node's sharding (see compiler/sharding.py); an op without a rule runs whole on every rank."""
        return (self.sharding or replicated)(node)

    @property
    def side_effect(self) -> bool:
        """True when the op writes state, so graph building keeps it even when no output is used."""
        return self.writes is not None

    def check_arity(self, count: int) -> None:
        if self.num_inputs is not None and count != self.num_inputs:
            raise ShapeInferenceError(f"{self.name} takes {self.num_inputs} inputs, got {count}")

    def bind(self, given: Mapping[str, Any]) -> Attrs:
        """The node's attributes: defaults filled in, unknown names and missing required ones rejected."""
        unknown = set(given) - set(self.attrs)
        if unknown:
            known = ", ".join(self.attrs) or "none"
            raise ShapeInferenceError(f"unknown attribute(s) {sorted(unknown)}; {self.name} takes: {known}")
        merged = {**self.attrs, **given}
        missing = [k for k, v in merged.items() if v is REQUIRED]
        if missing:
            raise ShapeInferenceError(f"missing required attribute(s) {missing}")
        return Attrs(merged)


_OPS: dict[str, OpDef] = {}


def register(name: str, **fields: Any) -> OpDef:
    """Define op `name` (see OpDef); redefining a name is an error, so an op lives in exactly one place."""
    if name in _OPS:
        raise ValueError(f"op {name!r} is already registered")
    op = OpDef(name=name, **fields)
    _OPS[name] = op
    return op


@dataclass(frozen=True)
class RewriteContext:
    """What a rank-graph rewrite may know of where the graph runs."""

    # Every rank of the world shares this host: a collective's result is there about as soon as it starts (shared
    # memory), so making work wait for one costs little next to doing that work less well.
    one_host: bool = False
    # Every rank runs a copy of this graph (a parallel plan's rank graphs): the same rewrite of each keeps their
    # collectives in one order, whatever order it makes (see rank_schedule's turns).
    spmd: bool = False
    # The graph's micro-batches run one after another so that only one micro-batch's activations are held
    # (GradAccumulation marks them): rewrites must not merge their work.
    micro_batches_apart: bool = False


NOTHING_KNOWN = RewriteContext()  # the default: assume the world may span hosts


def rewrites() -> list[Callable[[Any, RewriteContext], Any]]:
    """Every op's rank-graph rewrite, in registration order (one entry per function)."""
    _load_ops()
    return list(dict.fromkeys(op.rewrite for op in _OPS.values() if op.rewrite is not None))


def get(name: str) -> OpDef:
    """The definition of op `name`; an unknown name is a clear error listing close matches."""
    _load_ops()
    try:
        return _OPS[name]
    except KeyError:
        close = [n for n in _OPS if n.lower().startswith(name.lower()[:3])]
        raise ShapeInferenceError(
            f"unknown op {name!r}; similar registered ops: {close or sorted(_OPS)[:10]}"
        ) from None


def written(node: Node) -> Any:
    """The Value `node` writes in place (Assign's parameter), or None."""
    index = get(node.op).writes
    return None if index is None else node.inputs[index]


def names() -> list[str]:
    """Every registered op name, sorted."""
    _load_ops()
    return sorted(_OPS)


def _load_ops() -> None:
    import tessel.compiler.ops  # noqa: F401 - registers every op family on first use
