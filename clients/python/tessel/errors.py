"""The exceptions tessel raises, for users (`from tessel.errors import ConfigurationError`); defined in
`tessel.core.errors`, below every part of tessel."""

from tessel.core.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ConfigurationError,
    DaemonUnreachableError,
    JobFailedError,
    LimitExceededError,
    MissingRuntimeError,
    NotSupportedYetError,
    PeerFailedError,
    PeerUnreachableError,
    RendezvousTimeoutError,
    TesselError,
)

__all__ = [
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "ConfigurationError",
    "DaemonUnreachableError",
    "JobFailedError",
    "LimitExceededError",
    "MissingRuntimeError",
    "NotSupportedYetError",
    "PeerFailedError",
    "PeerUnreachableError",
    "RendezvousTimeoutError",
    "TesselError",
]
