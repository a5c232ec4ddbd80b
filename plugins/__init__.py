"""Hardware plugins: the `Plugin` interface and the registry that finds plugins by entry point."""

from tessel.plugins.base import (
    COLLECTIVE_DTYPES,
    REDUCE_OPS,
    CollectivePlugin,
    Communicator,
    ComputePlugin,
    DeviceInfo,
    Executable,
    GroupContext,
    Handle,
    Peer,
    Plugin,
)
from tessel.plugins.registry import available_plugins, load_plugin

__all__ = [
    "COLLECTIVE_DTYPES",
    "REDUCE_OPS",
    "CollectivePlugin",
    "Communicator",
    "ComputePlugin",
    "DeviceInfo",
    "Executable",
    "GroupContext",
    "Handle",
    "Peer",
    "Plugin",
    "available_plugins",
    "load_plugin",
]
