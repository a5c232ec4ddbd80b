"""The per-rank timeline: MindSpore's Profiler and TESSEL_TIMELINE write a Chrome trace per rank (segments named by
their ops, collectives issued / moving / waited for with their bytes, data loading, host transfers), and `tessel
timeline DIR` reads the share of communication hidden behind computation and the step-time breakdown."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tessel as ms
from tessel import nn, profiler
from tessel.core.errors import ConfigurationError
from tessel.daemon.core import Result
from tessel.dataset import NumpySlicesDataset
from tessel.profiler.recorder import Recorder
from tessel.profiler.report import main as timeline_main
from tessel.profiler.report import merge, pipeline_bubble, subtract, summarize, summarize_trace
from tessel.v1 import daemon_pb2

MS = 1_000_000  # ns


def _model():
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
    x = np.random.default_rng(0).random((64, 8)).astype(np.float32)
    data = NumpySlicesDataset({"x": x, "y": (np.arange(64) % 4).astype(np.int32)}, shuffle=False).batch(16)
    return ms.Model(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1)), data


@pytest.fixture(autouse=True)
def no_recording():
    yield
    profiler.stop()


def test_profiler_writes_one_chrome_trace_per_rank_that_the_summary_reads(tmp_path, capsys):
    model, data = _model()
    recorder = ms.Profiler(output_path=str(tmp_path))
    model.train(1, data, dataset_sink_mode=False)  # 4 steps, one Execute each
    model.train(1, data, dataset_sink_mode=True)  # 4 steps in one Execute
    recorder.analyse()
    trace = json.loads((tmp_path / "timeline_rank0.json").read_text())
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"steps", "script", "daemon"} <= names
    spans = [e for e in events if e["ph"] == "X"]
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in spans)
    categories = {e["cat"] for e in spans}
    assert {"step", "compute", "data", "transfer"} <= categories
    compute = [e for e in spans if e["cat"] == "compute"]
    assert len(compute) == 8 and all("MatMul" in e["name"] and e["args"]["ops"]["MatMul"] >= 2 for e in compute)
    assert sum(1 for e in spans if e["cat"] == "data" and e["name"].startswith("next batch")) == 4  # sink mode
    assert sum(1 for e in spans if e["cat"] == "data" and e["name"].startswith("data loading")) == 4  # feed mode
    summary = summarize(tmp_path)[0]
    assert summary.steps == 8 and summary.hidden_share is None  # one rank: no communication
    assert abs(sum(summary.breakdown_us.values()) - summary.span_us) < 1e-3 * summary.span_us
    assert timeline_main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "compute" in printed and "hidden" in printed and "   0      8" in printed


def test_tessel_timeline_environment_variable_records_without_code_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSEL_TIMELINE", str(tmp_path))
    monkeypatch.setattr(profiler, "_from_environment", False)
    model, data = _model()
    model.train(1, data)
    assert profiler.stop().endswith("timeline_rank0.json")
    assert summarize(tmp_path)[0].steps == 4


def test_set_context_enable_profiling_maps_to_the_timeline(tmp_path):
    ms.set_context(enable_profiling=True, profiling_options=json.dumps({"output": str(tmp_path)}))
    model, data = _model()
    model.train(1, data)
    ms.set_context(enable_profiling=False)
    assert summarize(tmp_path)[0].steps == 4
    with pytest.raises(ConfigurationError, match="not supported yet"):
        ms.set_context(profiling_options=json.dumps({"output": str(tmp_path), "aicpu": "on"}))
    ms.set_context(profiling_options="")


@pytest.mark.parametrize("option", [{"profile_memory": True}, {"aicore_metrics": 0}, {"l2_cache": True},
                                    {"op_time": False}, {"no_such_option": 1}])  # fmt: skip
def test_profiler_options_it_cannot_honour_say_not_supported_yet(option, tmp_path):
    with pytest.raises(ConfigurationError, match="not supported yet"):
        ms.Profiler(output_path=str(tmp_path), **option)


def test_profiler_start_and_stop_follow_mindspores_rules(tmp_path):
    recorder = ms.Profiler(output_path=str(tmp_path), start_profile=False, profile_communication=True)
    with pytest.raises(ConfigurationError, match="not recording"):
        recorder.stop()
    recorder.start()
    with pytest.raises(ConfigurationError, match="already recording"):
        recorder.start()
    recorder.stop()
    assert (tmp_path / "timeline_rank0.json").exists()
    recorder.analyse(pretty=True)  # after stop (MindSpore's StopAtStep pattern): the file is written indented
    assert (tmp_path / "timeline_rank0.json").read_text().startswith('{\n "traceEvents"')
    with pytest.raises(ConfigurationError, match="would overwrite it"):
        recorder.start()  # MindSpore refuses repeated start/stop; tessel would lose the first window
    with pytest.raises(ConfigurationError, match="start_profile must be a bool"):
        ms.Profiler(output_path=str(tmp_path), start_profile="no")
    first = ms.Profiler(output_path=str(tmp_path / "first"))
    with pytest.raises(ConfigurationError, match="a timeline is being recorded already"):
        ms.Profiler(output_path=str(tmp_path / "second"))
    first.stop()
    with pytest.raises(ConfigurationError, match="holds no event"):
        ms.Profiler(output_path=str(tmp_path), timeline_limit=1e-6)


def test_a_profiler_started_before_init_writes_the_launchers_rank(tmp_path, monkeypatch):
    from tessel.communication import runtime

    monkeypatch.setattr(runtime, "_runtime", None)  # before init()
    monkeypatch.setenv("RANK_ID", "3")  # MindSpore's Profiler reads RANK_ID; tessel run sets TESSEL_RANK too
    monkeypatch.setenv("TESSEL_RANK", "3")
    ms.Profiler(output_path=str(tmp_path)).stop()
    assert [p.name for p in tmp_path.iterdir()] == ["timeline_rank3.json"]


def _event(index, kind, start, end, **fields):
    return daemon_pb2.TimelineEvent(index=index, kind=kind, start_ns=start * MS, end_ns=end * MS, **fields)


class _FakeDaemon:
    """A daemon whose Execute 'ran' copy 0's AllReduce asynchronously while copy 1's segment computed."""

    def execute(self, session, program, **kwargs):
        assert kwargs.pop("timeline") is True
        events = [
            _event(0, "run_segment", 100, 110, name="train@1a2b3c4d/s0", store_bytes=1000),
            _event(
                1,
                "all_reduce",
                110,
                111,
                handle="h1",
                bytes=4 << 20,
                comm_start_ns=111 * MS,
                comm_end_ns=125 * MS,
                store_bytes=1000,
            ),
            _event(2, "run_segment", 111, 121, name="train@1a2b3c4d/s2", store_bytes=5000),
            _event(3, "wait", 121, 125, handle="h1", store_bytes=7000),
            _event(
                4,
                "all_reduce",
                125,
                129,
                bytes=1024,
                comm_start_ns=125 * MS,
                comm_end_ns=129 * MS,
                name="g_0_1",
                store_bytes=3000,
            ),
            _event(5, "run_segment", 129, 130, name="train@1a2b3c4d/s5", store_bytes=1000),
        ]
        return Result({"loss": np.float32(1.0)}, {}, [], events)


def test_recorder_names_collectives_by_kind_group_and_bytes_and_the_summary_measures_overlap(tmp_path):
    recorder = Recorder(tmp_path, rank=3)
    recorder.execute(_FakeDaemon(), "session", daemon_pb2.Program(), feed={"x": np.zeros(256, np.float32)})
    trace = recorder.trace()
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = [e["name"] for e in spans]
    assert "start AllReduce (world, 4.0 MiB)" in names and "wait for AllReduce (world)" in names
    assert "AllReduce (world, 4.0 MiB)" in names and "AllReduce (g_0_1, 1.0 KiB)" in names
    assert "host→daemon (1.0 KiB fed)" in names
    tracks = {e["tid"] for e in spans if e["cat"] == "communication"}
    assert len(tracks) == 2  # one per group, like the communicators' threads
    assert all(e["pid"] == 3 for e in trace["traceEvents"])
    summary = summarize_trace(trace)
    # communication: 111-125 (14 ms, of which 111-121 under segment s2) and 125-129 (none hidden) -> 10 of 18 ms
    assert summary.communication_us == pytest.approx(18_000)
    assert summary.hidden_share == pytest.approx(10 / 18)
    assert summary.breakdown_us["compute"] == pytest.approx(21_000)  # 10 + 10 + 1 ms of segments
    assert summary.breakdown_us["communication"] == pytest.approx(8_000)  # 121-125 and 125-129: exposed
    assert summary.steps == 1
    assert summary.idle_share == pytest.approx(1 - 21 / 30)  # of the step's 30 ms, 21 computed
    assert summary.peak_growth_bytes == 6000  # the store went from 1000 up to 7000 bytes within the step
    memory = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert [e["args"]["bytes"] for e in memory] == [1000, 1000, 5000, 7000, 3000, 1000]


def test_interval_arithmetic():
    assert merge([(3, 4), (0, 2), (1, 3), (6, 6)]) == [(0, 4)]
    assert subtract([(0, 10)], [(2, 3), (5, 12)]) == [(0, 2), (3, 5)]


def _stage_trace(rank: int, step: tuple[float, float], actions: list[tuple[float, float, str | None]], waits=()):
    """A rank's trace (milliseconds): one step, segments (with their schedule action or None) and waits."""
    us = 1000.0
    events = [{"name": "step 0", "cat": "step", "ph": "X", "ts": step[0] * us, "dur": (step[1] - step[0]) * us}]
    for start, end, action in actions:
        args = {"action": action} if action else {}
        events.append({"name": "s", "cat": "compute", "ph": "X", "ts": start * us, "dur": (end - start) * us,
                       "args": args})  # fmt: skip
    for start, end in waits:
        events.append({"name": "wait", "cat": "wait", "ph": "X", "ts": start * us, "dur": (end - start) * us})
    return {"traceEvents": events, "otherData": {"rank": rank}}


