"""Matrix products: MatMul (2-D) and BatchMatMul (batched, batch dims broadcast), both with transpose_a/b.

Both share one contraction rule (`_contract`); their gradients are products of the same ops with flipped
transposes, so no explicit Transpose nodes appear in the backward graph (ONNX Runtime fuses the ones lowering adds).
"""

from __future__ import annotations

from tessel.compiler import registry
from tessel.compiler.builder import apply as op
from tessel.compiler.builder import apply_all
from tessel.compiler.ir import Attrs, Graph, Node, TensorType, Value
from tessel.compiler.ops.common import Cost, io_bytes, operand_dtype, require
from tessel.compiler.registry import register
from tessel.compiler.row_parts import replace_nodes, row_partitions
from tessel.compiler.shapes import broadcast, format_shape, is_static, numel
from tessel.compiler.sharding import Rule, ShardingSpec, einsum


def _contract(a: TensorType, b: TensorType, ta: bool, tb: bool) -> tuple:
    m, ka = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
    require(
        ka == kb,
        f"contraction dims differ: x {format_shape(a.shape)} (transpose_a={ta}) gives k={ka}, "
        f"y {format_shape(b.shape)} (transpose_b={tb}) gives k={kb}; the rule: x's columns must equal y's rows "
        "after the transposes. Fix: transpose an input or set transpose_a/transpose_b",
    )
    return m, n


def _infer_matmul(types, attrs):
    a, b = types
    require(a.ndim == 2 and b.ndim == 2, "MatMul takes two 2-D tensors; use BatchMatMul for batched inputs")
    m, n = _contract(a, b, attrs["transpose_a"], attrs["transpose_b"])
    return (TensorType((m, n), operand_dtype(types)),)


def _infer_batch_matmul(types, attrs):
    a, b = types
    require(a.ndim >= 2 and b.ndim >= 2, "BatchMatMul inputs need at least 2 dims")
    m, n = _contract(a, b, attrs["transpose_a"], attrs["transpose_b"])
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    return (TensorType((*batch, m, n), operand_dtype(types)),)


def _lower(ctx, node, inputs, outputs):
    dtype = node.outputs[0].dtype
    names = []
    for name, value, flag in zip(inputs, node.inputs, (node.attrs["transpose_a"], node.attrs["transpose_b"])):
        name = ctx.cast(name, value.dtype, dtype)
        if flag:
            perm = [*range(value.ndim - 2), value.ndim - 1, value.ndim - 2]
            name = ctx.add1("Transpose", [name], perm=perm)
        names.append(name)
    ctx.add("MatMul", names, outputs)


def _grad(c):
    """C = op(A) op(B): each case's dA, dB written as products with transposes (no explicit transposes)."""
    a, b = c.inputs
    g, ta, tb = c.g, c.attrs["transpose_a"], c.attrs["transpose_b"]
    name = c.node.op
    if not ta and not tb:
        return op(name, g, b, transpose_a=False, transpose_b=True), op(name, a, g, transpose_a=True, transpose_b=False)
    if not ta and tb:
        return op(name, g, b, transpose_a=False, transpose_b=False), op(name, g, a, transpose_a=True, transpose_b=False)
    if ta and not tb:
        return op(name, b, g, transpose_a=False, transpose_b=True), op(name, a, g, transpose_a=False, transpose_b=False)
    return op(name, b, g, transpose_a=True, transpose_b=True), op(name, g, a, transpose_a=True, transpose_b=True)


def _cost(node, sizes) -> Cost:
    a = node.inputs[0]
    k = a.shape[-2] if node.attrs["transpose_a"] else a.shape[-1]
    return Cost(2 * numel(node.outputs[0].shape, sizes) * numel((k,), sizes), io_bytes(node, sizes))


_EINSUM = {  # (transpose_a, transpose_b) -> equation; a split k gives partial sums
    (False, False): "mk,kn->mn",
    (False, True): "mk,nk->mn",
    (True, False): "km,kn->mn",
    (True, True): "km,nk->mn",
}


