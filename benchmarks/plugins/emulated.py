"""EMULATED devices of two speeds for benchmarks/heterogeneous.py: the CPU plugin registered as plugins `emu-fast`
and `emu-slow`, whose compute, after every program it runs, sleeps so that the program takes SLOWDOWN times the
least CPU time of that program's runs so far (the same executable on inputs of the same shapes, this run
included): 4x (fast) and 8x (slow), devices that differ 2:1 in speed whatever else runs on the machine.

- Not the wall time: that would stretch the time spent waiting for a shared core too.
- Not each run's own CPU time: on this VM an idle single-thread matrix product's CPU time varies 0.6-2.6 ms
  around a median of 0.73 ms from one call to the next (steal and cache effects the guest counts as its own);
  stretched 8x, that made the even split's step time range 23-40 ms between the epochs of one job.
- Not a statistic of recent runs: the CPU time of the same work drifts by tens of percent over seconds here
  (measured over twelve epochs of the even split: the median of the latest 15 runs gave 28-37 ms a step, the
  least of the latest 64 gave 23-27 ms).

The least CPU time so far is the program's work without that noise, as a real device's time for a program does not
depend on the host's load (measured: the even split 20.8-23.9 ms a step after its first epoch, 96:32 15.5-17.1 ms).
It falls as runs accumulate (the noise's lower tail): a program is slower in its first epochs than later (the wide
MLP's step at a fixed 100:28 took 168, 150, 146, 145 ms in epochs 2-5, at the even split 210, 211, 204, 201 ms), and
so is a split just changed to, which counts against the speed-aware job (its split changes) and not the even one. A
run slower than SLOWDOWN times the least (a spike longer than the stretch) takes its own time. PyTorch's side
(benchmarks/_dp_torch.py --slowdown) likewise stretches every step by a fixed time, measured once. The emulated
devices compute exactly what the CPU plugin computes (the same ONNX Runtime sessions); only their time stretches.
The stretch is a sleep, not work, so on a machine whose 2 cores are shared with other work the CPU is not what
limits the job: the benchmark measures how tessel copes with a rank 2x slower than the other, not what real devices
are. The registration measurement (`measure`) runs through the same compute, so the coordinator sees the emulated
speeds too.

    tessel daemon --plugin emulated:EmulatedSlow      (with benchmarks/plugins on PYTHONPATH)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tessel.core.plugin import DeviceInfo
from tessel.plugins.cpu import CpuPlugin, _memory_bytes
from tessel.plugins.cpu.compute import CpuCompute


class _Binding:
    def __init__(self, binding: Any, compute: EmulatedCompute):
        self._binding, self._compute = binding, compute

    def run(self) -> Any:
        kept = self._binding._kept  # the bound inputs (and fresh outputs): their shapes name the work
        shapes = tuple(sorted((name, array.shape) for name, array in kept.items()))
        return self._compute.stretched((self._binding.exe.key, shapes), self._binding.run)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._binding, name)


class EmulatedCompute(CpuCompute):
    def __init__(self, threads: int, slowdown: float):
        super().__init__(threads)
        self.slowdown = slowdown
        self.clock = time.thread_time if threads == 1 else time.process_time
        self._least: dict[tuple, float] = {}  # (executable, input shapes) -> the least CPU seconds of its runs
        self._least_lock = threading.Lock()

    def run(self, executable: Any, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        shapes = tuple(sorted((name, np.shape(array)) for name, array in inputs.items()))
        return self.stretched((executable.key, shapes), super().run, executable, inputs)

    def bind(self, executable: Any) -> Any:
        return _Binding(super().bind(executable), self)

    def stretched(self, work: tuple, run, *args):
        """run(*args), then a sleep until the call has taken `slowdown` times the least CPU time of the runs of
        `work` (an executable and its input shapes) so far, this one's included (see the module docstring).
        The CPU time, not the wall time: on a shared machine the wall time includes waiting for a core (other
        processes, the other rank's compute), and stretching that too would make the emulated device's speed
        follow the machine's load rather than its rated slowdown (measured: a 35-row step of the wide MLP on
        emu-slow took as long as a 64-row one while the fast rank computed beside it). `clock`: the calling
        thread's CPU time where ONNX Runtime computes on that thread alone (1 thread), else the process's (which
        counts the daemon's other threads too: its RPC threads, a collective's; stretched 8x, they made emu-slow
        measure 2.4-3.1x slower than emu-fast at registration instead of 2x)."""
        started, cpu = time.perf_counter(), self.clock()
        result = run(*args)
        spent = self.clock() - cpu
        with self._least_lock:
            least = self._least[work] = min(spent, self._least.get(work, spent))
        time.sleep(max(0.0, self.slowdown * least - (time.perf_counter() - started)))
        return result


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
