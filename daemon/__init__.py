"""The per-device daemon: sessions, tensor store, rank-program executor and plugin host."""

from tessel.daemon.core import DaemonCore

__all__ = ["DaemonCore"]
