"""Running a RankProgram on a daemon handle (tessel.communication.daemon_handle.LocalDaemon / RemoteDaemon)."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from tessel.compiler.rank_program import RankProgram

# Groups already created per daemon handle and session: creating one twice is an error on the daemon.
_CREATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Installed programs per daemon handle, by (session, program name): what run_on reuses.
_INSTALLED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class InstalledProgram:
    """A RankProgram whose groups and segments exist on a daemon session; `run` executes it."""

    def __init__(self, program: RankProgram, daemon: Any, session_id: str):
        self.program, self.daemon, self.session_id = program, daemon, session_id

    def run(
        self,
        feed: Mapping[str, Any] | None = None,
        *,
        fetch: Sequence[str] | None = None,
        repeat: int = 1,
        collect: Sequence[str] = (),
        timings: bool = False,
    ) -> Any:
        """Store `feed`, run the program `repeat` times, return the daemon's Result (fetched = the program's
        outputs unless `fetch` names others; collected = per-repetition values of `collect`)."""
        return self.daemon.execute(
            self.session_id,
            self.program.program,
            repeat=repeat,
            fetch=list(self.program.outputs if fetch is None else fetch),
            timings=timings,
            feed=dict(feed or {}),
            collect=list(collect),
        )

    def state(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        """Current values of state tensors (default: all of the program's state)."""
        return self.daemon.get(self.session_id, list(self.program.state_inputs if names is None else names))


def install(
    program: RankProgram, daemon: Any, session_id: str, initial: Mapping[str, Any] | None = None
) -> InstalledProgram:
    created = _CREATED.setdefault(daemon, {}).setdefault(session_id, set())
    for name, ranks in program.groups.items():
        if name not in created:
            daemon.create_group(session_id, name, list(ranks))
            created.add(name)
    for segment in program.segments.values():
        daemon.compile_segment(session_id, segment.name, segment.onnx, list(segment.state))
    if initial:
        daemon.put(session_id, dict(initial))
    result = InstalledProgram(program, daemon, session_id)
    _INSTALLED.setdefault(daemon, {})[(session_id, program.name)] = result
    return result


def installed(program: RankProgram, daemon: Any, session_id: str) -> InstalledProgram:
    found = _INSTALLED.get(daemon, {}).get((session_id, program.name))
    return found if found is not None and found.program is program else install(program, daemon, session_id)
