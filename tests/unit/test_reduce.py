"""The reduce ops of tessel.core.collectives: numeric ops against numpy, bool as logic, clear refusals."""

from __future__ import annotations

import numpy as np
import pytest

from tessel.core import collectives
from tessel.core.errors import ConfigurationError
from tessel.core.plugin import COLLECTIVE_DTYPES, REDUCE_OPS

NUMERIC = [d for d in COLLECTIVE_DTYPES if d != np.bool_]


def _combine_all(operands: list[np.ndarray], op: str) -> np.ndarray:
    out = operands[0].copy()
    for operand in operands[1:]:
        collectives.reduce_into(out, operand, op)
    collectives.finish(out, op, len(operands))
    return out


@pytest.mark.parametrize("dtype", NUMERIC, ids=str)
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_numeric_ops_match_numpy(dtype, op):
    rng = np.random.default_rng(7)
    operands = [rng.integers(-3, 4, size=11).astype(dtype) for _ in range(4)]
    expected = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op](np.stack(operands), axis=0)
    result = _combine_all(operands, op)
    assert result.dtype == dtype
    np.testing.assert_array_equal(result, expected.astype(dtype))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_mean_divides_the_sum_by_the_group_size(dtype):
    operands = [np.array([1.0, 2.0, -3.0], dtype), np.array([2.0, 2.0, 0.0], dtype), np.array([0.0, 5.0, 0.0], dtype)]
    result = _combine_all(operands, "mean")
    assert result.dtype == np.dtype(dtype)
    np.testing.assert_allclose(result, np.array([1.0, 3.0, -1.0]), rtol=1e-3)


def test_bool_follows_logic():
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    assert _combine_all([a, b], "sum").tolist() == [True, True, True, False]  # or
    assert _combine_all([a, b], "max").tolist() == [True, True, True, False]  # or
    assert _combine_all([a, b], "prod").tolist() == [True, False, False, False]  # and
    assert _combine_all([a, b], "min").tolist() == [True, False, False, False]  # and
    assert collectives.ufunc(np.dtype(bool), "sum") is np.logical_or
    assert collectives.ufunc(np.dtype(bool), "prod") is np.logical_and


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_mean_of_integers_or_bools_is_refused(dtype):
    with pytest.raises(ConfigurationError, match="'mean' needs a floating dtype") as caught:
        collectives.check(np.dtype(dtype), "mean")
    assert "cast to float32" in str(caught.value)


@pytest.mark.parametrize("dtype", ["complex64", "uint8", "float128" if hasattr(np, "float128") else "int16"])
def test_unsupported_dtypes_are_named_with_the_supported_ones(dtype):
    with pytest.raises(ConfigurationError, match=f"do not support dtype {np.dtype(dtype)}") as caught:
        collectives.check(np.dtype(dtype))
    assert "float32" in str(caught.value) and "Cast" in str(caught.value)


def test_unknown_op_is_refused_and_known_ones_pass():
    with pytest.raises(ConfigurationError, match="unknown reduce op 'avg'"):
        collectives.check(np.dtype("float32"), "avg")
    for dtype in COLLECTIVE_DTYPES:
        for op in REDUCE_OPS:
            if op == "mean" and dtype.kind != "f":
                continue
            collectives.check(dtype, op)  # no error


def test_reduce_into_works_in_place_and_leaves_the_operand_alone():
    out, operand = np.array([1, 5, 3], np.int32), np.array([4, 2, 3], np.int32)
    before = out.__array_interface__["data"][0]
    collectives.reduce_into(out, operand, "max")
    assert out.tolist() == [4, 5, 3] and operand.tolist() == [4, 2, 3]
    assert out.__array_interface__["data"][0] == before
