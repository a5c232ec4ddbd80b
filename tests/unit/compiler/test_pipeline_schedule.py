"""Pipeline schedules: every generated schedule of every stage count, micro-batch count and scheduler is checked by
running it dry in the rank simulator; what the checker must catch (a deadlock, an action that waits on itself,
two stages whose transfer orders disagree, a send nobody receives) is caught; bubbles equal theory; and the
schedules keep the memory promises they are chosen for."""

from __future__ import annotations

import itertools

import pytest

from tessel.compiler.pipeline import Action, Link, Transfers, check, generate, simulate_schedule, skeleton
from tessel.compiler.pipeline.check import shared_cores_bubble
from tessel.compiler.pipeline.schedule import Schedule
from tessel.compiler.rank_simulator import World
from tessel.core.errors import ConfigurationError

A = Action
CASES = [
    (name, stages, micro, virtual)
    for name in ("gpipe", "1f1b", "zero_bubble_h1")
    for stages, micro, virtual in itertools.product((1, 2, 3, 4, 5), (1, 2, 3, 4, 5, 6, 8, 10), (1, 2, 3))
    if micro >= stages
    and not (virtual > 1 and name == "zero_bubble_h1")
    and not (virtual > 1 and name == "1f1b" and micro % stages)
]


@pytest.mark.parametrize(("name", "stages", "micro", "virtual"), CASES)
def test_every_generated_schedule_runs_dry_without_deadlock_and_does_each_action_once(name, stages, micro, virtual):
    schedule = generate(name, stages, micro, virtual)
    timing = check(schedule)
    kinds = "FBW" if schedule.split_backward else "FB"
    for physical, order in enumerate(schedule.orders):
        expected = {A(k, v, m) for k in kinds for v in schedule.chunks(physical) for m in range(micro)}
        assert sorted(order) == sorted(expected), f"stage {physical} of {schedule.describe()}"
    assert timing.makespan > 0 and len(timing.busy) == stages
    assert all(busy == timing.busy[0] for busy in timing.busy)  # every stage does the same work


@pytest.mark.parametrize(("stages", "micro"), [(2, 2), (2, 8), (3, 5), (4, 4), (4, 8), (5, 10)])
def test_gpipe_and_1f1b_bubbles_equal_theory_and_interleaving_divides_them(stages, micro):
    theory = (stages - 1) / (micro + stages - 1)
    for name in ("gpipe", "1f1b"):
        assert check(generate(name, stages, micro)).bubble == pytest.approx(theory)
        assert generate(name, stages, micro).theory_bubble() == pytest.approx(theory)
    if micro % stages == 0:
        interleaved = generate("1f1b", stages, micro, virtual=2)
        assert check(interleaved).bubble == pytest.approx((stages - 1) / (2 * micro + stages - 1))
        assert check(interleaved).bubble < theory


@pytest.mark.parametrize(("stages", "micro"), [(2, 2), (2, 4), (3, 7), (4, 4), (4, 8), (8, 16)])
def test_the_zero_bubble_schedule_idles_less_than_1f1b(stages, micro):
    # Same work per micro-batch: F + B + W = 3 units, 1F1B's unsplit backward 2.
    assert check(generate("zero_bubble_h1", stages, micro)).bubble < check(generate("1f1b", stages, micro)).bubble


def _in_flight(order, until: str) -> int:
    """The most micro-batches a stage holds at once: forward done, `until` (B or W) not yet."""
    live = peak = 0
    for action in order:
        live += action.kind == "F"
        live -= action.kind == until
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("stages", "micro"), [(2, 8), (4, 8), (4, 16)])
def test_1f1b_holds_fewer_micro_batches_than_gpipe_and_zero_bubble_no_more_than_1f1b_first_stage(stages, micro):
    gpipe, one, zero = (generate(n, stages, micro) for n in ("gpipe", "1f1b", "zero_bubble_h1"))
    for s in range(stages):
        assert _in_flight(gpipe.orders[s], "B") == micro
        assert _in_flight(one.orders[s], "B") == min(stages - s, micro)
        assert _in_flight(zero.orders[s], "W") <= stages


def test_transfers_beyond_the_next_stage_results_and_shared_gradients_are_checked_too():
    schedule = generate("1f1b", 4, 8)
    transfers = Transfers(
        (Link(0, 1, 2, 1), Link(1, 2), Link(2, 3), Link(0, 3, 1, 1)), results=((3, 1),), syncs=((0, 3),)
    )
    assert check(schedule, transfers).makespan > 0
    ops = schedule.rank_ops(0, transfers)
    assert [op.kind for op in ops[-2:]] == ["sync", "wait"]  # sums a shared gradient, then waits for the loss


def _schedule(*orders) -> Schedule:
    micro = max(a.micro for o in orders for a in o) + 1
    return Schedule("1f1b", len(orders), 1, micro, False, tuple(tuple(o) for o in orders))


