"""Hardware plugins (cpu, gpu, ascend), each found through the `tessel.plugins` entry-point group.

The contract they implement, and the lookup, live in `tessel.core.plugin`; the names are re-exported here for
plugin authors and tests.
"""

from tessel.core.plugin import (
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
    available_plugins,
    load_plugin,
)

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
