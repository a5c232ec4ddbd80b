"""ops.NeighborExchangeV2 (MindSpore's 2-D halo exchange) on real daemons: scripts/halo_exchange.py checks the
eager call, a GRAPH_MODE Cell and the gradient on every rank of a grid against a float64 numpy reference (the
output is a window of the zero-padded global image; the gradient sums the windows' weights). Argument errors are
checked without a cluster."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessel as ms
from tessel import ops
from tessel.core.errors import ConfigurationError
from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "halo_exchange.py"
NONE = [-1] * 8


@pytest.mark.slow
@pytest.mark.parametrize(
    ("n", "rows", "cols", "padding"),
    [(2, 2, 1, "fit"), (2, 1, 2, "zeros"), (4, 2, 2, "fit"), (4, 2, 2, "zeros")],
)
def test_halo_exchange_matches_numpy_forward_and_backward(tmp_path, n, rows, cols, padding):
    args = ["run", "-n", str(n), str(SCRIPT), str(rows), str(cols), padding]
    result = run_tessel(args, tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(n):
        out = rank_log(tmp_path, rank).read_text()
        assert re.search(rf"halo ok on rank {rank} of {n}: 3 checks", out), out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"send_rank_ids": [-1] * 7}, "list of 8 rank ids"),
        ({"recv_rank_ids": [1, -2, -1, -1, -1, -1, -1, -1]}, "list of 8 rank ids"),
        ({"send_rank_ids": [1, -1, -1, -1, 1, -1, -1, -1]}, "names a rank twice"),
        ({"send_lens": [0, 1, 0]}, "4 non-negative lengths"),
        ({"recv_lens": [0, -1, 0, 0]}, "4 non-negative lengths"),
        ({"data_format": "NHWC"}, "only 'NCHW'"),
        ({"group": 3}, "group must be a group name"),
    ],
)
def test_bad_arguments_name_the_rule(kwargs, message):
    args = {"send_rank_ids": NONE, "recv_rank_ids": NONE, "send_lens": [0] * 4, "recv_lens": [0] * 4} | kwargs
    with pytest.raises(ConfigurationError, match=message):
        ops.NeighborExchangeV2(**args)


def test_bad_inputs_are_refused_before_any_communication():
    bottom = [-1, -1, -1, -1, 1, -1, -1, -1]
    halo = ops.NeighborExchangeV2(bottom, bottom, [0, 3, 0, 0], [0, 3, 0, 0])
    with pytest.raises(ConfigurationError, match="not NCHW"):
        halo(ms.Tensor(np.zeros((2, 4, 4), np.float32)))
    with pytest.raises(ConfigurationError, match="exceed the input's H=2"):
        halo(ms.Tensor(np.zeros((1, 1, 2, 4), np.float32)))
    send_only = ops.NeighborExchangeV2(bottom, NONE, [0, 1, 0, 0], [0, 0, 0, 0])
    with pytest.raises(ConfigurationError, match="receives from no one"):
        send_only(ms.Tensor(np.zeros((1, 1, 2, 4), np.float32)))


def test_no_neighbours_is_the_identity():
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    out = ops.NeighborExchangeV2(NONE, NONE, [1, 1, 1, 1], [0, 0, 0, 0])(ms.Tensor(x))
    np.testing.assert_array_equal(out.asnumpy(), x)
