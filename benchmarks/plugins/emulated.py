"""EMULATED devices of two speeds for benchmarks/heterogeneous.py: the CPU plugin registered as plugins `emu-fast`
and `emu-slow`, whose compute, after every program it runs, sleeps so that the program takes SLOWDOWN times as
long as on the CPU: 4x (fast) and 8x (slow), devices that differ 2:1 in speed. They compute exactly what the CPU
plugin computes (the same ONNX Runtime sessions); only their time stretches. The stretch is a sleep, not work, so
on a machine whose 2 cores are shared with other work the CPU is not what limits the job: the benchmark measures
how tessel copes with a rank 2x slower than the other, not what real devices are. The registration measurement
(`measure`) runs through the same compute, so the coordinator sees the emulated speeds too.

    tessel daemon --plugin emulated:EmulatedSlow      (with benchmarks/plugins on PYTHONPATH)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tessel.core.plugin import DeviceInfo
from tessel.plugins.cpu import CpuPlugin, _memory_bytes
from tessel.plugins.cpu.compute import CpuCompute


class _Binding:
    def __init__(self, binding: Any, slowdown: float):
        self._binding, self._slowdown = binding, slowdown

    def run(self) -> Any:
        return _stretched(self._slowdown, self._binding.run)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._binding, name)


def _stretched(slowdown: float, run, *args):
    started = time.perf_counter()
    result = run(*args)
    time.sleep((slowdown - 1.0) * (time.perf_counter() - started))
    return result


class EmulatedCompute(CpuCompute):
    def __init__(self, threads: int, slowdown: float):
        super().__init__(threads)
        self.slowdown = slowdown

    def run(self, executable: Any, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return _stretched(self.slowdown, super().run, executable, inputs)

    def bind(self, executable: Any) -> Any:
        return _Binding(super().bind(executable), self.slowdown)


class _Emulated(CpuPlugin):
    slowdown = 1.0

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo(f"{self.name} (emulated)", self.device_id, self.threads, _memory_bytes())

    @property
    def compute(self) -> EmulatedCompute:
        if self._compute is None:
            self._compute = EmulatedCompute(self.threads, self.slowdown)
        return self._compute


class EmulatedFast(_Emulated):
    name, slowdown = "emu-fast", 4.0


class EmulatedSlow(_Emulated):
    name, slowdown = "emu-slow", 8.0
