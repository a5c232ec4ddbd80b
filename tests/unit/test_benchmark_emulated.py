"""The emulated devices of benchmarks/heterogeneous.py: each program takes SLOWDOWN times the least CPU time its runs
(same executable, same input shapes) have taken, so one run's CPU noise is not stretched with it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "plugins"))

import emulated


def _burn(seconds: float) -> float:
    """Spend `seconds` of this thread's CPU time; returns it."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass
    return seconds


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    asked: list[float] = []
    monkeypatch.setattr(emulated.time, "sleep", asked.append)
    return asked


def _stretched_to(compute, work, cpu_s: float, sleeps: list[float]) -> float:
    """One run of `work` burning `cpu_s` of CPU: the device time it was stretched to (its wall time plus the sleep
    asked), or nothing less than its own wall time where that was already longer (a run preempted on a busy
    machine is not stretched further)."""
    started = time.perf_counter()
    compute.stretched(work, _burn, cpu_s)
    return time.perf_counter() - started + sleeps[-1]


def _about(seconds: float, expected: float, sleeps: list[float]) -> bool:
    return expected - 1e-4 <= seconds <= expected + 0.005 or (sleeps[-1] == 0.0 and seconds >= expected)


def test_a_program_is_stretched_to_slowdown_times_its_least_cpu_time(sleeps):
    compute = emulated.EmulatedCompute(threads=1, slowdown=4.0)
    small, large = ("step", (("x", (8, 4)),)), ("step", (("x", (16, 4)),))
    assert _about(_stretched_to(compute, small, 0.040, sleeps), 0.160, sleeps)  # a slow first run: 4 x 40 ms
    assert _about(_stretched_to(compute, small, 0.010, sleeps), 0.040, sleeps)  # the work itself: 4 x 10 ms
    _stretched_to(compute, small, 0.060, sleeps)  # a spike: its own time, not 4 x 60 ms
    assert sleeps[-1] == 0.0
    assert _about(_stretched_to(compute, small, 0.020, sleeps), 0.040, sleeps)  # still 4 x the least, 10 ms
    # Other input shapes are other work, with a history of their own.
    assert _about(_stretched_to(compute, large, 0.020, sleeps), 0.080, sleeps)


def test_a_bound_program_is_keyed_by_its_executable_and_bound_shapes(sleeps):
    compute = emulated.EmulatedCompute(threads=1, slowdown=8.0)

    class Exe:
        key = "sha"

    class Bound:
        exe, _kept = Exe(), {}

        def run(self):
            return _burn(0.005)

    binding = emulated._Binding(Bound(), compute)
    started = time.perf_counter()
    assert binding.run() == 0.005
    assert ("sha", ()) in compute._least
    # Stretched to 8 x 5 ms of CPU: its wall time plus the sleep asked (a run preempted that long is not stretched).
    assert _about(time.perf_counter() - started + sleeps[-1], 0.040, sleeps)
