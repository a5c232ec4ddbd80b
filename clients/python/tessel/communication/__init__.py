"""`tessel.communication` — MindSpore's `mindspore.communication` names and semantics.

from tessel.communication import init, get_rank, get_group_size
init()                      # under `tessel run -n 4`: joins the job; plain `python`: a world of 1
print(get_rank(), get_group_size())
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from tessel.communication import runtime as _rt
from tessel.core.errors import ConfigurationError
from tessel.core.options import log_once, not_supported_yet


class GlobalComm:
    """MindSpore's GlobalComm: the world group's name and whether init() ran."""

    BACKEND = "tessel"
    WORLD_COMM_GROUP = "hccl_world_group"
    INITED = False


HCCL_WORLD_COMM_GROUP = "hccl_world_group"
NCCL_WORLD_COMM_GROUP = "nccl_world_group"
MCCL_WORLD_COMM_GROUP = "mccl_world_group"
_WORLD_ALIASES = {HCCL_WORLD_COMM_GROUP, NCCL_WORLD_COMM_GROUP, MCCL_WORLD_COMM_GROUP, "world", None}


# MindSpore environment variables that tune MindSpore's own graph compiler, cluster networking or Ascend libraries,
# with no counterpart in tessel; results are the same without them. Each is named in a warning when set, never
# read silently.
NO_EFFECT_ENV = {
    "MS_COMM_COMPILER_OPT": "MindSpore's reuse of communication subgraphs to shorten its graph compilation "
    "(tessel compiles each distinct communication once anyway)",
    "MS_DISABLE_HEARTBEAT": "tessel's liveness checks stay on: a rank that dies still fails the job within seconds",
    "MS_NODE_TIMEOUT": "tessel declares a silent rank dead within seconds (its heartbeat deadline), not after this",
    "MS_RECEIVE_MSG_TIMEOUT": "tessel's coordinator calls have their own deadlines",
    "MS_RETRY_INTERVAL_LOWER": "a worker retries the coordinator on tessel's own schedule",
    "MS_RETRY_INTERVAL_UPPER": "a worker retries the coordinator on tessel's own schedule",
    "MS_HCCL_CM_INIT": "Ascend's HCCL initialisation through its cluster manager; tessel's daemons set up their groups",
    "MS_ENABLE_LCCL": "Ascend's LCCL library; each daemon's plugin picks its device's collectives",
}


def _warn_no_effect_env() -> list[str]:
    """Warn once per process about each set variable of NO_EFFECT_ENV; returns the names warned about."""
    named = [name for name in NO_EFFECT_ENV if os.environ.get(name) and name not in _warned_env]
    for name in named:
        _warned_env.add(name)
        logging.getLogger("tessel").warning(
            "%s=%s is not supported yet and has no effect: %s; training gives the same results without it",
            name,
            os.environ[name],
            NO_EFFECT_ENV[name],
        )
    return named


_warned_env: set[str] = set()


# MindSpore's backend names (Ascend, GPU, CPU); None infers it from the device target.
BACKEND_NAMES = ("hccl", "nccl", "mccl")


def init(backend_name: str | None = None) -> None:
    """Join the job (or start a world of 1). `backend_name` is None or one of MindSpore's "hccl", "nccl", "mccl";
    any of them gives the same collectives: each daemon's plugin picks its native ones (logged once)."""
    if backend_name is not None:
        if backend_name not in BACKEND_NAMES:
            raise ConfigurationError(
                f"init(backend_name={backend_name!r}): backend_name must be None or one of "
                f"{', '.join(map(repr, BACKEND_NAMES))} (MindSpore's names); pass None to let tessel choose"
            )
        log_once(
            f"communication.init.{backend_name}",
            f"init(backend_name={backend_name!r}): tessel's daemons pick their device's native collectives, "
            "whatever the backend name",
            logging.INFO,
        )
    _warn_no_effect_env()
    _rt.init()
    GlobalComm.INITED = True


def release() -> None:
    """Release the distributed resources of this process (also runs at interpreter exit)."""
    _rt.release()
    GlobalComm.INITED = False


def _ranks(group: str | None) -> tuple[int, ...]:
    runtime = _rt.current()
    if group in _WORLD_ALIASES:
        return tuple(range(runtime.world_size))
    if group not in runtime.groups:
        raise ConfigurationError(f"unknown group {group!r}; create it with create_group({group!r}, rank_ids) first")
    return runtime.groups[group]


