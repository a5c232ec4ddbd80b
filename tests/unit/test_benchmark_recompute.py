"""The recompute benchmark measures MindSpore's sample with exactly the tutorial's one-line change."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import recompute


def test_the_recompute_variant_is_the_sample_plus_the_tutorials_line():
    plain, call = recompute.sample_source(False)
    changed, same_call = recompute.sample_source(True)
    assert call == same_call == recompute.RUN_LINE
    assert changed.replace(recompute.RECOMPUTE_LINE, "") == plain
    assert changed.count("b.recompute()") == 1 and "b.recompute()" not in plain
    assert "grad_network = AutoParallel(grad_network" in plain  # everything up to the call is set up
