"""What a client of a daemon needs of it without loading the daemon itself: an Execute's Result and the host
identity that tells whether a daemon runs on this host (its Unix socket is then reachable)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import NamedTuple

import numpy as np


class Result(NamedTuple):
    """What an Execute returns: fetched tensors, per-repetition collected values, per-instruction timings and
    (asked for with `timeline`) one daemon_pb2.TimelineEvent per instruction and repetition."""

    fetched: dict[str, np.ndarray]
    collected: dict[str, np.ndarray]
    timings: list[tuple[str, float]]
    timeline: list | tuple = ()


def host_id() -> str:
    """Equal on two processes exactly when they are on one host: hostname, this boot's id and the network namespace.

    Processes in two network namespaces could still share /dev/shm, but they are two hosts to the network (each its
    own addresses and links, as the multi-host test bed builds them), so their daemons talk TCP.
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    try:
        network = f"/net{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:  # no /proc (not Linux): the hostname and boot decide
        network = ""
    return f"{socket.gethostname()}/{boot}{network}"
