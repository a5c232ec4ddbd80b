"""Helpers shared by the dataset tests (a uniquely named module, importable from every test file here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tessel.dataset.formats import write_idx


def write_mnist(folder: Path, train: int, test: int = 0, seed: int = 0, compress: bool = False) -> dict:
    """Random MNIST-format files; returns the arrays written (images (n, 28, 28) uint8, labels (n,) uint8)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    suffix = ".gz" if compress else ""
    for prefix, count in (("train", train), ("t10k", test)):
        if not count:
            continue
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, count, dtype=np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", images, compress=compress)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", labels, compress=compress)
        written[prefix] = (images, labels)
    return written
