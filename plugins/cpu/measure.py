"""What this CPU does per second, measured in about a quarter of a second when a daemon starts: the figures the
coordinator's cost model is calibrated with (DESIGN: "Strategy assignment").

- matrix throughput: fp32 GEMMs (MatMul of two n x n matrices) run by ONNX Runtime in the daemon's own process-wide
  thread pool, i.e. with the daemon's thread count, as its programs will run; the median call's flop/s;
- memory bandwidth: a copy of a 32 MiB array, counting bytes read plus written (the cost model counts an op's
  traffic the same way: every input and output byte);
- shared memory: a ping-pong between two threads over a futex word in a shared mapping (one-way latency, the
  median of many round trips halved) and a copy into a shared mapping (bytes/s), what a shared-memory collective
  does per round and per byte.

    >>> measure(threads=2)
    Measurement(matmul_flops=1.6e+11, memory_bandwidth=1.9e+10, shm_latency_s=1.1e-05, shm_bandwidth=1.1e+10, ...)

`TESSEL_MEASURE=0` skips it (the coordinator then keeps its default figures for this daemon).
"""

from __future__ import annotations

import mmap
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

from tessel.core.plugin import Measurement
from tessel.plugins.cpu import futex

GEMM_SIZE = 384  # 2·384³ ≈ 0.11 Gflop: ~1 ms a call on one modern core, past the size where overheads dominate
COPY_BYTES = 32 << 20
PING_PONGS = 200


def measure(threads: int, compute=None, budget_s: float = 0.25) -> Measurement:
    """Every figure, in about `budget_s` seconds (GEMMs take half of it). `compute`: the daemon's CpuCompute (its
    thread pool); a new one with `threads` threads when None."""
    started = time.perf_counter()
    flops = matmul_flops(compute, threads, budget_s / 2)
    bandwidth = copy_bandwidth(budget_s / 6)
    latency, shm_bandwidth = shared_memory_link(budget_s / 6)
    return Measurement(flops, bandwidth, latency, shm_bandwidth, time.perf_counter() - started)


def matmul_flops(compute=None, threads: int = 1, budget_s: float = 0.12, size: int = GEMM_SIZE) -> float:
    """fp32 GEMM flop/s of ONNX Runtime with the process's thread pool: the median of calls over `budget_s`."""
    from tessel.plugins.cpu.compute import CpuCompute

    compute = compute or CpuCompute(threads=threads)
    exe = compute.compile(_matmul_model(size))
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size)).astype(np.float32) for _ in range(2))
    seconds = _timed(lambda: compute.run(exe, {"a": a, "b": b}), budget_s)
    return 2 * size**3 / statistics.median(seconds)


def copy_bandwidth(budget_s: float = 0.04, nbytes: int = COPY_BYTES) -> float:
    """Bytes read plus written per second by a large copy (numpy, one thread)."""
    source = np.ones(nbytes // 8, np.float64)
    target = np.empty_like(source)
    seconds = _timed(lambda: np.copyto(target, source), budget_s)
    return 2 * nbytes / statistics.median(seconds)


def shared_memory_link(budget_s: float = 0.04, nbytes: int = COPY_BYTES // 2) -> tuple[float, float]:
    """(one-way latency in seconds, bytes/s copied into shared memory)."""
    with mmap.mmap(-1, nbytes + 64, flags=mmap.MAP_SHARED) as shared:
        bandwidth = _copy_into(shared, nbytes, budget_s / 2)
        latency = _ping_pong(np.frombuffer(shared, np.uint32, 2), min(PING_PONGS, max(20, int(budget_s / 100e-6))))
    return latency, bandwidth


def _copy_into(shared: mmap.mmap, nbytes: int, budget_s: float) -> float:
    target = np.frombuffer(shared, np.uint8, nbytes, 64)  # released on return, before the mapping closes
    source = np.ones(nbytes, np.uint8)
    return nbytes / statistics.median(_timed(lambda: np.copyto(target, source), budget_s))


def _ping_pong(words: np.ndarray, rounds: int) -> float:
    """Half the median round trip of a counter passed between two threads that sleep on futexes between turns
    (the GIL is released while sleeping, as two processes would sleep)."""
    address = words.ctypes.data
    deadline = time.monotonic() + 5.0

    def wait_for(index: int, value: int) -> None:
        while int(words[index]) != value:
            if time.monotonic() > deadline:
                raise TimeoutError("shared-memory ping-pong: the other thread never answered")
            futex.wait(address + 4 * index, int(words[index]), 0.001)

    def echo() -> None:
        for k in range(1, rounds + 1):
            wait_for(0, k)
            words[1] = k
            futex.wake(address + 4)

    partner = threading.Thread(target=echo, name="tessel-measure-echo", daemon=True)
    partner.start()
    trips = []
    for k in range(1, rounds + 1):
        began = time.perf_counter()
        words[0] = k
        futex.wake(address)
        wait_for(1, k)
        trips.append(time.perf_counter() - began)
    partner.join(5.0)
    return statistics.median(trips) / 2


def _timed(call: Callable[[], object], budget_s: float, least: int = 5) -> list[float]:
    """Seconds of each call, after one warm-up, for `budget_s` (at least `least` calls)."""
    call()
    seconds: list[float] = []
    end = time.perf_counter() + budget_s
    while len(seconds) < least or time.perf_counter() < end:
        began = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - began)
    return seconds


def _matmul_model(size: int) -> bytes:
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [size, size])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [size, size])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [size, size])
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "measure_gemm", [a, b], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()
