"""EMULATED devices of two speeds for benchmarks/heterogeneous.py: the CPU plugin registered as plugins `emu-fast`
and `emu-slow`, whose compute, after every program it runs, sleeps so that the program takes SLOWDOWN times the CPU
time it used: 4x (fast) and 8x (slow), devices that differ 2:1 in speed whatever else runs on the machine (a
stretch of the wall time would stretch the time spent waiting for a shared core too). They compute exactly what
the CPU plugin computes (the same ONNX Runtime sessions); only their time stretches. The stretch is a sleep, not
work, so on a machine whose 2 cores are shared with other work the CPU is not what limits the job: the benchmark
measures how tessel copes with a rank 2x slower than the other, not what real devices are. The registration measurement
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
    def __init__(self, binding: Any, slowdown: float, clock):
        self._binding, self._slowdown, self._clock = binding, slowdown, clock

    def run(self) -> Any:
        return _stretched(self._slowdown, self._clock, self._binding.run)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._binding, name)


def _stretched(slowdown: float, clock, run, *args):
    """run(*args), then a sleep until the call has taken `slowdown` times the CPU time the daemon spent in it. The
    CPU time, not the wall time: on a shared machine the wall time includes waiting for a core (other processes,
    the other rank's compute), and stretching that too would make the emulated device's speed follow the machine's
    load rather than its rated slowdown (measured: a 35-row step of the wide MLP on emu-slow took as long as a
    64-row one while the fast rank computed beside it). `clock`: the calling thread's CPU time where ONNX Runtime
    computes on that thread alone (1 thread), else the process's (which counts the daemon's other threads too:
    its RPC threads, a collective's; stretched 8x, they made emu-slow measure 2.4-3.1x slower than emu-fast at
    registration instead of 2x)."""
    started, cpu = time.perf_counter(), clock()
    result = run(*args)
    spent = clock() - cpu
    time.sleep(max(0.0, slowdown * spent - (time.perf_counter() - started)))
    return result


class EmulatedCompute(CpuCompute):
    def __init__(self, threads: int, slowdown: float):
        super().__init__(threads)
        self.slowdown = slowdown
        self.clock = time.thread_time if threads == 1 else time.process_time

    def run(self, executable: Any, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return _stretched(self.slowdown, self.clock, super().run, executable, inputs)

    def bind(self, executable: Any) -> Any:
        return _Binding(super().bind(executable), self.slowdown, self.clock)


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
