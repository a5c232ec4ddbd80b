"""SDK tests run against the daemon embedded in the test process (a world of 1), one ONNX Runtime thread."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TESSEL_THREADS", "1")


@pytest.fixture(autouse=True)
def fresh_context(tmp_path, monkeypatch):
    """Every test starts in GRAPH_MODE with default parallel settings, seed 0 and a private dataset cache."""
    import tessel as ms

    monkeypatch.setenv("TESSEL_CACHE", str(tmp_path / "cache"))
    ms.set_context(mode=ms.GRAPH_MODE, save_graphs=False)
    ms.reset_auto_parallel_context()
    ms.set_seed(0)
    yield
    ms.set_context(mode=ms.GRAPH_MODE, save_graphs=False)
    ms.reset_auto_parallel_context()
    from tessel.dataset import config

    config.set_seed(config.DEFAULT_SEED)  # set_seed also seeded the dataset; leave it as other tests expect
