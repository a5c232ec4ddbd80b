"""Samples/s of the seed tutorials' MNIST pipeline vs a plain numpy loop doing the same work, on one core.

Usage: python benchmarks/data_pipeline.py [--data DIR] [--epochs N] [--batch 32] [--core K]

Both sides read uint8 MNIST rows in a shuffled order, Rescale(1/255) + Normalize(0.1307, 0.3081) in float32,
HWC -> CHW, cast labels to int32 and hand out batches of 32 — tessel through `ds.MnistDataset(...).map(...).batch()`
(as the seeds write it), the peer as the shortest numpy loop over arrays already in memory. Threads are pinned to
one core (OMP/BLAS threads = 1, CPU affinity). Without --data, an MNIST-format digits set (12000 rows) is generated
into a temporary folder first. Prints both figures and their ratio.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

MEAN, STD = 0.1307, 0.3081


def tessel_pipeline(data_dir: str, batch_size: int):
    import tessel.dataset as ds

    dataset = ds.MnistDataset(data_dir)
    image_transforms = [
        ds.vision.Rescale(1.0 / 255.0, 0),
        ds.vision.Normalize(mean=(MEAN,), std=(STD,)),
        ds.vision.HWC2CHW(),
    ]
    dataset = dataset.map(image_transforms, "image")
    dataset = dataset.map(ds.transforms.TypeCast(np.int32), "label")
    return dataset.batch(batch_size)


def run_tessel(dataset, epochs: int) -> tuple[float, int]:
    iterator = dataset.create_tuple_iterator(num_epochs=epochs, output_numpy=True)
    samples, start = 0, time.perf_counter()
    for _ in range(epochs):
        for image, _label in iterator:
            samples += len(image)
    return time.perf_counter() - start, samples


def load_numpy(data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    from tessel.dataset.formats import find_idx_file, read_idx

    folder = Path(data_dir)
    pairs = [
        (find_idx_file(folder, p, "images-idx3"), find_idx_file(folder, p, "labels-idx1")) for p in ("train", "t10k")
    ]
    images = np.concatenate([read_idx(i) for i, _ in pairs if i])[..., None]
    labels = np.concatenate([read_idx(lbl) for _, lbl in pairs if lbl]).astype(np.uint32)
    return images, labels


def run_numpy(images: np.ndarray, labels: np.ndarray, batch_size: int, epochs: int) -> tuple[float, int]:
    scale, mean, std = np.float32(1.0 / 255.0), np.float32(MEAN), np.float32(STD)
    rng = np.random.default_rng(0)
    samples, start = 0, time.perf_counter()
    for _ in range(epochs):
        order = rng.permutation(len(images))
        for first in range(0, len(order), batch_size):
            rows = order[first : first + batch_size]
            image = images[rows].astype(np.float32) * scale
            image = (image - mean) / std
            image = np.ascontiguousarray(image.transpose(0, 3, 1, 2))
            label = labels[rows].astype(np.int32)
            samples += len(image) if len(label) == len(image) else 0
    return time.perf_counter() - start, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="MNIST folder (default: generate digits into a temporary folder)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per timed round (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is reported")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--core", type=int, default=0, help="CPU core to pin to")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.core})
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("TESSEL_CACHE", str(Path(tmp) / "cache"))
        data_dir = args.data
        if data_dir is None:
            from tessel.dataset.digits import write_mnist_digits

            data_dir = str(Path(tmp) / "digits")
            write_mnist_digits(data_dir)
        dataset = tessel_pipeline(data_dir, args.batch)
        run_tessel(dataset, 1)  # warm-up: builds the Arrow cache and maps its pages
        images, labels = load_numpy(data_dir)
        tessel_rates, numpy_rates = [], []
        for _ in range(args.rounds):
            seconds, samples = run_tessel(dataset, args.epochs)
            tessel_rates.append(samples / seconds)
            seconds, samples = run_numpy(images, labels, args.batch, args.epochs)
            numpy_rates.append(samples / seconds)
    tessel_rate, numpy_rate = float(np.median(tessel_rates)), float(np.median(numpy_rates))
    print(
        f"pipeline: MnistDataset ({len(images)} rows) + Rescale + Normalize + HWC2CHW + TypeCast + batch {args.batch}"
    )
    print(f"one core, {args.rounds} rounds of {args.epochs} epochs, medians")
    print(f"tessel.dataset  {tessel_rate:12,.0f} samples/s")
    print(f"numpy loop      {numpy_rate:12,.0f} samples/s")
    print(f"ratio tessel/numpy: {tessel_rate / numpy_rate:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
