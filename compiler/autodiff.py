"""Reverse-mode autodiff on the IR, generic over the op registry.

`gradients(builder, loss, wrt)` appends the backward pass to a builder that holds the forward graph (`vjp`: the same for
several outputs at once, each with its cotangent): it walks the nodes between `wrt` and `loss` in reverse, calls each
op's gradient rule, sums the cotangents of values used more than once, sums broadcast dims away and casts back to each
input's dtype, and returns d(loss)/d(wrt) (zeros for an unused input). Where forward nodes are marked for recomputation,
the backward then reads copies of their outputs (compiler/recompute.py). `grad_graph` wraps it into a Graph: forward
outputs first, then the gradients. `expand_gradients(graph)` replaces each GradientOf node (gradients a traced function
asked for, deferred so that a parallel graph is differentiated after the parallel pass) by its backward pass.

A gradient rule sees a `GradContext`:

    grad=lambda c: (c.g * c.inputs[1], c.g * c.inputs[0])     # Mul
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tessel.compiler import registry
from tessel.compiler.builder import GraphBuilder, SymbolicTensor, apply
from tessel.compiler.errors import GradientError
from tessel.compiler.ir import Attrs, Graph, Node, Value
from tessel.compiler.recompute import rematerialize
from tessel.compiler.shapes import format_shape


@dataclass(frozen=True)
class GradContext:
    """What a gradient rule sees: the node's inputs and outputs, the output cotangents (None where no gradient
    arrives) and which inputs need a gradient. Rules return one cotangent (or None) per input."""

    node: Node
    inputs: tuple[SymbolicTensor, ...]
    outputs: tuple[SymbolicTensor, ...]
    grads: tuple[SymbolicTensor | None, ...]
    needs: tuple[bool, ...]

    @property
    def attrs(self) -> Attrs:
        return self.node.attrs

    @property
    def x(self) -> SymbolicTensor:
        return self.inputs[0]

    @property
    def out(self) -> SymbolicTensor:
        return self.outputs[0]

    @property
    def g(self) -> SymbolicTensor:
        """Cotangent of output 0 (zeros when only other outputs received one)."""
        g = self.grads[0]
        return g if g is not None else apply("ZerosLike", self.outputs[0])


def gradients(builder: GraphBuilder, loss: Value, wrt: Sequence[Value], sens: Value | None = None) -> list[Value]:
    """Append d(loss)/d(wrt) to `builder` (whose nodes compute `loss`); `sens` seeds the loss cotangent (default 1)."""
    for w in wrt:
        if not w.dtype.is_float:
            raise GradientError(f"cannot differentiate with respect to {w!r}: only float tensors have gradients")
    if not loss.dtype.is_float:
        raise GradientError(f"the loss {loss!r} must be a float tensor to differentiate")
    seed = sens if sens is not None else apply("OnesLike", SymbolicTensor(builder, loss)).value
    return vjp(builder, [(loss, seed)], wrt)


def vjp(builder: GraphBuilder, roots: Sequence[tuple[Value, Value]], wrt: Sequence[Value]) -> list[Value]:
    """Append the vector-Jacobian product of several outputs to `builder`: with `roots` pairs (value, its
    cotangent), the gradient of sum(value * cotangent) over the pairs with respect to each of `wrt` (zeros for an
    input none of them depends on). `gradients` is the one-root case; a pipeline stage's backward has one root per
    tensor it sent on, seeded by the gradient that came back."""
    for w in wrt:
        if not w.dtype.is_float:
            raise GradientError(f"cannot differentiate with respect to {w!r}: only float tensors have gradients")
    for value, _ in roots:
        if not value.dtype.is_float:
            raise GradientError(f"the output {value!r} must be a float tensor to differentiate")
    recompute, builder.recompute = builder.recompute, None  # the backward itself is never recomputed
    try:
        start = len(builder.nodes)
        grads, tokens = _backward(builder, roots, wrt)
        rematerialize(builder.nodes, start, tokens)
    finally:
        builder.recompute = recompute
    return grads


def _backward(builder: GraphBuilder, roots: Sequence[tuple[Value, Value]], wrt: Sequence[Value]) -> tuple[list, list]:
    """Append the backward pass. Returns the gradients and, for each forward node's backward, (index of its first
    node, the cotangent that starts it): they order recomputation (see compiler/recompute.py)."""
    nodes = _between(builder.nodes, set(wrt), {value for value, _ in roots})
    active = set(wrt) | {o for n in nodes for o in n.outputs}
    wrap = lambda v: SymbolicTensor(builder, v)  # noqa: E731
    cotangents: dict[Value, SymbolicTensor] = {}
    for value, cotangent in roots:
        g = _fit(wrap(cotangent), value, "the cotangent of an output")
        cotangents[value] = cotangents[value] + g if value in cotangents else g
    tokens: list = []

    for node in reversed(nodes):
        grads = tuple(cotangents.get(o) for o in node.outputs)
        if all(g is None for g in grads):
            continue
        tokens.append((len(builder.nodes), next(g.value for g in grads if g is not None)))
        needs = tuple(v in active and v.dtype.is_float for v in node.inputs)
        for value, g in zip(node.inputs, _node_grads(node, grads, needs, wrap)):
            if g is None or value not in active or not value.dtype.is_float:
                continue
            g = _fit(g, value, f"the gradient rule of {node.op}")
            cotangents[value] = cotangents[value] + g if value in cotangents else g
    grads = [cotangents[w].value if w in cotangents else apply("ZerosLike", wrap(w)).value for w in wrt]
    return grads, tokens


def _node_grads(node: Node, grads, needs, wrap) -> tuple:
    rule = registry.get(node.op).grad
    if rule is registry.ZERO_GRAD or not any(needs):
        return (None,) * len(node.inputs)
    if rule is None:
        where = f" (created at {node.source})" if node.source else ""
        raise GradientError(
            f"op {node.op}{where} has no gradient, but the loss depends on it through a differentiable input. "
            "Fix: stop the gradient before it (ops.stop_gradient) or use a differentiable op."
        )
    context = GradContext(node, tuple(map(wrap, node.inputs)), tuple(map(wrap, node.outputs)), grads, needs)
    result = tuple(rule(context))
    if len(result) != len(node.inputs):
        raise GradientError(
            f"gradient rule of {node.op} returned {len(result)} cotangents for {len(node.inputs)} inputs"
        )
    return result


def _between(nodes: Sequence[Node], sources: set[Value], targets: set[Value]) -> list[Node]:
    """The nodes on some differentiable path from a source to a target, in forward order."""
    reached = set(sources)
    forward = []
    for node in nodes:
        if registry.get(node.op).grad is registry.ZERO_GRAD:
            continue  # nothing flows back through it, so nothing beyond it depends on the sources
        if any(v in reached for v in node.inputs):
            forward.append(node)
            reached.update(node.outputs)
    needed = set(targets)
    on_path = []
    for node in reversed(forward):
        if any(o in needed for o in node.outputs):
            on_path.append(node)
            needed.update(node.inputs)
    return list(reversed(on_path))


def sum_to(g: SymbolicTensor, shape: tuple) -> SymbolicTensor:
    """Sum g over the dims that broadcasting added to reach g's shape from `shape`."""
    lead = g.ndim - len(shape)
    if lead < 0:
        raise GradientError(f"cannot sum {format_shape(g.shape)} down to the larger rank {format_shape(shape)}")
    if lead:
        g = apply("ReduceSum", g, axis=tuple(range(lead)), keep_dims=False)
    ones = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1)
    if ones:
        g = apply("ReduceSum", g, axis=ones, keep_dims=True)
    return g


