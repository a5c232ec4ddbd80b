"""Op-by-op execution (PYNATIVE_MODE): same semantics as graph mode, one compiled executable per signature."""

from __future__ import annotations

import numpy as np
import pytest
from compiler_testkit import compute

from tessel.compiler.eager import EagerExecutor
from tessel.compiler.errors import ShapeInferenceError


def test_runs_ops_on_numpy_and_caches_per_signature():
    eager = EagerExecutor(compute())
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(eager.run("MatMul", a, b, transpose_b=True), a @ b.T)
    eager.run("MatMul", a + 1, b, transpose_b=True)
    assert len(eager) == 1  # same op, attributes and input types: one executable
    eager.run("MatMul", np.ones((5, 3), np.float32), b, transpose_b=True)
    assert len(eager) == 2


def test_scalars_are_weak_and_part_of_the_signature():
    eager = EagerExecutor(compute())
    x = np.array([1.5, 2.5], np.float32)
    doubled = eager.run("Mul", x, 2)
    assert doubled.dtype == np.float32 and np.array_equal(doubled, x * 2)
    np.testing.assert_array_equal(eager.run("Mul", x, 3), x * 3)  # a different constant, not a stale cache hit
    counts = eager.run("Add", np.array([1, 2], np.int32), 1.5)
    assert counts.dtype == np.float32 and np.array_equal(counts, [2.5, 3.5])


def test_multi_output_ops_return_tuples_and_errors_are_the_graph_mode_ones():
    eager = EagerExecutor(compute())
    parts = eager.run("Split", np.arange(6, dtype=np.float32), output_num=3)
    assert isinstance(parts, tuple) and [p.tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ShapeInferenceError, match=r"Add\(f32\[2\], f32\[3\]\).*do not broadcast"):
        eager.run("Add", np.ones(2, np.float32), np.ones(3, np.float32))


def test_cache_is_bounded():
    eager = EagerExecutor(compute(), cache_size=2)
    for n in range(1, 5):
        eager.run("Neg", np.ones(n, np.float32))
    assert len(eager) == 2
