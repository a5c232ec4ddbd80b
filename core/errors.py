"""Exceptions a user can act on: each names what failed, where, the rule broken and a fix."""

from __future__ import annotations


class TesselError(RuntimeError):
    """Base class of every error tessel raises on purpose."""


class ConfigurationError(TesselError, ValueError):
    """Bad input from the user: an argument, an environment variable, a strategy."""


class LimitExceededError(ConfigurationError):
    """A request asks for more than a server allows (world size, id length, jobs, sessions, stored bytes...)."""


class NotSupportedYetError(TesselError, NotImplementedError):
    """A MindSpore option or API tessel knows but does not implement yet; the message says why and what to do.

    Raised at the call, never later, with the message "not supported yet: <what>, <why>".
    """


class ExecutionError(TesselError):
    """A compiled program failed while it ran: the runtime refused a value (an index out of range, such as a label
    of a class the logits do not have). The message names the tessel op and the user's line that made it."""


class MissingRuntimeError(TesselError, ImportError):
    """A runtime dependency (ONNX Runtime build, CUDA, CANN) is not installed or not usable."""


class JobFailedError(TesselError):
    """The job failed on some rank; every other rank raises this with the cause."""

    def __init__(self, message: str, culprit_rank: int = -1):
        super().__init__(message)
        self.culprit_rank = culprit_rank


class DaemonUnreachableError(JobFailedError):
    """This rank's daemon went away or does not answer (it died, or its host did): `culprit_rank` is this rank."""


class PeerFailedError(JobFailedError):
    """A peer of a collective died or its job was failed while this rank waited for it."""


class PeerUnreachableError(PeerFailedError):
    """A peer's data-plane address could not be connected to within seconds (no route, no answer or refused)."""


class CollectiveMismatchError(TesselError):
    """Ranks disagree on a collective (kind, reduce op, dtype, shape, root, group or order)."""

    def __init__(self, message: str, culprit_rank: int, field: str):
        super().__init__(message)
        self.culprit_rank = culprit_rank
        self.field = field


class CollectiveTimeoutError(TesselError, TimeoutError):
    """A collective waited longer than its deadline for a peer that is alive but never arrived."""


class RendezvousTimeoutError(TesselError, TimeoutError):
    """The world (or a group, or a barrier) did not complete before the deadline."""


class PlanningTimeoutError(TesselError, TimeoutError):
    """The coordinator's strategy search took longer than the caller's deadline (it goes on; its plan is cached)."""