def _matmul_sharding(batched: bool) -> Rule:
    """MatMul and BatchMatMul (and so Dense): one einsum per transpose case, batch dims broadcast."""

    def rule(node: Node) -> ShardingSpec:
        equation = _EINSUM[(node.attrs["transpose_a"], node.attrs["transpose_b"])]
        if batched:
            lhs, out = equation.split("->")
            a, b = lhs.split(",")
            equation = f"...{a},...{b}->...{out}"
        return einsum(equation)(node)

    return rule


# --- a rank-graph rewrite of sums of products (OpDef.rewrite) --------------------------------------------------


def fuse_summed_products(graph: Graph, context: registry.RewriteContext = registry.NOTHING_KNOWN) -> Graph:
    """Σ_i A_iᵀ B_i → [A_1; …; A_k]ᵀ [B_1; …; B_k]: a sum of products that contract over rows (the gradient of a
    weight that k copies of a network share, as MicroBatchInterleaved's copies and a pipeline's micro-batches do)
    becomes one product of the stacked rows. The k - 1 additions each read and write the whole weight-sized
    gradient, which for a wide layer costs more than the products themselves; stacking copies only the rows.
    Applied where the stacked rows are smaller than what the additions move, to products used only in the sum, and,
    when the world spans hosts, only to products whose inputs wait for the same collectives: stacking the rows of
    two copies that each wait for their own AllReduce across hosts would make the first copy's product wait for the
    second copy's communication too, instead of running while it is in flight. On one host (`context.one_host`)
    that wait is short and the stacked product is the quicker (measured: a 4-copy Megatron step 1.27-1.34x the
    1-copy step stacked, 1.41-1.47x unstacked)."""
    from tessel.compiler.rank_rewrite import Rewriter

    after = {} if context.one_host else _last_collective(graph)

    users: dict[Value, int] = {}
    for node in (*graph.nodes, Node("return", graph.outputs, Attrs(), ())):
        for v in node.inputs:
            users[v] = users.get(v, 0) + 1
    producer = graph.producers
    sums: dict[Value, tuple[list[tuple[Value, Value]], list[Node]]] = {}  # sum -> (its (A_i, B_i), nodes it absorbs)

    def parts(value: Value) -> tuple[list[tuple[Value, Value]], list[Node]] | None:
        node = producer.get(value)
        if node is None or users.get(value) != 1:
            return None
        if value in sums:
            return sums[value]
        if node.op != "MatMul" or not node.attrs["transpose_a"] or node.attrs["transpose_b"]:
            return None
        a, b = node.inputs
        return ([(a, b)], [node]) if a.ndim == 2 and b.ndim == 2 else None

    for node in graph.nodes:
        if node.op == "Add" and len(node.inputs) == 2 and node.inputs[0].type == node.inputs[1].type:
            left, right = parts(node.inputs[0]), parts(node.inputs[1])
            if left is not None and right is not None and _stackable(left[0] + right[0], after):
                sums[node.outputs[0]] = (left[0] + right[0], [*left[1], *right[1], node])
    absorbed = {n for _, inner in sums.values() for n in inner[:-1]}
    partitions = row_partitions(graph)
    chosen = {}
    for v, (terms, inner) in sums.items():
        aligned = _aligned(terms, partitions)
        if inner[-1] not in absorbed and (aligned is not None or _worth_stacking(terms, v)):
            chosen[v] = terms if aligned is None else aligned
    if not chosen:
        return graph
    skipped = {n for v in chosen for n in sums[v][1]}
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        if node.outputs and node.outputs[0] in chosen:
            terms = chosen[node.outputs[0]]
            with rewriter.at(node.source):
                a, b = (_rows([rewriter.tensor(t[i]) for t in terms]) for i in (0, 1))
                rewriter.alias(node.outputs[0], op("MatMul", a, b, transpose_a=True, transpose_b=False).value)
        elif node not in skipped:
            rewriter.keep(node)
    return rewriter.build()


def _rows(tensors: list):
    return tensors[0] if len(tensors) == 1 else op("Concat", *tensors, axis=0)


