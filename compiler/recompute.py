"""Recomputation (MindSpore's `Cell.recompute` and `Primitive.recompute`): forward values of recomputed nodes are
not kept for the backward pass; the backward reads copies computed again from the nearest kept values.

The tracer stamps `Node.recompute` on the ops of a recomputed cell (all but the cell's output ops, as in
MindSpore) and the parallel pass on the rank-local ops that implement them. Autodiff then calls `rematerialize`
on the backward it appended: every backward node that reads a recomputed value reads a copy instead. Copies are
made where their first backward reader is and computed from kept values (a recomputed value's inputs are copied
in turn, so a chain of recomputed ops is recomputed as a chain), and each kept value enters them through
`After(value, token)`, where the token is the cotangent that started that part of the backward. So no runtime can
compute a copy before the backward has reached it, and the originals die after their last forward reader: the
activations a recomputed cell holds between forward and backward are only its inputs and outputs.

Numbers do not change: a copy is the same op on the same values. Random ops are recomputed with their seed:
ONNX Runtime draws each Dropout node's masks from a generator of its own, seeded by the node's seed and advanced
once per run, so the copy draws the original's mask.

    >>> grads = gradients(builder, loss, wrt)   # calls rematerialize(builder, start, tokens) itself
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tessel.compiler import registry
from tessel.compiler.ir import Attrs, Node, Recompute, Value
from tessel.compiler.shapes import is_static, numel

_NO_ATTRS = Attrs({})


def recomputable(node: Node) -> bool:
    """Whether the backward reads a copy of `node`'s outputs: it is marked, computes something from inputs, writes
    no state, is no gradient, and is no collective whose result the cell keeps (mp_comm_recompute=False)."""
    if node.recompute is None or not node.inputs:
        return False
    op = registry.get(node.op)
    if op.side_effect or op.differentiates:
        return False
    return op.collective is None or node.recompute is Recompute.WITH_COMM


def rematerialize(nodes: list[Node], start: int, tokens: Sequence[tuple[int, Value]]) -> int:
    """Rewrite the backward `nodes[start:]` in place to read copies of recomputed forward values (`nodes[:start]`).

    `tokens` are (index into nodes, cotangent) pairs in increasing index order: the backward nodes from that
    index on were emitted once that cotangent existed. Backward nodes before the first token (the loss seed) read
    the originals. Returns the number of copied nodes."""
    forward = nodes[:start]
    recomputed = {out: node for node in forward if recomputable(node) for out in node.outputs}
    if not recomputed or not tokens:
        return 0
    constant = {out for node in forward if not node.inputs for out in node.outputs}
    rewriter = _Copier(recomputed, constant)
    out = list(forward)
    token_index, token = 0, None
    for index in range(start, len(nodes)):
        while token_index < len(tokens) and tokens[token_index][0] <= index:
            token = tokens[token_index][1]
            token_index += 1
        node = nodes[index]
        if token is not None and any(v in recomputed for v in node.inputs):
            inputs = tuple(rewriter.copy(v, token, out) if v in recomputed else v for v in node.inputs)
            node = replace(node, inputs=inputs)
        out.append(node)
    nodes[:] = out
    return rewriter.count


class _Copier:
    """Copies of recomputed values, each made once (at its first backward reader), appended to a node list."""

    def __init__(self, recomputed: dict[Value, Node], constant: set[Value]):
        self.recomputed, self.constant = recomputed, constant
        self.copies: dict[Value, Value] = {}
        self.afters: dict[tuple[Value, Value], Value] = {}
        self.count = 0

    def copy(self, value: Value, token: Value, out: list[Node]) -> Value:
        """The copy of recomputed `value`; copies of what it needs are appended to `out` first (depth first,
        without recursion: a recomputed region may be thousands of ops long)."""
        stack = [self.recomputed[value]]
        while stack:
            node = stack[-1]
            if node.outputs[0] in self.copies:
                stack.pop()
                continue
            missing = [self.recomputed[v] for v in node.inputs if v in self.recomputed and v not in self.copies]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            inputs = tuple(self.copies[v] if v in self.copies else self._kept(v, token, out) for v in node.inputs)
            outputs = tuple(Value(o.type) for o in node.outputs)
            out.append(Node(node.op, inputs, node.attrs, outputs, node.source))
            self.copies.update(zip(node.outputs, outputs))
            self.count += 1
        return self.copies[value]

    def _kept(self, value: Value, token: Value, out: list[Node]) -> Value:
        """A kept value as a copy reads it: after `token`, so the copy cannot run before the backward needs it."""
        if value in self.constant or not _usable_token(token):
            return value
        key = (value, token)
        if key not in self.afters:
            (after_type,) = registry.get("After").infer((value.type, token.type), _NO_ATTRS)
            after = Value(after_type)
            out.append(Node("After", (value, token), _NO_ATTRS, (after,)))
            self.afters[key] = after
        return self.afters[key]


def _usable_token(token: Value) -> bool:
    """A token orders by its first element; one known to have none orders nothing."""
    return not is_static(token.shape) or numel(token.shape) > 0
