"""Collective ops: shape inference and its errors, forward semantics and gradients checked in a simulated world.

Each rank's graph is lowered to a rank program and run by the in-process simulator; the forward results are
compared with a numpy model of each collective, and the gradients with float64 central differences of the sum
of every rank's loss (MindSpore's bprops are that gradient, except Broadcast', which MindSpore defines as the
identity and so does tessel).
"""

from __future__ import annotations

import numpy as np
import pytest
from compiler_testkit import compute

from tessel.compiler import grad_graph, lower_rank_program, simulate, to_onnx
from tessel.compiler.builder import apply, apply_all
from tessel.compiler.errors import GradientError, ShapeInferenceError
from tessel.compiler.registry import get as get_op
from tessel.compiler.tracer import Trace
from tessel.core.errors import ConfigurationError

G2, G3 = (0, 1), (0, 1, 2)


def _trace(op, specs, attrs):
    with Trace(op.lower()) as t:
        args = [t.input(f"a{i}", shape, dtype) for i, (shape, dtype) in enumerate(specs)]
        outs = apply_all(op, *args, **attrs)
        graph, _ = t.build(list(outs))
    return graph


SHAPES = [
    ("AllReduce", [("N", 3)], {"group": G2}, [("N", 3)]),
    ("AllReduce", [(2, 3)], {"group": G3, "reduce_op": "max"}, [(2, 3)]),
    ("AllGather", [(2, 3)], {"group": G3}, [(6, 3)]),
    ("AllGather", [("N", 3)], {"group": G2, "axis": -1}, [("N", 6)]),
    ("ReduceScatter", [(6, 3)], {"group": G3}, [(2, 3)]),
    ("ReduceScatter", [("N", 4)], {"group": G2, "axis": 1}, [("N", 2)]),
    ("Broadcast", [(2,)], {"group": G3, "root": 2}, [(2,)]),
    ("AlltoAll", [(6, 4)], {"group": G3, "split_dim": 0, "concat_dim": 1}, [(2, 12)]),
    ("AlltoAll", [("N", 4)], {"group": G2, "split_dim": 1, "concat_dim": 1}, [("N", 4)]),
    ("Send", [(2, 3)], {"peer": 1, "group": G2}, [(2, 3)]),
    ("Mirror", [(3,)], {"group": G2}, [(3,)]),
]


@pytest.mark.parametrize(("op", "shapes", "attrs", "want"), SHAPES, ids=[f"{s[0]}-{i}" for i, s in enumerate(SHAPES)])
def test_shape_inference_uses_the_group_size(op, shapes, attrs, want):
    graph = _trace(op, [(s, "float32") for s in shapes], attrs)
    assert [v.shape for v in graph.outputs] == want
    assert all(v.dtype.value == "float32" for v in graph.outputs)


def test_exchange_and_receive_take_their_output_types_from_attributes():
    attrs = {"send_ranks": (1, 2), "recv_ranks": (2, 0), "recv_shapes": ((4, 1), (2,)), "recv_dtype": "int32"}
    graph = _trace("NeighborExchange", [((2,), "float32"), ((3,), "float32")], {**attrs, "group": G3})
    assert [(v.shape, v.dtype.value) for v in graph.outputs] == [((4, 1), "int32"), ((2,), "int32")]
    graph = _trace("Receive", [((), "float32")], {"peer": 0, "shape": (2, 5), "dtype": "int64", "group": G2})
    assert [(v.shape, v.dtype.value) for v in graph.outputs] == [((2, 5), "int64")]


