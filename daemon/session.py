"""A (job, rank) session on a daemon: its tensor store, communicators, async handles and segments."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError, JobFailedError
from tessel.core.plugin import Communicator, Handle

WORLD_GROUP = "world"
log = logging.getLogger("tessel.daemon")


class TensorStore(dict):
    """A session's tensors by name: a dict, at a dict's speed. Threads other than the program's (PutTensors,
    FreeTensors: they take no session lock) change it under `lock`. While a step is recorded the store is a
    MeteredStore (`metered()`), the same object: the switch there and every metered change take `lock` too, so
    a put or free from another thread lands whole, in the store and in its counts, before, during or after."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lock = threading.RLock()

    def __reduce__(self) -> tuple:
        return (TensorStore, (dict(self),))  # the contents; the lock and any counts belong to this process

    @contextlib.contextmanager
    def metered(self) -> Iterator[MeteredStore]:
        if type(self) is MeteredStore:  # already metered (a step recorded inside another): nothing to switch
            yield self  # type: ignore[misc]
            return
        with self.lock:
            self.__class__ = MeteredStore
            self.recount()  # type: ignore[attr-defined]
        try:
            yield self  # type: ignore[misc]
        finally:
            with self.lock:
                self.__class__ = TensorStore
                del self.nbytes, self._key, self._views


class MeteredStore(TensorStore):
    """A tensor store that keeps `nbytes`, the bytes its values span (views of one buffer counted once, at the
    largest of them), up to date as names come and go. A recorded step runs on one (core._record) to read the
    store after every instruction: walking the whole store there took ~35 us an instruction on 2 cores, in the
    middle of the step being recorded. A change that waited for `lock` while the step ended finds the store plain
    again and makes a plain change."""

    def __init__(self, tensors: dict[str, Any] | None = None):
        super().__init__(tensors or {})
        self.recount()

    def recount(self) -> None:
        with self.lock:
            self.nbytes = 0
            self._key: dict[str, int] = {}  # name -> its buffer's key
            self._views: dict[int, dict[str, int]] = {}  # buffer key -> {name: bytes} of the names viewing it
            for name, value in list(dict.items(self)):
                self._count(name, value)

    def __setitem__(self, name: str, value: Any) -> None:
        with self.lock:
            metering = type(self) is MeteredStore
            if metering:
                self._forget(name)
            dict.__setitem__(self, name, value)
            if metering:
                self._count(name, value)

    def __delitem__(self, name: str) -> None:
        with self.lock:
            dict.__delitem__(self, name)
            if type(self) is MeteredStore:
                self._forget(name)

    def pop(self, name: str, *default: Any) -> Any:
        with self.lock:
            value = dict.pop(self, name, *default)
            if type(self) is MeteredStore:
                self._forget(name)
            return value

    def popitem(self) -> tuple[str, Any]:
        with self.lock:
            name, value = dict.popitem(self)
            if type(self) is MeteredStore:
                self._forget(name)
            return name, value

    def setdefault(self, name: str, value: Any = None) -> Any:
        with self.lock:
            if name not in self:
                self[name] = value
            return dict.__getitem__(self, name)

    def update(self, *args: Any, **kwargs: Any) -> None:
        with self.lock:
            for name, value in dict(*args, **kwargs).items():
                self[name] = value

    def __ior__(self, other: Any) -> MeteredStore:
        self.update(other)
        return self

    def clear(self) -> None:
        with self.lock:
            dict.clear(self)
            if type(self) is MeteredStore:
                self.nbytes, self._key, self._views = 0, {}, {}

    def _count(self, name: str, value: Any) -> None:
        array = value if type(value) is np.ndarray else np.asarray(value)
        base = array.base
        key = id(base) if type(base) is np.ndarray else id(value)  # the store keeps both alive: ids stay unique
        views = self._views.setdefault(key, {})
        before = max(views.values(), default=0)
        views[name], self._key[name] = array.nbytes, key
        self.nbytes += max(before, array.nbytes) - before

    def _forget(self, name: str) -> None:
        key = self._key.pop(name, None)
        if key is None:
            return
        views = self._views[key]
        before = max(views.values())
        del views[name]
        if not views:
            del self._views[key]
        self.nbytes -= before - max(views.values(), default=0)