def test_pipeline_bubble_is_the_idle_share_of_the_window_of_the_actions_with_overheads_apart(tmp_path):
    # Two stages, 2 micro-batches, F = 1 ms and B = 2 ms: stage 0 F F . . B B (waits 2-4), stage 1 . F B F B; both
    # run a 5 ms update after their last action (no bubble) and start with a 1 ms prologue.
    zero = _stage_trace(0, (0, 16), [(0, 1, None), (1, 2, "F(v=0,m=0)"), (2, 3, "F(v=0,m=1)"),
                                     (5, 7, "B(v=0,m=0)"), (8, 10, "B(v=0,m=1)"), (10, 15, None)],
                        waits=[(3, 5), (7, 8)])  # fmt: skip
    one = _stage_trace(1, (0, 14), [(0, 1, None), (2, 3, "F(v=1,m=0)"), (3, 5, "B(v=1,m=0)"),
                                    (5, 6, "F(v=1,m=1)"), (6, 8, "B(v=1,m=1)"), (8, 13, None)],
                       waits=[(1, 2)])  # fmt: skip
    for trace in (zero, one):
        (tmp_path / f"timeline_rank{trace['otherData']['rank']}.json").write_text(json.dumps(trace))
    figure = pipeline_bubble(tmp_path)
    assert figure.window_us == pytest.approx(9000)  # 1 .. 10 ms
    assert figure.work_us == pytest.approx(12000)  # 6 ms of actions on each stage
    assert figure.bubble == pytest.approx(1 - 12 / 18)  # (S-1)(F+B) / ((M+S-1)(F+B)) = 3/9: the theory's figure
    assert figure.waiting_us == pytest.approx(3000 + 1000)  # 3-5 and 7-8 on stage 0, 1-2 on stage 1 from 1 ms on
    assert figure.outside_us == pytest.approx(15000 - 9000)  # the update and prologue: reported apart
    (tmp_path / "other").mkdir()
    plain = _stage_trace(0, (0, 5), [(0, 5, None)])
    (tmp_path / "other" / "timeline_rank0.json").write_text(json.dumps(plain))
    assert pipeline_bubble(tmp_path / "other") is None  # no schedule actions: not a pipeline


