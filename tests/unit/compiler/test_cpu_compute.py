"""CpuCompute: the ComputePlugin on ONNX Runtime's CPU EP (sessions, feeds, bindings, the shared thread pool)."""

from __future__ import annotations

import numpy as np
import pytest

from tessel.compiler.builder import apply
from tessel.compiler.lower_onnx import to_onnx
from tessel.compiler.tracer import TensorSpec, trace
from tessel.core.errors import ConfigurationError
from tessel.core.plugin import ComputePlugin
from tessel.plugins.cpu import CpuPlugin
from tessel.plugins.cpu.compute import CpuCompute


def model(fn, *specs) -> bytes:
    return to_onnx(trace(fn, *specs).graph).SerializeToString()


AFFINE = model(lambda x, w: (apply("MatMul", x, w), x.sum()), TensorSpec(("N", 3)), TensorSpec((3, 2)))


@pytest.fixture(scope="module")
def compute():
    return CpuCompute(threads=1)


def test_is_the_cpu_plugins_compute_and_shares_one_thread_pool(compute):
    assert isinstance(compute, ComputePlugin)
    assert isinstance(CpuPlugin().compute, CpuCompute)
    # The process-wide pool is created once; later instances report its actual size.
    assert CpuCompute(threads=2).threads == compute.threads


def test_sessions_are_cached_by_model_content(compute):
    assert compute.compile(AFFINE) is compute.compile(bytes(AFFINE))
    assert compute.compile(AFFINE) is not compute.compile(model(lambda x: x * 2.0, TensorSpec((2,))))


def test_the_cache_keeps_the_models_used_last_and_no_more(monkeypatch):
    # a long-running daemon compiles models job after job: the least recently used go, by count and by bytes
    monkeypatch.setattr("tessel.plugins.cpu.compute.CACHED_SESSIONS", 2)
    compute = CpuCompute(threads=1)
    models = [model(lambda x, k=k: x * float(k), TensorSpec((2,))) for k in range(3)]
    first = compute.compile(models[0])
    compute.compile(models[1])
    assert compute.compile(models[0]) is first  # used last now: models[1] goes next
    compute.compile(models[2])
    assert len(compute._sessions) == 2 and compute.compile(models[0]) is first
    monkeypatch.setattr("tessel.plugins.cpu.compute.CACHED_MODEL_BYTES", len(models[0]) + len(models[1]) - 1)
    compute.compile(models[1])  # over the bytes: only the newest stays
    assert list(compute._sessions) == [compute.compile(models[1]).key]


def test_one_session_runs_any_batch_size(compute):
    exe = compute.compile(AFFINE)
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    for batch in (1, 9):
        x = np.ones((batch, 3), np.float32)
        y, total = compute.run(exe, {"x": x, "w": w})
        np.testing.assert_array_equal(y, x @ w)
        assert total == batch * 3


def test_feed_errors_name_the_input(compute):
    exe = compute.compile(AFFINE)
    w = np.zeros((3, 2), np.float32)
    with pytest.raises(ConfigurationError, match=r"input 'x' must be float32, got float64; convert it"):
        compute.run(exe, {"x": np.zeros((2, 3)), "w": w})
    with pytest.raises(ConfigurationError, match=r"input 'w' must have shape \(3, 2\), got \(2, 3\)"):
        compute.run(exe, {"x": np.zeros((2, 3), np.float32), "w": w.T.copy()})
    with pytest.raises(ConfigurationError, match=r"missing model input\(s\) \['w'\]"):
        compute.run(exe, {"x": np.zeros((2, 3), np.float32)})
    with pytest.raises(ConfigurationError, match="the model has no input 'z'"):
        compute.run(exe, {"x": np.zeros((2, 3), np.float32), "w": w, "z": w})


def test_a_model_runtime_rejects_is_a_clear_error(compute):
    with pytest.raises(ConfigurationError, match="ONNX Runtime rejected the model"):
        compute.compile(b"not a model")


