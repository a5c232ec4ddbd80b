"""Find plugins through the `tessel.plugins` entry-point group, so a third party can ship one."""

from __future__ import annotations

from importlib.metadata import entry_points

from tessel.errors import ConfigurationError, MissingRuntimeError
from tessel.plugins.base import Plugin

GROUP = "tessel.plugins"


def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def plugin_class(name: str) -> type[Plugin]:
    found = _entry_points()
    if name not in found:
        raise ConfigurationError(
            f"no tessel plugin named {name!r}; installed: {sorted(found)}. "
            f"A plugin registers itself in the {GROUP!r} entry-point group (pip install it, or pick one listed)."
        )
    return found[name].load()


def available_plugins() -> dict[str, tuple[bool, str]]:
    """Every installed plugin with (available, reason)."""
    result = {}
    for name, ep in sorted(_entry_points().items()):
        try:
            result[name] = ep.load().available()
        except Exception as exc:  # a broken third-party plugin must not hide the others
            result[name] = (False, f"failed to load: {exc}")
    return result


def load_plugin(
    name: str, device_id: int = 0, threads: int = 1, host: str = "127.0.0.1", advertise_host: str = ""
) -> Plugin:
    """The plugin `name` for one device; its data plane listens on `host` and peers reach it at `advertise_host`
    (default `host`)."""
    cls = plugin_class(name)
    ok, why = cls.available()
    if not ok:
        raise MissingRuntimeError(f"plugin {name!r} cannot run here: {why}")
    return cls(device_id=device_id, threads=threads, host=host, advertise_host=advertise_host)
