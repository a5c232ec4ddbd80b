"""tessel.dataset — MindSpore's dataset API on Apache Arrow.

Write `import tessel.dataset as ds` where MindSpore scripts write `import mindspore.dataset as ds`:

>>> import numpy as np
>>> import tessel.dataset as ds
>>> data = ds.NumpySlicesDataset({"image": np.zeros((4, 2, 2, 1), np.uint8), "label": np.arange(4)}, shuffle=False)
>>> data = data.map([ds.vision.Rescale(1.0 / 255.0, 0), ds.vision.HWC2CHW()], "image").batch(2)
>>> [image.shape for image, label in data.create_tuple_iterator(output_numpy=True)]
[(2, 1, 2, 2), (2, 1, 2, 2)]
"""

from collections.abc import Sequence

from tessel.dataset import config, transforms, vision
from tessel.dataset.core import Dataset
from tessel.dataset.files import ArrowDataset, ParquetDataset
from tessel.dataset.generator import GeneratorDataset
from tessel.dataset.parallel import shard_batch, shard_options
from tessel.dataset.reader import ShardReader
from tessel.dataset.sources import Cifar10Dataset, MnistDataset, NumpySlicesDataset
from tessel.dataset.spec import from_spec


def zip(datasets: Sequence[Dataset]) -> Dataset:
    """Rows of several datasets side by side (`ds.zip((a, b))`)."""
    first, *others = datasets
    return first.zip(others)


# MindSpore's sources, samplers and schema tessel does not map yet: each name raises NotSupportedYetError.
_NOT_YET = frozenset(
    {
        "CSVDataset", "CelebADataset", "Cifar100Dataset", "CocoDataset", "DistributedSampler", "ImageFolderDataset",
        "ManifestDataset", "MindDataset", "PKSampler", "PaddedDataset", "RandomSampler", "Schema", "SequentialSampler",
        "SubsetRandomSampler", "SubsetSampler", "TFRecordDataset", "TextFileDataset", "VOCDataset",
        "WeightedRandomSampler",
    }
)  # fmt: skip


def __getattr__(name: str):
    if name in _NOT_YET:
        from tessel.core.options import not_supported_yet

        raise not_supported_yet(
            f"mindspore.dataset.{name}",
            "tessel's sources are NumpySlicesDataset, GeneratorDataset, MnistDataset, Cifar10Dataset, ArrowDataset "
            "and ParquetDataset (shards by num_shards/shard_id, not samplers)",
        )
    raise AttributeError(f"module 'tessel.dataset' has no attribute {name!r}")


__all__ = [
    "ArrowDataset",
    "Cifar10Dataset",
    "Dataset",
    "GeneratorDataset",
    "MnistDataset",
    "NumpySlicesDataset",
    "ParquetDataset",
    "ShardReader",
    "config",
    "from_spec",
    "shard_batch",
    "shard_options",
    "transforms",
    "vision",
    "zip",
]
