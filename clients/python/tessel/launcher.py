"""`tessel run`: start N copies of a script, one per rank (SPMD, like msrun / torchrun / mpirun).

Without --coordinator it embeds a coordinator in this process and starts N local CPU daemons whose compute
threads together use this host's cores (never more, unless N itself exceeds the cores); with --coordinator
it joins the cluster there and the coordinator assigns daemons. Each rank's output goes to
`<log-dir>/<job>/rank.<r>/{stdout,stderr}`; rank 0 also streams to the terminal. The first rank to fail stops
the others, and its last lines are printed. Ctrl-C tears everything down.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from tessel import local_daemons
from tessel.core import token as tokens
from tessel.core.errors import ConfigurationError, TesselError

TAIL_LINES = 20
# What tessel.train.progress writes before each redraw of its bar: the terminal shows the last redraw of a line,
# and so does the log, which keeps only the text after the last one.
ERASE_LINE = b"\r\x1b[2K"
_MAX_PARTIAL_LINE = 1 << 20  # longer output without a newline is logged as it comes
RANKS_LEARN_S = 3.0  # how long the other ranks of a failed job get to exit with the cause before being stopped


def _plugin_specs(value: str) -> list[str]:
    specs = [spec.strip() for spec in value.split(",") if spec.strip()]
    if not specs:
        raise SystemExit(f"tessel run: --plugin {value!r} names no plugin; e.g. --plugin cpu or --plugin gpu,cpu")
    return specs


def _plugin_names(value: str) -> list[str]:
    """The names the daemons of `--plugin` register (an entry point's name, or a module:Class plugin's `name`).
    Only a module:Class plugin is loaded to learn its name: `tessel run` starts its ranks before loading anything
    heavy (plugins import numpy and gRPC)."""
    specs = _plugin_specs(value)
    if not any(":" in spec for spec in specs):
        return specs
    from tessel.core.plugin import plugin_class

    return [plugin_class(spec).name if ":" in spec else spec for spec in specs]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tessel run", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks")
    parser.add_argument("--coordinator", default=None, help="host:port of a running coordinator (default: embed one)")
    parser.add_argument(
        "--plugin",
        default="cpu",
        help="plugin of the local daemons / required of assigned ones; several, comma-separated, make a job over "
        "mixed hardware (local daemons take them in turn; assigned ones may be any of them)",
    )
    parser.add_argument("--log-dir", default="log_output", help="per-rank logs go to LOG_DIR/<job>/rank.<r>/")
    parser.add_argument(
        "--job-id",
        default=None,
        help="job id (default: the next free number in the log dir, a nonce appended: 3-1f0a9c)",
    )
    parser.add_argument("--threads", type=int, default=0, help="compute threads for all local daemons together")
    parser.add_argument("--join-timeout", type=float, default=120.0, help="seconds for all ranks to join")
    parser.add_argument("--quiet", action="store_true", help="do not stream rank 0 to the terminal")
    parser.add_argument(
        "--sim-level",
        type=int,
        default=None,
        help="simulate the -n world (msrun's --sim_level): 0 plans and compiles one rank, starting no daemons",
    )
    parser.add_argument("--sim-rank-id", type=int, default=0, help="the rank a simulation plans and compiles")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    args = parser.parse_args(argv)
    if args.nproc < 1:
        parser.error("-n must be at least 1")
    if not Path(args.script).is_file():
        parser.error(f"script {args.script!r} does not exist")
    return args


def _cluster_token(coordinator: str | None) -> str:
    """The token of the cluster this launch runs on, from the one source every server and client uses
    ($TESSEL_TOKEN, else the token file: `tokens.cluster_token`). A running coordinator was started with it, so
    without one it is an error; an embedded cluster is this launch's own, so a fresh token serves there."""
    if coordinator is not None:
        return tokens.cluster_token()
    try:
        return tokens.cluster_token()
    except ConfigurationError:
        return secrets.token_hex(16)


