"""Errors the compiler raises. Both are `tessel.core.errors.ConfigurationError`s: the user's program is at fault."""

from __future__ import annotations

from tessel.core.errors import ConfigurationError


class ShapeInferenceError(ConfigurationError):
    """An op got inputs (shapes, dtypes, attributes) it cannot take; the message names the op and the inputs."""


class TraceError(ConfigurationError):
    """A traced program did something a graph cannot express, such as branching on a tensor's value."""


class DataDependentError(TraceError):
    """Python code read a traced tensor's value (if/while on it, int(), .item(), .asnumpy()), which a graph being
    traced does not have yet."""


class GradientError(ConfigurationError):
    """A gradient was asked for through an op that has none."""
