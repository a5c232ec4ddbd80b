"""What a CPU daemon measures at start (plugins/cpu/measure.py) and the TCP link probe (plugins/cpu/tcp_probe.py),
in one process: plausible figures within the time budget, probes authenticated and bounded, clear errors."""

from __future__ import annotations

import struct

import pytest

from tessel.core.errors import ConfigurationError
from tessel.core.plugin import LinkMeasurement, Measurement
from tessel.daemon.core import DaemonCore
from tessel.plugins.cpu import CpuPlugin
from tessel.plugins.cpu.measure import copy_bandwidth, matmul_flops, measure
from tessel.plugins.cpu.tcp import TcpTransport
from tessel.plugins.cpu.tcp_probe import probe


def test_a_measurement_is_plausible_and_takes_a_fraction_of_a_second():
    found = measure(threads=1)
    assert isinstance(found, Measurement)
    assert 1e9 < found.matmul_flops < 1e13  # a GEMM core does gigaflops, not petaflops
    assert 1e8 < found.memory_bandwidth < 1e13 and 1e8 < found.shm_bandwidth < 1e13
    assert 0 < found.shm_latency_s < 0.01
    assert found.seconds < 3.0  # ~0.25 s on a quiet machine; generous for a loaded one


def test_other_sizes_and_budgets_give_rates():
    """The figures are rates (flop/s, bytes/s) whatever the size and budget; their values move with the machine's
    load (on a shared 2-core machine a 384-GEMM measured 9-100 Gflop/s within minutes), so only sanity is checked."""
    assert matmul_flops(threads=1, budget_s=0.03, size=192) > 1e8
    assert copy_bandwidth(0.01, 1 << 20) > 1e8


def test_the_plugin_reports_its_measurement():
    assert CpuPlugin(threads=1).measure().matmul_flops > 0


@pytest.fixture
def transports():
    pair = [TcpTransport("127.0.0.1", token="secret") for _ in range(2)]
    yield pair
    for t in pair:
        t.close()


def test_a_probe_measures_latency_and_bandwidth_between_two_data_planes(transports):
    found = probe(transports[0], transports[1].address, pings=10, bulk_bytes=1 << 20)
    assert isinstance(found, LinkMeasurement)
    assert 0 < found.latency_s < 0.05 and found.bandwidth > 1e7


def test_a_probe_with_the_wrong_token_is_refused(transports):
    stranger = TcpTransport("127.0.0.1", token="wrong")
    try:
        with pytest.raises(ConfigurationError, match="refused a link probe: wrong cluster token"):
            probe(stranger, transports[1].address)
    finally:
        stranger.close()


def test_a_probe_connection_is_bounded(transports, monkeypatch):
    from tessel.plugins.cpu import tcp_probe

    monkeypatch.setattr(tcp_probe, "PROBE_MAX_BYTES", 1024)
    sock = transports[0].dial_probe(transports[1].address)
    try:
        sock.sendall(struct.pack("<BQ", 2, 4096))  # more than the peer serves: it closes the connection
        sock.settimeout(5)
        try:
            answer = sock.recv(1)
        except ConnectionResetError:
            answer = b""
        assert answer == b""
    finally:
        sock.close()


def test_the_daemon_probes_through_its_plugin_and_refuses_bad_addresses():
    core = DaemonCore(CpuPlugin(threads=1))
    other = CpuPlugin(threads=1)
    try:
        assert core.probe_link(other.collective.data_address).bandwidth > 0
        with pytest.raises(ConfigurationError, match="not a data-plane address"):
            core.probe_link("nowhere")
        with pytest.raises(ConfigurationError, match="cannot reach the data plane at 'no-such-host"):
            core.probe_link("no-such-host.invalid:1")  # the name does not resolve: an error naming it, not INTERNAL
        assert core.probe_link(other.collective.data_address).bandwidth > 0  # the probe lock was given back
    finally:
        core.close()
        other.close()


def test_the_daemon_reports_the_plugin_s_figures_and_a_factor_per_reference_op(monkeypatch):
    from tessel.daemon.calibration import FACTOR_RANGE, REFERENCES, measure_device

    plugin = CpuPlugin(threads=1)
    found = measure_device(plugin)
    assert found.matmul_flops > 1e9 and found.launch_overhead_s > 0 and found.measured_at > 0
    assert set(found.op_factors) == {r.op for r in REFERENCES}
    assert all(FACTOR_RANGE[0] <= f <= FACTOR_RANGE[1] for f in found.op_factors.values())
    monkeypatch.setenv("TESSEL_MEASURE", "0")
    assert measure_device(plugin) is None


def test_a_daemon_s_start_reuses_the_hosts_fresh_per_op_factors_and_a_refresh_calibrates_anew(monkeypatch, tmp_path):
    import json

    from tessel.daemon import calibration

    monkeypatch.setenv("TESSEL_CALIBRATION_DIR", str(tmp_path))
    calls = []
    real = calibration.calibrate
    monkeypatch.setattr(calibration, "calibrate", lambda *a, **k: calls.append(1) or real(*a, **k))
    plugin, other_device, more_threads = CpuPlugin(threads=1), CpuPlugin(device_id=3, threads=1), CpuPlugin(threads=2)
    first = calibration.measure_device(plugin, reuse_factors=True)
    again = calibration.measure_device(other_device, reuse_factors=True)  # cpu devices share the host's cores
    assert len(calls) == 1 and dict(again.op_factors) == dict(first.op_factors)
    calibration.measure_device(more_threads, reuse_factors=True)  # another thread count: its own factors
    assert len(calls) == 2
    calibration.measure_device(plugin)  # a Measure request (refresh): calibrates and stores anew
    assert len(calls) == 3
    path = calibration.factors_path(plugin)
    stored = json.loads(path.read_text())
    stale = stored["calibrated_at"] - calibration.FACTORS_MAX_AGE_S - 1
    path.write_text(json.dumps({**stored, "calibrated_at": stale}))
    calibration.measure_device(plugin, reuse_factors=True)  # older than a day: calibrated again
    assert len(calls) == 4
    path.write_text("not json")
    assert set(calibration.measure_device(plugin, reuse_factors=True).op_factors) == {"MatMul", "Conv2D", "ReLU"}
    assert len(calls) == 5


def test_two_daemons_time_a_collective_among_themselves_and_refuse_bad_requests():
    """Daemon.ProbeGroup: every member asked at once forms a temporary group and times small all_reduces over it
    (what the coordinator's cost model takes as a collective's latency among a job's ranks)."""
    import os
    import threading

    from tessel.daemon.core import host_id
    from tessel.v1 import common_pb2

    cores = [DaemonCore(CpuPlugin(threads=1)) for _ in range(2)]
    try:
        members = [
            common_pb2.Member(rank=r, data_address=c.plugin.collective.data_address, host_id=host_id(), pid=os.getpid())
            for r, c in enumerate(cores)
        ]
        found: dict[int, float] = {}
        threads = [
            threading.Thread(target=lambda r=r: found.__setitem__(r, cores[r].probe_group("p1", r, members, 8)))
            for r in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert set(found) == {0, 1} and all(0 < s < 5 for s in found.values()), found
        with pytest.raises(ConfigurationError, match="2 or more members"):
            cores[0].probe_group("p2", 0, members[:1], 8)
        with pytest.raises(ConfigurationError, match="collectives"):
            cores[0].probe_group("p3", 0, members, 0)
    finally:
        for core in cores:
            core.close()
