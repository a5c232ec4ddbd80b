"""Where the coordinator keeps what must outlive it: daemons with their ids, jobs and their history, groups, KV.

A store is a flat map of (kind, key) → bytes. The coordinator writes through it on every state change worth
keeping (a registration, a job's start or end, a group arrival, a key set) and reads it all back once at start;
heartbeats are never written (a restarted coordinator gives every member a grace period to beat again instead).

Backends, chosen by `open_store(url)`:
- `sqlite:PATH` (the default of `tessel coordinator`): an embedded SQLite database in WAL mode, one transaction per
  write (synchronous=NORMAL: a killed process loses nothing committed; a power cut may lose the last writes).
- `etcd://HOST:PORT[/PREFIX]`: an etcd v3 cluster through its JSON gRPC gateway (`/v3/kv/...`), for a cluster whose
  coordinator must be highly available (its successor reads the same keys).
- `memory`: nothing kept (a coordinator that forgets everything when it stops).

Values are protobuf messages or JSON, never pickle.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sqlite3
import threading
import urllib.error
import urllib.request
from pathlib import Path

from tessel.core import errors

log = logging.getLogger("tessel.coordinator")

# Kinds of records.
META, DAEMON, JOB, RANK, GROUP, KV = "meta", "daemon", "job", "rank", "group", "kv"
KINDS = (META, DAEMON, JOB, RANK, GROUP, KV)
PUT, DELETE, DELETE_PREFIX = "put", "delete", "delete_prefix"


class Store:
    """The interface: `put`, `delete`, `delete_prefix` (keys of one kind starting with a prefix), `apply` (several
    of those at once, e.g. the daemons a starting job takes), `load`, `close`."""

    url = "memory"

    def apply(self, ops: list[tuple]) -> None:
        """(PUT, kind, key, value), (DELETE, kind, key) or (DELETE_PREFIX, kind, prefix) items, in order."""
        for op, *args in ops:
            getattr(self, op)(*args)

    def put(self, kind: str, key: str, value: bytes) -> None:
        pass

    def delete(self, kind: str, key: str) -> None:
        pass

    def delete_prefix(self, kind: str, prefix: str) -> None:
        pass

    def load(self) -> dict[str, dict[str, bytes]]:
        """Every record, by kind then key."""
        return {kind: {} for kind in KINDS}

    def close(self) -> None:
        pass

    @property
    def durable(self) -> bool:
        return False


class MemoryStore(Store):
    """Keeps nothing: the state lives only in the coordinator's memory."""


