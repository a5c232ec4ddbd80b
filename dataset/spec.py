"""Sink mode: a declarative pipeline as a protobuf `DatasetSpec`, and back (`from_spec`) in another process.

Sources are described by their files or inline Arrow data, transforms by their registered names and plain
parameters, and the spec carries the seed and the next epoch, so the rebuilt pipeline yields exactly the batches
the original would. Python callables cannot travel (never pickle): such pipelines raise a clear error and run in
feed mode (`Dataset.iter_record_batches`).

>>> import numpy as np
>>> from tessel.dataset import NumpySlicesDataset
>>> data = NumpySlicesDataset({"x": np.arange(6)}, shuffle=False).batch(4)
>>> [b[0].tolist() for b in from_spec(data.to_spec().SerializeToString()).create_tuple_iterator(output_numpy=True)]
[[0, 1, 2, 3], [4, 5]]
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from tessel.core.errors import ConfigurationError
from tessel.dataset import ops
from tessel.dataset.core import Dataset
from tessel.dataset.files import ArrowDataset, ParquetDataset
from tessel.dataset.generator import GeneratorDataset
from tessel.dataset.sampling import ShardShares
from tessel.dataset.sources import Cifar10Dataset, MappableSource, MnistDataset, NumpySlicesDataset
from tessel.dataset.storage import record_batch_columns
from tessel.dataset.transforms.base import is_registered, transform_from_params
from tessel.v1 import dataset_pb2 as pb

DATASET_SPEC_VERSION = 1


def unserializable_reason(dataset: Dataset) -> str | None:
    """Why `dataset` cannot become a spec (the first Python callable found), or None when it can."""
    if isinstance(dataset, GeneratorDataset):
        return "GeneratorDataset calls Python code"
    if isinstance(dataset, ops.MapDataset):
        for op in dataset.operations:
            if not is_registered(op):
                return f"map(input_columns={dataset.input_columns}) applies {op!r}, which is not a registered transform"
    if type(dataset) not in _WRITERS:
        return f"{type(dataset).__name__} has no spec form"
    return next((r for r in map(unserializable_reason, dataset.children) if r), None)


def to_spec(dataset: Dataset, held: InlineCache | None = None) -> pb.DatasetSpec:
    """The DatasetSpec of a declarative pipeline; ConfigurationError (feed mode) if it calls Python code. `held`:
    the bookkeeping of the daemon session it goes to (InlineCache): in-memory data the session holds is written as
    its digest alone, and every inline source is noted as opened."""
    reason = unserializable_reason(dataset)
    if reason:
        raise ConfigurationError(
            f"Dataset.to_spec: {reason}, so the pipeline is not serializable and runs in feed mode: stream it with "
            f"Dataset.iter_record_batches(), or build it from declarative parts (MnistDataset, Cifar10Dataset, "
            f"NumpySlicesDataset, ArrowDataset, ParquetDataset and the transforms of ds.vision / ds.transforms)"
        )
    sources = _inline_sources(dataset, held)
    return pb.DatasetSpec(
        version=DATASET_SPEC_VERSION,
        root=_node(dataset, sources),
        seed=dataset._effective_seed(),
        epoch=dataset._next_epoch,
    )


def from_spec(spec: pb.DatasetSpec | bytes, inline: InlineCache | None = None) -> Dataset:
    """Rebuild the pipeline a DatasetSpec (or its serialized bytes) describes. `inline`: the streams of in-memory
    data its session sent before (a daemon's), which an inline source may name by digest alone."""
    if isinstance(spec, (bytes, bytearray)):
        spec = pb.DatasetSpec.FromString(bytes(spec))
    if spec.version != DATASET_SPEC_VERSION:
        raise ConfigurationError(
            f"from_spec: DatasetSpec version {spec.version} is not {DATASET_SPEC_VERSION}; run the same tessel "
            f"version on the client and the daemons"
        )
    dataset = _build(spec.root, inline)
    dataset._seed, dataset._next_epoch = spec.seed, spec.epoch
    return dataset


# -- parameters ------------------------------------------------------------------------------------------------
def _param(name: str, value: Any) -> pb.ParamValue:
    if value is None:
        return pb.ParamValue(none=True)
    if isinstance(value, (bool, np.bool_)):
        return pb.ParamValue(bool_value=bool(value))
    if isinstance(value, (int, np.integer)):
        return pb.ParamValue(int_value=int(value))
    if isinstance(value, (float, np.floating)):
        return pb.ParamValue(float_value=float(value))
    if isinstance(value, str):
        return pb.ParamValue(string_value=value)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
            return pb.ParamValue(ints=pb.IntList(values=[int(v) for v in value]))
        if all(isinstance(v, (int, float, np.integer, np.floating)) for v in value):
            return pb.ParamValue(floats=pb.FloatList(values=[float(v) for v in value]))
    raise ConfigurationError(f"to_spec: transform parameter {name}={value!r} is not a number, string or number list")


def _value(param: pb.ParamValue) -> Any:
    kind = param.WhichOneof("kind")
    if kind in ("floats", "ints"):
        return tuple(getattr(param, kind).values)
    return None if kind in (None, "none") else getattr(param, kind)


def _sampling(source: MappableSource | Any) -> pb.Sampling:
    shares = source.shard_shares
    return pb.Sampling(
        shuffle=source.shuffle_flag,
        num_samples=source.num_samples or 0,
        num_shards=source.num_shards or 0,
        shard_id=source.shard_id or 0,
        shares=shares.shares if shares is not None else (),
        shares_drop_remainder=shares is not None and shares.drop_remainder,
    )


def _with_shares(source: Dataset, sampling: pb.Sampling) -> Dataset:
    if sampling.shares:
        source.shard_shares = ShardShares(tuple(sampling.shares), sampling.shares_drop_remainder)
    return source


def _sampling_kwargs(sampling: pb.Sampling) -> dict[str, Any]:
    sharded = sampling.num_shards > 0
    return {
        "shuffle": sampling.shuffle,
        "num_samples": sampling.num_samples or None,
        "num_shards": sampling.num_shards if sharded else None,
        "shard_id": sampling.shard_id if sharded else None,
    }


# -- writers: one per node type ----------------------------------------------------------------------------------
def _inline(d: NumpySlicesDataset, stream: bytes, digest: bytes) -> pb.DatasetNode:
    return pb.DatasetNode(inline=pb.InlineSource(arrow_ipc_stream=stream, sampling=_sampling(d), digest=digest))


def _files(d: ArrowDataset | ParquetDataset) -> pb.DatasetNode:
    paths = [str(p.resolve()) for p in d.files]
    source = pb.FileSource(format=d.kind, paths=paths, columns=d.columns_list or [], sampling=_sampling(d))
    return pb.DatasetNode(files=source)


def _map(d: ops.MapDataset) -> pb.DatasetNode:
    operations = [
        pb.TransformSpec(name=type(op).__name__, params={k: _param(k, v) for k, v in op.params().items()})
        for op in d.operations
    ]
    return pb.DatasetNode(
        map=pb.MapOp(operations=operations, input_columns=d.input_columns, output_columns=d.output_columns)
    )


_WRITERS: dict[type, Callable[[Any], pb.DatasetNode]] = {
    MnistDataset: lambda d: pb.DatasetNode(
        mnist=pb.MnistSource(dataset_dir=str(d.dataset_dir.resolve()), usage=d.usage, sampling=_sampling(d))
    ),
    Cifar10Dataset: lambda d: pb.DatasetNode(
        cifar10=pb.Cifar10Source(dataset_dir=str(d.dataset_dir.resolve()), usage=d.usage, sampling=_sampling(d))
    ),
    NumpySlicesDataset: lambda d: _inline(d, *d.inline_stream()),  # to_spec writes it through _inline_sources
    ArrowDataset: _files,
    ParquetDataset: _files,
    ops.MapDataset: _map,
    ops.BatchDataset: lambda d: pb.DatasetNode(
        batch=pb.BatchOp(batch_size=d.batch_size, drop_remainder=d.drop_remainder)
    ),
    ops.ShuffleDataset: lambda d: pb.DatasetNode(shuffle=pb.ShuffleOp(buffer_size=d.buffer_size)),
    ops.RepeatDataset: lambda d: pb.DatasetNode(repeat=pb.RepeatOp(count=d.count or -1)),
    ops.TakeDataset: lambda d: pb.DatasetNode(take=pb.TakeOp(count=d.count)),
    ops.SkipDataset: lambda d: pb.DatasetNode(skip=pb.SkipOp(count=d.count)),
    ops.ProjectDataset: lambda d: pb.DatasetNode(project=pb.ProjectOp(columns=d.columns)),
    ops.RenameDataset: lambda d: pb.DatasetNode(
        rename=pb.RenameOp(input_columns=d.input_columns, output_columns=d.output_columns)
    ),
    ops.ZipDataset: lambda d: pb.DatasetNode(zip=pb.ZipOp()),
    ops.ConcatDataset: lambda d: pb.DatasetNode(concat=pb.ConcatOp()),
}


def _node(dataset: Dataset, sources: dict[int, tuple[bytes, bytes]]) -> pb.DatasetNode:
    if type(dataset) is NumpySlicesDataset:
        node = _inline(dataset, *sources[id(dataset)])
    else:
        node = _WRITERS[type(dataset)](dataset)
    node.children.extend(_node(child, sources) for child in dataset.children)
    return node


def _inline_sources(dataset: Dataset, held: InlineCache | None) -> dict[int, tuple[bytes, bytes]]:
    """{id: (stream, digest)} of the in-memory sources of `dataset`; with `held` (the bookkeeping of the daemon
    session the spec goes to), the stream is empty for those the session still holds when its `from_spec` reads
    them, and each is noted as opened, in the order it reads them (children first)."""
    sources: dict[int, tuple[bytes, bytes]] = {}
    for node in _inline_nodes(dataset):
        stream, digest = node.inline_stream()
        if held is not None and held.note(digest, len(stream)):
            stream = b""  # the session holds it: the digest alone
        sources[id(node)] = (stream, digest)
    return sources


def _inline_nodes(dataset: Dataset) -> Iterator[NumpySlicesDataset]:
    """The in-memory sources of `dataset` in the order `from_spec` reads them (children first)."""
    for child in dataset.children:
        yield from _inline_nodes(child)
    if type(dataset) is NumpySlicesDataset:
        yield dataset


def inline_streams(dataset: Dataset | pb.DatasetSpec, larger_than: int = 0) -> list[tuple[bytes, bytes]]:
    """(Arrow IPC stream, digest) of each in-memory source of `dataset` (a pipeline or its spec) whose data passes
    `larger_than` bytes, in the order `from_spec` reads them: what a client may send its daemon session ahead of the
    spec (the daemon decodes it with `decode_inline`). A spec's sources sent as their digest alone, or without one,
    are left out. A pipeline's sources are measured by their arrays' bytes (a stream holds those and a little
    more), so that a small one is neither hashed nor serialized here."""
    if isinstance(dataset, Dataset):
        return [
            node.inline_stream()
            for node in _inline_nodes(dataset)
            if sum(np.asarray(column).nbytes for column in node.columns.values()) > larger_than
        ]
    found: list[tuple[bytes, bytes]] = []

    def visit(node: pb.DatasetNode) -> None:
        for child in node.children:
            visit(child)
        source = node.inline
        if node.WhichOneof("kind") == "inline" and source.digest and len(source.arrow_ipc_stream) > larger_than:
            found.append((source.arrow_ipc_stream, source.digest))

    visit(dataset.root)
    return found


def decode_inline(stream: bytes | bytearray, digest: bytes, where: str = "from_spec") -> dict[str, np.ndarray]:
    """The columns of an inline source's Arrow IPC `stream`, once its `digest` (when given) checks out."""
    if digest and hashlib.blake2b(stream, digest_size=16).digest() != digest:
        raise ConfigurationError(
            f"{where}: an inline source's digest is not the blake2b-16 of its arrow_ipc_stream; build the spec "
            "with Dataset.to_spec(), which sets both"
        )
    try:
        table = ipc.open_stream(pa.BufferReader(stream)).read_all().combine_chunks()
    except pa.ArrowException as exc:
        raise ConfigurationError(
            f"{where}: an inline source's arrow_ipc_stream is not an Arrow IPC stream ({exc}); build the spec with "
            "Dataset.to_spec()"
        ) from None
    return record_batch_columns(table.to_batches()[0])


# -- readers: one per oneof case ---------------------------------------------------------------------------------
def _read_inline(m: pb.InlineSource, inline: InlineCache | None) -> Dataset:
    if m.arrow_ipc_stream:
        columns = decode_inline(m.arrow_ipc_stream, m.digest)
        if inline is not None and m.digest:
            inline.touch(m.digest, len(m.arrow_ipc_stream), columns)
    elif inline is not None and m.digest in inline:
        columns = inline.touch(m.digest)
    else:
        raise ConfigurationError(
            f"from_spec: an inline source names data by digest {m.digest.hex() or '(none)'} without sending it, and "
            f"this daemon session holds no data of that digest (it keeps the last {InlineCache.KEEP}); send its "
            "arrow_ipc_stream"
        )
    return _with_shares(NumpySlicesDataset(columns, **_sampling_kwargs(m.sampling)), m.sampling)


def _read_files(m: pb.FileSource, children: list[Dataset]) -> Dataset:
    kinds = {"arrow": ArrowDataset, "parquet": ParquetDataset}
    if m.format not in kinds:
        raise ConfigurationError(f"from_spec: unknown file format {m.format!r}; expected one of {sorted(kinds)}")
    columns = list(m.columns) or None
    made = kinds[m.format]([Path(p) for p in m.paths], columns_list=columns, **_sampling_kwargs(m.sampling))
    return _with_shares(made, m.sampling)


def _read_map(m: pb.MapOp, children: list[Dataset]) -> Dataset:
    operations = [transform_from_params(t.name, {k: _value(v) for k, v in t.params.items()}) for t in m.operations]
    return children[0].map(operations, list(m.input_columns), list(m.output_columns))


_READERS: dict[str, Callable[[Any, list[Dataset]], Dataset]] = {
    "mnist": lambda m, c: _with_shares(
        MnistDataset(m.dataset_dir, m.usage, **_sampling_kwargs(m.sampling)), m.sampling
    ),
    "cifar10": lambda m, c: _with_shares(
        Cifar10Dataset(m.dataset_dir, m.usage, **_sampling_kwargs(m.sampling)), m.sampling
    ),
    "files": _read_files,
    "map": _read_map,
    "batch": lambda m, c: c[0].batch(m.batch_size, m.drop_remainder),
    "shuffle": lambda m, c: c[0].shuffle(m.buffer_size),
    "repeat": lambda m, c: c[0].repeat(m.count),
    "take": lambda m, c: c[0].take(m.count),
    "skip": lambda m, c: c[0].skip(m.count),
    "project": lambda m, c: c[0].project(list(m.columns)),
    "rename": lambda m, c: c[0].rename(list(m.input_columns), list(m.output_columns)),
    "zip": lambda m, c: ops.ZipDataset(c),
    "concat": lambda m, c: ops.ConcatDataset(c),
}


def _build(node: pb.DatasetNode, inline: InlineCache | None) -> Dataset:
    kind = node.WhichOneof("kind")
    if kind == "inline":
        return _read_inline(node.inline, inline)
    if kind not in _READERS:
        known = sorted([*_READERS, "inline"])
        raise ConfigurationError(f"from_spec: a pipeline node has kind {kind!r}; expected one of {known}")
    children = [_build(child, inline) for child in node.children]
    return _READERS[kind](getattr(node, kind), children)


class InlineCache:
    """The streams of in-memory data (inline sources) one daemon session was sent, by digest, so that the same data
    opened again in the session (a new batch split of speed-aware data parallelism re-shards it; a new pipeline
    over the same NumpySlicesDataset) travels as its digest alone. The daemon keeps the decoded columns; the client
    keeps the same bookkeeping without them (`thin`): both apply one rule to the same opens, in the same order, so
    the client knows what the daemon holds without asking. Least recently opened first out, once more than KEEP
    are held or together they pass KEEP_BYTES of stream (the newest always stays)."""

    KEEP = 4
    KEEP_BYTES = 512 << 20

    def __init__(self):
        self._held: OrderedDict[bytes, tuple[int, Any]] = OrderedDict()  # digest -> (stream bytes, columns)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._held

    def note(self, digest: bytes, nbytes: int) -> bool:
        """Note a client's open of `digest` (`nbytes` of stream); True when the session already holds it, so that
        the digest alone is sent."""
        held = digest in self._held
        self.touch(digest, None if held else nbytes)
        return held

    def touch(self, digest: bytes, nbytes: int | None = None, value: Any = None) -> Any:
        """Note an open of `digest`: sent now (`nbytes` of stream, `value` to keep) or held (both None); returns
        what is kept for it."""
        if nbytes is None:
            nbytes, value = self._held.pop(digest)
        else:
            self._held.pop(digest, None)
        self._held[digest] = (nbytes, value)
        while len(self._held) > 1 and (
            len(self._held) > self.KEEP or sum(n for n, _ in self._held.values()) > self.KEEP_BYTES
        ):
            self._held.popitem(last=False)
        return value


def thin(spec: pb.DatasetSpec, held: InlineCache) -> pb.DatasetSpec:
    """A spec already built, as the client sends it to a daemon session whose opens `held` has followed: inline
    sources the session holds by digest without their stream (a copy; `spec` is left whole), every inline source
    noted as opened, in the order the daemon's `from_spec` reads them (children first). From a Dataset,
    `to_spec(dataset, held)` does this without copying the streams into the spec first."""
    thinned = None

    def visit(node: pb.DatasetNode, path: tuple[int, ...]) -> None:
        nonlocal thinned
        for index, child in enumerate(node.children):
            visit(child, (*path, index))
        if node.WhichOneof("kind") != "inline" or not node.inline.digest:
            return
        source = node.inline
        if held.note(source.digest, len(source.arrow_ipc_stream)):
            if thinned is None:
                thinned = pb.DatasetSpec()
                thinned.CopyFrom(spec)
            target = thinned.root
            for index in path:
                target = target.children[index]
            target.inline.arrow_ipc_stream = b""

    visit(spec.root, ())
    return spec if thinned is None else thinned
