"""How a rank's input is taken from the data: dataset shards, `full_batch` and `dataset_strategy` slicing.

The SDK's auto-parallel context calls these:

* data parallel (the default): each rank reads its own shard — `shard_options(False, rank, device_num)` gives the
  `num_shards` / `shard_id` to pass to a source;
* `full_batch=True` (or dataset_strategy "full_batch"): every rank reads the whole dataset and gets the global batch;
* `dataset_strategy=((s0, s1, ...), ...)`: every rank reads the global batch and keeps its slice of each input,
  input i cut into s_d equal parts along each dim d.

Ranks map to slices like MindSpore's VirtualDataset: the device matrix is the strategy with the repeat dimension
(device_num / prod(strategy)) on the left by default, so rank r holds slice `unravel(r mod prod(strategy))`;
`repeat_dim_right=True` (MindSpore's `dataset_repeat_dim_right`) puts it on the right: `unravel(r // repeat)`.

>>> import numpy as np
>>> x = np.arange(8).reshape(4, 2)
>>> shard_batch((x,), ((2, 1),), rank=1, device_num=2)[0].tolist()
[[4, 5], [6, 7]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError

Strategy = str | Sequence[Sequence[int]]


def shard_options(full_batch: bool, rank: int, device_num: int) -> dict[str, int | None]:
    """Keyword arguments for a source: its own shard in data parallel, everything with full_batch."""
    if full_batch or device_num == 1:
        return {"num_shards": None, "shard_id": None}
    return {"num_shards": device_num, "shard_id": rank}


def _resolve_strategy(strategy: Strategy, arrays: list[np.ndarray], device_num: int) -> list[tuple[int, ...]]:
    if strategy == "full_batch":
        return [(1,) * a.ndim for a in arrays]
    if strategy == "data_parallel":
        return [(device_num,) + (1,) * (a.ndim - 1) if a.ndim else () for a in arrays]
    if isinstance(strategy, str):
        raise ConfigurationError(
            f"dataset_strategy {strategy!r} is not 'full_batch', 'data_parallel' or a tuple of per-input tuples"
        )
    resolved = [tuple(int(v) for v in s) for s in strategy]
    if len(resolved) != len(arrays):
        raise ConfigurationError(
            f"dataset_strategy has {len(resolved)} entries but the batch has {len(arrays)} inputs; give one tuple per "
            f"input, e.g. (({device_num}, 1), ({device_num},)) for (image, label)"
        )
    return resolved


def _slice_input(index: int, array: np.ndarray, split: tuple[int, ...], rank: int, device_num: int, right: bool):
    where = f"dataset_strategy for input {index} (shape {array.shape})"
    if len(split) != array.ndim:
        raise ConfigurationError(f"{where}: {split} has {len(split)} entries, one per dim ({array.ndim}) is needed")
    parts = int(np.prod(split, dtype=np.int64))
    if any(s < 1 for s in split) or device_num % parts:
        raise ConfigurationError(
            f"{where}: {split} splits into {parts} parts, which must be >= 1 each and divide device_num={device_num}"
        )
    for dim, (size, s) in enumerate(zip(array.shape, split)):
        if size % s:
            raise ConfigurationError(
                f"{where}: dim {dim} of size {size} is not divisible by {s}; change the batch size or the strategy"
            )
    repeat = device_num // parts
    coords = np.unravel_index(rank // repeat if right else rank % parts, split) if parts > 1 else (0,) * array.ndim
    index_tuple = tuple(
        slice(int(c) * (size // s), (int(c) + 1) * (size // s)) for c, size, s in zip(coords, array.shape, split)
    )
    return array[index_tuple]


def shard_batch(
    batch: Sequence[Any] | Mapping[str, Any],
    strategy: Strategy,
    rank: int,
    device_num: int,
    repeat_dim_right: bool = False,
) -> Any:
    """This rank's slice of each input of a global batch (a tuple/list of arrays or a dict), same container type."""
    if not 0 <= rank < device_num:
        raise ConfigurationError(f"shard_batch: rank {rank} is not in [0, device_num={device_num})")
    names = list(batch) if isinstance(batch, Mapping) else None
    arrays = [np.asarray(v) for v in (batch.values() if isinstance(batch, Mapping) else batch)]
    splits = _resolve_strategy(strategy, arrays, device_num)
    sliced = [_slice_input(i, a, s, rank, device_num, repeat_dim_right) for i, (a, s) in enumerate(zip(arrays, splits))]
    if names is not None:
        return dict(zip(names, sliced))
    return type(batch)(sliced) if isinstance(batch, (tuple, list)) else sliced


# Between a sharded source and the batch op, only row-wise operations keep every shard's batches whole rows of its
# own windows; anything that counts or mixes rows (take, skip, repeat, zip, concat) would give shards different
# numbers of batches.
_ROW_WISE = ("MapDataset", "ProjectDataset", "RenameDataset", "ShuffleDataset")


