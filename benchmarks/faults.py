"""Fault-injection campaign: SIGKILL or SIGSTOP a random rank, daemon or the coordinator of a running 4-rank job at
a random moment, and measure how the job ends.

Usage: python benchmarks/faults.py [--trials 100] [--seed 0] [--ranks 4] [--targets rank,daemon,coordinator]
                                   [--signals kill,stop] [--no-checkpoint] [--json out.json]
                                   [--job-seconds 12] [--max-delay 3]

A coordinator and one daemon per rank run as an operator starts them (`tessel coordinator`, `tessel daemon`);
each trial is `tessel run -n 4 --coordinator ... _faults_rank.py` (all-reduces for --job-seconds while rank 0 saves
a 16 MiB checkpoint every fifth step). Once every rank runs, after a random delay (up to --max-delay seconds), one
process is signalled:
- rank r: its script process; daemon r: the daemon the coordinator gave rank r; coordinator: the coordinator.
What is measured, per trial:
- detection: seconds from the signal until every rank still able to report has printed its failure (the
  ranks catch the error and print the time; a SIGSTOPped rank cannot, and is not waited for);
- culprit right: the coordinator's verdict, the launcher's summary and every rank's error all name rank r;
- hang: `tessel run` still running TRIAL_DEADLINE_S after the signal (its processes' stacks are then dumped into
  their logs with SIGABRT, and everything of the trial is killed);
- leftovers once the cluster is repaired (the signalled process killed for good and started again): processes
  of the job, socket directories of dead daemons, shared-memory segments of the job's groups that no process
  maps, checkpoint temp files still there after a later save.
- coordinator trials: the coordinator keeps its state in an SQLite store (`--store`), so a killed one is started
  again on the same port RESTART_AFTER_S later and a stopped one is continued (SIGCONT) after PAUSE_S; its ranks
  and daemons reconnect within their grace ($TESSEL_COORDINATOR_GRACE) and the trial passes when the job finishes
  (every rank done, the launcher's status 0): "jobs that finished". No rank is at fault, so no detection time.

Prints a table by target and signal, and the targets: 0 hangs, culprit right in 100 %, detection <= 5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RANK_SCRIPT = Path(__file__).with_name("_faults_rank.py")
JOB_SECONDS = 12.0  # how long a trial's job all-reduces when nothing goes wrong
MAX_DELAY_S = 3.0  # a fault comes at a random moment this long at most after every rank runs
REAPED_WAIT_S = 1.0  # longest wait for the processes of a trial's job to be gone before the cluster is repaired
TRIAL_DEADLINE_S = 60.0
DETECTION_TARGET_S = 5.0
RESTART_AFTER_S = 1.0  # a killed coordinator is started again this long after the kill
PAUSE_S = 4.0  # a stopped coordinator is continued after this long (longer than the 3 s heartbeat timeout)
RECOVERY_MARGIN_S = 2.0  # a trial's job still runs this long after its coordinator is back at the latest
FAILED = re.compile(r"rank (\d+): (\w+) at ([\d.]+) culprit=(-?\d+|None): (.*)")
SUMMARY = re.compile(r"tessel run: rank (-?\d+) failed")


@dataclass
class Trial:
    number: int
    target: str  # rank | daemon | coordinator
    signal: str  # kill | stop
    rank: int  # the rank whose process (or daemon) was signalled; -1 for the coordinator
    delay_s: float
    detection_s: float | None = None
    reported: int = 0  # ranks that printed their failure
    culprit_right: bool = False
    clear_error: bool = False
    hang: bool = False
    finished: bool = False  # the job ended well despite the fault
    leftovers: dict = field(default_factory=dict)
    note: str = ""


# ---------------------------------------------------------------------------------------------------- processes


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _job_processes(job: str) -> dict[int, int]:
    """rank -> pid of the live script processes of `job`."""
    found = {}
    for pid in _pids():
        env = _environ(pid)
        if env.get("TESSEL_JOB_ID") == job and "TESSEL_RANK" in env and _alive(pid):
            found[int(env["TESSEL_RANK"])] = pid
    return found


def _mapped_segments(pids) -> set[str]:
    segments = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "/dev/shm/tessel-" in line:
                    segments.add(line.split()[-1])
    return segments


# ---------------------------------------------------------------------------------------------------- cluster


class Cluster:
    """A coordinator and one daemon per rank, as an operator runs them; `repair()` brings back what a trial broke."""

    def __init__(self, workdir: Path, daemons: int):
        self.workdir, self.count = workdir, daemons
        self.env = dict(os.environ, TESSEL_TOKEN=secrets.token_hex(16), TESSEL_HOME=str(workdir / "home"))
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env["PYTHONFAULTHANDLER"] = "1"  # a hang's stacks can be dumped (SIGABRT)
        with socket.socket() as probe:  # a fixed port: a restarted coordinator must come back where it was
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.store = f"sqlite:{workdir / 'coordinator.db'}"
        self.coordinator: subprocess.Popen | None = None
        self.daemons: list[subprocess.Popen | None] = [None] * daemons
        self.start_coordinator()
        for index in range(daemons):
            self._start_daemon(index)
        self.wait_idle()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        with open(self.workdir / log, "a") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "tessel.cli", *args],
                env=self.env,
                stdout=subprocess.PIPE if args[0] == "coordinator" else out,
                stderr=out,
                text=True,
                cwd=self.workdir,
                start_new_session=True,
            )

    def start_coordinator(self) -> None:
        self.coordinator = self._spawn(
            ["coordinator", "--port", str(self.port), "--store", self.store], "coordinator.log"
        )
        line = self.coordinator.stdout.readline()
        if not line.strip():
            raise RuntimeError(f"the coordinator did not start: {(self.workdir / 'coordinator.log').read_text()}")
        self.port = int(line.strip().rsplit(":", 1)[1])

    def _start_daemon(self, index: int) -> None:
        args = ["daemon", "--coordinator", self.address, "--device", str(index), "--threads", "1"]
        self.daemons[index] = self._spawn(args, f"daemon.{index}.log")

    def client(self):
        from tessel.core.coordinator_client import CoordinatorClient

        return CoordinatorClient(self.address, self.env["TESSEL_TOKEN"], timeout_s=5.0, grace_s=0.0)

    def wait_idle(self, timeout_s: float = 90.0) -> None:
        """Until every daemon of ours is registered and idle."""
        deadline = time.monotonic() + timeout_s
        pids = {d.pid for d in self.daemons if d is not None}
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception), self.client() as client:
                idle = {d.pid for d in client.cluster_status().daemons if d.state == "idle"}
                if pids <= idle:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"the daemons {sorted(pids)} did not all become idle within {timeout_s:g} s")

    def daemon_of(self, job: str, rank: int) -> subprocess.Popen | None:
        with self.client() as client:
            pid = next((d.pid for d in client.cluster_status().daemons if d.job_id == job and d.rank == rank), None)
        return next((d for d in self.daemons if d is not None and d.pid == pid), None)

    def repair(self) -> None:
        """Kill for good what was stopped, start again what is dead, wait until the daemons are idle."""
        for proc in [self.coordinator, *self.daemons]:
            if proc is not None and proc.poll() is None and not _running(proc.pid):
                proc.kill()  # SIGSTOPped: a stopped process is dead to the cluster anyway
                proc.wait()
        if self.coordinator.poll() is not None:
            self.start_coordinator()  # same port: the daemons register again by themselves
        for index, proc in enumerate(self.daemons):
            if proc.poll() is not None:
                self._start_daemon(index)
        self.wait_idle()

    def close(self) -> None:
        for proc in [*self.daemons, self.coordinator]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in [*self.daemons, self.coordinator]:
            if proc is None:
                continue
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t", "Z", "X")
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------- trials


def run_trial(cluster: Cluster, trial: Trial, ranks: int, checkpoint: str, job_seconds: float) -> Trial:
    job = f"fault-{trial.number}-{secrets.token_hex(3)}"
    logs = cluster.workdir / "logs"
    command = [sys.executable, "-m", "tessel.cli", "run", "-n", str(ranks), "--coordinator", cluster.address]
    command += ["--log-dir", str(logs), "--job-id", job, "--quiet", str(RANK_SCRIPT), str(job_seconds)]
    command += [checkpoint] if checkpoint else []
    with open(cluster.workdir / f"{job}.launcher", "w") as launcher_log:
        launcher = subprocess.Popen(
            command, env=cluster.env, stdout=launcher_log, stderr=launcher_log, cwd=cluster.workdir,
            start_new_session=True,
        )  # fmt: skip
    try:
        if not _wait_running(logs / job, ranks, launcher):
            trial.note = "the job never ran: " + (cluster.workdir / f"{job}.launcher").read_text()[-300:]
            return trial
        time.sleep(trial.delay_s)
        victim = _victim(cluster, job, trial)
        if victim is None or launcher.poll() is not None:
            trial.note = "the job ended before the fault"
            return trial
        segments = _mapped_segments([d.pid for d in cluster.daemons if d is not None])
        faulted = time.time()
        os.kill(victim, signal.SIGKILL if trial.signal == "kill" else signal.SIGSTOP)
        if trial.target == "coordinator":
            _bring_back(cluster, trial)
        trial.hang = not _wait_exit(launcher, TRIAL_DEADLINE_S)
        if trial.hang:
            _dump_stacks([launcher.pid, *_job_processes(job).values()])
        _judge(cluster, trial, job, logs / job, ranks, faulted)
    finally:
        if launcher.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    reaped_by = time.monotonic() + REAPED_WAIT_S  # ranks the launcher stopped are gone by then
    while _job_processes(job) and time.monotonic() < reaped_by:
        time.sleep(0.05)
    cluster.repair()
    trial.leftovers = {
        "processes": len(_job_processes(job)),
        "sockets": len(_dead_socket_directories()),
        "shm": len([s for s in segments if os.path.exists(s) and s not in _mapped_segments(_pids())]),
    }
    return trial


def _bring_back(cluster: Cluster, trial: Trial) -> None:
    """What an operator (or a supervisor such as systemd) does: start the killed coordinator again on its port and
    store, or continue the stopped one."""
    if trial.signal == "kill":
        cluster.coordinator.wait(10)
        time.sleep(RESTART_AFTER_S)
        cluster.start_coordinator()
    else:
        time.sleep(PAUSE_S)
        os.kill(cluster.coordinator.pid, signal.SIGCONT)


def _dump_stacks(pids: list[int]) -> None:
    """Where a hung trial's processes are: SIGABRT makes Python's faulthandler (PYTHONFAULTHANDLER, set for every
    process of the campaign) print every thread's stack to the process's stderr, i.e. its log."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGABRT)
    time.sleep(1.0)


