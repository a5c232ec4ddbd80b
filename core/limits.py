"""Bounds on the work and memory one request can cause at the coordinator or a daemon.

The defaults are far beyond what a real cluster meets, and each can be changed: by the servers' constructors, or
by an environment variable TESSEL_LIMIT_<FIELD IN CAPITALS> read when a server starts, e.g.

    TESSEL_LIMIT_MAX_WORLD_SIZE=4096 tessel coordinator

A request over a limit is refused with a `LimitExceededError` (gRPC RESOURCE_EXHAUSTED) naming the limit and its
variable; texts kept or sent back (failure causes, error messages) are cut to `max_text_chars` instead.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from tessel.core.errors import ConfigurationError, LimitExceededError


@dataclass(frozen=True)
class Limits:
    """Example: `Limits.from_env(max_world_size=64)`: the environment's limits with one changed."""

    max_world_size: int = 1 << 20  # ranks of one job
    max_id_chars: int = 1024  # job ids, group names, keys, daemon and session ids, addresses
    max_text_chars: int = 8192  # failure causes and error messages, kept and sent back
    max_jobs: int = 10_000  # jobs waiting or running at one coordinator
    keep_ended_jobs: int = 256  # ended jobs kept for `tessel status` and GetJob
    max_daemons: int = 100_000  # registered daemons
    forget_dead_daemon_s: float = 300.0  # a daemon silent this long after it was declared dead leaves the registry
    max_kv_bytes: int = 256 << 20  # the key-value store of one job, keys and values together
    max_request_bytes: int = 64 << 20  # one request to the coordinator (daemons take --max-request-mb)
    max_wait_s: float = 7 * 24 * 3600.0  # the longest a blocking call (JoinJob, Barrier, ...) may ask to wait
    max_sessions: int = 4096  # sessions open on one daemon
    max_tensor_bytes: int = 1 << 40  # one tensor a program asks a daemon to allocate (a received one)
    orphan_session_s: float = 30.0  # a daemon closes a session whose job the coordinator no longer runs after this
    # The coordinator's gRPC worker threads (made as needed): each heartbeat stream and each blocked call (JoinJob,
    # Barrier, KeyValueGet, ...) holds one while it lasts, so the ranks of live jobs need about 2 each, a daemon 1.
    server_threads: int = 4096

    @classmethod
    def from_env(cls, **overrides) -> Limits:
        values = {}
        for field in dataclasses.fields(cls):
            name = f"TESSEL_LIMIT_{field.name.upper()}"
            raw = os.environ.get(name)
            if raw is None:
                continue
            try:
                values[field.name] = int(float(raw)) if isinstance(field.default, int) else float(raw)
            except ValueError:
                raise ConfigurationError(f"{name}={raw!r} is not a number") from None
        values.update(overrides)
        return cls(**values)

    def refuse(self, what: str, value: object, field: str) -> LimitExceededError:
        return LimitExceededError(
            f"{what} is {value}, over this server's limit of {getattr(self, field)} "
            f"(raise it with TESSEL_LIMIT_{field.upper()} if a real workload needs more)"
        )

    def check_id(self, what: str, value: str) -> str:
        """`value` if it is at most max_id_chars long, else a LimitExceededError that does not echo it whole."""
        if len(value) > self.max_id_chars:
            raise LimitExceededError(
                f"{what} {clip(value, 60)!r} has {len(value)} characters, over this server's limit of "
                f"{self.max_id_chars} (TESSEL_LIMIT_MAX_ID_CHARS)"
            )
        return value

    def check_ids(self, what: str, values) -> None:
        for value in values:
            self.check_id(what, value)

    def check_count(self, what: str, count: int, field: str) -> None:
        if count > getattr(self, field):
            raise self.refuse(what, count, field)

    def clip_text(self, text: str) -> str:
        return clip(text, self.max_text_chars)

    def wait_s(self, requested_s: float, default_s: float) -> float:
        """A blocking call's wait: the default for 0, negative or NaN, at most max_wait_s."""
        if not requested_s > 0:  # also NaN
            return default_s
        return min(requested_s, self.max_wait_s)


def clip(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[: max(0, limit - 40)]}… ({len(text) - max(0, limit - 40)} more characters cut)"


DEFAULT = Limits()