def test_a_schedule_that_would_deadlock_is_an_error_naming_the_stages_and_what_they_wait_for():
    bad = _schedule(
        [A("F", 0, 0), A("B", 0, 0), A("F", 0, 1), A("B", 0, 1)],
        [A("F", 1, 0), A("F", 1, 1), A("B", 1, 0), A("B", 1, 1)],
    )
    with pytest.raises(ConfigurationError, match=r"deadlock.*stage 0 waits for 'grad\(v=0->1,m=0\)#0' from stage 1"):
        check(bad)


def test_an_action_that_needs_what_its_own_stage_makes_later_is_an_error():
    bad = _schedule([A("F", 0, 0), A("B", 0, 0)], [A("B", 1, 0), A("F", 1, 0)])
    with pytest.raises(ConfigurationError, match=r"stage 1: B\(v=1,m=0\) needs \['F\(v=1,m=0\)'\].*waits on itself"):
        check(bad)


def test_a_transfer_that_crosses_backwards_is_a_deadlock_not_a_hang():
    with pytest.raises(ConfigurationError, match="deadlock"):
        check(generate("1f1b", 2, 2), Transfers((Link(0, 1), Link(1, 0, 1, 1))))


def test_ranks_that_disagree_on_what_crosses_fail_in_the_simulator_naming_the_tensors():
    schedule = generate("1f1b", 2, 2)
    two, one = Transfers((Link(0, 1, 2, 1),)), Transfers((Link(0, 1, 1, 1),))  # as if the ranks traced different nets
    world = World([skeleton(schedule, 0, two), skeleton(schedule, 1, one)], None)
    with pytest.raises(
        ConfigurationError, match=r"receives 'act\(v=0->1,m=1\)#0' from rank 0, which sends 'act\(v=0->1,m=0\)#1'"
    ):
        world.run([{}, {}])
    world = World([skeleton(schedule, 0, one), skeleton(schedule, 1, Transfers((Link(0, 1, 0, 1),)))], None)
    with pytest.raises(ConfigurationError, match="every send needs its receive"):
        world.run([{}, {}])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("1f1b", 4, 2), r"micro_size 2 is smaller than pipeline_stages 4.*Fix: micro_size >= 4"),
        (("gpipe", 2, 1), r"micro_size 1 is smaller than pipeline_stages 2"),
        (("1f1b", 2, 3, 2), r"interleaved 1F1B .* micro_size 3 is not a multiple of 2.*e\.g\. 4"),
        (("zero_bubble_h1", 2, 4, 2), r"'zero_bubble_h1' runs one chunk per stage"),
        (("seqpipe", 2, 4), r"pipeline_scheduler 'seqpipe' is not one of"),
        (("1f1b", 0, 4), r"stages must be an int >= 1"),
    ],
)
def test_invalid_combinations_are_errors_with_a_fix(args, message):
    with pytest.raises(ConfigurationError, match=message):
        generate(*args)


@pytest.mark.parametrize(("name", "stages", "virtual"), [("gpipe", 4, 1), ("1f1b", 2, 1), ("1f1b", 4, 1),
                                                         ("zero_bubble_h1", 4, 1), ("1f1b", 2, 2)])  # fmt: skip
def test_the_shared_cores_bound_is_the_theory_with_a_core_per_stage_and_lower_with_fewer(name, stages, virtual):
    schedule = generate(name, stages, 8, virtual)
    alone = shared_cores_bubble(schedule, stages)
    assert alone == pytest.approx(simulate_schedule(schedule).bubble)
    assert shared_cores_bubble(schedule, stages + 4) == pytest.approx(alone)
    # Fewer cores: the stages that compute run slower while others wait, so less of the window is idle.
    assert 0 < shared_cores_bubble(schedule, 1) <= shared_cores_bubble(schedule, max(1, stages // 2)) <= alone
    with pytest.raises(ConfigurationError, match="cores"):
        shared_cores_bubble(schedule, 0)


def test_the_shared_cores_bound_by_hand():
    # 1F1B, 2 stages, 2 micro-batches on 1 core (F = 1, B = 2): 0-1 stage 0 F0 alone; 1-3 F1 | F0 at half speed;
    # 3-5 stage 1 B0 alone; 5-7 B0 (half done) | F1; 7-9 B0 done | B1 half; 9-10 B1 alone; 10-12 stage 0 B1 alone.
    # The stages spend 9 + 9 of the 2 x 12 in actions: 25 % idle (with a core each: 1/3).
    schedule = generate("1f1b", 2, 2)
    assert shared_cores_bubble(schedule, 1) == pytest.approx(1 - 18 / 24)
    assert shared_cores_bubble(schedule, 2) == pytest.approx(1 / 3)