@dataclass
class Session:
    session_id: str
    job_id: str
    rank: int
    world_size: int
    members: list  # common_pb2.Member, index = rank
    job_nonce: str = ""  # the coordinator's per-job random value (JoinJobReply.job_nonce)
    collectives: str = ""  # groups spanning hosts or plugins: "" / "auto" hierarchical, "flat" (daemon/hierarchy.py)
    tensors: TensorStore = field(default_factory=TensorStore)
    groups: dict[str, Communicator] = field(default_factory=dict)
    handles: dict[str, tuple[Handle, list[str]]] = field(default_factory=dict)
    # handle -> (start, end) in time.time_ns() of the collective a wait last completed (for the timeline)
    waited: dict[str, tuple[int, int]] = field(default_factory=dict)
    deferred: list = field(default_factory=list)  # all-reduces started but not run yet (executor.Deferred)
    segments: dict[str, Any] = field(default_factory=dict)
    datasets: dict[str, Any] = field(default_factory=dict)
    inline: Any = None  # dataset.spec.InlineCache: in-memory data sent in this session, by digest (sink mode)
    upload: Any = None  # (digest, total bytes, bytearray so far): inline data arriving in pieces (PutInlineData)
    bound: dict[bytes, list] = field(default_factory=dict)  # program bytes -> bound steps (DaemonCore._bound)
    # Seconds spent running programs, and the part of them spent blocked in collectives (waiting for peers and
    # moving data): what is left is this rank's own work, the measure of its speed (speed-aware data parallelism).
    run_s: float = 0.0
    blocked_s: float = 0.0
    steps: int = 0  # program repetitions completed: with run_s and blocked_s, this rank's pace (coordinator/pace.py)
    abort_cause: str | None = None
    culprit_rank: int = -1
    orphan_since: float | None = None  # since when the coordinator has not had this session's job run here
    reaping: bool = False
    closed: bool = False  # set by close(), under `lock`
    # Held for the whole of an Execute: one program at a time per session, and cleanup waits for it.
    lock: threading.RLock = field(default_factory=threading.RLock)

    def describe(self) -> str:
        return f"session {self.session_id} (job {self.job_id!r}, rank {self.rank}/{self.world_size})"

    def check_alive(self) -> None:
        if self.abort_cause is not None:
            raise JobFailedError(f"job {self.job_id!r} failed: {self.abort_cause}", self.culprit_rank)
        if self.closed:  # closed while this call waited for the session's lock
            raise ConfigurationError(f"{self.describe()} is closed (its job ended, or its client closed it)")

    def tensor(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError:
            raise ConfigurationError(
                f"tensor {name!r} is not in the store of {self.describe()}; put it first "
                f"(present: {sorted(self.tensors)[:10]}{' …' if len(self.tensors) > 10 else ''})"
            ) from None

    def tensor_bytes(self) -> int:
        # list() copies the values at once (under the GIL): the program's thread changes the store meanwhile
        return sum(getattr(t, "nbytes", 0) for t in list(self.tensors.values()))

    def close(self) -> None:
        """Free everything (under `lock`); later calls that waited for the lock find it closed (check_alive)."""
        self.closed = True
        for name, comm in list(self.groups.items()):
            try:
                comm.close()
            except Exception as exc:  # the others and the tensors must go all the same
                log.warning("closing group %r of %s: %s", name, self.describe(), exc)
        self.groups.clear()
        self.handles.clear()
        self.waited.clear()
        self.deferred.clear()
        self.tensors.clear()
        self.segments.clear()
        self.datasets.clear()
        self.bound.clear()
