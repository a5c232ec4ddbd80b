"""The fault-injection campaign's short form (benchmarks/faults.py): one trial of each fault (kill -9 and SIGSTOP of
a rank, a daemon and the coordinator of a 4-rank job) must end without a hang and leave nothing behind; a rank or
daemon fault with the right culprit detected within 5 s; a coordinator killed and restarted, or stopped and
continued, with the job finished."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_one_trial_of_each_fault_passes_every_target(tmp_path):
    record = tmp_path / "trials.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "faults.py"), "--trials", "6", "--json", str(record)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    print(result.stdout[-4000:])
    trials = json.loads(record.read_text())
    assert {(t["target"], t["signal"]) for t in trials} == {
        (target, signal) for target in ("rank", "daemon", "coordinator") for signal in ("kill", "stop")
    }
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    for trial in trials:
        assert not trial["hang"] and not any(trial["leftovers"].values()), trial
        if trial["target"] == "coordinator":  # restarted (kill) or continued (stop): the job must finish
            assert trial["finished"], trial
            continue
        assert trial["culprit_right"], trial
        assert trial["detection_s"] is not None and trial["detection_s"] <= 5.0, trial
