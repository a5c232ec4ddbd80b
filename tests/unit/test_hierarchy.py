"""Which communicator a group gets (daemon/hierarchy.py): parts by host and plugin, the flat and hierarchical
choices, and the errors. The collectives themselves run in real jobs: tests/integration/test_mixed_plugins.py
(two plugins on one host) and test_multi_host.py (two test-bed hosts of two ranks)."""

from __future__ import annotations

import numpy as np
import pytest

from tessel.core.errors import ConfigurationError
from tessel.core.plugin import GroupContext, Peer
from tessel.daemon import DaemonCore, hierarchy
from tessel.plugins import load_plugin


def _peers(*where: tuple[str, str]) -> tuple[Peer, ...]:
    return tuple(Peer(rank, host, f"127.0.0.1:{9000 + rank}", 1, plugin) for rank, (host, plugin) in enumerate(where))


def test_parts_are_the_ranks_of_one_host_and_one_plugin_in_order_of_their_first_member():
    peers = _peers(("a", "cpu"), ("b", "cpu"), ("a", "cpu"), ("a", "gpu"), ("b", "cpu"))
    assert hierarchy.parts_of(peers) == [[0, 2], [1, 4], [3]]
    assert hierarchy.parts_of(_peers(("a", "cpu"), ("a", "cpu"))) == [[0, 1]]


def test_a_group_of_one_rank_per_part_is_flat_on_the_host_transport():
    plugin = load_plugin("cpu", threads=1)
    try:
        context = GroupContext("job", "g", (0, 1), 0, _peers(("a", "cpu"), ("b", "cpu")), timeout_s=5)
        comm = hierarchy.communicator(context, plugin.collective, plugin.host_transport)
        assert comm.transport == "tcp"
        comm.close()
    finally:
        plugin.close()


def test_a_group_beyond_the_plugin_without_a_host_transport_says_what_to_install():
    plugin = load_plugin("cpu", threads=1)
    try:
        context = GroupContext("job", "g", (0, 1), 0, _peers(("a", "gpu"), ("a", "cpu")), timeout_s=5)
        with pytest.raises(ConfigurationError, match=r"no host transport.*install the cpu plugin"):
            hierarchy.communicator(context, plugin.collective, None)
        with pytest.raises(ConfigurationError, match=r"collectives='ring' is not one of \['auto', 'flat'\]"):
            hierarchy.communicator(context, plugin.collective, plugin.host_transport, "ring")
    finally:
        plugin.close()


def test_a_session_with_an_unknown_collectives_mode_is_refused():
    core = DaemonCore(load_plugin("cpu", threads=1))
    try:
        with pytest.raises(ConfigurationError, match="TESSEL_COLLECTIVES"):
            core.open_session("job", 0, 1, [], collectives="ring")
    finally:
        core.close()


def test_a_plugin_is_found_by_entry_point_or_at_module_colon_class_and_an_unavailable_one_says_why(monkeypatch):
    from pathlib import Path

    from tessel.core.errors import MissingRuntimeError
    from tessel.core.plugin import available_plugins, plugin_class

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "integration" / "plugins"))
    slow = plugin_class("cpu_slow:SlowCpuPlugin")
    assert slow.name == "cpu-slow" and slow(threads=1).device.kind == "cpu-slow"
    with pytest.raises(ConfigurationError, match=r"cannot load 'Nope' from module 'cpu_slow'"):
        plugin_class("cpu_slow:Nope")
    with pytest.raises(ConfigurationError, match=r"not a tessel.core.plugin.Plugin subclass"):
        plugin_class("cpu_slow:DeviceInfo")
    ok, why = available_plugins()["gpu"]
    assert not ok and why
    with pytest.raises(MissingRuntimeError, match=r"plugin 'gpu' cannot run here: .+"):
        load_plugin("gpu")


def test_the_ways_of_a_large_all_reduce_are_each_warmed_up_then_timed_in_rotating_rounds():
    ways = len(hierarchy.WAYS)
    plan = [hierarchy.tuning_way(i) for i in range(hierarchy.TUNING_CALLS + 1)]
    assert plan[:ways] == [(w, False) for w in hierarchy.WAYS]
    timed = plan[ways:-1]
    assert all(t for _, t in timed) and len(timed) == ways * hierarchy.TUNING_ROUNDS
    assert sorted(w for w, _ in timed) == sorted(hierarchy.WAYS * hierarchy.TUNING_ROUNDS)
    assert [w for w, _ in timed[:ways]] != [w for w, _ in timed[ways : 2 * ways]]  # each round another order
    assert plan[-1] is None
    assert hierarchy.tuning_way(0, warm_up=False) == (hierarchy.WAYS[0], True)


