"""What a daemon tells the coordinator about its device: the plugin's measurement (Plugin.measure: matrix throughput,
memory bandwidth, runtime overheads, the shared-memory link) and per-op calibration factors, in one
DeviceMeasurement message, taken at start (reported at registration) and again when the coordinator asks (Measure).

Per-op calibration. The cost model prices a node's training compute as three times its forward, at the measured
GEMM rate or memory bandwidth (CostModel.compute_time, objective.py). That holds for a matrix product; it does not
for ops whose gradients the runtime runs far below its GEMM rate (a convolution's filter gradient is lowered as a
convolution with a kernel as large as the image), nor for element-wise ops whose backward reads more than their
forward. So for each reference net below (an op at shapes a training step meets, every float input trained so that
the whole backward runs) the daemon times the fused train step with its own compute plugin, alternating with a
GEMM, both in CPU time (a ratio that other work on the machine does not blur), and reports

    factor(op) = (measured step - the model's price of everything but the op) / the model's price of the op

priced at the GEMM rate and copy bandwidth measured alongside, per CPU second. Ops without a reference keep
factor 1. The references are data; the
machinery is generic over the op registry (tracing, autodiff, lowering, the cost model).

    >>> measure_device(plugin).op_factors
    {'MatMul': 0.95, 'Conv2D': 2.4, 'ReLU': 4.3}

The factors are ratios of CPU times, which neither the load nor the moment change: a daemon's start takes them from
this host's store ($TESSEL_CALIBRATION_DIR, else $TESSEL_HOME/calibration) when a daemon with the same plugin,
device and threads calibrated them within a day (the eight daemons of an 8-rank job calibrate once, not eight
times); a Measure request calibrates anew. The plugin's own figures (throughput, bandwidth, the shared-memory link)
are measured at every start.

`TESSEL_MEASURE=0` skips all of it (the coordinator then keeps its default figures for the daemon).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tessel.v1 import common_pb2

log = logging.getLogger("tessel.daemon")

FACTOR_RANGE = (0.2, 50.0)  # a factor outside it is a measurement gone wrong (a stall), clamped
GEMM = (256, 512, 256)  # the product timed alongside each reference: (m, k, n), ~67 Mflop
FACTORS_MAX_AGE_S = 24 * 3600.0  # stored per-op factors older than this are calibrated again at a daemon's start
STORE_LOCK_WAIT_S = 30.0  # longest a starting daemon waits for another to finish calibrating the same device
_measuring = threading.Lock()


@dataclass(frozen=True)
class Reference:
    """A small net timing `op`'s forward and backward: the op on inputs of `shapes`, summed to a loss."""

    op: str
    shapes: tuple[tuple[int, ...], ...]
    attrs: tuple[tuple[str, object], ...] = ()


REFERENCES = (
    Reference("MatMul", ((128, 512), (512, 256))),
    Reference("Conv2D", ((16, 16, 16, 16), (32, 16, 3, 3)), (("pad_mode", "same"),)),
    Reference("ReLU", ((256, 1024),)),
)


class _Held:
    """Releases a lock acquired already when the block ends."""

    def __init__(self, lock: threading.Lock):
        self.lock = lock

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        self.lock.release()