def get_rank(group: str = GlobalComm.WORLD_COMM_GROUP) -> int:
    """This process's rank in `group` (the world by default)."""
    return _ranks(group).index(_rt.current().rank)


def get_group_size(group: str = GlobalComm.WORLD_COMM_GROUP) -> int:
    return len(_ranks(group))


def _local_ranks(group: str | None, call: str) -> list[int]:
    """The ranks of `group` on this process's host (world ranks, in group order)."""
    runtime = _rt.current()
    ranks = _ranks(group)
    if runtime.rank not in ranks:
        raise ConfigurationError(f"{call}: rank {runtime.rank} is not in group {group!r} (ranks {list(ranks)})")
    if len(runtime.hosts) != runtime.world_size:
        raise not_supported_yet(f"{call}(group={group!r})", "this runtime does not know which host each rank is on")
    here = runtime.hosts[runtime.rank]
    return [r for r in ranks if runtime.hosts[r] == here]


def get_local_rank(group: str = GlobalComm.WORLD_COMM_GROUP) -> int:
    """This process's rank among the ranks of `group` on its host (the world by default)."""
    if group in _WORLD_ALIASES:
        _ranks(group)
        return _rt.current().local_rank
    return _local_ranks(group, "get_local_rank").index(_rt.current().rank)


def get_local_rank_size(group: str = GlobalComm.WORLD_COMM_GROUP) -> int:
    """How many ranks of `group` are on this process's host (the world by default)."""
    if group in _WORLD_ALIASES:
        _ranks(group)
        return _rt.current().local_size
    return len(_local_ranks(group, "get_local_rank_size"))


def get_world_rank_from_group_rank(group: str, group_rank_id: int) -> int:
    ranks = _ranks(group)
    if not 0 <= group_rank_id < len(ranks):
        raise ConfigurationError(f"group rank {group_rank_id} is outside group {group!r} of size {len(ranks)}")
    return ranks[group_rank_id]


def get_group_rank_from_world_rank(world_rank_id: int, group: str) -> int:
    ranks = _ranks(group)
    if world_rank_id not in ranks:
        raise ConfigurationError(f"world rank {world_rank_id} is not in group {group!r} (ranks {list(ranks)})")
    return ranks.index(world_rank_id)


def create_group(group: str, rank_ids: Sequence[int], options: object = None) -> None:
    """Create a named group of world ranks; every member calls it with the same list (MindSpore's rule).
    `options` (MindSpore's GroupOptions: HCCL settings for the group's communicator) is not supported yet."""
    if options is not None:
        raise not_supported_yet(
            f"create_group({group!r}, options=...)",
            "options is MindSpore's GroupOptions, whose hccl_config tunes the group's HCCL communicator "
            "(hccl_buffer_size, hccl_comm, hccl_op_expansion_mode); tessel's groups run on its daemons' "
            "collectives, not on HCCL communicators; drop options (results are the same without it)",
        )
    runtime = _rt.current()
    if group in _WORLD_ALIASES:
        raise ConfigurationError(f"{group!r} names the world group; pick another name")
    if group in runtime.groups:
        raise ConfigurationError(f"group {group!r} already exists; destroy_group({group!r}) first")
    ranks = tuple(int(r) for r in rank_ids)
    repeated = sorted({r for r in ranks if ranks.count(r) > 1})
    if repeated:
        raise ConfigurationError(
            f"create_group({group!r}, rank_ids={list(ranks)}): rank_ids must not repeat a rank (MindSpore's rule), "
            f"but {repeated} appear more than once; list each world rank once"
        )
    runtime.daemon.create_group(runtime.session_id, group, ranks)
    runtime.groups[group] = ranks


def destroy_group(group: str) -> None:
    runtime = _rt.current()
    if group in _WORLD_ALIASES or group not in runtime.groups:
        raise ConfigurationError(f"cannot destroy group {group!r}: it is the world or was never created")
    runtime.daemon.destroy_group(runtime.session_id, group)
    del runtime.groups[group]


__all__ = [
    "HCCL_WORLD_COMM_GROUP",
    "MCCL_WORLD_COMM_GROUP",
    "NCCL_WORLD_COMM_GROUP",
    "GlobalComm",
    "create_group",
    "destroy_group",
    "get_group_rank_from_world_rank",
    "get_group_size",
    "get_local_rank",
    "get_local_rank_size",
    "get_rank",
    "get_world_rank_from_group_rank",
    "init",
    "release",
]