def with_shares(dataset: Any, shares: Sequence[int], rank: int) -> Any:
    """Rank `rank`'s pipeline when the global batch is split unevenly by `shares` (rows per rank of each global
    batch; speed-aware data parallelism, `set_auto_parallel_context(batch_split=...)`): a copy of `dataset` whose
    sharded source reads this rank's rows of every global batch (`sampling.share_rows`) and whose batch op takes
    shares[rank] of them. Equal shares return `dataset` itself (MindSpore's shard rule, unchanged).

    The pipeline must read one source sharded over the ranks (num_shards = len(shares), shard_id = rank), batched
    once with batch_size = sum(shares) / len(shares) (MindSpore's per-rank batch), with only map / project / rename
    / shuffle in between; other pipelines raise "not supported yet", naming the part in the way.

    >>> import numpy as np
    >>> from tessel.dataset import NumpySlicesDataset
    >>> data = NumpySlicesDataset({"x": np.arange(12)}, shuffle=False, num_shards=2, shard_id=1).batch(3)
    >>> [b[0].tolist() for b in with_shares(data, (2, 4), 1).create_tuple_iterator(output_numpy=True)]
    [[1, 2, 4, 5], [7, 8, 10, 11]]
    """
    import copy
    import itertools

    from tessel.dataset.sampling import ShardShares

    shares = tuple(int(s) for s in shares)
    world = len(shares)
    path, at = _split_point(dataset, world, rank, whole_batches=len(set(shares)) > 1)
    batch = path[at]
    if sum(shares) != batch.batch_size * world:
        raise ConfigurationError(
            f"batch_split: shares {list(shares)} add up to {sum(shares)}, not the global batch "
            f"{batch.batch_size} x {world} ranks = {batch.batch_size * world}"
        )
    if len(set(shares)) == 1:
        return dataset
    copies = [copy.copy(node) for node in path]
    for node, child in itertools.pairwise(copies):
        node.children = (child, *node.children[1:])
    for node in copies:
        node._probe, node._salt_value = None, None
    copies[at].batch_size = shares[rank]
    copies[-1].shard_shares = ShardShares(shares, batch.drop_remainder)
    return copies[0]


def check_splittable(dataset: Any, world: int, rank: int) -> None:
    """Raise, naming the part in the way, unless `with_shares` can split `dataset` unevenly over `world` ranks."""
    _split_point(dataset, world, rank, whole_batches=True)


def _split_point(dataset: Any, world: int, rank: int, whole_batches: bool) -> tuple[list[Any], int]:
    """The pipeline's nodes from the top down to its source, and the index of its batch op, checked for a split:
    one batch op, only row-wise ops below it, a random-access source sharded over the ranks, and, with
    `whole_batches` (uneven shares), whole global batches (a partial last one cannot be split as one device reads
    it; the even rule gives every rank the same partial batch)."""
    from tessel.dataset.ops import BatchDataset

    path = _path_to_source(dataset)
    batches = [i for i, node in enumerate(path) if isinstance(node, BatchDataset)]
    if len(batches) != 1:
        raise _unsupported(f"a pipeline with {len(batches)} batch ops", "it needs exactly one, below any repeat")
    batch, source = path[batches[0]], path[-1]
    for node in path[batches[0] + 1 : -1]:
        if type(node).__name__ not in _ROW_WISE:
            raise _unsupported(
                f"{type(node).__name__} between the source and batch()",
                "only map, project, rename and shuffle keep every rank's batches whole there; move it after batch()",
            )
    if getattr(source, "num_shards", None) != world or getattr(source, "shard_id", None) != rank:
        raise ConfigurationError(
            f"batch_split: the dataset source {source._where()} must be sharded over the {world} ranks to follow the "
            f"shares (it has num_shards={getattr(source, 'num_shards', None)}, shard_id="
            f"{getattr(source, 'shard_id', None)}); pass num_shards=get_group_size(), shard_id=get_rank()"
        )
    if not hasattr(source, "shard_shares") or not getattr(source, "random_access", True):
        kind = type(source).__name__
        raise _unsupported(f"{kind} as the sharded source", "uneven shards need a random-access source")
    rows = source._num_rows()  # a shard's rows per epoch under the even rule (MindSpore's: ceil(n/N), num_samples)
    if whole_batches and rows % batch.batch_size and not batch.drop_remainder:
        raise _unsupported(
            f"a last batch of {rows % batch.batch_size} of {batch.batch_size} rows per rank (each of the {world} "
            f"shards has {rows} rows an epoch)",
            "its global batch is partial, which uneven shares cannot split as one device reads it: batch with "
            "drop_remainder=True, or choose a batch size that divides the shard",
        )
    return path, batches[0]


def per_rank_batch(dataset: Any) -> int:
    """The batch size of the one batch op of a pipeline `with_shares` can split (MindSpore's per-rank batch)."""
    from tessel.dataset.ops import BatchDataset

    batches = [node for node in _path_to_source(dataset) if isinstance(node, BatchDataset)]
    if len(batches) != 1:
        raise _unsupported(f"a pipeline with {len(batches)} batch ops", "it needs exactly one, below any repeat")
    return batches[0].batch_size


def _path_to_source(dataset: Any) -> list[Any]:
    path = [dataset]
    while path[-1].children:
        if len(path[-1].children) != 1:
            raise _unsupported(f"{type(path[-1]).__name__} of several pipelines", "uneven shards need one source")
        path.append(path[-1].children[0])
    return path


def _unsupported(what: str, why: str) -> Exception:
    from tessel.core.errors import NotSupportedYetError

    return NotSupportedYetError(f"not supported yet: batch_split with {what}, {why}")
