"""The CPU plugin: ONNX Runtime's CPU execution provider and host collectives.

Collectives run over shared memory between daemons on one host and over TCP between hosts
(`TESSEL_TRANSPORT=tcp` forces TCP, for tests and for hosts without /dev/shm).
"""

from __future__ import annotations

import os

from tessel.core.plugin import (
    CollectivePlugin,
    Communicator,
    ComputePlugin,
    DeviceInfo,
    GroupContext,
    LinkMeasurement,
    Measurement,
    Plugin,
)


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


class CpuCollective(CollectivePlugin):
    """Picks the transport per group: shared memory when every member is on this host, else TCP."""

    def __init__(self, host: str = "127.0.0.1", advertise_host: str = ""):
        self.host, self.advertise_host = host, advertise_host
        self._tcp = None

    @property
    def tcp(self):
        """The TCP data plane, listening from first use (daemons start it to register its address)."""
        if self._tcp is None:
            from tessel.plugins.cpu.tcp import TcpTransport

            self._tcp = TcpTransport(self.host, advertise_host=self.advertise_host)
        return self._tcp

    @property
    def data_address(self) -> str:
        return self.tcp.address

    def new_group(self, context: GroupContext) -> Communicator:
        forced = os.environ.get("TESSEL_TRANSPORT", "").lower()
        same_host = len({p.host_id for p in context.peers}) == 1
        if forced not in ("", "shm", "tcp"):
            from tessel.core.errors import ConfigurationError

            raise ConfigurationError(f"TESSEL_TRANSPORT={forced!r} is not a transport; use 'shm' or 'tcp'")
        if same_host and forced != "tcp":
            from tessel.plugins.cpu.shm import ShmCommunicator

            return ShmCommunicator(context)
        return self.tcp.communicator(context)

    def probe_link(self, data_address: str) -> LinkMeasurement:
        """TCP latency and bandwidth to the daemon listening at `data_address` (plugins/cpu/tcp_probe.py)."""
        from tessel.plugins.cpu.tcp_probe import probe

        return probe(self.tcp, data_address)

    def close(self) -> None:
        if self._tcp is not None:
            self._tcp.close()

    def deadlines(self) -> str:
        from tessel.plugins.cpu.shm_sync import LIVENESS_PERIOD_S
        from tessel.plugins.cpu.tcp import CONNECT_TIMEOUT_S
        from tessel.plugins.cpu.tcp_handshake import HANDSHAKE_TIMEOUT_S

        return (
            f"TCP connect {CONNECT_TIMEOUT_S:g} s (TESSEL_CONNECT_TIMEOUT), TCP handshake {HANDSHAKE_TIMEOUT_S:g} s, "
            f"shared-memory peers checked alive every {LIVENESS_PERIOD_S:g} s"
        )


class CpuPlugin(Plugin):
    name = "cpu"
    interchangeable_devices = True  # device indices are shares of one host's cores

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return True, ""

    def __init__(self, device_id: int = 0, threads: int = 1, host: str = "127.0.0.1", advertise_host: str = ""):
        self.device_id, self.threads = device_id, threads
        self._collective = CpuCollective(host, advertise_host)
        self._compute: ComputePlugin | None = None

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo("cpu", self.device_id, self.threads, _memory_bytes())

    @property
    def compute(self) -> ComputePlugin:
        if self._compute is None:
            from tessel.plugins.cpu.compute import CpuCompute

            self._compute = CpuCompute(threads=self.threads)
        return self._compute

    @property
    def collective(self) -> CpuCollective:
        return self._collective

    @property
    def host_transport(self) -> CpuCollective:
        """The cpu plugin is the host transport itself: shared memory within a host, TCP between hosts."""
        return self._collective

    def measure(self) -> Measurement:
        """GEMM throughput with this daemon's threads, copy bandwidth and the shared-memory link
        (plugins/cpu/measure.py); about a quarter of a second."""
        from tessel.plugins.cpu.measure import measure

        return measure(self.threads, self.compute)
