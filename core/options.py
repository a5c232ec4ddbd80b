"""How tessel answers a MindSpore option or API it accepts: it works, it is logged once as having no effect here,
or it raises `NotSupportedYetError` at the call. Never an AttributeError, never a silent no-op. (Shared by every
part: the SDK re-exports these from tessel.common.support.)

    >>> from tessel.core.options import not_supported_yet
    >>> raise not_supported_yet("mindspore.mint.fft", "tessel has no FFT op")
    Traceback (most recent call last):
    tessel.core.errors.NotSupportedYetError: not supported yet: mindspore.mint.fft, tessel has no FFT op
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tessel.core.errors import NotSupportedYetError

logger = logging.getLogger("tessel")
_logged: set[str] = set()


def not_supported_yet(what: str, why: str) -> NotSupportedYetError:
    """The error for a known MindSpore API or option tessel does not implement (raise it)."""
    return NotSupportedYetError(f"not supported yet: {what}, {why}")


def log_once(key: str, message: str, level: int = logging.WARNING) -> bool:
    """Log `message` on the "tessel" logger the first time `key` is seen in this process; True if it was logged."""
    if key in _logged:
        return False
    _logged.add(key)
    logger.log(level, message)
    return True


def keyword_options(
    call: str,
    given: Mapping[str, Any],
    hints: Mapping[str, str] = {},
    unsupported: Mapping[str, tuple[tuple[Any, ...], str]] = {},
) -> None:
    """Check the keyword options a MindSpore API takes through its **kwargs, as `call(**given)` passed them:

    - `unsupported`: name -> (the values that mean "off", why tessel lacks the option). Those values pass (scripts
      often spell out MindSpore's default); any other raises NotSupportedYetError naming the option and its value.
    - `hints`: name -> why the option changes nothing here (a setting of MindSpore's own runtime, such as its
      worker processes, whose results are the same either way). Logged once per call and name.
    - Any other name is a TypeError, as Python's for an unexpected keyword argument: a misspelt option is never
      swallowed.
    """
    for name, value in given.items():
        if name in unsupported:
            off, why = unsupported[name]
            if not any(_same(value, v) for v in off):
                raise not_supported_yet(f"{call}({name}={value!r})", why)
        elif name in hints:
            log_once(f"{call}.{name}", f"{call}: {name}={value!r} has no effect in tessel; {hints[name]}", logging.INFO)
        else:
            known = sorted({*hints, *unsupported})
            raise TypeError(
                f"{call}() got an unexpected keyword argument {name!r}"
                + (f"; its keyword options are {', '.join(known)}" if known else "")
            )


def check_type(value: Any, types: type | tuple[type, ...], call: str, argument: str) -> None:
    """TypeError, as MindSpore's argument checks raise, when `value` is not one of `types`. A bool passes only where
    bool is listed (MindSpore refuses True for a number, and 1 for a bool)."""
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, types) and (bool in types or not isinstance(value, bool)):
        return
    names = " or ".join(t.__name__ for t in types)
    raise TypeError(f"{call}: {argument} must be of type {names}, got {type(value).__name__} {value!r}")


def _same(value: Any, off: Any) -> bool:
    if value is None or off is None:
        return value is off
    return type(value) is type(off) and value == off
