"""Sink mode over gRPC (a RemoteDaemon and an in-process daemon server): the same NumpySlicesDataset opened again in
a session, re-sharded as a new batch split does, travels as its digest alone and the daemon reads the new shares
from the data it kept; an open that fails makes the client send the data again next time."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import tessel.dataset as ds
from tessel.communication.daemon_handle import RemoteDaemon
from tessel.core import rpc
from tessel.core.errors import ConfigurationError
from tessel.daemon import DaemonCore, service
from tessel.dataset.parallel import with_shares
from tessel.plugins import load_plugin
from tessel.v1 import daemon_pb2

TOKEN = "inline-dataset-test-token"


@pytest.fixture
def remote():
    core = DaemonCore(load_plugin("cpu", threads=1))
    server, port = rpc.start_server([service.handler(core, TOKEN)])
    client = RemoteDaemon(f"127.0.0.1:{port}", TOKEN)
    sent: list[int] = []
    real = client.client.OpenDataset
    client.client.OpenDataset = lambda request, *a: sent.append(request.ByteSize()) or real(request, *a)
    yield client, sent
    client.close()
    server.stop(None)
    core.close()


def _read(client: RemoteDaemon, session: str, name: str, batches: int) -> list[list[int]]:
    step = daemon_pb2.Program(
        instructions=[daemon_pb2.Instruction(next_batch=daemon_pb2.NextBatch(dataset=name, outputs=["x", "i"]))]
    )
    return [client.execute(session, step, fetch=["i"]).fetched["i"].tolist() for _ in range(batches)]


def test_a_new_split_sends_the_digest_alone_and_reads_the_new_shares(remote):
    client, sent = remote
    session = client.open_session("job-inline", 0, 1)  # the shards are the dataset's own
    x = np.random.default_rng(0).standard_normal((4096, 64)).astype(np.float32)  # 1 MiB
    data = ds.NumpySlicesDataset({"x": x, "i": np.arange(4096)}, shuffle=False, num_shards=2, shard_id=1).batch(8)
    count, columns = client.open_dataset(session, "even", data)  # as SinkRunner opens it: the Dataset
    assert columns == ["x", "i"] and count == 256
    resplit = with_shares(data, (4, 12), 1)
    client.open_dataset(session, "split", resplit)
    client.open_dataset(session, "spec", resplit.to_spec())  # a spec already built: thinned on a copy
    assert sent[0] > 1 << 20 and sent[1] < 1024 and sent[2] < 1024, sent  # the digest, not the megabyte
    first = lambda d: [b[1].tolist() for _, b in zip(range(3), d.create_tuple_iterator(output_numpy=True))]  # noqa: E731
    assert _read(client, session, "split", 3) == first(resplit) != first(data)
    assert [len(rows) for rows in first(resplit)] == [12, 12, 12]

    with pytest.raises(ConfigurationError, match="columns \\['nope'\\] are not in the pipeline"):
        client.open_dataset(session, "bad", data, ["nope"])
    client.open_dataset(session, "again", data)  # after a failed open the data travels again
    assert sent[-1] > 1 << 20, sent
    client.close_session(session)


def test_data_larger_than_a_request_goes_ahead_in_pieces_and_the_open_names_its_digest(remote, monkeypatch):
    from tessel.communication import daemon_handle

    client, sent = remote
    monkeypatch.setattr(daemon_handle, "REQUEST_CHUNK_BYTES", 256 << 10)
    pieces: list[tuple[int, int]] = []
    real = client.client.PutInlineData
    client.client.PutInlineData = lambda request, *a: (
        pieces.append((request.offset, len(request.data))) or real(request, *a)
    )
    session = client.open_session("job-pieces", 0, 1)
    x = np.random.default_rng(1).standard_normal((4096, 64)).astype(np.float32)  # 1 MiB
    data = ds.NumpySlicesDataset({"x": x, "i": np.arange(4096)}, shuffle=False).batch(8)
    count, _ = client.open_dataset(session, "big", data)
    assert count == 512 and sent[-1] < 1024, sent  # the open carries the digest alone
    assert len(pieces) >= 4 and all(size <= 256 << 10 for _, size in pieces)
    assert [offset for offset, _ in pieces] == [k * (256 << 10) for k in range(len(pieces))]
    assert _read(client, session, "big", 2) == [list(range(8)), list(range(8, 16))]
    before = len(pieces)
    client.open_dataset(session, "same", data)  # held: neither pieces nor data again
    assert len(pieces) == before and sent[-1] < 1024
    other = ds.NumpySlicesDataset({"x": -x, "i": np.arange(4096)}, shuffle=False).batch(8)
    client.open_dataset(session, "spec", other.to_spec())  # a spec already built: its data goes ahead in pieces too
    assert len(pieces) >= 2 * before and sent[-1] < 1024, (pieces, sent)
    assert _read(client, session, "spec", 1) == [list(range(8))]
    client.close_session(session)


def test_pieces_out_of_order_or_past_their_total_are_errors_and_the_upload_starts_over():
    core = DaemonCore(load_plugin("cpu", threads=1))
    try:
        session = core.open_session("job-bad-pieces", 0, 1, [])
        data = ds.NumpySlicesDataset({"x": np.arange(1000, dtype=np.int64)}, shuffle=False)
        stream, digest = data.inline_stream()
        half = len(stream) // 2
        with pytest.raises(ConfigurationError, match=r"at offset 5 .* where offset 0 \(no upload in progress\)"):
            core.put_inline_data(session, digest, len(stream), 5, stream[5:half])
        core.put_inline_data(session, digest, len(stream), 0, stream[:half])
        with pytest.raises(ConfigurationError, match=f"at offset {half + 1} .* where offset {half} .* was due"):
            core.put_inline_data(session, digest, len(stream), half + 1, stream[half + 1 :])
        with pytest.raises(ConfigurationError, match="passed its total of 10 bytes"):
            core.put_inline_data(session, digest, 10, 0, stream[:half])
        with pytest.raises(ConfigurationError, match="digest is not the blake2b-16"):
            core.put_inline_data(session, b"0" * 16, len(stream), 0, stream)
        garbage = b"not an arrow stream"
        garbage_digest = hashlib.blake2b(garbage, digest_size=16).digest()
        with pytest.raises(ConfigurationError, match="arrow_ipc_stream is not an Arrow IPC stream"):
            core.put_inline_data(session, garbage_digest, len(garbage), 0, garbage)
        core.put_inline_data(session, digest, len(stream), 0, stream[:half])  # starting over works
        core.put_inline_data(session, digest, len(stream), half, stream[half:])
        assert digest in core.session(session).inline
    finally:
        core.close()


def test_data_within_a_request_is_serialized_and_hashed_once_per_open(remote, monkeypatch):
    from tessel.dataset.sources import NumpySlicesDataset

    client, sent = remote
    calls: list[int] = []
    real = NumpySlicesDataset.inline_stream
    monkeypatch.setattr(NumpySlicesDataset, "inline_stream", lambda self: calls.append(1) or real(self))
    session = client.open_session("job-small", 0, 1)
    data = ds.NumpySlicesDataset({"x": np.arange(1000, dtype=np.float32)}, shuffle=False).batch(10)
    client.open_dataset(session, "small", data)
    assert len(calls) == 1 and sent[-1] > 4000  # the data rides with the open, read once
    client.close_session(session)
