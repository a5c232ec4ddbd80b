"""Which communicator a group gets (daemon/hierarchy.py): parts by host and plugin, the flat and hierarchical
choices, and the errors. The collectives themselves run in real jobs: tests/integration/test_mixed_plugins.py
(two plugins on one host) and test_multi_host.py (two test-bed hosts of two ranks)."""

from __future__ import annotations

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
