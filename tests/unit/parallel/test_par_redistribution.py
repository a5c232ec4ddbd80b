"""Redistribution between layouts: every plan, run on simulated ranks, reproduces the numpy tensor exactly
(property-based over random layouts on 2x2 and 2x4 meshes, partial sums and maxima included); the planner picks
the table's cheapest steps and caches its plans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from par_testkit import compute

from tessel.compiler.builder import GraphBuilder
from tessel.compiler.parallel import Layout, piece, scatter
from tessel.compiler.parallel import plan_redistribution as plan
from tessel.compiler.parallel.redistribution import TABLE, emit_steps
from tessel.compiler.rank_simulator import run_graphs

# Device matrices of the same device count (a layout may live on any of them).
MATRICES = {4: [(2, 2), (4,)], 8: [(2, 4), (4, 2), (8,), (2, 2, 2)]}


def run(move, pieces):
    """Each rank's piece after the redistribution's steps, run on simulated ranks."""
    graphs = []
    for rank, p in enumerate(pieces):
        builder = GraphBuilder(f"r{rank}")
        x = builder.add_input("x", p.shape, p.dtype.name).value
        out = emit_steps(move, x, rank, lambda op, ins, attrs, layout, b=builder: b.emit(op, ins, attrs)[0])
        graphs.append(builder.build([out]))
    return [outs[0] for outs in run_graphs(graphs, [{"x": p} for p in pieces], compute())]


def check(source: Layout, target: Layout, shape, seed=0):
    rng = np.random.default_rng(seed)
    full = rng.standard_normal(shape)
    move = plan(source, target, tuple(shape), 8)
    got = run(move, scatter(full, source, rng))
    for rank, p in enumerate(got):
        np.testing.assert_allclose(p, piece(full, target, rank), rtol=1e-12, atol=1e-12, err_msg=f"rank {rank}")
    return move


@st.composite
def layout_on(draw, matrix, ndim: int, partial: bool) -> Layout:
    choices = ["R", *range(ndim)] + (["P"] if partial else [])
    where = [draw(st.sampled_from(choices)) for _ in matrix]
    dims = [draw(st.permutations([a for a, w in enumerate(where) if w == d])) for d in range(ndim)]
    partial_axes = [a for a, w in enumerate(where) if w == "P"]
    return Layout.from_axes(matrix, dims, partial_axes, draw(st.sampled_from(["sum", "max"])))


@st.composite
def redistributions(draw, devices: int):
    ndim = draw(st.integers(1, 3))
    source = draw(layout_on(draw(st.sampled_from(MATRICES[devices])), ndim, partial=True))
    target = draw(layout_on(draw(st.sampled_from(MATRICES[devices])), ndim, partial=False))
    shape = tuple(int(np.lcm(a, b)) * draw(st.sampled_from([1, 2, 3])) for a, b in zip(source.splits, target.splits))
    return source, target, shape


@pytest.mark.parametrize("devices", [4, 8], ids=["2x2", "2x4"])
def test_every_redistribution_reproduces_the_tensor(devices):
    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=redistributions(devices), seed=st.integers(0, 2**16))
    def prop(case, seed):
        source, target, shape = case
        move = check(source, target, shape, seed)
        # the planner's choice is never worse than the plan without AlltoAll and ReduceScatter
        basic = plan(source, target, shape, 8, frozenset({"all_reduce", "all_gather", "slice"}))
        assert move.cost <= basic.cost + 1e-9

    prop()


def ops(move):
    return [TABLE[s.kind].op for s in move.steps]


def test_each_table_entry_is_the_cheapest_for_its_change():
    m = (2, 4)
    shape = (8, 16)
    assert ops(check(Layout.from_axes(m, ((), ()), (1,)), Layout.from_axes(m, ((), ())), shape)) == ["AllReduce"]
    p_to_s = check(Layout.from_axes(m, ((), ()), (1,)), Layout.from_axes(m, ((1,), ())), shape)
    assert ops(p_to_s) == ["ReduceScatter"]  # (n-1)/n b instead of AllReduce's 2(n-1)/n b
    assert ops(check(Layout.from_axes(m, ((1,), ())), Layout.from_axes(m, ((), ())), shape)) == ["AllGather"]
    assert ops(check(Layout.from_axes(m, ((1,), ())), Layout.from_axes(m, ((), (1,))), shape)) == ["AlltoAll"]
    assert ops(check(Layout.from_axes(m, ((), ())), Layout.from_axes(m, ((0,), (1,))), shape)) == ["StridedSlice"] * 2
    assert plan(Layout.from_axes(m, ((), ())), Layout.from_axes(m, ((0,), (1,))), shape, 8).sent_bytes == 0


def test_one_collective_over_a_group_of_four_beats_two_over_pairs():
    move = check(Layout.from_axes((2, 2, 2), ((0, 1, 2), ())), Layout.from_axes((2, 2, 2), ((0,), ())), (8, 4))
    assert ops(move) == ["AllGather"]
    assert move.segments[0].steps[0].axes == (1, 2)


def test_layouts_on_different_device_matrices_meet_on_the_refined_mesh():
    source = Layout((8,), (0, -1))  # dim 0 cut 8 ways
    target = Layout((2, 4), ((1, 0), -1))  # the same cut written on a 2x4 device matrix
    assert source.same_as(target)
    assert plan(source, target, (8, 2), 8).steps == ()
    check(Layout((4, 2), (1, 0)), Layout((2, 4), (0, 1)), (8, 8))


def test_device_matrices_that_do_not_refine_alike_go_through_the_replicated_layout():
    source, target = Layout((2, 3), (1, 0)), Layout((3, 2), (1, 0))
    assert not source.same_as(target)
    move = check(source, target, (6, 6))
    assert len(move.segments) == 2 and set(ops(move)) == {"AllGather", "StridedSlice"}


def test_plans_are_cached_on_layouts_and_shape():
    a, b = Layout((2, 4), (1, 0)), Layout((2, 4), (0, 1))
    first = plan(a, b, (8, 8), 4)
    assert plan(Layout((2, 4), (1, 0)), Layout((2, 4), (0, 1)), (8, 8), 4) is first


def test_a_partial_target_cannot_be_created():
    with pytest.raises(ValueError, match="cannot create partial"):
        plan(Layout((4,), (-1,)), Layout((4,), (-1,), partial=(0,)), (4,), 4)
