"""Random and absurd protobuf requests built from the services' descriptors, and a sender for them.

`RequestFuzzer(seed, pools).request(descriptor)` fills a message of that type: numbers at their edges (0, -1,
the type's extremes, NaN and infinities), empty, long and odd strings, random bytes, unknown enum values, one
member of each oneof, nested messages, and now and then a huge repeated field (kept under `max_bytes`). String
fields whose names are in `pools` (job_id, session_id, ...) often take a value that exists on the server, so
requests reach past the first lookup.

`send_all(channel, service, fuzzer, count, token)` sends `count` requests spread over every method of `service`
(streams get a few messages and are cancelled) and returns the status codes it got, by method (INTERNAL and
UNKNOWN with the start of their message: what an unexpected exception said).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor

from tessel.core.rpc import TOKEN_HEADER

_INT32 = [0, 1, -1, 2, 3, 7, 2**31 - 1, -(2**31), 1 << 24]
_INT64 = [*_INT32, 2**63 - 1, -(2**63), 1 << 40]
_UINT = [0, 1, 2, 2**32 - 1, 1 << 20]
_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-9, 1e308, -1e308, float("inf"), float("-inf"), float("nan")]
_ODD = ["", " ", "\x00", "../../etc/passwd", "world", "é字🙂", "%s%n{}", "a" * 300, "-1", "d0/../d1"]
T = FieldDescriptor


class RequestFuzzer:
    def __init__(self, seed: int, pools: dict[str, list[str]] | None = None, max_bytes: int = 2 << 20):
        self.rng = random.Random(seed)
        self.pools = pools or {}
        self.max_bytes = max_bytes

    def request(self, descriptor):
        message = message_factory.GetMessageClass(descriptor)()
        self._fill(message, 0)
        while message.ByteSize() > self.max_bytes:  # a huge field went past the cap: start smaller
            message = message_factory.GetMessageClass(descriptor)()
            self._fill(message, 3)
        return message

    def _fill(self, message, depth: int) -> None:
        rng = self.rng
        chosen_oneofs = {o.name: rng.choice(o.fields) for o in message.DESCRIPTOR.oneofs if rng.random() < 0.8}
        for field in message.DESCRIPTOR.fields:
            oneof = field.containing_oneof
            if oneof is not None and chosen_oneofs.get(oneof.name) is not field:
                continue
            if rng.random() < 0.25:
                continue  # left unset
            if field.is_repeated:
                self._fill_repeated(message, field, depth)
            elif field.type == T.TYPE_MESSAGE:
                if depth < 4:
                    self._fill(getattr(message, field.name), depth + 1)
            else:
                setattr(message, field.name, self._scalar(field))

    def _fill_repeated(self, message, field, depth: int) -> None:
        rng = self.rng
        target = getattr(message, field.name)
        huge = rng.random() < 0.03 and depth < 2
        if field.type == T.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name
            key_field, value_field = entry["key"], entry["value"]
            for _ in range(rng.randint(100, 500) if huge else rng.choice([0, 1, 2, 3])):
                key = self._scalar(key_field, small=huge)
                if value_field.type == T.TYPE_MESSAGE:
                    if depth < 3:
                        self._fill(target[key], 3 if huge else depth + 1)
                else:
                    target[key] = self._scalar(value_field)
        elif field.type == T.TYPE_MESSAGE:
            count = rng.randint(100, 500) if huge else rng.choice([0, 1, 1, 2, 3])
            for _ in range(count):
                item = target.add()
                if depth < 3:
                    self._fill(item, 3 if huge else depth + 1)
        elif huge:  # many copies of a few values: absurd in size, cheap to build
            count = rng.randint(10_000, 200_000 if field.type not in (T.TYPE_STRING, T.TYPE_BYTES) else 20_000)
            values = [self._scalar(field, small=True) for _ in range(4)]
            target.extend(values * (count // 4))
        else:
            target.extend(self._scalar(field) for _ in range(rng.choice([0, 1, 2, 3, 5])))

    def _scalar(self, field, small: bool = False):
        rng = self.rng
        kind = field.type
        if kind == T.TYPE_BOOL:
            return rng.random() < 0.5
        if kind in (T.TYPE_INT32, T.TYPE_SINT32, T.TYPE_SFIXED32):
            return rng.choice(_INT32) if rng.random() < 0.7 else rng.randint(-(2**31), 2**31 - 1)
        if kind in (T.TYPE_INT64, T.TYPE_SINT64, T.TYPE_SFIXED64):
            return rng.choice(_INT64) if rng.random() < 0.7 else rng.randint(-(2**63), 2**63 - 1)
        if kind in (T.TYPE_UINT32, T.TYPE_FIXED32):
            return rng.choice(_UINT)
        if kind in (T.TYPE_UINT64, T.TYPE_FIXED64):
            return rng.choice([*_UINT, 2**64 - 1])
        if kind in (T.TYPE_DOUBLE, T.TYPE_FLOAT):
            value = rng.choice(_FLOATS) if rng.random() < 0.7 else rng.uniform(-1e6, 1e6)
            return value if kind == T.TYPE_DOUBLE or abs(value) < 3e38 or value != value else float("inf")
        if kind == T.TYPE_ENUM:
            known = [v.number for v in field.enum_type.values]
            return rng.choice(known) if rng.random() < 0.7 else rng.randint(-5, 60)
        if kind == T.TYPE_BYTES:
            size = rng.choice([0, 1, 7, 64, 4096, 65536]) if rng.random() < 0.95 else rng.randint(1 << 18, 1 << 20)
            return rng.randbytes(8 if small else size)
        pool = self.pools.get(field.name)
        if pool and rng.random() < 0.6:
            return rng.choice(pool)
        if rng.random() < 0.05 and not small:
            return "x" * rng.choice([10_000, 200_000, 1_000_000])
        return rng.choice(_ODD) if rng.random() < 0.6 else "".join(rng.choices("abcdefgh0123-/_.:", k=8))


def send_all(
    address: str, service, fuzzer: RequestFuzzer, count: int, token: str, timeout_s: float = 0.3, workers: int = 16
) -> dict[str, Counter]:
    """Send `count` fuzzed requests round-robin over the methods of `service`; returns status codes by method."""
    channel = grpc.insecure_channel(
        address, options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    )
    metadata = ((TOKEN_HEADER, token),)
    methods = list(service.methods)
    lock = threading.Lock()
    plan = []
    for n in range(count):
        method = methods[n % len(methods)]
        messages = [fuzzer.request(method.input_type) for _ in range(fuzzer.rng.randint(1, 3))]
        plan.append((method, messages))
    codes: dict[str, Counter] = {m.name: Counter() for m in methods}

    def one(item) -> None:
        method, messages = item
        path = f"/{service.full_name}/{method.name}"
        serialize = lambda m: m.SerializeToString()  # noqa: E731
        try:
            if method.client_streaming:
                call = channel.stream_stream(path, request_serializer=serialize)(
                    iter(messages), timeout=timeout_s, metadata=metadata
                )
                for _ in call:
                    pass
            elif method.server_streaming:
                for _ in channel.unary_stream(path, request_serializer=serialize)(
                    messages[0], timeout=timeout_s, metadata=metadata
                ):
                    pass
            else:
                channel.unary_unary(path, request_serializer=serialize)(
                    messages[0], timeout=timeout_s, metadata=metadata
                )
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
            if code in ("INTERNAL", "UNKNOWN"):
                code = f"{code}: {(exc.details() or '')[:200]}"
        with lock:
            codes[method.name][code] += 1

    try:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, plan))
    finally:
        channel.close()
    return codes
