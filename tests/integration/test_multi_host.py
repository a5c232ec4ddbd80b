"""Jobs across hosts, on the network-namespace test bed (testbed.py): a coordinator on the switch, daemons in the
hosts listening on their host's address, ranks started in their daemon's host.

Checked: collectives over TCP between hosts give numpy's numbers and really cross the links; ranks of one host
share memory while ranks of two hosts talk TCP (as the daemons' Status reports); a peer that cannot be reached is
an error naming its rank and address within seconds, not a hang.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from testbed_cluster import describe

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).with_name("scripts") / "multi_host.py")
LARGE_BYTES = (1 << 18) * 4 * 2  # the script's large float32 case on the world of two


def _reports(results) -> list[dict]:
    assert [r.returncode for r in results] == [0] * len(results), describe(results)
    return [json.loads(r.output.strip().splitlines()[-1]) for r in results]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("testbed", [{"hosts": 2, "rate": "10gbit"}], indirect=True)
def test_collectives_across_two_hosts_over_tcp(testbed, make_testbed_cluster):
    cluster = make_testbed_cluster(testbed, daemons_per_host=1)
    assert [d.host for d in cluster.daemons] == testbed.hosts
    assert all(d.address.startswith(f"{d.host.address}:") for d in cluster.daemons)
    before = testbed.link_bytes(testbed.hosts[0])
    reports = _reports(cluster.run_ranks([SCRIPT, "collectives"]))
    sent, received = (after - first for after, first in zip(testbed.link_bytes(testbed.hosts[0]), before))
    for report in reports:
        assert report["failures"] == [] and report["checks"] == 9, report
        assert report["transports"] == {"world": "tcp"}, report
    # The large cases crossed host 0's link both ways (not some loopback): at least one payload each way.
    assert sent > LARGE_BYTES and received > LARGE_BYTES, (sent, received)


@pytest.mark.timeout(300)
def test_ranks_of_one_host_share_memory_and_hosts_talk_tcp_hierarchically(testbed, make_testbed_cluster):
    """2 hosts x 2 ranks: groups within a host take shared memory, groups of one rank per host TCP, and groups
    with several ranks on each host are hierarchical (shared memory inside each host, TCP across; hierarchy.py):
    exact on exactly summable data, within float32 rounding of float64 on random floats, like the flat ring."""
    cluster = make_testbed_cluster(testbed, daemons_per_host=2)
    hosts = [d.host.name for d in cluster.daemons]
    assert hosts == ["h0", "h0", "h1", "h1"], hosts  # ranks 0, 1 on host 0; ranks 2, 3 on host 1
    groups = {"local0": [0, 1], "local1": [2, 3], "cross0": [0, 2], "cross1": [3, 1], "interleaved": [0, 2, 3, 1]}
    hierarchical = "hierarchical(shm+tcp)"
    expected = {
        0: {"world": hierarchical, "interleaved": hierarchical, "local0": "shm", "cross0": "tcp"},
        1: {"world": hierarchical, "interleaved": hierarchical, "local0": "shm", "cross1": "tcp"},
        2: {"world": hierarchical, "interleaved": hierarchical, "local1": "shm", "cross0": "tcp"},
        3: {"world": hierarchical, "interleaved": hierarchical, "local1": "shm", "cross1": "tcp"},
    }
    for mode in ("auto", "flat"):
        env = {"TESSEL_COLLECTIVES": mode}
        reports = _reports(cluster.run_ranks([SCRIPT, "collectives", json.dumps(groups)], env=env, timeout_s=180))
        for rank, report in enumerate(reports):
            assert report["failures"] == [] and report["checks"] == 33, (mode, report)
            want = (
                expected[rank]
                if mode == "auto"
                else {g: "tcp" if t == hierarchical else t for g, t in expected[rank].items()}
            )
            assert report["transports"] == want, (mode, report)
            assert report["rounding"] <= 1.0, (mode, report)


@pytest.mark.timeout(120)
def test_an_unreachable_peer_is_an_error_naming_its_address_within_seconds(testbed, make_testbed_cluster):
    cluster = make_testbed_cluster(testbed, daemons_per_host=1)
    first, second = testbed.hosts
    testbed.partition(first, second)  # both still reach the coordinator on the switch, not each other
    results = cluster.run_ranks([SCRIPT, "unreachable"], timeout_s=60)
    assert all(r.returncode not in (0, None) for r in results), describe(results)  # an error, not a hang
    dialer, waiter = (json.loads(next(line for line in r.output.splitlines() if line[:1] == "{")) for r in results)
    # Rank 0 dials rank 1 (the lower group rank connects) and names it, its address and the cause.
    assert dialer["error"] == "PeerUnreachableError" and dialer["culprit"] == 1, dialer
    assert "global rank 1" in dialer["message"], dialer
    assert re.search(rf"{re.escape(second.address)}:\d+", dialer["message"]), dialer
    assert dialer["seconds"] < 15, dialer
    # Rank 1 learns from the job's failure, with rank 0's cause.
    assert waiter["error"] in ("JobFailedError", "PeerFailedError", "PeerUnreachableError"), waiter
    assert second.address in waiter["message"] and waiter["seconds"] < 20, waiter


@pytest.mark.timeout(120)
def test_daemons_listening_on_every_interface_register_their_advertised_address(testbed, make_testbed_cluster):
    cluster = make_testbed_cluster(testbed, daemons_per_host=0)
    for host in testbed.hosts:
        cluster.add_daemons(host, extra=("--host", "0.0.0.0", "--advertise-host", host.address))
    assert [d.address.split(":")[0] for d in cluster.daemons] == [h.address for h in testbed.hosts]
    results = cluster.run_ranks([str(Path(__file__).parents[2] / "examples" / "hello_collectives.py")])
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert all("— ok" in r.output for r in results), describe(results)
