"""A tessel cluster on the network-namespace test bed (testbed.py), as processes, the way an operator starts one.

    with Testbed(2, rate="1gbit") as bed, TestbedCluster(bed, tmp_path, daemons_per_host=2) as cluster:
        results = cluster.run_ranks(["examples/hello_collectives.py"])   # rank r on cluster.daemons[r]
        print(describe(results))

The coordinator listens on the switch's address; every daemon listens (gRPC and data plane) on its host's address;
rank r runs inside the host of the daemon it is pinned to and reaches the coordinator over its link.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from testbed import Host, Testbed, bed_environment, stop

_STOP_GRACE_S = 5.0

_ADDRESS = re.compile(r"(\d+\.\d+\.\d+\.\d+:\d+)")


@dataclass(frozen=True)
class Daemon:
    host: Host
    daemon_id: str
    address: str  # its gRPC address
    process: subprocess.Popen = field(compare=False, repr=False)


@dataclass(frozen=True)
class RankResult:
    rank: int
    returncode: int | None  # None: killed at the deadline
    output: str  # stdout and stderr together


def _first_line(proc: subprocess.Popen, what: str, timeout_s: float, log: Path) -> str:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not lines or not lines[0]:
        proc.kill()
        proc.wait(_STOP_GRACE_S)
        stderr = log.read_text(errors="replace") if log.exists() else ""
        raise RuntimeError(f"{what} did not start within {timeout_s:g} s (exit {proc.returncode}): {stderr[-3000:]}")
    return lines[0]


class TestbedCluster:
    """A coordinator on the switch and `daemons_per_host` CPU daemons in every host of `bed`, as processes."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        bed: Testbed,
        workdir: Path,
        daemons_per_host: int = 1,
        threads: int = 1,
        heartbeat_timeout_ms: int = 3000,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 60.0,
    ):
        self.bed = bed
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(8)
        inherited = bed_environment()
        inherited.pop("TESSEL_TRANSPORT", None)  # the transport follows from the hosts unless `env` forces one
        self.env = {
            **inherited,
            "TESSEL_TOKEN": self.token,
            "TESSEL_HOME": str(self.workdir / "home"),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        self.start_timeout_s = start_timeout_s
        coordinator, log = self._server(
            bed.switch,
            f"-m tessel.coordinator --host {bed.switch.address} --port 0 --heartbeat-timeout-ms {heartbeat_timeout_ms}",
            "coordinator",
        )
        self.address = _ADDRESS.search(_first_line(coordinator, "coordinator", start_timeout_s, log)).group(1)
        self.env["TESSEL_COORDINATOR"] = self.address
        self.daemons: list[Daemon] = []
        for host in bed.hosts:
            self.add_daemons(host, daemons_per_host, threads)

    def __enter__(self) -> TestbedCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _server(self, host: Host, args: str, name: str) -> tuple[subprocess.Popen, Path]:
        """Start `python args` in `host`: stdout piped (its first line says where it listens), stderr to a log."""
        log = self.workdir / f"{name}.log"
        with open(log, "w") as stderr:
            proc = self.bed.popen(
                host, [sys.executable, *args.split()], env=self.env, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        return proc, log

    def log(self, daemon: Daemon) -> str:
        """What `daemon` wrote to stderr so far."""
        return (self.workdir / f"daemon-{daemon.daemon_id}.log").read_text(errors="replace")

    def add_daemons(self, host: Host, count: int = 1, threads: int = 1, extra: tuple[str, ...] = ()) -> list[Daemon]:
        """Start `count` daemons in `host` listening on its address (plus `extra` arguments); wait until registered."""
        first = sum(d.host == host for d in self.daemons)
        started = [
            self._server(
                host,
                f"-m tessel.daemon --coordinator {self.address} --host {host.address} --device {first + i} "
                f"--threads {threads} {' '.join(extra)}",
                f"daemon-{host.name}-{first + i}",
            )
            for i in range(count)
        ]
        added = []
        for proc, log in started:
            line = _first_line(proc, f"daemon on {host.name}", self.start_timeout_s, log)
            daemon = Daemon(host, line.split()[2], _ADDRESS.search(line).group(1), proc)
            log.rename(self.workdir / f"daemon-{daemon.daemon_id}.log")  # the open file follows the rename
            added.append(daemon)
        self.daemons += added
        return added

    def run_ranks(
        self,
        argv: list[str],
        daemons: list[Daemon] | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = 120.0,
        job_id: str | None = None,
    ) -> list[RankResult]:
        """Run `python argv...` once per rank, rank r pinned to `daemons[r]` (default: all, in order) and started in
        that daemon's host. Returns every rank's exit code and output; ranks still running at `timeout_s` are
        killed (returncode None)."""
        daemons = list(self.daemons if daemons is None else daemons)
        job_id = job_id or f"tb-{uuid.uuid4().hex[:10]}"
        procs = []
        for rank, daemon in enumerate(daemons):
            rank_env = {
                **self.env,
                **(env or {}),
                "TESSEL_JOB_ID": job_id,
                "TESSEL_RANK": str(rank),
                "TESSEL_WORLD_SIZE": str(len(daemons)),
                "TESSEL_DAEMON_ID": daemon.daemon_id,
                "TESSEL_DAEMON_ADDRESS": daemon.address,
            }
            procs.append(
                self.bed.popen(
                    daemon.host,
                    [sys.executable, *argv],
                    env=rank_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outputs: list[str] = [""] * len(procs)
        readers = [
            threading.Thread(target=lambda i=i, p=p: outputs.__setitem__(i, p.stdout.read()), daemon=True)
            for i, p in enumerate(procs)
        ]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.05, deadline - time.monotonic()))
        hung = [p for p in procs if p.poll() is None]
        stop(hung, grace_s=1.0)
        for reader in readers:
            reader.join(_STOP_GRACE_S)
        return [RankResult(r, None if p in hung else p.returncode, outputs[r]) for r, p in enumerate(procs)]

    def close(self) -> None:
        """Stop the daemons and the coordinator (the test bed's close() would too)."""
        stop([d.process for d in reversed(self.daemons)])
        self.daemons = []
        stop([p for p in self.bed.processes if p.poll() is None])


def describe(results: list[RankResult]) -> str:
    return "\n".join(f"--- rank {r.rank} (exit {r.returncode}) ---\n{r.output[-3000:]}" for r in results)
