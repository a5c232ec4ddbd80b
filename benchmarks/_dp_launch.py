"""Process handling for benchmarks/data_parallel.py: every run has a deadline and leaves no process behind.

- `run_tessel(...)`: `tessel run -n N _dp_tessel.py` (embedded coordinator + N daemons), the ranks' records;
- `run_ddp(...)`: N `_dp_torch.py` processes (gloo, tcp://127.0.0.1), the ranks' records;
- `ResidentCluster`: `tessel coordinator --port 0` and N `tessel daemon` processes started once, so that
  `time_launch(...)` can time whole `tessel run -n N --coordinator ADDR` commands on already-running daemons.
A failure raises `BenchmarkError` with the tail of the failing process's output.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).parent
TESSEL_RANK = HERE / "_dp_tessel.py"
TORCH_RANK = HERE / "_dp_torch.py"
_PR_SET_PDEATHSIG = 1


class BenchmarkError(RuntimeError):
    """A run failed or missed its deadline; the message carries the cause and the output's tail."""


def _die_with_parent() -> None:
    # A benchmark killed mid-run must not leave daemons or workers behind (Linux prctl).
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _tessel(*args: str) -> list[str]:
    return [sys.executable, "-m", "tessel.cli", *args]


def _records(out: Path, world: int, what: str) -> list[dict]:
    missing = [r for r in range(world) if not (out / f"rank{r}.json").is_file()]
    if missing:
        raise BenchmarkError(f"{what}: ranks {missing} wrote no result into {out}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _stop(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_tessel(
    world: int, threads: int, rank_args: list[str], deadline_s: float, env: dict[str, str] | None = None
) -> list[dict]:
    """`tessel run -n world --threads threads _dp_tessel.py rank_args --out TMP`; the ranks' records. `env`: more
    environment variables for the job (e.g. TESSEL_TIMELINE)."""
    with tempfile.TemporaryDirectory(prefix="tessel-dp-") as tmp:
        out = Path(tmp) / "out"
        cmd = _tessel("run", "-n", str(world), "--threads", str(threads), "--quiet", "--log-dir", f"{tmp}/logs")
        cmd += [str(TESSEL_RANK), *rank_args, "--out", str(out)]
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=deadline_s,
                preexec_fn=_die_with_parent,
                env=None if env is None else {**os.environ, **env},
            )
        except subprocess.TimeoutExpired:
            raise BenchmarkError(f"tessel {world} ranks: no result within {deadline_s:.0f} s") from None
        if done.returncode != 0:
            raise BenchmarkError(f"tessel {world} ranks: exit code {done.returncode}\n{done.stderr[-2000:]}")
        return _records(out, world, f"tessel {world} ranks")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ddp(world: int, threads: int, batch: int, steps: int, epochs: int, deadline_s: float) -> list[dict]:
    """N `_dp_torch.py` ranks with `threads` torch threads each; the ranks' records."""
    with tempfile.TemporaryDirectory(prefix="ddp-dp-") as tmp:
        out, port = Path(tmp) / "out", _free_port()
        env = dict(os.environ, **{v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")})
        procs = []
        try:
            for rank in range(world):
                cmd = [sys.executable, str(TORCH_RANK), "--rank", str(rank), "--world", str(world), "--port", str(port)]
                cmd += [
                    "--batch",
                    str(batch),
                    "--steps",
                    str(steps),
                    "--epochs",
                    str(epochs),
                    "--threads",
                    str(threads),
                ]
                cmd += ["--out", str(out)]
                log = open(Path(tmp) / f"rank{rank}.log", "w+")  # noqa: SIM115 - closed with the process below
                procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
            deadline = time.monotonic() + deadline_s
            while any(p.poll() is None for p, _ in procs) and time.monotonic() < deadline:
                if any(p.poll() not in (None, 0) for p, _ in procs):
                    break  # one rank failed: the others would wait for it until gloo's timeout
                time.sleep(0.05)
            failed = [(r, p.returncode) for r, (p, _) in enumerate(procs) if p.poll() != 0]
            if failed:
                rank = failed[0][0]
                procs[rank][1].seek(0)
                tail = procs[rank][1].read()[-2000:]
                raise BenchmarkError(
                    f"DDP {world} ranks: rank {rank} ended with {failed[0][1]} (None: timeout)\n{tail}"
                )
            return _records(out, world, f"DDP {world} ranks")
        finally:
            _stop([p for p, _ in procs])
            for _, log in procs:
                log.close()


class ResidentCluster:
    """A coordinator and `world` daemons that outlive the jobs run on them (the cluster use case)."""

    def __init__(self, world: int, threads_per_daemon: int, start_timeout_s: float = 60.0):
        self.world, self.threads, self.start_timeout_s = world, threads_per_daemon, start_timeout_s
        self.token = secrets.token_hex(16)
        self.procs: list[subprocess.Popen] = []
        self.address = ""
        self.tmp = tempfile.TemporaryDirectory(prefix="tessel-resident-")

    def __enter__(self) -> ResidentCluster:
        try:
            coordinator = self._start(_tessel("coordinator", "--port", "0", "--log-level", "WARNING"))
            self.address = self._first_line(coordinator, "coordinator")
            for device in range(self.world):
                cmd = _tessel("daemon", "--coordinator", self.address, "--device", str(device))
                line = self._first_line(self._start([*cmd, "--threads", str(self.threads)]), f"daemon {device}")
                if not line.startswith("tessel daemon"):
                    raise BenchmarkError(f"daemon {device} printed {line!r} instead of its address")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        _stop(list(reversed(self.procs)))  # daemons first, then the coordinator
        self.tmp.cleanup()

    def env(self) -> dict[str, str]:
        return dict(os.environ, TESSEL_TOKEN=self.token, TESSEL_HOME=self.tmp.name)

    def _start(self, cmd: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(
            cmd,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.procs.append(proc)
        return proc

    def _first_line(self, proc: subprocess.Popen, what: str) -> str:
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        if not got or not got[0].strip():
            raise BenchmarkError(f"{what} did not start within {self.start_timeout_s:.0f} s (exit {proc.poll()})")
        # Keep draining stdout so a chatty process never blocks on a full pipe.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        return got[0].strip()

    def time_launch(self, script: Path, script_args: list[str], deadline_s: float) -> float:
        """Wall-clock seconds of one whole `tessel run -n world --coordinator ADDR script` command."""
        logs = Path(self.tmp.name) / "logs"
        cmd = _tessel("run", "-n", str(self.world), "--coordinator", self.address, "--quiet", "--log-dir", str(logs))
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [*cmd, str(script), *script_args],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=deadline_s,
                preexec_fn=_die_with_parent,
            )
        except subprocess.TimeoutExpired:
            raise BenchmarkError(f"tessel run on the resident cluster: no exit within {deadline_s:.0f} s") from None
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise BenchmarkError(f"tessel run on the resident cluster: exit {done.returncode}\n{done.stderr[-2000:]}")
        return seconds
