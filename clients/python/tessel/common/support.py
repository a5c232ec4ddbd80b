"""How tessel answers a MindSpore option or API it accepts: it works, it is logged once as having no effect here,
or it raises `NotSupportedYetError` at the call. Never an AttributeError, never a silent no-op.

    >>> from tessel.common.support import not_supported_yet
    >>> raise not_supported_yet("mindspore.mint.fft", "tessel has no FFT op")
    Traceback (most recent call last):
    tessel.core.errors.NotSupportedYetError: not supported yet: mindspore.mint.fft, tessel has no FFT op
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tessel.core.options import keyword_options, log_once, logger, not_supported_yet

__all__ = ["keyword_options", "log_once", "logger", "not_supported_yet", "unsupported_names"]


def unsupported_names(module: str, names: Iterable[str], why: str) -> Any:
    """A module `__getattr__` for names MindSpore's `module` has and tessel does not map yet: each raises
    NotSupportedYetError naming it; any other name is the usual AttributeError."""
    known = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in known:
            # not an AttributeError: `from module import name` would turn that into a bare "cannot import name"
            raise not_supported_yet(f"{module}.{name}", why)
        raise AttributeError(f"module {module.replace('mindspore', 'tessel', 1)!r} has no attribute {name!r}")

    return __getattr__
