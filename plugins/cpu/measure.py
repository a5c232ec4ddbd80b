"""What this CPU does per second, measured in about a quarter of a second when a daemon starts: the figures the
coordinator's cost model is calibrated with (DESIGN: "Strategy assignment").

- matrix throughput: fp32 GEMMs (MatMul of two n x n matrices) run by ONNX Runtime in the daemon's own process-wide
  thread pool, i.e. with the daemon's thread count, as its programs will run;
- memory bandwidth: a copy of a 32 MiB array, counting bytes read plus written (the cost model counts an op's
  traffic the same way: every input and output byte);
- runtime overheads: the time of one run of a one-node model through an IOBinding (a segment launch, as the daemon
  runs segments) and the extra time per node of a chain of tiny Adds (an op's dispatch);
- shared memory: a ping-pong between two threads over a futex word in a shared mapping (one-way latency, half a
  round trip) and a copy into a shared mapping (bytes/s), what a shared-memory collective does per round and byte.

Rates (flop/s, bytes/s) are work over the time all calls took, waits for a busy core included: on a machine shared
with other work (other ranks, other jobs) a device runs at the share of its cores it gets, and a step costs what the
same share gives. Per-call costs (overheads, latency) are medians: a preempted call says nothing about them.
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
    from tessel.plugins.cpu.compute import CpuCompute

    started = time.perf_counter()
    compute = compute or CpuCompute(threads=threads)
    flops = matmul_flops(compute, threads, budget_s / 2)
    bandwidth = copy_bandwidth(budget_s / 6)
    launch, per_op = runtime_overheads(compute, budget_s / 12)
    latency, shm_bandwidth = shared_memory_link(budget_s / 8)
    return Measurement(flops, bandwidth, latency, shm_bandwidth, time.perf_counter() - started, per_op, launch)


def matmul_flops(compute=None, threads: int = 1, budget_s: float = 0.12, size: int = GEMM_SIZE) -> float:
    """fp32 GEMM flop/s of ONNX Runtime with the process's thread pool, over the calls made for `budget_s`."""
    from tessel.plugins.cpu.compute import CpuCompute

    compute = compute or CpuCompute(threads=threads)
    exe = compute.compile(_matmul_model(size))
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size)).astype(np.float32) for _ in range(2))
    seconds = _timed(lambda: compute.run(exe, {"a": a, "b": b}), budget_s)
    return 2 * size**3 * len(seconds) / sum(seconds)


def copy_bandwidth(budget_s: float = 0.04, nbytes: int = COPY_BYTES) -> float:
    """Bytes read plus written per second by a large copy (numpy, one thread), over all the copies made."""
    source = np.ones(nbytes // 8, np.float64)
    target = np.empty_like(source)
    seconds = _timed(lambda: np.copyto(target, source), budget_s)
    return 2 * nbytes * len(seconds) / sum(seconds)


def runtime_overheads(compute, budget_s: float = 0.02, chain: int = 33) -> tuple[float, float]:
    """(seconds of one run of a one-node model through an IOBinding, extra seconds per node of a longer chain)."""
    one = _bound_run(compute, _chain_model(1))
    many = _bound_run(compute, _chain_model(chain))
    launch = statistics.median(_timed(one, budget_s / 2, least=20))
    per_node = statistics.median(_timed(many, budget_s / 2, least=20))
    return launch, max(per_node - launch, 0.0) / (chain - 1)


def _bound_run(compute, model: bytes) -> Callable[[], object]:
    exe = compute.compile(model)
    binding = compute.bind(exe)
    x = np.ones(16, np.float32)
    binding.input("x", x)
    binding.output("y", np.empty(16, np.float32))
    return binding.run


def shared_memory_link(budget_s: float = 0.04, nbytes: int = COPY_BYTES // 2) -> tuple[float, float]:
    """(one-way latency in seconds, bytes/s copied into shared memory)."""
    with mmap.mmap(-1, nbytes + 64, flags=mmap.MAP_SHARED) as shared:
        bandwidth = _copy_into(shared, nbytes, budget_s / 2)
        latency = _ping_pong(np.frombuffer(shared, np.uint32, 2), min(PING_PONGS, max(20, int(budget_s / 100e-6))))
    return latency, bandwidth


def _copy_into(shared: mmap.mmap, nbytes: int, budget_s: float) -> float:
    target = np.frombuffer(shared, np.uint8, nbytes, 64)  # released on return, before the mapping closes
    source = np.ones(nbytes, np.uint8)
    seconds = _timed(lambda: np.copyto(target, source), budget_s)
    return nbytes * len(seconds) / sum(seconds)


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
    return _model([helper.make_node("MatMul", ["a", "b"], ["c"])], [a, b], [c])


def _chain_model(nodes: int) -> bytes:
    """y = x + x + ... (`nodes` Adds, each of the previous result and x): nothing for the optimizer to fold."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])
    names = ["x", *(f"t{k}" for k in range(1, nodes)), "y"]
    adds = [helper.make_node("Add", [names[k], "x"], [names[k + 1]]) for k in range(nodes)]
    return _model(adds, [x], [y])


def _model(nodes, inputs, outputs) -> bytes:
    from onnx import helper

    graph = helper.make_graph(nodes, "measure", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()