def measure_device(
    plugin, calibrate_ops: bool = True, wait: bool = True, reuse_factors: bool = False
) -> common_pb2.DeviceMeasurement | None:
    """The plugin's measurement and the per-op factors, now; None when the plugin measures nothing or
    TESSEL_MEASURE=0. One measurement at a time per process: a second caller waits for the first, or with
    `wait=False` (a Measure request) is refused at once, so requests never pile up behind one another.
    `reuse_factors` (a daemon's start): per-op factors this host calibrated for the same device and threads within
    FACTORS_MAX_AGE_S are taken from its store (`factors_path`) instead of calibrating again; the plugin's own
    figures are measured now all the same. Every calibration is stored for the next start."""
    if os.environ.get("TESSEL_MEASURE", "1") == "0":
        return None
    if not _measuring.acquire(blocking=wait):
        from tessel.core.errors import LimitExceededError

        raise LimitExceededError("Measure: this daemon is measuring already; ask again when it is done (about 1 s)")
    with _Held(_measuring):
        started = time.perf_counter()
        found = plugin.measure()
        if found is None:
            return None
        message = common_pb2.DeviceMeasurement(
            matmul_flops=found.matmul_flops,
            memory_bandwidth=found.memory_bandwidth,
            shm_latency_s=found.shm_latency_s,
            shm_bandwidth=found.shm_bandwidth,
            op_overhead_s=found.op_overhead_s,
            launch_overhead_s=found.launch_overhead_s,
            measured_at=time.time(),
        )
        if calibrate_ops:
            try:
                message.op_factors.update(_op_factors(plugin, message, reuse_factors))
            except Exception:  # the figures above still hold
                log.exception("calibrating ops on the %s device failed; reporting no op factors", plugin.name)
        message.seconds = time.perf_counter() - started
    log.info(
        "measured in %.2f s: %.1f Gflop/s, %.1f GB/s memory, shared memory %.1f us / %.1f GB/s, op factors %s",
        message.seconds,
        message.matmul_flops / 1e9,
        message.memory_bandwidth / 1e9,
        message.shm_latency_s * 1e6,
        message.shm_bandwidth / 1e9,
        dict(message.op_factors),
    )
    return message


def factors_path(plugin) -> Path:
    """Where this host keeps the per-op factors of `plugin`'s device at its thread count: $TESSEL_CALIBRATION_DIR, else
    $TESSEL_HOME/calibration (default ~/.tessel), one file per plugin, device (unless the plugin's devices are
    interchangeable) and thread count, its name carrying a digest of what the factors depend on besides: the
    references, this module, the CPU and the compute runtime's version. Anything else changed calibrates anew."""
    device = plugin.device
    runtime = sys.modules.get("onnxruntime")
    what = repr(
        (
            REFERENCES,
            GEMM,
            FACTOR_RANGE,
            hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
            platform.machine(),
            _cpu_model(),
            type(plugin.compute).__module__,
            getattr(runtime, "__version__", ""),
        )
    )
    which = "any" if plugin.interchangeable_devices else str(device.device_id)
    name = f"{plugin.name}-{device.kind}-{which}-{device.cores}t-{hashlib.sha256(what.encode()).hexdigest()[:16]}.json"
    store = os.environ.get("TESSEL_CALIBRATION_DIR")
    return (
        Path(store) if store else Path(os.environ.get("TESSEL_HOME", Path.home() / ".tessel")) / "calibration"
    ) / name


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def _op_factors(plugin, measurement, reuse: bool) -> dict[str, float]:
    """Calibrated factors, or with `reuse` the stored ones when fresh. Daemons starting together on one host take
    turns at the store's lock: the first calibrates, the others read what it stored."""
    try:
        path = factors_path(plugin)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 - closed below
    except OSError as exc:  # no writable home: calibrate, keep nothing
        log.info("calibration store unavailable (%s); calibrating", exc)
        return calibrate(plugin.compute, measurement)
    with lock:
        _lock_within(lock, STORE_LOCK_WAIT_S)  # past it (a holder stopped mid-calibration) calibrate all the same
        stored = _read_factors(path) if reuse else None
        if stored is not None:
            log.info("per-op factors from %s", path)
            return stored
        factors = calibrate(plugin.compute, measurement)
        _write_factors(path, factors)
        return factors