def _aligned(terms: list[tuple[Value, Value]], partitions) -> list[tuple[Value, Value]] | None:
    """[(T, U)] when the terms are A_i = T[P_i], B_i = U[P_i] over every part of one row partition P of T and one of
    U alike: Σ_i A_iᵀ B_i = Tᵀ U, with nothing copied (MicroBatchInterleaved's copies merged on one host, see
    compiler/row_parts.py). Else None."""
    owners = [(partitions.get(a), partitions.get(b)) for a, b in terms]
    if not all(p is not None and q is not None and p[1] == q[1] for p, q in owners):
        return None
    (p0, _), (q0, _) = owners[0]
    whole = all(p[0] is p0 and q[0] is q0 for p, q in owners) and p0.rows == q0.rows
    if not whole or sorted(p[1] for p, _ in owners) != list(range(len(p0.parts))):
        return None
    return [(p0.source, q0.source)]


def _stackable(terms: list[tuple[Value, Value]], after: dict[Value, int]) -> bool:
    (a0, b0), rest = terms[0], terms[1:]
    waits = {max(after.get(a, -1), after.get(b, -1)) for a, b in terms}
    return len(waits) == 1 and all(
        a.shape[1] == a0.shape[1] and b.shape[1] == b0.shape[1] and a.dtype == a0.dtype and b.dtype == b0.dtype
        for a, b in rest
    )


def _last_collective(graph: Graph) -> dict[Value, int]:
    """For each value, the position of the last collective (in graph order) it depends on (absent: none)."""
    after: dict[Value, int] = {}
    for position, node in enumerate(graph.nodes):
        last = max((after[v] for v in node.inputs if v in after), default=-1)
        if registry.get(node.op).collective is not None:
            last = position
        if last >= 0:
            for out in node.outputs:
                after[out] = last
    return after


def _worth_stacking(terms: list[tuple[Value, Value]], out: Value) -> bool:
    """Copying the rows costs less than the additions: (k - 1) reads of two and a write of the sum."""
    if not all(is_static(v.shape) for pair in terms for v in pair) or not is_static(out.shape):
        return False
    copied = sum(numel(a.shape) * a.dtype.itemsize + numel(b.shape) * b.dtype.itemsize for a, b in terms)
    return copied < (len(terms) - 1) * 3 * numel(out.shape) * out.dtype.itemsize


# A product with fewer rows than this runs at fewer FLOP/s (ONNX Runtime's CPU MatMul, 1 thread, K x N 2048 x 1024:
# 64 rows 74 GFLOP/s, 128 rows 82, 256 rows 88, 512 and 1024 rows 77-95).
_FULL_RATE_ROWS = 512
# Stacking copies each row of A in and of the product out; it pays where a row's product is far more work than that
# copy (K N multiply-adds per K + N elements moved).
_MACS_PER_COPIED = 256


def stack_shared_products(graph: Graph, context: registry.RewriteContext = registry.NOTHING_KNOWN) -> Graph:
    """Y_i = A_i op(B) for i = 1..k → [Y_1; …; Y_k] = [A_1; …; A_k] op(B): products that share their right operand
    (a weight that k copies of a network read, forward and in the input gradients, where their rows are not parts
    of one tensor, which compiler/row_parts.py merges without copying) and whose left operands do not depend on one
    another become one product of the stacked rows, split back. Applied on one host only (`context.one_host`), and
    not to GradAccumulation's micro-batches (`context.micro_batches_apart`): stacking makes every copy wait
    for the last copy's input, which across hosts is the last copy's collective, the very wait the copies exist to
    hide; on one host that wait is short, and products of fewer rows run slower (`_FULL_RATE_ROWS`). Only products
    whose rows are fewer than that, and that do enough work per row for the copying to be small
    (`_MACS_PER_COPIED`). A stacking that would change the order of the graph's collectives is not made unless
    every rank's graph is a copy of this one (`context.spmd`), and never one that reorders sends and receives: ranks
    whose graphs differ could start them in different orders."""
    if not context.one_host or context.micro_batches_apart:
        return graph
    passed: set[tuple] = set()
    order = _collectives(graph, context.spmd)  # what every stacking must leave as it is
    while (batch := _independent_products(graph, passed)) is not None:
        stacked = _stack_products(graph, batch)
        if _collectives(stacked, context.spmd) == order:
            graph = stacked
        else:
            passed.add(_shared(batch[0]))
    return graph


