"""An MNIST-format digits dataset made offline from scikit-learn's bundled 8x8 digits (no download).

Each output image picks a source digit and draws it into 28x28 through a random affine map (rotation, scale,
shear, shift) plus a smooth elastic displacement field, then adds a little pixel noise — the usual MNIST-style
augmentations, kept mild so that classes stay recognisable. The test split draws only from source digits held out
of the train split (a fifth of the 1797, chosen by a fixed permutation), so test accuracy measures generalisation to
unseen handwriting, not recall of augmented training images. Everything is seeded: the same arguments give
byte-identical files. Files use the standard MNIST names and IDX layout, so `MnistDataset` reads them exactly as it
reads real MNIST.

>>> import tempfile
>>> out = write_mnist_digits(tempfile.mkdtemp(), train=100, test=20)
>>> sorted(p.name for p in out)
['t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte', 'train-images-idx3-ubyte', 'train-labels-idx1-ubyte']
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from tessel.dataset.formats import write_idx

IMAGE_SIZE = 28
_DIGIT_BOX = 20.0  # MNIST digits fill a 20x20 box centred in the 28x28 image
_CHUNK = 1000
_UPSAMPLE = 4


@functools.lru_cache(maxsize=1)
def _source_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 8x8 digits upsampled 4x with cubic splines (smooth strokes), pixel values 0..255."""
    from scipy.ndimage import zoom
    from sklearn.datasets import load_digits

    digits = load_digits()
    # Image by image: a 3-D zoom would also run the spline filter across the 1797 images (10x slower).
    smooth = np.stack(
        [
            zoom(image * (255.0 / 16.0), _UPSAMPLE, order=3, grid_mode=True, mode="grid-constant")
            for image in digits.images
        ]
    )
    return np.clip(smooth, 0, 255).astype(np.float32), digits.target.astype(np.uint8)


def _sample_coordinates(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Source-image (row, col) coordinates of every output pixel for `count` random warps."""
    from scipy.ndimage import gaussian_filter

    centre = (IMAGE_SIZE - 1) / 2.0
    grid_y, grid_x = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float64) - centre
    # Elastic field: smoothed uniform noise, a few pixels of displacement (Simard et al. 2003).
    smooth = (0, 4.0, 4.0)
    alpha = rng.uniform(6.0, 10.0, size=(count, 1, 1))
    dy = gaussian_filter(rng.uniform(-1, 1, (count, IMAGE_SIZE, IMAGE_SIZE)), smooth) * alpha
    dx = gaussian_filter(rng.uniform(-1, 1, (count, IMAGE_SIZE, IMAGE_SIZE)), smooth) * alpha
    y, x = grid_y + dy, grid_x + dx
    angle = np.deg2rad(rng.uniform(-10, 10, count))[:, None, None]
    scale = (8.0 / _DIGIT_BOX) / rng.uniform(0.9, 1.1, count)[:, None, None]
    shear = rng.uniform(-0.1, 0.1, count)[:, None, None]
    shift_y, shift_x = (rng.uniform(-1.5, 1.5, (2, count)) * (8.0 / _DIGIT_BOX))[:, :, None, None]
    cos, sin = np.cos(angle), np.sin(angle)
    src_y = scale * (cos * y - sin * x) + 3.5 + shift_y
    src_x = scale * (sin * y + cos * x + shear * y) + 3.5 + shift_x
    # From 8x8 pixel units to the upsampled image's (pixel-area aligned, as zoom(grid_mode=True) samples).
    return (src_y + 0.5) * _UPSAMPLE - 0.5, (src_x + 0.5) * _UPSAMPLE - 0.5


HELD_OUT = 0.2  # share of the source digits only the test split draws from


def _sources(split: str) -> np.ndarray:
    """Indices of the source digits a split draws from: "test" the held-out fifth, "train" the rest."""
    _, targets = _source_digits()
    order = np.random.default_rng(7).permutation(len(targets))
    cut = int(len(targets) * HELD_OUT)
    return np.sort(order[:cut] if split == "test" else order[cut:])


def make_digits(count: int, seed: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """`count` augmented 28x28 uint8 digit images of `split`'s source digits and their uint8 labels (balanced)."""
    from scipy.ndimage import map_coordinates

    images_8x8, targets = _source_digits()
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(count) % 10).astype(np.uint8)
    pool = _sources(split)
    by_class = [pool[targets[pool] == c] for c in range(10)]
    picks = np.array([rng.choice(by_class[c]) for c in labels])
    out = np.empty((count, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    for start in range(0, count, _CHUNK):
        chosen = picks[start : start + _CHUNK]
        src_y, src_x = _sample_coordinates(rng, len(chosen))
        layer = np.broadcast_to(np.arange(len(chosen), dtype=np.float64)[:, None, None], src_y.shape)
        warped = map_coordinates(images_8x8[chosen], [layer, src_y, src_x], order=1, cval=0.0)
        warped += rng.normal(0.0, 6.0, warped.shape) * (warped > 8)
        out[start : start + len(chosen)] = np.clip(np.rint(warped), 0, 255).astype(np.uint8)
    return out, labels


def write_mnist_digits(
    out_dir: str | os.PathLike, train: int = 10000, test: int = 2000, seed: int = 0, compress: bool = False
) -> list[Path]:
    """Write train-/t10k- images and labels IDX files into `out_dir`; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if compress else ""
    written = []
    for prefix, count, split_seed, split in (("train", train, seed, "train"), ("t10k", test, seed + 1_000_003, "test")):
        images, labels = make_digits(count, split_seed, split)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            path = out / f"{prefix}-{kind}-ubyte{suffix}"
            write_idx(path, array, compress=compress)
            written.append(path)
    return written
