"""A timeline per rank: `TESSEL_TIMELINE=DIR`, or MindSpore's `Profiler`, writes DIR/timeline_rank<r>.json.

Each file is a Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing): per rank, the steps, the
script (data loading, host-to-daemon and daemon-to-host transfers around each Execute), the daemon (segments
named by their main ops and source lines, collectives issued, waits for them, batches read in sink mode) and one
track per communication group (when its communicator moved the data, with the bytes). `tessel timeline DIR`
summarises the files: per rank, the share of communication hidden behind computation and where a step's time goes.

    TESSEL_TIMELINE=/tmp/tl tessel run -n 2 train.py && tessel timeline /tmp/tl

MindSpore's entry point works too (the files land in output_path)::

    profiler = ms.Profiler(output_path="./profiler_data")
    model.train(1, dataset)
    profiler.analyse()

Options of MindSpore's Profiler that describe device counters tessel does not collect (profile_memory,
aicore_metrics, l2_cache, ...) raise "not supported yet" instead of being ignored.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from tessel.common.support import not_supported_yet
from tessel.core.errors import ConfigurationError
from tessel.profiler.recorder import SEGMENT_NAMES, Recorder, describe_graph, file_name

__all__ = ["Profiler", "Recorder", "active", "execute", "file_name", "name_segment", "start", "stop"]

_recorder: Recorder | None = None
_from_environment = False  # TESSEL_TIMELINE has been looked at


def name_segment(segment: str, graph: Any, action: str | None = None) -> None:
    """Remember what a compiled segment computes (its main ops, the source lines, and for a pipeline stage the
    schedule's action it runs, e.g. "B(v=1,m=3)"), for the timeline's names."""
    name, details = describe_graph(graph)
    if action is not None:
        name, details = f"{action} {name}", {**details, "action": action}
    SEGMENT_NAMES[segment] = (name, details)


def execute(daemon: Any, session: str, program: Any, **kwargs: Any) -> Any:
    """daemon.execute(...), recorded into the timeline when one is being recorded."""
    recorder = active()
    if recorder is None:
        return daemon.execute(session, program, **kwargs)
    return recorder.execute(daemon, session, program, **kwargs)


def _rank() -> int:
    """This process's rank: the runtime's once init() ran, before that the launcher's variables (tessel run,
    msrun, mpirun, a rank table's RANK_ID), as MindSpore's Profiler reads RANK_ID; 0 for a single process."""
    from tessel.communication import runtime

    if runtime._runtime is not None:
        return runtime._runtime.rank
    try:
        return runtime._env_int(runtime._RANK_VARS) or 0
    except ConfigurationError:
        return 0


def _written(recorder: Recorder, pretty: bool = False) -> str:
    recorder.rank = _rank()  # known by now if init() ran after the recording started
    return str(recorder.write(pretty))


def active() -> Recorder | None:
    """The recorder in use, if any (TESSEL_TIMELINE starts one on first use)."""
    global _from_environment
    if _recorder is None and not _from_environment:
        _from_environment = True
        directory = os.environ.get("TESSEL_TIMELINE")
        if directory:
            start(directory)
    return _recorder if _recorder is not None and _recorder.enabled else None


def start(directory: str | os.PathLike) -> Recorder:
    """Record this rank's timeline into `directory` (written by stop(), and at exit)."""
    global _recorder
    if _recorder is not None and _recorder.enabled:
        _written(_recorder)
    _recorder = Recorder(directory, _rank())
    atexit.register(_write_at_exit, _recorder)
    return _recorder


def stop(pretty: bool = False) -> str | None:
    """Stop recording and write the file (indented if `pretty`); returns its path (None when nothing was recording)."""
    global _recorder
    if _recorder is None:
        return None
    recorder, _recorder = _recorder, None
    recorder.enabled = False
    return _written(recorder, pretty)


def _write_at_exit(recorder: Recorder) -> None:
    if recorder.enabled:
        _written(recorder)


_NOT_SUPPORTED = {  # MindSpore Profiler options that need device counters, with their "off" value
    "profile_memory": False,
    "aicore_metrics": -1,  # MindSpore: -1 collects no AI Core data, 0 and up pick a metric
    "l2_cache": False,
    "hbm_ddr": False,
    "pcie": False,
    "sync_enable": True,
    "with_stack": False,
    "parallel_strategy": False,
    "data_simplification": True,
    "mstx": False,
    "profiler_level": None,
    "activities": None,
    "schedule": None,
    "on_trace_ready": None,
}
_ACCEPTED = {"output_path", "start_profile", "profile_communication", "op_time", "data_process", "timeline_limit"}


class Profiler:
    """MindSpore's `mindspore.Profiler`: records this rank's timeline from creation (start_profile=True) or
    start() until stop() / analyse(), into output_path/timeline_rank<r>.json.

    Accepted: output_path (default "./data"), start_profile, profile_communication and data_process (both always
    on here), op_time=True (segments are timed), timeline_limit (MB of events kept; 500 by default).
    """

    def __init__(self, **kwargs: Any):
        for key, value in kwargs.items():
            if key in _NOT_SUPPORTED:
                if value != _NOT_SUPPORTED[key]:
                    raise ConfigurationError(
                        f"Profiler({key}={value!r}) is not supported yet: tessel records a timeline of segments, "
                        f"collectives, data loading and transfers; drop {key}"
                    )
            elif key not in _ACCEPTED:
                raise ConfigurationError(
                    f"Profiler: unknown option {key!r} (not supported yet); accepted: {sorted(_ACCEPTED)}"
                )
        start_profile = kwargs.get("start_profile", True)
        if not isinstance(start_profile, bool):
            raise ConfigurationError(f"Profiler: start_profile must be a bool, got {start_profile!r}")
        if active() is not None:  # MindSpore: "Do not init twice in the profiler"
            raise ConfigurationError(
                "Profiler: a timeline is being recorded already (another Profiler, set_context(enable_profiling=True) "
                "or TESSEL_TIMELINE); stop it first, or use that one"
            )
        if kwargs.get("op_time", True) is not True:
            raise ConfigurationError("Profiler(op_time=False) is not supported yet: segments are always timed")
        self.output_path = os.path.realpath(str(kwargs.get("output_path", "./data")))
        limit = kwargs.get("timeline_limit", 500)
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0:
            raise ConfigurationError(f"Profiler: timeline_limit must be a positive size in MB, got {limit!r}")
        self._events = int(limit * 2**20 / 200)  # about 200 bytes per event in the file
        if self._events < 1:
            raise ConfigurationError(f"Profiler: timeline_limit={limit} MB holds no event; give at least 0.001")
        self._recorder: Recorder | None = None
        if start_profile:
            self.start()

    def start(self) -> None:
        if self._recorder is not None and self._recorder.enabled:
            raise ConfigurationError("Profiler.start(): the profiler is already recording")
        if self._recorder is not None:  # MindSpore refuses repeated start/stop too; the second would overwrite
            raise ConfigurationError(
                "Profiler.start(): this profiler recorded and wrote its timeline already; a second start would "
                "overwrite it. Create another Profiler with its own output_path for another window"
            )
        self._recorder = start(self.output_path)
        self._recorder.limit = self._events

    def stop(self) -> None:
        self._finish(pretty=False)

    def _finish(self, pretty: bool) -> None:
        if self._recorder is None or not self._recorder.enabled:
            raise ConfigurationError("Profiler.stop(): the profiler is not recording; call start() first")
        if _recorder is self._recorder:
            stop(pretty)
        else:
            self._recorder.enabled = False
            _written(self._recorder, pretty)

    def analyse(
        self, offline_path: Any = None, pretty: bool = False, step_list: Any = None, mode: str = "sync"
    ) -> None:
        """Stop recording (if still on) and write the timeline, indented if `pretty`; `tessel timeline output_path`
        summarises it. The file is written before analyse returns, with mode="async" too."""
        if offline_path is not None:
            raise not_supported_yet(
                f"Profiler.analyse(offline_path={offline_path!r})", "tessel writes the timeline of the run in progress"
            )
        if step_list is not None:
            raise not_supported_yet(
                f"Profiler.analyse(step_list={step_list!r})", "the timeline holds every recorded step"
            )
        if mode not in ("sync", "async"):
            raise ConfigurationError(f"Profiler.analyse: mode must be 'sync' or 'async', got {mode!r}")
        if self._recorder is not None and self._recorder.enabled:
            self._finish(pretty)
        elif self._recorder is not None and pretty:  # stopped already (MindSpore's StopAtStep callback): indent it
            _written(self._recorder, pretty=True)

    def op_analyse(self, op_name: Any, device_id: int | None = None) -> str:
        raise ConfigurationError(
            "Profiler.op_analyse is not supported yet: open output_path/timeline_rank<r>.json in Perfetto, or run "
            "`tessel timeline <output_path>`"
        )
