"""Fixtures of the multi-host tests: a test bed of network-namespace "hosts" (testbed.py) and a cluster on it."""

from __future__ import annotations

import pytest
from testbed import Testbed, available
from testbed_cluster import TestbedCluster


@pytest.fixture
def make_testbed():
    """`make_testbed(hosts=2, rate="10gbit")` builds a test bed, closed after the test (skips where impossible)."""
    made: list[Testbed] = []

    def make(hosts: int = 2, rate: str | None = "10gbit") -> Testbed:
        ok, why = available()
        if not ok:
            pytest.skip(f"no network-namespace test bed here: {why}")
        bed = Testbed(hosts, rate)
        made.append(bed)
        return bed.up()

    try:
        yield make
    finally:
        for bed in made:
            bed.close()


@pytest.fixture
def testbed(make_testbed, request) -> Testbed:
    """Two hosts at 10 Gbit/s, or what `@pytest.mark.parametrize("testbed", [{...}], indirect=True)` asks for."""
    return make_testbed(**getattr(request, "param", {}))


@pytest.fixture
def make_testbed_cluster(tmp_path):
    """`make_testbed_cluster(bed, daemons_per_host=1, ...)`: a coordinator and daemons on `bed`, stopped after."""
    made: list[TestbedCluster] = []

    def make(bed: Testbed, **kwargs) -> TestbedCluster:
        cluster = TestbedCluster(bed, tmp_path / f"cluster{len(made)}", **kwargs)
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()