def _shared(node: Node) -> tuple:
    """What products must have alike to stack: the right operand itself, its transpose flag, A's columns, dtype."""
    a, b = node.inputs
    return (b, node.attrs["transpose_b"], a.shape[1], a.dtype)


def _row_product(node: Node) -> bool:
    if node.op != "MatMul" or node.attrs["transpose_a"]:
        return False
    a, out = node.inputs[0], node.outputs[0]
    if not (is_static(a.shape) and is_static(out.shape)):
        return False
    (rows, k), n = a.shape, out.shape[1]
    return rows < _FULL_RATE_ROWS and k * n >= _MACS_PER_COPIED * (k + n)


def _independent_products(graph: Graph, passed: set[tuple]) -> list[Node] | None:
    """The first set of ≥ 2 stackable products sharing a right operand, none depending on another (in graph
    order), or None."""
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        if _row_product(node) and _shared(node) not in passed:
            groups.setdefault(_shared(node), []).append(node)
    index = {n: i for members in groups.values() if len(members) > 1 for i, n in enumerate(members)}
    if not index:
        return None
    # upstream[v]: bit i set when v depends on the product with index i in its group (bits of different groups
    # share positions; only a group's own bits are compared below).
    upstream: dict[Value, int] = {}
    reads: dict[Node, int] = {}
    for node in graph.nodes:
        mask = 0
        for v in node.inputs:
            mask |= upstream.get(v, 0)
        reads[node] = mask
        if node in index:
            mask |= 1 << index[node]
        for out in node.outputs:
            upstream[out] = mask
    for key, members in groups.items():
        if len(members) < 2:
            continue
        batch, taken = [], 0
        for node in members:
            if not reads[node] & taken:
                batch.append(node)
                taken |= 1 << index[node]
        if len(batch) > 1:
            return batch
        passed.add(key)
    return None


def _stack_products(graph: Graph, batch: list[Node]) -> Graph:
    """`batch` (independent products sharing B, in graph order) as one product at the last one's place."""
    last = batch[-1]

    def emit(rewriter) -> None:
        a = op("Concat", *(rewriter.tensor(n.inputs[0]) for n in batch), axis=0)
        y = op("MatMul", a, rewriter.tensor(last.inputs[1]), transpose_a=False, transpose_b=last.attrs["transpose_b"])
        for n, part in zip(batch, apply_all("Split", y, axis=0, sizes=tuple(n.inputs[0].shape[0] for n in batch))):
            rewriter.alias(n.outputs[0], part.value)

    return replace_nodes(graph, [(batch, emit)])


def _collectives(graph: Graph, point_to_point_only: bool) -> list[tuple]:
    """The graph's collectives (or only its sends and receives) in order, each as what a rewrite keeps of it (a kept
    node's inputs may be remapped)."""
    from tessel.compiler.rank_plan import is_collective, is_point_to_point

    chosen = [n for n in graph.nodes if is_collective(n) and (is_point_to_point(n) or not point_to_point_only)]
    return [(n.op, n.attrs, n.outputs) for n in chosen]


def _rewrite_products(graph: Graph, context: registry.RewriteContext = registry.NOTHING_KNOWN) -> Graph:
    """MatMul's rank-graph rewrites: sums of products over rows, then products that share a right operand."""
    return stack_shared_products(fuse_summed_products(graph, context), context)


for _name, _infer, _batched in (("MatMul", _infer_matmul, False), ("BatchMatMul", _infer_batch_matmul, True)):
    register(
        _name,
        infer=_infer,
        sharding=_matmul_sharding(_batched),
        lower=_lower,
        grad=_grad,
        cost=_cost,
        attrs={"transpose_a": False, "transpose_b": False},
        num_inputs=2,
        doc=f"{_name}(x, y, transpose_a=False, transpose_b=False): matrix product of the last two dims.",
        rewrite=_rewrite_products if not _batched else None,
    )