def _fit(g: SymbolicTensor, target: Value, who: str) -> SymbolicTensor:
    if g.shape != target.shape:
        g = sum_to(g, target.shape)
        if g.shape != target.shape:
            raise GradientError(
                f"{who} produced a cotangent of shape {format_shape(g.shape)} for an input of shape "
                f"{format_shape(target.shape)}; the shapes are not related by broadcasting"
            )
    if g.dtype != target.dtype:
        g = apply("Cast", g, dtype=target.dtype)
    return g


def grad_graph(graph: Graph, wrt: Sequence[str], loss: int = 0, sens: bool = False, name: str | None = None) -> Graph:
    """`graph`'s outputs followed by d(outputs[loss])/d(input) for each input named in `wrt`.

    With `sens=True` the loss cotangent is a new last input named "sens" (MindSpore GradOperation sens_param).

    >>> g = grad_graph(forward, wrt=["w1", "b1"])   # outputs: (*forward.outputs, dw1, db1)
    """
    builder = GraphBuilder.extend(graph)
    loss_value = graph.outputs[loss]
    seed = builder.add_input("sens", loss_value.shape, loss_value.dtype).value if sens else None
    grads = gradients(builder, loss_value, [graph.input(n) for n in wrt], seed)
    return builder.build([*graph.outputs, *grads], name or f"{graph.name}_grad")


def expand_gradients(graph: Graph) -> Graph:
    """`graph` with every GradientOf node replaced by the backward pass it stands for (see `gradients`)."""
    if not any(registry.get(n.op).differentiates for n in graph.nodes):
        return graph
    builder = GraphBuilder(graph.name)
    builder.inputs = list(graph.inputs)
    env: dict[Value, Value] = {v: v for v in graph.inputs}
    for node in graph.nodes:
        inputs = [env[v] for v in node.inputs]
        if registry.get(node.op).differentiates:
            loss, *wrt = inputs
            seed = wrt.pop() if node.attrs["seeded"] else None
            outputs = gradients(builder, loss, wrt, seed)
        else:
            same = all(a is b for a, b in zip(inputs, node.inputs))
            builder.nodes.append(node if same else replace(node, inputs=tuple(inputs)))
            outputs = list(node.outputs)
        env.update(zip(node.outputs, outputs))
    return Graph(graph.inputs, tuple(builder.nodes), tuple(env[v] for v in graph.outputs), graph.name)
