"""Memory stays flat across epochs: the source is a memory-mapped Arrow file and blocks are freed as they pass."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest
from dataset_testkit import write_mnist

import tessel.dataset as ds


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc to read the resident set size")
def test_resident_memory_is_flat_over_twenty_epochs(tmp_path: Path):
    write_mnist(tmp_path / "mnist", train=6000, test=0)  # 4.7 MB of images
    data = ds.MnistDataset(tmp_path / "mnist", num_shards=2, shard_id=1)
    data = data.map([ds.vision.Rescale(1.0 / 255.0, 0), ds.vision.Normalize((0.1307,), (0.3081,)), ds.vision.HWC2CHW()])
    data = data.map(ds.transforms.TypeCast(np.int32), "label").batch(32)
    iterator = data.create_tuple_iterator(num_epochs=21, output_numpy=True)
    for _ in iterator:  # the first epoch maps the file's pages in
        pass
    gc.collect()
    after_first = resident_bytes()
    total = 0
    for _ in range(20):
        for image, label in iterator:
            total += int(label.sum() >= 0) + 0 * image.size
    gc.collect()
    growth = resident_bytes() - after_first
    assert total == 20 * data.get_dataset_size()
    assert growth < 2 * 1024 * 1024, f"resident memory grew by {growth / 2**20:.1f} MiB over 20 epochs"