def _lock_within(lock, timeout_s: float) -> bool:
    """Take the store's lock (released with the file), waiting at most `timeout_s`; False when it stayed taken."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                log.warning("the calibration store's lock %s stayed taken for %g s; calibrating", lock.name, timeout_s)
                return False
            time.sleep(0.02)


def _read_factors(path: Path) -> dict[str, float] | None:
    try:
        stored = json.loads(path.read_text())
        age = time.time() - float(stored["calibrated_at"])
        factors = {str(op): float(v) for op, v in stored["factors"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not 0 <= age <= FACTORS_MAX_AGE_S or set(factors) != {r.op for r in REFERENCES}:
        return None
    return factors


def _write_factors(path: Path, factors: dict[str, float]) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        temp.write_text(json.dumps({"calibrated_at": time.time(), "factors": factors}))
        os.replace(temp, path)
    except OSError as exc:
        log.info("could not store the per-op factors in %s: %s", path, exc)


def calibrate(compute, measurement, budget_s: float = 0.2, references=REFERENCES) -> dict[str, float]:
    """{op: factor} for every reference, within about `budget_s` seconds in all (after compiling)."""
    gemm = _gemm(compute)
    bandwidth = _copy_bandwidth()
    return {r.op: _factor(compute, measurement, gemm, bandwidth, r, budget_s / len(references)) for r in references}


def _copy_bandwidth(nbytes: int = 32 << 20, copies: int = 4) -> float:
    """Bytes read plus written per CPU second by a copy as large as the CPU plugin's (as Plugin.measure counts)."""
    source = np.ones(nbytes // 8, np.float64)
    target = np.empty_like(source)
    np.copyto(target, source)
    began = time.process_time()
    for _ in range(copies):
        np.copyto(target, source)
    return 2 * nbytes * copies / max(time.process_time() - began, 1e-6)


def _factor(compute, measurement, gemm, bandwidth: float, reference: Reference, budget_s: float) -> float:
    from tessel.compiler.builder import apply
    from tessel.compiler.optimizers import SGD
    from tessel.compiler.parallel import parallelize
    from tessel.compiler.parallel.cost import local_cost
    from tessel.compiler.parallel.search import CostModel, Link, predict_step_time
    from tessel.compiler.parallel.search.objective import TRAIN_COMPUTE
    from tessel.compiler.tracer import TensorSpec, trace
    from tessel.compiler.train_step import TrainStep, build_train_step

    names = [f"input{i}" for i in range(len(reference.shapes))]
    specs = [TensorSpec(shape, name=name) for shape, name in zip(reference.shapes, names)]
    graph = trace(lambda *xs: apply(reference.op, *xs, **dict(reference.attrs)).sum(), *specs).graph
    rng = np.random.default_rng(0)
    values = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in zip(names, reference.shapes)}
    step = TrainStep(build_train_step(graph, names, SGD(learning_rate=1e-6)), compute, values)
    gemm_s, step_s = _alternating(gemm, step, budget_s)
    model = CostModel(  # priced per CPU second, as the two calls were timed
        2 * GEMM[0] * GEMM[1] * GEMM[2] / gemm_s,
        bandwidth,
        1 << 40,
        Link(1e-5, 1e10),
        Link(1e-5, 1e10),
        op_overhead=measurement.op_overhead_s,
        launch_overhead=measurement.launch_overhead_s,
    )
    plan = parallelize(graph, {}, 1, parameters=names)
    whole = predict_step_time(plan, model).total
    (node,) = [n for n in graph.nodes if n.op == reference.op]
    own = TRAIN_COMPUTE * model.compute_time(local_cost(node, plan.specs[node], plan.placements[node]))
    low, high = FACTOR_RANGE
    return min(max((step_s - (whole - own)) / own, low), high)


def _gemm(compute):
    """A call running the GEMM product once through `compute`."""
    from tessel.compiler.builder import apply
    from tessel.compiler.lower_onnx import model_bytes
    from tessel.compiler.tracer import TensorSpec, trace

    m, k, n = GEMM
    graph = trace(lambda a, b: apply("MatMul", a, b), TensorSpec((m, k), name="a"), TensorSpec((k, n), name="b")).graph
    exe = compute.compile(model_bytes(graph))
    feeds = {"a": np.ones((m, k), np.float32), "b": np.ones((k, n), np.float32)}
    return lambda: compute.run(exe, feeds)


def _alternating(first, second, budget_s: float, least: int = 5) -> tuple[float, float]:
    """Mean seconds per call of `first` and of `second`, called in turn for `budget_s` after a warm-up of each, in
    CPU time of this process: a factor is a ratio of the two, which time spent waiting for a core shared with other
    work would only blur (the GEMM rate priced with it is the wall-clock one of Plugin.measure)."""
    first(), second()
    times: tuple[list[float], list[float]] = ([], [])
    end = time.perf_counter() + budget_s
    while len(times[1]) < least or time.perf_counter() < end:
        for call, into in ((first, times[0]), (second, times[1])):
            began = time.process_time()
            call()
            into.append(time.process_time() - began)
    return statistics.fmean(times[0]), statistics.fmean(times[1])