ERRORS = [
    ("AllGather", [("N", 3)], {"group": G2}, r"AllGather\(f32\[N,3\]\).*dim 0 of \(N, 3\) is the symbol 'N'; "
     r"AllGather makes that dim group-size times larger, so it must be static\. Fix"),
    ("ReduceScatter", [(5, 2)], {"group": G2}, r"ReduceScatter\(f32\[5,2\]\).*dim 0 of \(5, 2\) has size 5, which "
     r"does not divide by the group size 2; ReduceScatter gives each rank 1/group-size of that dim\. Fix"),
    ("AlltoAll", [(5, 4)], {"group": G2}, r"AlltoAll.*dim 0 of \(5, 4\) has size 5, which does not divide by the "
     r"group size 2; AlltoAll sends"),
    ("AlltoAll", [("N", 4)], {"group": G2, "split_dim": 1}, r"AlltoAll.*dim 0 of \(N, 2\) is the symbol 'N'; "
     r"AlltoAll makes concat_dim group-size times larger"),
    ("AllReduce", [(2,)], {"group": G2, "reduce_op": "avg"}, r"AllReduce.*reduce_op='avg' is not a reduce op; "
     r"use one of \['max', 'mean', 'min', 'prod', 'sum'\]"),
    ("AllReduce", [(2,)], {"group": "world"}, r"group 'world' must be a non-empty tuple of distinct global ranks"),
    ("AllReduce", [(2,)], {"group": (0, 0)}, r"group \(0, 0\) must be a non-empty tuple of distinct global ranks"),
    ("AllReduce", [(2,)], {}, r"missing required attribute\(s\) \['group'\]"),
    ("Broadcast", [(2,)], {"group": G2, "root": 2}, r"Broadcast.*root=2 must be a group rank in 0\.\.1"),
    ("Send", [(2,)], {"group": G2, "peer": 5}, r"Send.*peer=5 must be a group rank in 0\.\.1"),
    ("Receive", [(2,)], {"group": G2, "peer": 0, "shape": ("N",)}, r"shape=\('N',\) must be a static shape"),
    ("NeighborExchange", [(2,), (2,)], {"group": G2, "send_ranks": (1,), "recv_ranks": (1,), "recv_shapes": ((2,),),
     "recv_dtype": "float32"}, r"2 input\(s\) for send_ranks=\(1,\); the rule: one input per send rank"),
    ("NeighborExchange", [(2,)], {"group": G2, "send_ranks": (1,), "recv_ranks": (), "recv_shapes": (),
     "recv_dtype": "float32"}, r"recv_ranks is empty.*a rank that only sends uses Send"),
    ("NeighborExchange", [(2,)], {"group": G2, "send_ranks": (1,), "recv_ranks": (0, 1), "recv_shapes": ((2,),),
     "recv_dtype": "float32"}, r"1 recv_shapes for 2 recv_ranks"),
]  # fmt: skip


