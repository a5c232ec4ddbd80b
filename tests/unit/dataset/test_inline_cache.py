"""In-memory data sent once per daemon session (dataset.spec.InlineCache, thin): a NumpySlicesDataset opened again
in the session (a new batch split re-shards it) travels as its digest alone, and the daemon rebuilds the same rows;
the client's bookkeeping follows the daemon's, so it never names data the daemon no longer holds."""

from __future__ import annotations

import numpy as np
import pytest

import tessel.dataset as ds
from tessel.core.errors import ConfigurationError
from tessel.dataset.parallel import with_shares
from tessel.dataset.spec import InlineCache, from_spec, thin, to_spec


def _data(seed: int = 0, rows: int = 24) -> ds.Dataset:
    x = np.random.default_rng(seed).standard_normal((rows, 3)).astype(np.float32)
    return ds.NumpySlicesDataset({"x": x, "i": np.arange(rows)}, shuffle=False, num_shards=2, shard_id=1).batch(3)


def _rows(dataset) -> list[list[int]]:
    return [b[1].tolist() for b in dataset.create_tuple_iterator(output_numpy=True)]


def test_a_new_split_of_the_same_data_travels_as_its_digest_and_rebuilds_the_same_rows():
    data = _data()
    client, daemon = InlineCache(), InlineCache()
    first = to_spec(data, client)
    assert len(first.root.children[0].inline.arrow_ipc_stream) > 0 and first == data.to_spec()
    assert _rows(from_spec(first, daemon)) == _rows(data)

    resplit = with_shares(data, (2, 4), 1)  # a copy of the pipeline, the source re-sharded
    whole = resplit.to_spec()
    assert whole.root.children[0].inline.digest == first.root.children[0].inline.digest
    sent = to_spec(resplit, client)
    assert sent.root.children[0].inline.arrow_ipc_stream == b""  # the digest alone
    assert sent.root.children[0].inline.digest == whole.root.children[0].inline.digest
    assert sent.ByteSize() < whole.ByteSize() // 4
    rebuilt = _rows(from_spec(sent, daemon))
    assert rebuilt == _rows(resplit) == [[1, 2, 4, 5], [7, 8, 10, 11], [13, 14, 16, 17], [19, 20, 22, 23]]
    assert rebuilt != _rows(data)  # the new shares, read from the data the daemon kept


def test_a_spec_already_built_is_thinned_on_a_copy():
    data = _data()
    client, daemon = InlineCache(), InlineCache()
    first = data.to_spec()
    assert thin(first, client) is first  # nothing held yet: sent whole, noted
    from_spec(first, daemon)
    spec = with_shares(data, (4, 2), 1).to_spec()
    sent = thin(spec, client)
    assert sent.root.children[0].inline.arrow_ipc_stream == b"" and sent.root.children[0].inline.digest
    assert len(spec.root.children[0].inline.arrow_ipc_stream) > 0  # the caller's spec is left whole
    assert _rows(from_spec(sent, daemon)) == _rows(with_shares(data, (4, 2), 1))


def test_the_stream_is_made_once_per_source_and_shared_by_its_copies():
    data = _data()
    stream, digest = data.children[0].inline_stream()
    copy = with_shares(data, (4, 2), 1)
    assert copy.children[0] is not data.children[0]
    assert copy.children[0].inline_stream()[0] is stream and copy.children[0].inline_stream()[1] == digest


def test_both_sides_forget_the_least_recently_opened_alike():
    client, daemon = InlineCache(), InlineCache()
    sets = [_data(seed) for seed in range(InlineCache.KEEP + 1)]
    for data in sets:
        from_spec(to_spec(data, client), daemon)
    assert sets[0].to_spec().root.children[0].inline.digest not in client
    sent = to_spec(sets[0], client)  # forgotten on both sides: the data travels again
    assert len(sent.root.children[0].inline.arrow_ipc_stream) > 0
    assert _rows(from_spec(sent, daemon)) == _rows(sets[0])
    newest = to_spec(sets[-1], client)  # still held: the digest alone
    assert newest.root.children[0].inline.arrow_ipc_stream == b""
    assert _rows(from_spec(newest, daemon)) == _rows(sets[-1])


def test_a_byte_budget_keeps_at_least_the_newest(monkeypatch):
    monkeypatch.setattr(InlineCache, "KEEP_BYTES", 1)
    cache = InlineCache()
    cache.touch(b"a" * 16, 10, "A")
    cache.touch(b"b" * 16, 10, "B")
    assert b"a" * 16 not in cache and cache.touch(b"b" * 16) == "B"


def test_data_named_but_not_held_or_a_wrong_digest_is_a_clear_error():
    spec = _data().to_spec()
    bare = type(spec)()
    bare.CopyFrom(spec)
    bare.root.children[0].inline.arrow_ipc_stream = b""
    with pytest.raises(ConfigurationError, match=r"holds no data of that digest .* send its arrow_ipc_stream"):
        from_spec(bare, InlineCache())
    with pytest.raises(ConfigurationError, match="holds no data of that digest"):
        from_spec(bare)  # no session cache at all
    forged = type(spec)()
    forged.CopyFrom(spec)
    forged.root.children[0].inline.digest = b"\0" * 16
    with pytest.raises(ConfigurationError, match="digest is not the blake2b-16 of its arrow_ipc_stream"):
        from_spec(forged, InlineCache())


def test_arrays_changed_in_place_are_sent_again_not_the_old_snapshot():
    x = np.zeros((12, 2), np.float32)
    source = ds.NumpySlicesDataset({"x": x}, shuffle=False)
    client, daemon = InlineCache(), InlineCache()
    from_spec(to_spec(source.batch(4), client), daemon)
    x[:] = 7.0  # the user's arrays change between two trainings
    sent = to_spec(source.batch(6), client)
    assert len(sent.root.children[0].inline.arrow_ipc_stream) > 0  # new contents: a new digest, sent whole
    batches = [b[0] for b in from_spec(sent, daemon).create_tuple_iterator(output_numpy=True)]
    assert all((b == 7.0).all() for b in batches) and len(batches) == 2