def _next_job_id(log_dir: Path) -> str:
    # Directories are "<n>-<nonce>" (older launchers wrote "<n>" for an embedded cluster): n counts both.
    taken = {p.name.split("-")[0] for p in log_dir.iterdir()} if log_dir.is_dir() else set()
    n = 1
    while str(n) in taken:
        n += 1
    return str(n)


class _Tee(threading.Thread):
    """Copies a child's pipe to its log file and (for rank 0) the terminal.

    The log gets every line whatever happens to the terminal: a reader that went away (`tessel run | head`) only
    ends the echo, and the pipe is drained to its end so the child never blocks on it. The terminal gets what
    arrived at once, also a line still being drawn (a progress bar); the log gets whole lines as they end up shown."""

    def __init__(self, pipe, path: Path, echo):
        super().__init__(daemon=True)
        self.pipe, self.path, self.echo = pipe, path, echo
        self.copied = 0  # bytes logged so far: shutdown waits while this grows

    def run(self) -> None:
        partial = b""
        with open(self.path, "wb") as log:
            for chunk in iter(lambda: self.pipe.read1(1 << 16), b""):
                *lines, partial = (partial + chunk).split(b"\n")
                for line in lines:
                    log.write(line.rsplit(ERASE_LINE, 1)[-1] + b"\n")
                redrawn = partial.rfind(ERASE_LINE)
                if redrawn > 0:  # a bar redrawn for hours without a newline must not pile up here
                    partial = partial[redrawn:]
                if len(partial) > _MAX_PARTIAL_LINE:
                    log.write(partial)
                    partial = b""
                log.flush()
                self.copied += len(chunk)
                if self.echo is not None and not _echo(self.echo, chunk):
                    self.echo = None
            log.write(partial.rsplit(ERASE_LINE, 1)[-1])

    def finish(self, idle_s: float = 2.0) -> None:
        """Wait until the pipe is drained. A grandchild of the rank may hold it open for ever, so give up only
        once nothing arrived for `idle_s`, never while output is still being copied."""
        seen = -1
        while self.is_alive() and self.copied != seen:
            seen = self.copied
            self.join(idle_s)


def _echo(stream, data: bytes) -> bool:
    """Write to the launcher's terminal; False once its reader is gone (the stream then writes to /dev/null, so
    that neither later messages nor the interpreter's last flush fail on it)."""
    try:
        stream.write(data)
        stream.flush()
        return True
    except (OSError, ValueError):  # EPIPE (`| head` exited), EIO (the terminal hung up), a closed stream
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        return False


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _say(message: str) -> None:
    """A launcher message on stderr, which may be a closed pipe by now: the job's exit status matters more."""
    _echo(sys.stderr.buffer, (message + "\n").encode(errors="replace"))