@pytest.mark.parametrize(("op", "shapes", "attrs", "pattern"), ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_collectives_name_the_op_the_dim_and_the_rule(op, shapes, attrs, pattern):
    with pytest.raises(ShapeInferenceError, match=pattern):
        _trace(op, [(s, "float32") for s in shapes], attrs)


def test_collectives_refuse_dtypes_the_wire_does_not_carry():
    with pytest.raises(ShapeInferenceError, match=r"dtype int8 cannot travel in a collective.*Fix: Cast"):
        _trace("AllReduce", [((2,), "int8")], {"group": G2})


def test_a_collective_has_no_onnx_form_and_says_how_to_lower_it():
    with pytest.raises(ConfigurationError, match=r"AllReduce is a collective.*lower_rank_program"):
        to_onnx(_trace("AllReduce", [((2,), "float32")], {"group": G2}))


def test_reduce_scatter_other_than_sum_has_no_gradient():
    with Trace("loss") as t:
        x = t.input("a0", (4,), "float32")
        loss = apply("ReduceScatter", x, group=G2, reduce_op="max").sum()
        graph, _ = t.build(loss)
    with pytest.raises(GradientError, match=r"ReduceScatter\(reduce_op='max'\) has no gradient"):
        grad_graph(graph, ["a0"])


def test_cost_is_the_bytes_through_a_ranks_link():
    graph = _trace("AllReduce", [((1024,), "float32")], {"group": (0, 1, 2, 3)})
    node = graph.nodes[0]
    assert get_op("AllReduce").cost(node, {}).bytes == 2 * 3 * 4096 // 4  # ring: 2 (n-1)/n of the buffer
    gather = _trace("AllGather", [(("N", 8), "float64")], {"group": G2, "axis": 1}).nodes[0]
    assert get_op("AllGather").cost(gather, {"N": 5}).bytes == 1 * 5 * 8 * 8  # (n-1) blocks of the input
    scatter = _trace("ReduceScatter", [((6, 2), "float32")], {"group": G3}).nodes[0]
    assert get_op("ReduceScatter").cost(scatter, {}).bytes == 2 * 48 // 3


# --- forward and gradients in a simulated world ---------------------------------------------------------------------


def _world(op, inputs, attrs, group, wrt=True):
    """Run `op` on every rank (inputs[r] = that rank's arrays), with loss_r = sum_k sum(out_k * w_k[r]).
    Returns (per-rank outputs, per-rank gradients of the inputs, the weights)."""
    n = len(inputs)
    rng = np.random.default_rng(1)
    with Trace(op.lower()) as t:
        args = [t.input(f"a{i}", x.shape, x.dtype) for i, x in enumerate(inputs[0])]
        outs = apply_all(op, *args, group=group, **attrs)
        weights = [t.input(f"w{k}", o.shape, o.dtype) for k, o in enumerate(outs)]
        loss = None
        for out, w in zip(outs, weights):
            term = (out * w).sum()
            loss = term if loss is None else loss + term
        graph, _ = t.build([loss, *outs])
    graph = grad_graph(graph, [f"a{i}" for i in range(len(args))]) if wrt else graph
    program = lower_rank_program(graph, world_size=n)
    ws = [[rng.standard_normal(o.shape) for o in outs] for _ in range(n)]
    feeds = [{**{f"a{i}": x for i, x in enumerate(xs)}, **{f"w{k}": w for k, w in enumerate(ws[r])}}
             for r, xs in enumerate(inputs)]  # fmt: skip
    stores = simulate([program] * n, feeds, compute())
    values = [[store[name] for name in program.outputs] for store in stores]
    return [v[1 : 1 + len(outs)] for v in values], [v[1 + len(outs) :] for v in values], ws


def _numeric(reference, inputs, ws, eps=1e-6):
    """Central differences of sum_r sum_k out_k[r] * w_k[r] with respect to every rank's every input."""

    def total(xs):
        return sum(float(np.sum(o * w)) for outs, wr in zip(reference(xs), ws) for o, w in zip(outs, wr))

    grads = []
    for r, xs in enumerate(inputs):
        per_input = []
        for i, x in enumerate(xs):
            g = np.zeros_like(x)
            for idx in np.ndindex(x.shape):
                for sign in (1, -1):
                    shifted = [list(v) for v in inputs]
                    shifted[r][i] = x.copy()
                    shifted[r][i][idx] += sign * eps
                    g[idx] += sign * total(shifted)
            per_input.append(g / (2 * eps))
        grads.append(per_input)
    return grads


def _reduce(name):
    return {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[name]


def _gather(xs, axis):
    return [[np.concatenate([x[0] for x in xs], axis=axis)] for _ in xs]


def _scatter(xs, axis):
    total = np.sum([x[0] for x in xs], axis=0)
    return [[block] for block in np.split(total, len(xs), axis=axis)]


def _all_to_all(xs, split, concat):
    n = len(xs)
    blocks = [np.split(x[0], n, axis=split) for x in xs]
    return [[np.concatenate([blocks[j][i] for j in range(n)], axis=concat)] for i in range(n)]


def _ring(xs):
    """Every rank sends x to the next rank and y to the previous; receives from the previous and the next."""
    n = len(xs)
    return [[xs[(r - 1) % n][0], xs[(r + 1) % n][1]] for r in range(n)]


def _inputs(n, *shapes, low=-1.0, high=1.0, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.uniform(low, high, s) for s in shapes] for _ in range(n)]


CASES = [
    ("AllReduce", {"reduce_op": "sum"}, 3, [(2, 3)], lambda xs: [[np.sum([x[0] for x in xs], 0)]] * len(xs)),
    ("AllReduce", {"reduce_op": "max"}, 3, [(2, 3)], lambda xs: [[np.max([x[0] for x in xs], 0)]] * len(xs)),
    ("AllReduce", {"reduce_op": "min"}, 2, [(4,)], lambda xs: [[np.min([x[0] for x in xs], 0)]] * len(xs)),
    ("AllReduce", {"reduce_op": "prod"}, 3, [(3,)], lambda xs: [[np.prod([x[0] for x in xs], 0)]] * len(xs)),
    ("AllGather", {"axis": 0}, 3, [(2, 2)], lambda xs: _gather(xs, 0)),
    ("AllGather", {"axis": 1}, 2, [(2, 3)], lambda xs: _gather(xs, 1)),
    ("ReduceScatter", {"axis": 0}, 2, [(4, 2)], lambda xs: _scatter(xs, 0)),
    ("ReduceScatter", {"axis": 1}, 3, [(2, 6)], lambda xs: _scatter(xs, 1)),
    ("AlltoAll", {"split_dim": 1, "concat_dim": 0}, 3, [(2, 3)], lambda xs: _all_to_all(xs, 1, 0)),
    ("AlltoAll", {"split_dim": 0, "concat_dim": 0}, 2, [(4, 3)], lambda xs: _all_to_all(xs, 0, 0)),
]


@pytest.mark.parametrize(("op", "attrs", "n", "shapes", "reference"), CASES,
                         ids=[f"{c[0]}-{'-'.join(map(str, c[1].values()))}-n{c[2]}" for c in CASES])  # fmt: skip
def test_forward_and_gradient_match_the_sum_of_every_ranks_loss(op, attrs, n, shapes, reference):
    low, high = (0.5, 1.5) if attrs.get("reduce_op") == "prod" else (-1.0, 1.0)  # prod' divides by x
    inputs = _inputs(n, *shapes, low=low, high=high)
    outs, grads, ws = _world(op, inputs, attrs, tuple(range(n)))
    for r, want in enumerate(reference(inputs)):
        for got, w in zip(outs[r], want):
            np.testing.assert_allclose(got, w, rtol=1e-12, err_msg=f"{op} forward on rank {r}")
    numeric = _numeric(reference, inputs, ws)
    for r in range(n):
        for got, want in zip(grads[r], numeric[r]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8, err_msg=f"{op} gradient on rank {r}")


def test_neighbor_exchange_forward_and_gradient_in_a_ring():
    n = 3
    attrs = {"send_ranks": None, "recv_ranks": None, "recv_shapes": ((2,), (3,)), "recv_dtype": "float64"}
    inputs = _inputs(n, (2,), (3,))
    # Every rank runs its own graph: the ring's neighbours differ by rank.
    programs, feeds, ws = [], [], []
    rng = np.random.default_rng(5)
    for r in range(n):
        ring = {**attrs, "send_ranks": ((r + 1) % n, (r - 1) % n), "recv_ranks": ((r - 1) % n, (r + 1) % n)}
        with Trace("ring") as t:
            a = [t.input(f"a{i}", x.shape, x.dtype) for i, x in enumerate(inputs[r])]
            outs = apply_all("NeighborExchange", *a, group=(0, 1, 2), **ring)
            w = [t.input(f"w{k}", o.shape, o.dtype) for k, o in enumerate(outs)]
            loss = (outs[0] * w[0]).sum() + (outs[1] * w[1]).sum()
            graph, _ = t.build([loss, *outs])
        programs.append(lower_rank_program(grad_graph(graph, ["a0", "a1"]), world_size=n))
        ws.append([rng.standard_normal(o.shape) for o in outs])
        feeds.append({"a0": inputs[r][0], "a1": inputs[r][1], "w0": ws[r][0], "w1": ws[r][1]})
    stores = simulate(programs, feeds, compute())
    numeric = _numeric(_ring, inputs, ws)
    for r in range(n):
        got = [stores[r][name] for name in programs[r].outputs]
        np.testing.assert_allclose(got[1], inputs[(r - 1) % n][0], rtol=0)
        np.testing.assert_allclose(got[2], inputs[(r + 1) % n][1], rtol=0)
        np.testing.assert_allclose(got[3], numeric[r][0], rtol=1e-6)
        np.testing.assert_allclose(got[4], numeric[r][1], rtol=1e-6)


def test_broadcast_gives_the_roots_value_and_passes_each_ranks_cotangent_through():
    inputs = _inputs(3, (2, 2))
    outs, grads, ws = _world("Broadcast", inputs, {"root": 1}, (0, 1, 2))
    for r in range(3):
        np.testing.assert_array_equal(outs[r][0], inputs[1][0])
        np.testing.assert_array_equal(grads[r][0], ws[r][0])  # MindSpore's bprop of Broadcast: dout


@pytest.mark.parametrize("mean", [False, True])
def test_mirror_is_the_identity_whose_gradient_is_the_groups_sum(mean):
    inputs = _inputs(3, (2, 3))
    outs, grads, ws = _world("Mirror", inputs, {"mean": mean}, (0, 1, 2))
    total = sum(w[0] for w in ws) / (3 if mean else 1)
    for r in range(3):
        np.testing.assert_array_equal(outs[r][0], inputs[r][0])
        np.testing.assert_allclose(grads[r][0], total, rtol=1e-12)


def test_send_and_receive_carry_a_value_forward_and_its_gradient_back():
    """A two-stage pipeline: rank 0 sends x, rank 1 computes sum(recv * w). Send' receives the gradient from the
    peer and Receive' sends it back (MindSpore's bprops), so rank 0's gradient of x is w."""
    x, w = np.arange(6, dtype=np.float64).reshape(2, 3), np.linspace(-1, 1, 6).reshape(2, 3)
    with Trace("first_stage") as t:
        a = t.input("a", (2, 3), "float64")
        graph, _ = t.build([apply("Send", a, peer=1, group=G2).sum() * 0.0])
    first = lower_rank_program(grad_graph(graph, ["a"]), world_size=2)
    with Trace("second_stage") as t:
        token, weight = t.input("token", (), "float64"), t.input("w", (2, 3), "float64")
        received = apply("Receive", token, peer=0, shape=(2, 3), dtype="float64", group=G2)
        graph, _ = t.build([(received * weight).sum(), received])
    second = lower_rank_program(grad_graph(graph, ["token"]), world_size=2)
    assert first.collective_counts() == {"SEND": 1, "RECV": 1} == second.collective_counts()
    stores = simulate([first, second], [{"a": x}, {"token": np.zeros(()), "w": w}], compute())
    np.testing.assert_array_equal(stores[1][second.outputs[1]], x)
    np.testing.assert_array_equal(stores[0][first.outputs[1]], w)
    assert stores[1][second.outputs[2]] == 0.0