def test_whole_is_kept_unless_another_way_is_clearly_quicker():
    whole, segments, long, flat = (hierarchy.WAYS.index(w) for w in ("whole", "segments", "long segments", "flat"))

    def figures(**ms):
        out = [1.0] * len(hierarchy.WAYS)
        for way, value in ms.items():
            out[hierarchy.WAYS.index(way)] = value / 1e3
        return out

    assert whole == 0 and hierarchy.choose(figures(whole=100, segments=97, flat=96)) == "whole"  # within PREFER
    assert hierarchy.choose(figures(whole=200, segments=150, flat=250)) == "segments"  # a slow link
    assert hierarchy.choose(figures(whole=120, segments=160, flat=60)) == "flat"  # busy cores, fast link
    assert hierarchy.choose(figures(whole=20, segments=24, flat=25, **{"long segments": 15})) == "long segments"
    # a lent 16-core machine's test bed, 16 MiB at 10 Gbit/s: 9 % quicker is quicker
    assert hierarchy.choose(figures(whole=18.0, segments=24.0, flat=21.4, **{"long segments": 16.4})) == "long segments"
    assert (segments, long, flat) == (1, 2, 3)


def test_members_with_different_timings_choose_the_same_way_from_the_agreed_figures():
    """Two members of one group, on threads, each timing its own noisy runs; they agree through a stand-in for
    _agree_max's all_reduce (elementwise max over both), so they choose alike and see through the noise."""
    import threading

    cost = {"whole": 0.100, "segments": 0.140, "long segments": 0.120, "flat": 0.060}
    meeting, posted = threading.Barrier(2, timeout=10), {}

    def agree(member: int, best: np.ndarray) -> np.ndarray:
        posted[member] = best.copy()
        meeting.wait()
        out = np.maximum(posted[0], posted[1])
        meeting.wait()
        return out

    nbytes, results = 16 << 20, {}

    def member(index: int) -> None:
        rng = np.random.default_rng(index)
        tuner = hierarchy.WayTuner(lambda best: agree(index, best))
        plan = []
        for _ in range(hierarchy.TUNING_CALLS):
            way, timed = tuner.way(nbytes)
            plan.append(way)
            if timed:
                tuner.record(nbytes, way, cost[way] * rng.uniform(1.0, 1.6))  # load only adds time
        results[index] = (plan, tuner.choice(nbytes), tuner.way(nbytes), tuner.choice(1 << 20))

    threads = [threading.Thread(target=member, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results[0] == results[1]  # the same schedule, the same choice
    _, choice, after, other_class = results[0]
    assert choice == "flat" and after == ("flat", False)
    assert other_class is None  # another size class measures for itself


def test_a_size_class_measures_again_after_tuning_every_calls():
    tuner = hierarchy.WayTuner(lambda best: best)
    nbytes = 4 << 20
    for _ in range(hierarchy.TUNING_CALLS):
        way, timed = tuner.way(nbytes)
        if timed:
            tuner.record(nbytes, way, {"whole": 1.0, "segments": 0.5, "long segments": 0.7, "flat": 2.0}[way])
    assert tuner.choice(nbytes) == "segments"
    for _ in range(hierarchy.TUNING_EVERY):
        assert tuner.way(nbytes) == ("segments", False)
    assert tuner.way(nbytes) == (hierarchy.WAYS[0], True)  # timed rounds again, no warm-up
    assert tuner.choice(nbytes) is None


class _Groups:
    """A CollectivePlugin stand-in whose groups only say whether they keep a core busy."""

    def __init__(self, compute_bound: bool):
        self.compute_bound = compute_bound

    def new_group(self, context):
        return type("Group", (), {"compute_bound": self.compute_bound, "transport": "fake", "close": lambda s: None})()


def test_a_hierarchical_group_may_overlap_where_its_step_across_hosts_waits_on_a_link():
    """The thread budget (DaemonCore._may_overlap) holds back compute-bound collectives; a hierarchical one whose
    parts are shared memory but whose cross step is TCP waits on the link most of its time, and runs beside the
    segments (2 hosts x 2 ranks under MicroBatchInterleaved: 0 % of communication hidden before, 63 % after)."""
    peers = _peers(("a", "cpu"), ("b", "cpu"), ("a", "cpu"), ("b", "cpu"))
    context = GroupContext("job", "g", (0, 1, 2, 3), 0, peers, timeout_s=5)
    parts = hierarchy.parts_of(peers)
    across_tcp = hierarchy.HierarchicalCommunicator(context, parts, _Groups(True), _Groups(False))
    assert not across_tcp.compute_bound
    across_bound = hierarchy.HierarchicalCommunicator(context, parts, _Groups(False), _Groups(True))
    assert across_bound.compute_bound