class SqliteStore(Store):
    """An SQLite file in WAL mode; safe to use from any thread (one connection behind a lock).

    Example:
        store = SqliteStore("/var/lib/tessel/coordinator.db")
        store.put("job", "train1", b"{}")
        assert store.load()["job"]["train1"] == b"{}"
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        self.url = f"sqlite:{self.path}"
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not self.path.exists():  # the records name jobs and their nonces: for this user only
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=5.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS records (kind TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, "
                "PRIMARY KEY (kind, key))"
            )
        except (OSError, sqlite3.Error) as exc:
            raise errors.ConfigurationError(
                f"coordinator store {self.url}: cannot open it ({exc}); pass --store sqlite:PATH with a writable "
                "PATH, or --store memory to keep nothing"
            ) from None
        self._lock = threading.Lock()

    @property
    def durable(self) -> bool:
        return True

    def put(self, kind: str, key: str, value: bytes) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO records (kind, key, value) VALUES (?, ?, ?)", (kind, key, value))

    def delete(self, kind: str, key: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM records WHERE kind = ? AND key = ?", (kind, key))

    def delete_prefix(self, kind: str, prefix: str) -> None:
        with self._lock:
            self._delete_prefix(kind, prefix)

    def _delete_prefix(self, kind: str, prefix: str) -> None:
        self._db.execute("DELETE FROM records WHERE kind = ? AND substr(key, 1, ?) = ?", (kind, len(prefix), prefix))

    def apply(self, ops: list[tuple]) -> None:
        """One transaction."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                for op, kind, key, *value in ops:
                    if op == PUT:
                        self._db.execute(
                            "INSERT OR REPLACE INTO records (kind, key, value) VALUES (?, ?, ?)", (kind, key, value[0])
                        )
                    elif op == DELETE:
                        self._db.execute("DELETE FROM records WHERE kind = ? AND key = ?", (kind, key))
                    else:
                        self._delete_prefix(kind, key)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def load(self) -> dict[str, dict[str, bytes]]:
        found: dict[str, dict[str, bytes]] = {kind: {} for kind in KINDS}
        with self._lock:
            for kind, key, value in self._db.execute("SELECT kind, key, value FROM records"):
                found.setdefault(kind, {})[key] = bytes(value)
        return found

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key after every key that starts with `prefix` (etcd's range_end for a prefix)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


class EtcdStore(Store):
    """etcd v3 through its JSON gateway: each record is the key PREFIX/kind/key. Needs no client library.

    Example:
        store = EtcdStore("127.0.0.1:2379", prefix="/tessel/cluster1")
    """

    def __init__(self, endpoint: str, prefix: str = "/tessel", timeout_s: float = 5.0):
        self.endpoint, self.prefix, self.timeout_s = endpoint, prefix.rstrip("/"), timeout_s
        self.url = f"etcd://{endpoint}{self.prefix}"
        try:
            self._post("/v3/maintenance/status", {})
        except errors.TesselError as exc:
            raise errors.ConfigurationError(
                f"coordinator store {self.url}: {exc}; start etcd there (e.g. `etcd --listen-client-urls "
                f"http://{endpoint} --advertise-client-urls http://{endpoint}`) or pass another --store"
            ) from None

    @property
    def durable(self) -> bool:
        return True

    def _post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"http://{self.endpoint}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise errors.TesselError(f"etcd at {self.endpoint} refused {path}: HTTP {exc.code} {detail}") from None
        except (OSError, ValueError) as exc:
            raise errors.TesselError(f"etcd at {self.endpoint} did not answer {path}: {exc}") from None

    def _key(self, kind: str, key: str) -> bytes:
        return f"{self.prefix}/{kind}/{key}".encode()

    def put(self, kind: str, key: str, value: bytes) -> None:
        self._post("/v3/kv/put", {"key": _b64(self._key(kind, key)), "value": _b64(value)})

    def delete(self, kind: str, key: str) -> None:
        self._post("/v3/kv/deleterange", {"key": _b64(self._key(kind, key))})

    def delete_prefix(self, kind: str, prefix: str) -> None:
        start = self._key(kind, prefix)
        self._post("/v3/kv/deleterange", {"key": _b64(start), "range_end": _b64(_prefix_end(start))})

    def apply(self, ops: list[tuple], chunk: int = 100) -> None:
        """Transactions of at most `chunk` operations (etcd's --max-txn-ops is 128 by default)."""
        for at in range(0, len(ops), chunk):
            requests = []
            for op, kind, key, *value in ops[at : at + chunk]:
                if op == PUT:
                    requests.append({"request_put": {"key": _b64(self._key(kind, key)), "value": _b64(value[0])}})
                else:
                    start = self._key(kind, key)
                    body = {"key": _b64(start)}
                    if op == DELETE_PREFIX:
                        body["range_end"] = _b64(_prefix_end(start))
                    requests.append({"request_delete_range": body})
            self._post("/v3/kv/txn", {"success": requests})

    def load(self) -> dict[str, dict[str, bytes]]:
        found: dict[str, dict[str, bytes]] = {kind: {} for kind in KINDS}
        start = f"{self.prefix}/".encode()
        reply = self._post("/v3/kv/range", {"key": _b64(start), "range_end": _b64(_prefix_end(start))})
        for item in reply.get("kvs", []):
            name = base64.b64decode(item["key"])[len(start) :].decode()
            kind, _, key = name.partition("/")
            found.setdefault(kind, {})[key] = base64.b64decode(item.get("value", ""))
        return found


def open_store(url: str) -> Store:
    """`memory`, `sqlite:PATH` (or a bare path) or `etcd://HOST:PORT[/PREFIX]`."""
    if not url or url == "memory":
        return MemoryStore()
    if url.startswith("etcd://"):
        rest = url.removeprefix("etcd://")
        endpoint, slash, prefix = rest.partition("/")
        if not endpoint:
            raise errors.ConfigurationError(f"--store {url}: name etcd's HOST:PORT, e.g. etcd://127.0.0.1:2379")
        return EtcdStore(endpoint, "/" + prefix if slash and prefix else "/tessel")
    if "://" in url:
        raise errors.ConfigurationError(
            f"--store {url}: unknown kind of store; use memory, sqlite:PATH or etcd://HOST:PORT[/PREFIX]"
        )
    return SqliteStore(url.removeprefix("sqlite:"))