def test_tessel_timeline_names_a_bad_file_and_says_when_events_were_dropped(tmp_path, capsys):
    from tessel.profiler import report

    assert report.main([str(tmp_path / "missing")]) == 1
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "timeline_rank0.json").write_text("{not json")
    assert report.main([str(tmp_path)]) == 1
    assert "timeline_rank0.json is not a timeline tessel wrote" in capsys.readouterr().err
    recorder = Recorder(tmp_path, rank=0, limit=1)
    recorder.span("a", "compute", 0, 1000, 1)
    recorder.span("b", "compute", 1000, 2000, 1)  # past the limit: dropped
    recorder.write()
    assert report.main([str(tmp_path)]) == 0
    assert "reached the recorder's event limit" in capsys.readouterr().out


def test_an_op_run_eagerly_is_no_step(tmp_path):
    class Eager:  # a PYNATIVE op on a daemon of its own: one Execute of one eager segment
        def execute(self, session, program, **kwargs):
            return Result({}, {}, [], [_event(0, "run_segment", 1, 2, name="eager/0123456789abcdef")])

    recorder = Recorder(tmp_path, rank=0)
    recorder.execute(Eager(), "session", daemon_pb2.Program())
    recorder.execute(_FakeDaemon(), "session", daemon_pb2.Program())
    assert recorder.steps == 1 and [e["name"] for e in recorder.trace()["traceEvents"] if e.get("cat") == "step"] == [
        "step 0"
    ]