class Launch:
    """One `tessel run`: the embedded coordinator and daemons (if any), and the rank processes."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.daemons: list[subprocess.Popen] = []
        self.ranks: list[subprocess.Popen] = []
        self.tees: list[_Tee] = []
        self.server = None
        self.daemon_ids: list[str] = []
        self.token = _cluster_token(args.coordinator)
        self.coordinator = args.coordinator
        # Set by SIGINT / SIGTERM (`local_daemons.signals_stop`). Once `signals_deferred`, a signal only sets it and
        # the wait loop ends itself on it, at a point of its own (a KeyboardInterrupt raised inside Popen.poll could
        # leave the process's wait lock held, and the shutdown blocked for ever: seen once in CI, `tessel run` still
        # running 30 s after Ctrl-C).
        self.stopping = threading.Event()
        self.signals_deferred = False

    # ------------------------------------------------------------------------------------------ cluster

    def start_cluster(self, log_root: Path) -> None:
        from tessel.coordinator import serve

        self.server = serve(host="127.0.0.1", port=0, token=self.token)
        self.coordinator = self.server.address
        cores = os.cpu_count() or 1
        total = self.args.threads or cores
        threads = max(1, total // self.args.nproc)
        plugins = _plugin_specs(self.args.plugin)
        for device in range(self.args.nproc):
            plugin = plugins[device % len(plugins)]
            self.daemons.append(
                local_daemons.spawn_daemon(self.coordinator, self.token, plugin=plugin, device=device, threads=threads)
            )
        for device, proc in enumerate(self.daemons):
            self.daemon_ids.append(local_daemons.read_started(proc, f"daemon {device}")[0])
            # The rest of the daemon's output goes to its log; an unread pipe would block it once full.
            out_dir = log_root / f"daemon.{device}"
            out_dir.mkdir(parents=True, exist_ok=True)
            for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
                tee = _Tee(pipe, out_dir / name, None)
                tee.start()
                self.tees.append(tee)

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["TESSEL_TOKEN"] = self.token
        if self.coordinator:
            env["TESSEL_COORDINATOR"] = self.coordinator
        return env

    # ------------------------------------------------------------------------------------------ ranks

    def start_ranks(self, job_id: str, log_root: Path) -> None:
        n = self.args.nproc
        plugin_names = ",".join(_plugin_names(self.args.plugin))
        for rank in range(n):
            env = self._base_env()
            env.update(
                TESSEL_JOB_ID=job_id,
                TESSEL_RANK=str(rank),
                TESSEL_WORLD_SIZE=str(n),
                TESSEL_PLUGIN=plugin_names,
                TESSEL_JOIN_TIMEOUT=str(self.args.join_timeout),
                RANK_ID=str(rank),
                RANK_SIZE=str(n),
                DEVICE_ID=str(rank),
                PYTHONUNBUFFERED="1",
                # The script only drives its daemon; its own numpy must not compete with the daemons' threads.
                OMP_NUM_THREADS="1",
                OPENBLAS_NUM_THREADS="1",
                MKL_NUM_THREADS="1",
            )
            if self.daemon_ids:
                env["TESSEL_DAEMON_ID"] = self.daemon_ids[rank]
            if rank == 0 and not self.args.quiet and _is_terminal(sys.stdout):
                env["TESSEL_TERMINAL"] = "1"  # its output reaches a person: Model.train may draw its progress bar
            out_dir = log_root / f"rank.{rank}"
            out_dir.mkdir(parents=True, exist_ok=True)
            proc = subprocess.Popen(
                [sys.executable, self.args.script, *self.args.args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=local_daemons.die_with_parent,  # never outlive the launcher
            )
            echo_out = sys.stdout.buffer if rank == 0 and not self.args.quiet else None
            echo_err = sys.stderr.buffer if rank == 0 and not self.args.quiet else None
            for pipe, name, echo in ((proc.stdout, "stdout", echo_out), (proc.stderr, "stderr", echo_err)):
                tee = _Tee(pipe, out_dir / name, echo)
                tee.start()
                self.tees.append(tee)
            self.ranks.append(proc)

    def wait_ranks(self, job_id: str) -> tuple[int, int, str]:
        """Wait for every rank; on the first failure stop the others. Returns (exit code, failing rank, cause)."""
        pending = set(range(len(self.ranks)))
        self.signals_deferred = True  # from now on a signal only sets `stopping` (see __init__)
        left, next_look = set(), 0.0  # ranks that exited 0 while the job may still be forming
        while pending:
            if self.stopping.is_set():
                raise KeyboardInterrupt
            failed = None
            for rank in sorted(pending):
                code = self.ranks[rank].poll()
                if code is not None:
                    pending.discard(rank)
                    if code != 0:
                        failed = rank
                        break
                    left.add(rank)
            if failed is None and left and pending and time.monotonic() >= next_look:
                next_look = time.monotonic() + 0.5
                failed = self._left_before_joining(job_id, left)
            dead_daemon = next((d for d, proc in enumerate(self.daemons) if proc.poll() is not None), None)
            if failed is None and pending and dead_daemon is not None:
                # The ranks learn of a dead daemon from the coordinator within seconds and fail with the cause.
                self._await_exit(self.ranks, 10.0, self.stopping)
                failed = next((r for r, p in enumerate(self.ranks) if p.returncode not in (0, None)), dead_daemon)
            if failed is not None:
                # The status reaches the coordinator even if the rank could not say it (`raise SystemExit(3)`, a
                # signal); a rank that reported its failure itself is not blamed again (coordinator/state.py).
                culprit, cause = self._culprit(job_id, failed, self.ranks[failed].poll())
                # The coordinator failed the job (or went away: the ranks hear that too), so the other ranks learn
                # of it within moments and exit saying why; stopping them at once raced that, and their logs stayed
                # empty.
                self._await_exit(self.ranks, RANKS_LEARN_S, self.stopping)
                self._stop(self.ranks)
                rank = culprit if culprit >= 0 else failed
                code = self.ranks[rank].returncode if rank >= 0 else 1
                return (code or 1), rank, cause
            self.stopping.wait(0.02)
        return 0, -1, ""

    def _left_before_joining(self, job_id: str, left: set[int]) -> int | None:
        """A rank that exited 0 while the others wait for the job to form never joined it (init() returns only once
        the job runs): it would keep them waiting until their join deadline, then be named among the missing. Fail
        the job now, blaming it; returns that rank, or None (the job ran: those ranks finished their part)."""
        from tessel.core.coordinator_client import CoordinatorClient

        with CoordinatorClient(self.coordinator, self.token, timeout_s=2.0, grace_s=0.0) as client:
            try:
                state = client.get_job(job_id).state
            except (TesselError, KeyError):
                return None  # no rank joined yet, or the coordinator is gone (the ranks hear of that)
            if state != "waiting":
                left.clear()
                return None
            rank = min(left)
            with contextlib.suppress(TesselError, KeyError):
                client.fail_job(
                    job_id, rank, "exited with status 0 before it joined the job (it never called init())", rank
                )
            return rank

    def _culprit(self, job_id: str, rank: int = -1, code: int | None = None, wait_s: float = 2.0) -> tuple[int, str]:
        """The rank the coordinator blames (the first to die or raise), and why; (-1, "") if it has no verdict.
        `rank` exited with status `code` (None: still running): the coordinator hears of it first."""
        from tessel.core.coordinator_client import CoordinatorClient

        deadline = time.monotonic() + wait_s
        with CoordinatorClient(self.coordinator, self.token, timeout_s=2.0, grace_s=0.0) as client:
            if code not in (0, None):
                with contextlib.suppress(TesselError, KeyError):
                    client.fail_job(job_id, rank, f"exited with status {code}", rank)
            while time.monotonic() < deadline:
                try:
                    job = client.get_job(job_id)
                except (TesselError, KeyError):
                    return -1, ""
                if job.state == "failed":
                    return job.culprit_rank, job.cause
                if rank in job.finished_ranks and code not in (0, None):
                    return -1, (
                        f"after it had finished its part: a rank whose exit hangs writes its threads' stacks and ends "
                        f"with status 1 once TESSEL_EXIT_TIMEOUT seconds have passed; or its program raised "
                        f"SystemExit({code}) itself after its work (sys.exit is seen, a bare raise is not)"
                    )
                time.sleep(0.05)
        return -1, ""

    @staticmethod
    def _await_exit(procs: list[subprocess.Popen], timeout_s: float, stop: threading.Event | None = None) -> None:
        """Until every process exited, `timeout_s` passed or `stop` is set."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if stop is None:
                time.sleep(0.05)
            elif stop.wait(0.05):
                return

    def _stop(self, procs: list[subprocess.Popen], grace_s: float = 3.0) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        self._await_exit(procs, grace_s)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def shutdown(self) -> None:
        self._stop(self.ranks)
        if self.server is not None:
            self.server.stop()  # first, so that daemons going away is not reported as a failure
        self._stop(self.daemons)
        for tee in self.tees:
            tee.finish()


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            return b"".join(deque(f, maxlen=lines)).decode(errors="replace")
    except OSError:
        return ""


