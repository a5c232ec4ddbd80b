"""Shared fixtures: a private Arrow cache per test, the default seed restored, small MNIST folders on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from dataset_testkit import write_mnist

from tessel.dataset import config


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "tessel-cache"
    monkeypatch.setenv("TESSEL_CACHE", str(cache))
    yield cache
    config.set_seed(config.DEFAULT_SEED)


@pytest.fixture
def mnist_dir(tmp_path: Path) -> tuple[Path, dict]:
    folder = tmp_path / "mnist"
    return folder, write_mnist(folder, train=10, test=4)
