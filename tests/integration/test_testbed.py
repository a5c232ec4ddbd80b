"""The network-namespace test bed itself (testbed.py): hosts reach each other and the switch, links carry the tbf
limit, the root namespace is left alone, and everything is removed on close, after an error and when stale."""

from __future__ import annotations

import subprocess
import sys

import pytest
import testbed as tb

pytestmark = pytest.mark.slow

ECHO_SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], 0))
server.settimeout(20)
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.sendall(conn.recv(100).upper())
"""
ECHO_CLIENT = """
import socket, sys
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
conn.sendall(b"hello")
print(conn.recv(100).decode())
"""


def _root_links() -> str:
    return subprocess.run(["ip", "-brief", "link"], capture_output=True, text=True, timeout=10).stdout


def _echo(bed: tb.Testbed, client: tb.Host, server: tb.Host) -> str:
    listening = bed.popen(
        server, [sys.executable, "-c", ECHO_SERVER, server.address], stdout=subprocess.PIPE, text=True
    )
    port = listening.stdout.readline().strip()
    done = bed.run(client, [sys.executable, "-c", ECHO_CLIENT, server.address, port], timeout_s=30)
    listening.wait(10)
    return done.stdout.strip() or done.stderr


@pytest.mark.timeout(60)
def test_hosts_reach_each_other_and_the_switch_over_limited_links(make_testbed):
    links_before = _root_links()
    bed = make_testbed(hosts=3, rate="1gbit")
    a, b, c = bed.hosts
    assert len({a.address, b.address, c.address, bed.switch.address}) == 4
    assert _echo(bed, a, c) == "HELLO" and _echo(bed, c, b) == "HELLO" and _echo(bed, b, bed.switch) == "HELLO"
    for host in bed.hosts:
        qdisc = bed.run(host, ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        assert "tbf" in qdisc and "rate 1Gbit" in qdisc, qdisc
    bed.set_rate("10gbit")
    assert "rate 10Gbit" in bed.run(a, ["tc", "qdisc", "show", "dev", "eth0"]).stdout
    assert _root_links() == links_before  # nothing was added to the root namespace
    sent, _ = bed.link_bytes(a)
    assert sent > 0


@pytest.mark.timeout(60)
def test_partition_cuts_two_hosts_apart_but_not_from_the_switch(make_testbed):
    bed = make_testbed(hosts=2)
    a, b = bed.hosts
    bed.partition(a, b)
    cut = bed.run(a, [sys.executable, "-c", ECHO_CLIENT, b.address, "9"], timeout_s=30)
    assert cut.returncode != 0 and ("timed out" in cut.stderr or "No route" in cut.stderr), cut.stderr[-500:]
    assert _echo(bed, a, bed.switch) == "HELLO"
    bed.heal(a, b)
    assert _echo(bed, a, b) == "HELLO"


@pytest.mark.timeout(60)
def test_namespaces_and_processes_are_removed_on_close_even_after_an_error():
    ok, why = tb.available()
    if not ok:
        pytest.skip(why)
    with pytest.raises(RuntimeError, match="on purpose"), tb.Testbed(2, rate=None) as bed:
        names = [h.namespace for h in [bed.switch, *bed.hosts]]
        sleeper = bed.popen(bed.hosts[0], [sys.executable, "-c", "import time; time.sleep(60)"])
        raise RuntimeError("the test fails on purpose")
    assert sleeper.poll() is not None
    assert not set(names) & set(tb._namespaces())
    bed.close()  # idempotent


@pytest.mark.timeout(60)
def test_stale_namespaces_of_dead_creators_are_removed():
    ok, why = tb.available()
    if not ok:
        pytest.skip(why)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = f"{tb.PREFIX}-{finished.stdout.strip()}-abc123-h0"  # its creator's pid is gone
    subprocess.run(["ip", "netns", "add", stale], check=True, timeout=10)
    try:
        assert stale in tb.remove_stale()
        assert stale not in tb._namespaces()
    finally:
        subprocess.run(["ip", "netns", "delete", stale], capture_output=True, timeout=10)


def test_where_namespaces_cannot_be_made_the_reason_is_given(monkeypatch):
    monkeypatch.setattr(tb.os, "geteuid", lambda: 1000)
    ok, why = tb.available()
    assert not ok and "needs root" in why, why
    monkeypatch.setattr(tb.os, "geteuid", lambda: 0)
    monkeypatch.setattr(tb.shutil, "which", lambda tool: None)
    assert tb.available() == (False, "ip and tc not found (apt-get install iproute2)")
    with pytest.raises(tb.TestbedUnavailable, match="iproute2"):
        tb.Testbed(2).up()