def _wait_running(directory: Path, ranks: int, launcher: subprocess.Popen, timeout_s: float = 90.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.poll() is None:
        running = 0
        for rank in range(ranks):
            with contextlib.suppress(OSError):
                running += "running" in (directory / f"rank.{rank}" / "stdout").read_text()
        if running == ranks:
            return True
        time.sleep(0.05)
    return False


def _victim(cluster: Cluster, job: str, trial: Trial) -> int | None:
    if trial.target == "coordinator":
        return cluster.coordinator.pid
    if trial.target == "daemon":
        daemon = cluster.daemon_of(job, trial.rank)
        return daemon.pid if daemon is not None else None
    return _job_processes(job).get(trial.rank)


def _wait_exit(proc: subprocess.Popen, timeout_s: float) -> bool:
    try:
        proc.wait(timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def _judge(cluster: Cluster, trial: Trial, job: str, directory: Path, ranks: int, faulted: float) -> None:
    """Detection time and culprit from the ranks' logs, the launcher's summary and the coordinator's verdict."""
    expected = trial.rank
    reporters = [r for r in range(ranks) if not (trial.target == "rank" and r == trial.rank)]
    failures, finished = {}, 0
    for rank in reporters:
        with contextlib.suppress(OSError):
            text = (directory / f"rank.{rank}" / "stdout").read_text()
            found = FAILED.search(text)
            finished += f"rank {rank} done" in text
            if found:
                failures[rank] = found
    trial.reported = len(failures)
    trial.finished = finished == len(reporters) and not failures
    if trial.target == "coordinator":  # the job must survive: nothing to detect, nobody to blame
        trial.finished = trial.finished and "failed" not in (cluster.workdir / f"{job}.launcher").read_text()
        trial.culprit_right = trial.clear_error = trial.finished
        if not trial.finished:
            texts = [f.group(0) for f in failures.values()]
            trial.note += f"not finished: {texts[:2]}; "
        return
    if failures:
        trial.detection_s = max(float(f.group(3)) for f in failures.values()) - faulted
    if len(failures) < len(reporters):
        trial.note += f"ranks {sorted(set(reporters) - set(failures))} did not report a failure; "
    summary = SUMMARY.search((cluster.workdir / f"{job}.launcher").read_text())
    verdict = -2
    if cluster.coordinator.poll() is None and _running(cluster.coordinator.pid):
        with contextlib.suppress(Exception), cluster.client() as client:
            verdict = client.get_job(job).culprit_rank
    named = {int(f.group(4)) for f in failures.values() if f.group(4) != "None"}
    trial.culprit_right = (
        verdict == expected and summary is not None and int(summary.group(1)) == expected and named <= {expected}
    )
    if not trial.culprit_right:
        trial.note += (
            f"verdict {verdict}, summary {summary.group(1) if summary else None}, ranks named {sorted(named)}; "
        )


def _dead_socket_directories() -> list[str]:
    root = Path(tempfile.gettempdir())
    dead = []
    for entry in root.glob("tessel-daemon-*"):
        pid = entry.name.split("-")[2]
        if pid.isdigit() and not _alive(int(pid)) and entry.stat().st_uid == os.getuid():
            dead.append(str(entry))
    return dead


def _stale_temps(checkpoint: str) -> set[str]:
    if not checkpoint:
        return set()
    folder, name = os.path.split(checkpoint)
    return {str(p) for p in Path(folder).glob(f".tmp-{name}.*")}


# ---------------------------------------------------------------------------------------------------- report


def table(trials: list[Trial]) -> str:
    lines = [
        "| target | signal | trials | detection s (min / median / max) | culprit right | hangs | leftovers "
        "(processes / sockets / shm / temp files) | job survived |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for target in ("rank", "daemon", "coordinator"):
        for sig in ("kill", "stop"):
            group = [t for t in trials if t.target == target and t.signal == sig and not t.note.startswith("the job")]
            if not group:
                continue
            times = sorted(t.detection_s for t in group if t.detection_s is not None)
            detection = f"{times[0]:.2f} / {statistics.median(times):.2f} / {times[-1]:.2f}" if times else "-"
            right = f"{100 * sum(t.culprit_right for t in group) / len(group):.0f} %"
            left = [sum(t.leftovers.get(k, 0) for t in group) for k in ("processes", "sockets", "shm", "tmp")]
            survived = "no (by design)"
            if target == "coordinator":  # restarted (kill) or continued (stop): nobody to detect or blame
                detection, right = "- (restarted)" if sig == "kill" else "- (continued)", "n/a"
                survived = f"{sum(t.finished for t in group)}/{len(group)} jobs finished"
            lines.append(
                f"| {target} | {sig} | {len(group)} | {detection} | {right} | "
                f"{sum(t.hang for t in group)} | {' / '.join(map(str, left))} | {survived} |"
            )
    return "\n".join(lines)


def verdict(trials: list[Trial]) -> list[str]:
    ran = [t for t in trials if not t.note.startswith("the job")]
    blamed = [t for t in ran if t.target != "coordinator"]
    restarts = [t for t in ran if t.target == "coordinator"]
    times = [t.detection_s for t in blamed if t.detection_s is not None]
    slow = [t for t in blamed if t.detection_s is None or t.detection_s > DETECTION_TARGET_S]
    return [
        f"hangs: {sum(t.hang for t in ran)} (target 0) — {'PASS' if not any(t.hang for t in ran) else 'FAIL'}",
        f"culprit right: {sum(t.culprit_right for t in blamed)}/{len(blamed)} (target all) — "
        f"{'PASS' if all(t.culprit_right for t in blamed) else 'FAIL'}",
        f"detection <= {DETECTION_TARGET_S:g} s: {len(blamed) - len(slow)}/{len(blamed)} "
        f"(max {max(times, default=0):.2f} s) — {'PASS' if not slow else 'FAIL'}",
        f"coordinator faults survived (jobs that finished): {sum(t.finished for t in restarts)}/{len(restarts)} "
        f"(target all) — {'PASS' if all(t.finished for t in restarts) else 'FAIL'}",
        f"leftovers: {sum(sum(t.leftovers.values()) for t in ran)} — "
        f"{'PASS' if not any(sum(t.leftovers.values()) for t in ran) else 'FAIL'}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--targets", default="rank,daemon,coordinator")
    parser.add_argument("--signals", default="kill,stop")
    parser.add_argument("--no-checkpoint", action="store_true", help="rank 0 does not save checkpoints")
    parser.add_argument("--json", default="", help="write every trial's record here")
    parser.add_argument("--job-seconds", type=float, default=JOB_SECONDS, help="how long each trial's job runs")
    parser.add_argument("--max-delay", type=float, default=MAX_DELAY_S, help="latest fault, seconds after start")
    args = parser.parse_args(argv)
    if args.max_delay < 0:
        parser.error(f"--max-delay {args.max_delay:g}: a fault cannot come before the job runs; give 0 or more")
    # A coordinator trial must see the job through its fault: stopped, the coordinator comes back PAUSE_S later.
    least = args.max_delay + PAUSE_S + RECOVERY_MARGIN_S
    if args.job_seconds < least:
        parser.error(
            f"--job-seconds {args.job_seconds:g} ends the job before a coordinator stopped as late as --max-delay "
            f"{args.max_delay:g} s is back ({PAUSE_S:g} s later) and its ranks have reconnected; give at least "
            f"{least:g} or a smaller --max-delay"
        )
    rng = random.Random(args.seed)
    plan = [(t, s) for t in args.targets.split(",") for s in args.signals.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="tessel-faults-"))
    checkpoint = "" if args.no_checkpoint else str(workdir / "ckpt" / "model.ckpt")
    if checkpoint:
        os.makedirs(os.path.dirname(checkpoint))
    trials: list[Trial] = []
    cluster = Cluster(workdir, args.ranks)
    earlier_temps: set[str] = set()
    started = time.monotonic()
    try:
        for number in range(args.trials):
            target, sig = plan[number % len(plan)] if number < len(plan) else rng.choice(plan)
            rank = rng.randrange(args.ranks) if target != "coordinator" else -1
            trial = Trial(number, target, sig, rank, delay_s=round(rng.uniform(0.0, args.max_delay), 3))
            run_trial(cluster, trial, args.ranks, checkpoint, args.job_seconds)
            temps = _stale_temps(checkpoint)
            trial.leftovers["tmp"] = len(earlier_temps & temps)  # still there after this trial's saves
            earlier_temps = temps
            trials.append(trial)
            detection = f"{trial.detection_s:.2f} s" if trial.detection_s is not None else "-"
            outcome = f"detected in {detection}, culprit {'right' if trial.culprit_right else 'WRONG'}"
            if target == "coordinator":
                how = "restarted" if sig == "kill" else "continued"
                outcome = f"{how}, job {'finished' if trial.finished else 'FAILED'}"
            print(
                f"trial {number:3d}: {sig:4s} {target:11s} {rank:2d} after {trial.delay_s:.2f} s: {outcome}, "
                f"{'HANG, ' if trial.hang else ''}leftovers {trial.leftovers} {trial.note}",
                flush=True,
            )
    finally:
        cluster.close()
    print(f"\n{len(trials)} trials in {time.monotonic() - started:.0f} s ({args.ranks} ranks, seed {args.seed})\n")
    print(table(trials))
    print()
    lines = verdict(trials)
    for line in lines:
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(t) for t in trials], indent=1))
    passed = all("PASS" in line for line in lines)
    if passed:  # the cluster's logs, store and checkpoints matter only to a campaign that failed
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"the cluster's logs are kept in {workdir}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