def simulate(args: argparse.Namespace, log_root: Path) -> int:
    """`--sim-level`: the script once, as rank --sim-rank-id of an -n world that is not running
    (tessel.communication.simulation); its output goes to the terminal and LOG_DIR/<job>/rank.<r>/."""
    from tessel.communication.simulation import SIM_LEVEL, SIM_RANK, SIM_WORLD

    if not 0 <= args.sim_rank_id < args.nproc:
        _say(f"tessel run: --sim-rank-id {args.sim_rank_id} is not a rank of the {args.nproc}-rank world")
        return 2
    rank_dir = log_root / f"rank.{args.sim_rank_id}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.update({SIM_LEVEL: str(args.sim_level), SIM_RANK: str(args.sim_rank_id), SIM_WORLD: str(args.nproc)})
    for name in ("TESSEL_COORDINATOR", "TESSEL_RANK", "MS_ROLE", "RANK_TABLE_FILE"):
        env.pop(name, None)
    with open(rank_dir / "stdout", "wb") as out, open(rank_dir / "stderr", "wb") as err:
        child = subprocess.run([sys.executable, args.script, *args.args], env=env, stdout=out, stderr=err)
    sys.stdout.write((rank_dir / "stdout").read_text(errors="replace"))
    if child.returncode != 0:
        _say(f"tessel run: the simulated rank failed with exit code {child.returncode}; last lines of its stderr:")
        _say(_tail(rank_dir / "stderr"))
    return child.returncode


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_dir = Path(args.log_dir)
    # Job ids must be unique at the coordinator (a shared one sees other users' jobs) and two runs started together
    # in one directory would take the same next number, so a nonce follows it: "3-1f0a9c".
    job_id = args.job_id or f"{_next_job_id(log_dir)}-{secrets.token_hex(3)}"
    log_root = log_dir / job_id
    if args.sim_level is None and os.environ.get("MS_SIMULATION_LEVEL", "").strip():  # MindSpore's dry run
        try:
            args.sim_level = int(os.environ["MS_SIMULATION_LEVEL"])
        except ValueError:
            _say(f"tessel run: MS_SIMULATION_LEVEL={os.environ['MS_SIMULATION_LEVEL']!r} must be an integer")
            return 2
    if args.sim_level is not None:
        return simulate(args, log_root)
    try:
        launch = Launch(args)
    except ConfigurationError as exc:  # e.g. no cluster token for --coordinator
        _say(f"tessel run: {exc}")
        return 2
    with local_daemons.signals_stop(launch):
        try:
            log_root.mkdir(parents=True, exist_ok=True)
            if args.coordinator is None:
                launch.start_cluster(log_root)
            launch.start_ranks(job_id, log_root)
            code, failed, cause = launch.wait_ranks(job_id)
        except KeyboardInterrupt:
            _say("tessel run: interrupted; stopping all ranks and daemons")
            return 130
        except (TesselError, ConfigurationError) as exc:
            _say(f"tessel run: {exc}")
            return 2
        finally:
            # Whatever ended the wait: an embedded coordinator left running would keep this process alive. A second
            # Ctrl-C meanwhile only sets the flag: the shutdown is not cut half-way.
            launch.signals_deferred = True
            launch.shutdown()
            # Every process of the job is gone; should this one's own end hang, it prints its stacks and exits.
            from tessel.communication.supervision import bound_exit

            bound_exit()
    if code != 0:
        because = f" ({cause})" if cause else ""
        if failed < 0:  # no rank to show (the coordinator had no verdict and no rank process failed)
            _say(f"\ntessel run: the job failed with exit code {code}{because}")
            return code if code > 0 else 1
        rank_dir = log_root / f"rank.{failed}"
        own = launch.ranks[failed].returncode
        how = f"failed with exit code {code}" if own in (code, None) else f"failed the job (it exited with {own})"
        _say(f"\ntessel run: rank {failed} {how}{because}; last lines of {rank_dir}/stderr:")
        _say(_tail(rank_dir / "stderr") or _tail(rank_dir / "stdout"))
        return code if code > 0 else 1
    return 130 if launch.stopping.is_set() else 0
