"""A second registration of the CPU plugin for tests of mixed plugins in one job (`tessel daemon --plugin
cpu_slow:SlowCpuPlugin`, with this folder on PYTHONPATH): the same code, presented as another plugin and device kind,
so a job of `cpu` and `cpu-slow` daemons is a job of two plugins (daemon/hierarchy.py makes one part per plugin and
host). It is slower only where the test makes it so (fewer --threads, a CPU quota): nothing here sleeps.
"""

from __future__ import annotations

from tessel.core.plugin import DeviceInfo
from tessel.plugins.cpu import CpuPlugin, _memory_bytes


class SlowCpuPlugin(CpuPlugin):
    name = "cpu-slow"

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo("cpu-slow", self.device_id, self.threads, _memory_bytes())