def test_a_kernel_onnx_runtime_lacks_is_not_supported_yet_naming_the_op(compute):
    from onnx import TensorProto, helper

    from tessel.core.errors import NotSupportedYetError

    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2])
    graph = helper.make_graph([helper.make_node("Erf", ["x"], ["y"])], "erf64", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(NotSupportedYetError, match="not supported yet: Erf for these input dtypes on the CPU plugin"):
        compute.compile(model.SerializeToString())


def test_binding_writes_outputs_into_caller_buffers(compute):
    exe = compute.compile(AFFINE)
    binding = compute.bind(exe)
    x, w = np.ones((4, 3), np.float32), np.full((3, 2), 0.5, np.float32)
    out = np.empty((4, 2), np.float32)
    binding.input("x", x)
    binding.input("w", w)
    binding.output(exe.output_names[0], out)
    binding.output(exe.output_names[1])  # allocated by the runtime, returned by run()
    (total,) = binding.run()
    np.testing.assert_array_equal(out, x @ w)
    assert total == 12
    w[...] = 2.0  # bound inputs are read in place on every run
    binding.run()
    np.testing.assert_array_equal(out, x @ w)
    with pytest.raises(ConfigurationError, match="already bound"):
        binding.output(exe.output_names[0], out)
    with pytest.raises(ConfigurationError, match="must be float32, got float64"):
        compute.bind(exe).output(exe.output_names[0], np.empty((4, 2)))
    with pytest.raises(ConfigurationError, match="C-contiguous"):
        compute.bind(exe).input("w", np.ones((2, 3), np.float32).T)


def test_outputs_of_static_shape_come_back_as_new_arrays_on_every_run(compute):
    exe = compute.compile(AFFINE)
    binding = compute.bind(exe)
    x = np.ones((2, 3), np.float32)
    binding.input("x", x)
    binding.input("w", np.ones((3, 2), np.float32))
    binding.output(exe.output_names[0])  # (N, 2): allocated by the runtime
    binding.output(exe.output_names[1])  # a scalar: a fresh numpy array per run
    y1, total1 = binding.run()
    x[...] = 2.0
    y2, total2 = binding.run()
    assert (total1, total2) == (6, 12) and total1 is not total2
    np.testing.assert_array_equal(y1, np.full((2, 2), 3.0))
    np.testing.assert_array_equal(y2, np.full((2, 2), 6.0))


def test_a_binding_runs_again_with_another_batch_size():
    from tessel.compiler import TensorSpec, apply, model_bytes, trace

    traced = trace(lambda x: apply("ReLU", x) * 2.0, TensorSpec(("N", 3)))
    compute = CpuCompute(threads=1)
    exe = compute.compile(model_bytes(traced.graph))
    binding = compute.bind(exe)
    binding.output(exe.output_names[0])
    for rows in (4, 2, 5):
        x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) - 4
        binding.input(exe.input_names[0], x)
        (y,) = binding.run()
        np.testing.assert_array_equal(y, np.maximum(x, 0) * 2)


def _faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _resident_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


# A model of large tensors (an 8 MiB input: compute.LARGE_TENSOR_BYTES) whose intermediates are 8 MiB too.
LARGE = model(lambda x: (x * 2.0 + 1.0).sum(), TensorSpec((2048, 1024)))


def test_a_large_models_intermediates_are_reused_run_after_run_not_mapped_anew(compute):
    # Taken from the system, an 8 MiB intermediate is mapped anew every run: 2048 page faults, each ~2.6 us here.
    exe = compute.compile(LARGE)
    binding = compute.bind(exe)
    x = np.ones((2048, 1024), np.float32)
    binding.input(exe.input_names[0], x)
    binding.output(exe.output_names[0])
    for _ in range(3):  # the shared arena grows to what one run needs
        binding.run()
    before = _faults()
    for _ in range(5):
        (total,) = binding.run()
    assert float(total) == 3.0 * x.size
    assert (_faults() - before) / 5 < 256, "a run of a large model faulted its intermediates in afresh"


def test_release_memory_gives_the_shared_arenas_free_blocks_back():
    # In a process of its own, as a daemon is: what earlier tests left in this one's arena would blur the figure.
    import subprocess
    import sys

    script = """
import numpy as np
from tessel.compiler.builder import apply
from tessel.compiler.lower_onnx import to_onnx
from tessel.compiler.tracer import TensorSpec, trace
from tessel.plugins.cpu.compute import CpuCompute

def resident():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))

compute = CpuCompute(threads=1)
traced = trace(lambda x: (x * 2.0 + 1.0).sum(), TensorSpec((2048, 1024)))
exe = compute.compile(to_onnx(traced.graph).SerializeToString())
x = np.ones((2048, 1024), np.float32)
(total,) = compute.run(exe, {exe.input_names[0]: x})
assert float(total) == 3.0 * x.size
held = resident()
compute.release_memory()
released = held - resident()
(total,) = compute.run(exe, {exe.input_names[0]: x * 2.0})  # and the arena grows again
assert float(total) == 5.0 * x.size
print(released)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) >= 6.0, "the arena kept its free 8 MiB blocks"


def test_runs_at_ever_new_batch_sizes_do_not_pile_up_in_the_shared_arena(compute):
    # The arena grows by what a run asks and cannot merge blocks: a batch growing 64 rows at a time left every
    # size's intermediates behind (measured +158 MiB; the last run's input and intermediates are ~24 MiB, and
    # +55 MiB with the release); a run at new shapes now starts from a released arena.
    grow = model(lambda x, w: (x * 2.0 + 1.0).sum() + w.sum(), TensorSpec(("N", 2048)), TensorSpec((1024, 2048)))
    exe = compute.compile(grow)
    assert exe.shared_arena  # w is 8 MiB: a model of large tensors
    binding = compute.bind(exe)
    binding.output(exe.output_names[0])
    w = np.zeros((1024, 2048), np.float32)
    binding.input(exe.input_names[1], w)
    compute.release_memory()
    start = _resident_mib()
    for rows in range(64, 1025, 64):
        x = np.ones((rows, 2048), np.float32)
        binding.input(exe.input_names[0], x)
        (total,) = binding.run()
        assert float(total) == 3.0 * x.size
        del x
    assert _resident_mib() - start < 90.0, "every batch size's intermediates stayed in the arena"
