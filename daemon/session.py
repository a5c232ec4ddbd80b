"""A (job, rank) session on a daemon: its tensor store, communicators, async handles and segments."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError, JobFailedError
from tessel.core.plugin import Communicator, Handle

WORLD_GROUP = "world"


@dataclass
class Session:
    session_id: str
    job_id: str
    rank: int
    world_size: int
    members: list  # common_pb2.Member, index = rank
    job_nonce: str = ""  # the coordinator's per-job random value (JoinJobReply.job_nonce)
    collectives: str = ""  # groups spanning hosts or plugins: "" / "auto" hierarchical, "flat" (daemon/hierarchy.py)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
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
    # Held for the whole of an Execute: one program at a time per session, and cleanup waits for it.
    lock: threading.RLock = field(default_factory=threading.RLock)

    def describe(self) -> str:
        return f"session {self.session_id} (job {self.job_id!r}, rank {self.rank}/{self.world_size})"

    def check_alive(self) -> None:
        if self.abort_cause is not None:
            raise JobFailedError(f"job {self.job_id!r} failed: {self.abort_cause}", self.culprit_rank)

    def tensor(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError:
            raise ConfigurationError(
                f"tensor {name!r} is not in the store of {self.describe()}; put it first "
                f"(present: {sorted(self.tensors)[:10]}{' …' if len(self.tensors) > 10 else ''})"
            ) from None

    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def close(self) -> None:
        for comm in self.groups.values():
            comm.close()
        self.groups.clear()
        self.handles.clear()
        self.waited.clear()
        self.deferred.clear()
        self.tensors.clear()
        self.segments.clear()
        self.datasets.clear()
        self.bound.clear()
