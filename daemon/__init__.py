"""The per-device daemon: sessions, tensor store, rank-program executor and plugin host."""

__all__ = ["DaemonCore"]


def __getattr__(name: str):
    # Loaded on first use: a client importing tessel.daemon.results or .local_channel must not load the executor.
    if name == "DaemonCore":
        from tessel.daemon.core import DaemonCore

        return DaemonCore
    raise AttributeError(f"module 'tessel.daemon' has no attribute {name!r}")
