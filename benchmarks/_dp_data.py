"""The synthetic data both sides of benchmarks/data_parallel.py train on (numpy only, so DDP ranks need no tessel)."""

from __future__ import annotations

import numpy as np

IMAGE = (1, 28, 28)


def synthetic(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-shaped normalised images and int32 labels that a fixed linear map of the image decides (learnable)."""
    rng = np.random.default_rng(1234)
    images = rng.standard_normal((rows, *IMAGE), dtype=np.float32)
    projection = rng.standard_normal((int(np.prod(IMAGE)), 10)).astype(np.float32)
    labels = (images.reshape(rows, -1) @ projection).argmax(1).astype(np.int32)
    return images, labels
