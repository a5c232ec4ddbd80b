"""Helpers for SDK tests: float64 numpy references and central finite differences."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def finite_difference(fn: Callable[[], float], array: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d fn / d array by central differences, perturbing `array` (float64) in place."""
    grad = np.zeros_like(array, dtype=np.float64)
    for index in np.ndindex(array.shape):
        saved = array[index]
        array[index] = saved + eps
        up = fn()
        array[index] = saved - eps
        down = fn()
        array[index] = saved
        grad[index] = (up - down) / (2 * eps)
    return grad


def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = z - z.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(-log_softmax(logits.astype(np.float64))[np.arange(len(labels)), labels].mean())


def rand(*shape: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def np_conv2d(x, w, b=None, stride=1, pad=(0, 0, 0, 0)):
    """NCHW convolution with OIHW weights; pad = (top, bottom, left, right)."""
    x = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[1]), (pad[2], pad[3])))
    windows = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    out = np.einsum("nchwij,ocij->nohw", windows, w)
    return out if b is None else out + b[None, :, None, None]
