"""`tessel msrun`: MindSpore's `msrun` launcher — its options, defaults and log files — on tessel.

    tessel msrun --worker_num=4 --local_worker_num=4 --master_port=8118 --log_dir=msrun_log --join=True train.py
    tessel msrun --worker_num=8 --local_worker_num=4 --master_addr=10.0.0.1 --node_rank=1 --join=True train.py

On the node whose address is --master_addr (node_rank 0 or -1) it starts the scheduler: the task with
MS_ROLE=MS_SCHED, whose `init()` serves the job's coordinator. On every node it starts --local_worker_num workers
(MS_ROLE=MS_WORKER, MS_NODE_ID = node_rank * local_worker_num + i when known), each of which starts its own daemon
(`tessel.communication.dynamic_cluster`). Output goes to LOG_DIR/scheduler.log and LOG_DIR/worker_<rank>.log.
The task runs as `python task_script args…`, or as given when task_script is python, python3 or pytest.
Every process of a job started on several nodes needs the same TESSEL_TOKEN (one host shares ~/.tessel/token).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from tessel import local_daemons
from tessel.core import token as tokens
from tessel.core.errors import ConfigurationError

_LEARN_S = 10.0  # after a process failed, how long the others get to exit with the cause before being stopped
_TAIL_LINES = 20


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tessel msrun", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--worker_num", type=int, default=8, help="workers of the job on all nodes (default 8)")
    add("--local_worker_num", type=int, default=8, help="workers started on this node (default 8)")
    add("--master_addr", default="127.0.0.1", help="address or host name of the scheduler's node")
    add("--master_port", type=int, default=8118, help="the scheduler's port (default 8118)")
    add("--node_rank", type=int, default=-1, help="index of this node; -1: ranks in order of arrival")
    add("--log_dir", default="", help="directory of scheduler.log and worker_<rank>.log (default: here)")
    add("--join", type=_boolean, default=False, help="wait for every process and exit with the job's status")
    add("--cluster_time_out", type=int, default=600, help="seconds for all workers to join (default 600; < 0: 7 days)")
    add("--bind_core", default="False", help='True, or a JSON dict {"device0": ["0-3"], ...}: pin workers to cores')
    add("--sim_level", type=int, default=-1, help="simulated compilation: 0 plans and compiles, starting no daemon")
    add("--sim_rank_id", type=int, default=-1, help="the rank simulated (default: each of this node's ranks)")
    add("--rank_table_file", default="", help="a rank table: the ranks and devices of this node's workers")
    add("--worker_log_name", default="", help="worker log name; {ip} and {hostname} are replaced; _<rank>.log added")
    add("--tail_worker_log", default="-1", help="with --join: workers whose logs are echoed, e.g. 0,1 (-1: all)")
    add("task_script", help="the training script (or python, python3, pytest)")
    add("task_script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if args.worker_num < 1 or args.local_worker_num < 1:
        parser.error("--worker_num and --local_worker_num must be at least 1")
    if args.local_worker_num > args.worker_num:
        parser.error(f"--local_worker_num {args.local_worker_num} exceeds --worker_num {args.worker_num}")
    if args.sim_rank_id != -1 and args.sim_level == -1 and not os.environ.get("MS_SIMULATION_LEVEL", "").strip():
        parser.error("--sim_rank_id needs --sim_level or MS_SIMULATION_LEVEL (a simulated world)")
    return args


def task_command(script: str, script_args: list[str]) -> list[str]:
    """msrun's rule: `python task_script args…`, unless task_script is python, python3 or pytest itself. Python
    is this interpreter, the one tessel is installed in."""
    if script in ("python", "python3"):
        return [sys.executable, *script_args]
    if script == "pytest":
        return [sys.executable, "-m", "pytest", *script_args]
    return [sys.executable, script, *script_args]


def _core_sets(bind_core: str, workers: int) -> list[list[int]] | None:
    """The cores each local worker (and the daemon it starts) is pinned to, or None (no binding)."""
    text = bind_core.strip()
    if text.lower() in ("false", "0", ""):
        return None
    if text.lower() in ("true", "1"):
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < workers:
            raise ConfigurationError(f"--bind_core: {len(cores)} cores cannot be split among {workers} workers")
        share = len(cores) // workers
        return [cores[i * share : (i + 1) * share] for i in range(workers)]
    try:
        mapping = json.loads(text)
    except ValueError:
        raise ConfigurationError(f"--bind_core must be True, False or a JSON dict, got {bind_core!r}") from None
    sets = []
    for i in range(workers):
        ranges = mapping.get(f"device{i}") if isinstance(mapping, dict) else None
        if not ranges:
            raise ConfigurationError(f'--bind_core: no cores for worker {i}; give "device{i}": ["first-last"]')
        cores: list[int] = []
        for item in ranges:
            first, _, last = str(item).partition("-")
            try:
                cores += list(range(int(first), int(last or first) + 1))
            except ValueError:
                raise ConfigurationError(f'--bind_core: "device{i}" range {item!r} is not "first-last"') from None
        sets.append(cores)
    return sets


class Msrun:
    """One node's processes of an msrun job: the scheduler (on the master node) and the local workers."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        # Ctrl-C / SIGTERM while the job runs only set `stopping`, which `wait` ends on (local_daemons.signals_stop).
        self.stopping, self.signals_deferred = threading.Event(), True
        self.master = self._resolve(args.master_addr)
        one_node = args.local_worker_num == args.worker_num
        if args.master_port == 0:  # tessel's addition: a free port, for a job that runs on this node alone
            if not one_node:
                raise ConfigurationError("--master_port 0 (any free port) needs one node: the others must know it")
            with socket.socket() as probe:
                probe.bind((self.master, 0))
                args.master_port = probe.getsockname()[1]
        self.is_master = local_address(self.master) and (one_node or args.node_rank in (-1, 0))
        self.log_dir = Path(args.log_dir or ".")
        self.cores = _core_sets(args.bind_core, args.local_worker_num)
        self.token = ""  # read (or made) when the processes start
        self.placement = self._placement(one_node)
        self._check_tail()
        self.processes: list[tuple[str, Path, subprocess.Popen]] = []  # (name, log, process)

    @staticmethod
    def _resolve(host: str) -> str:
        try:
            address = socket.gethostbyname(host)
        except OSError:
            raise ConfigurationError(f"--master_addr {host!r}: DNS resolution has failed") from None
        if address != host:
            print(f"tessel msrun: converted host name {host} to ip address {address}", file=sys.stderr)
        return address

    def _placement(self, one_node: bool) -> list[tuple[str | None, int]]:
        """(node id or None, device id) of each local worker."""
        args = self.args
        if args.rank_table_file:
            return self._placement_from_table()
        if one_node:
            if args.node_rank not in (-1, 0):
                print(f"tessel msrun: all workers run on this node; --node_rank {args.node_rank} is ignored")
            return [(str(i), i) for i in range(args.local_worker_num)]
        if args.node_rank >= 0:
            first = args.node_rank * args.local_worker_num
            if first + args.local_worker_num > args.worker_num:
                raise ConfigurationError(
                    f"--node_rank {args.node_rank} with --local_worker_num {args.local_worker_num} gives ranks "
                    f"beyond --worker_num {args.worker_num}"
                )
            return [(str(first + i), i) for i in range(args.local_worker_num)]
        return [(None, i) for i in range(args.local_worker_num)]  # ranks in order of arrival

    def _placement_from_table(self) -> list[tuple[str | None, int]]:
        from tessel.communication import rank_table

        args = self.args
        table = rank_table.load(args.rank_table_file)
        if table.size != args.worker_num:
            raise ConfigurationError(
                f"--rank_table_file {args.rank_table_file} lists {table.size} devices but --worker_num is "
                f"{args.worker_num}; they must be equal"
            )
        if args.node_rank >= 0:
            if args.node_rank >= len(table.servers):
                raise ConfigurationError(
                    f"--node_rank {args.node_rank}: the rank table has {len(table.servers)} servers"
                )
            server = table.servers[args.node_rank]
        elif len(table.servers) == 1:
            server = table.servers[0]
        else:
            mine = [s for s in table.servers if local_address(s.host)]
            if len(mine) != 1:
                raise ConfigurationError(
                    f"--rank_table_file: cannot tell which of its {len(table.servers)} servers this node is; "
                    "pass --node_rank"
                )
            server = mine[0]
        if len(server.devices) != args.local_worker_num:
            raise ConfigurationError(
                f"--rank_table_file: server {server.server_id!r} has {len(server.devices)} devices but "
                f"--local_worker_num is {args.local_worker_num}"
            )
        return [(str(d.rank), d.device_id) for d in server.devices]

    def _check_tail(self) -> None:
        wanted = {item.strip() for item in self.args.tail_worker_log.split(",") if item.strip()}
        local = {node_id if node_id is not None else str(i) for i, (node_id, _) in enumerate(self.placement)}
        unknown = sorted(wanted - local - {"-1"})
        if unknown:
            raise ConfigurationError(
                f"--tail_worker_log {self.args.tail_worker_log}: no worker of this node is {', '.join(unknown)}; "
                f"its workers are {', '.join(sorted(local, key=int))} (-1: all)"
            )

    # ------------------------------------------------------------------------------------------ processes

    def _env(self, role: str) -> dict[str, str]:
        args = self.args
        env = dict(os.environ)
        env.update(
            MS_ROLE=role,
            MS_WORKER_NUM=str(args.worker_num),
            MS_SCHED_HOST=self.master,
            MS_SCHED_PORT=str(args.master_port),
            MS_TOPO_TIMEOUT=str(args.cluster_time_out),
            RANK_SIZE=str(args.worker_num),
            TESSEL_TOKEN=self.token,
        )
        for name in ("MS_NODE_ID", "RANK_ID", "DEVICE_ID", "TESSEL_RANK", "TESSEL_COORDINATOR"):
            env.pop(name, None)  # a value left in the shell must not override this launch's
        env.setdefault("PYTHONUNBUFFERED", "1")  # the logs (and --tail_worker_log) follow the task as it runs
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, "1")  # the script drives its daemon: its own numpy must not compete with it
        return env

    def _worker_log(self, index: int, node_id: str | None) -> Path:
        suffix = node_id if node_id is not None else str(index)
        name = self.args.worker_log_name
        if not name:
            return self.log_dir / f"worker_{suffix}.log"
        ip = socket.gethostbyname(socket.gethostname())
        name = name.replace("{ip}", ip).replace("{hostname}", socket.gethostname()).removesuffix(".log")
        return self.log_dir / f"{name}_{suffix}.log"

    def _spawn(self, name: str, log: Path, env: dict[str, str], cores: list[int] | None) -> None:
        join = self.args.join

        def prepare() -> None:
            if join:
                local_daemons.die_with_parent()
            if cores:
                os.sched_setaffinity(0, cores)

        with open(log, "wb") as out:
            proc = subprocess.Popen(
                task_command(self.args.task_script, self.args.task_script_args),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=prepare,
            )
        self.processes.append((name, log, proc))

    def start(self) -> None:
        self.token = os.environ.get("TESSEL_TOKEN") or tokens.cluster_token(create=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.is_master:
            log = self.log_dir / "scheduler.log"
            self._spawn("scheduler", log, self._env("MS_SCHED"), None)
            print(f"tessel msrun: started the scheduler at {self.master}:{self.args.master_port}, log {log}")
        cores_total = len(os.sched_getaffinity(0))
        for index, (node_id, device) in enumerate(self.placement):
            env = self._env("MS_WORKER")
            env["DEVICE_ID"] = str(device)
            if node_id is not None:
                env["MS_NODE_ID"] = node_id
                env["RANK_ID"] = node_id
            cores = self.cores[index] if self.cores else None
            threads = len(cores) if cores else max(1, cores_total // self.args.local_worker_num)
            env.setdefault("TESSEL_THREADS", str(threads))
            log = self._worker_log(index, node_id)
            self._spawn(f"worker {node_id if node_id is not None else index}", log, env, cores)
            rank = f"rank id {node_id}" if node_id is not None else "rank id assigned at arrival"
            print(f"tessel msrun: started worker process with {rank}, log {log}")

    def tail(self) -> list[threading.Thread]:
        """Echo the chosen workers' logs to this terminal as they grow (msrun --tail_worker_log)."""
        wanted = {item.strip() for item in self.args.tail_worker_log.split(",") if item.strip()}
        followers = []
        for name, log, proc in self.processes:
            number = name.split()[-1]
            if name.startswith("worker") and ("-1" in wanted or number in wanted):
                thread = threading.Thread(target=_follow, args=(log, proc), daemon=True)
                thread.start()
                followers.append(thread)
        return followers

    def wait(self) -> list[tuple[str, Path, subprocess.Popen]]:
        """Wait for every process; after the first failure the others get a moment to exit, then are stopped.
        Returns the processes that failed."""
        failed_at = None
        while True:
            if self.stopping.is_set():
                raise KeyboardInterrupt
            codes = [proc.poll() for _, _, proc in self.processes]
            if all(code is not None for code in codes):
                break
            if failed_at is None and any(code not in (None, *self.success) for code in codes):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > _LEARN_S:
                self.stop()
                break
            self.stopping.wait(0.05)
        return [(name, log, proc) for name, log, proc in self.processes if proc.returncode not in self.success]

    @property
    def success(self) -> tuple[int, ...]:
        # MindSpore's samples train at import under `msrun … pytest -s train.py` and hold no test: pytest's
        # "no tests collected" (exit 5) is their normal end.
        return (0, 5) if self.args.task_script == "pytest" else (0,)

    def stop(self) -> None:
        local_daemons.stop([proc for _, _, proc in self.processes])


def local_address(host: str) -> bool:
    from tessel.communication.bootstrap import is_local_address

    return is_local_address(host)


def _follow(path: Path, proc: subprocess.Popen) -> None:
    with open(path, "rb") as f:
        partial = b""
        while True:
            chunk = f.read(1 << 16)
            if chunk:
                *lines, partial = (partial + chunk).split(b"\n")
                if lines:
                    sys.stdout.buffer.write(b"".join(line + b"\n" for line in lines))
                    sys.stdout.flush()
                continue
            if proc.poll() is not None:
                if partial:
                    sys.stdout.buffer.write(partial + b"\n")
                return
            time.sleep(0.1)


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            return b"".join(deque(f, maxlen=lines)).decode(errors="replace")
    except OSError:
        return ""


def simulate(args: argparse.Namespace) -> int:
    """--sim_level: the task as rank --sim_rank_id of a --worker_num world that is not running, or, as MindSpore's
    msrun does without --sim_rank_id, as each of this node's ranks in turn (tessel.communication.simulation), logging
    to log_dir/worker_<rank>.log. Without --sim_level, MindSpore's MS_SIMULATION_LEVEL starts a simulation too,
    with RANK_ID as --sim_rank_id and RANK_SIZE, when set, as the world."""
    from tessel.communication.simulation import MS_LEVEL, SIM_LEVEL, SIM_RANK, SIM_WORLD

    level, rank, world = args.sim_level, args.sim_rank_id, args.worker_num
    if level == -1:
        try:
            level = int(os.environ[MS_LEVEL])
            rank = rank if rank != -1 else int(os.environ.get("RANK_ID", "-1"))
            world = int(os.environ.get("RANK_SIZE", str(world)))
        except ValueError:
            print(f"tessel msrun: {MS_LEVEL}, RANK_ID and RANK_SIZE must be integers", file=sys.stderr)
            return 2
    if rank != -1:
        ranks = [rank]
    elif args.local_worker_num > 128:  # MindSpore's msrun simulates one rank rather than start so many processes
        ranks = [0]
    else:
        first = max(args.node_rank, 0) * args.local_worker_num if args.local_worker_num < args.worker_num else 0
        ranks = list(range(first, first + args.local_worker_num))
    if not all(0 <= r < world for r in ranks):
        print(f"tessel msrun: simulated ranks {ranks} are not all ranks of the {world}-rank world", file=sys.stderr)
        return 2
    log_dir = Path(args.log_dir or ".")
    log_dir.mkdir(parents=True, exist_ok=True)
    for simulated in ranks:  # one after another: each compiles with the host's cores
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.update({SIM_LEVEL: str(level), SIM_RANK: str(simulated), SIM_WORLD: str(world)})
        log_path = log_dir / f"worker_{simulated}.log"
        with open(log_path, "wb") as log:
            child = subprocess.run(
                task_command(args.task_script, args.task_script_args), env=env, stdout=log, stderr=subprocess.STDOUT
            )
        print(log_path.read_text(errors="replace"), end="", flush=True)
        if child.returncode != 0:
            return child.returncode
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sim_level != -1 or os.environ.get("MS_SIMULATION_LEVEL", "").strip():
        return simulate(args)
    launch = None
    try:
        launch = Msrun(args)
        launch.start()
    except BaseException as exc:  # what started must not outlive a start that failed half way
        if launch is not None:
            launch.stop()
        if not isinstance(exc, (ConfigurationError, OSError)):
            raise
        print(f"tessel msrun: {exc}", file=sys.stderr)
        return 2
    if not args.join:
        print(f"tessel msrun: the job runs in the background; its logs are in {launch.log_dir}/")
        return 0

    followers = launch.tail()
    with local_daemons.signals_stop(launch):
        try:
            failures = launch.wait()
        except KeyboardInterrupt:
            print("tessel msrun: interrupted; stopping the scheduler and workers", file=sys.stderr)
            failures = None
        # What remains (stopping the processes, this interpreter's end) is bounded: should it hang, every thread's
        # stack goes to stderr after TESSEL_EXIT_TIMEOUT seconds and msrun exits 1.
        from tessel.communication.supervision import bound_exit

        bound_exit()
        if failures is None:
            launch.stop()
            return 130
    for follower in followers:
        follower.join(5.0)
    for name, log, proc in failures:
        print(f"\ntessel msrun: {name} (pid {proc.pid}) exited with code {proc.returncode}; last lines of {log}:")
        print(_tail(log), end="", flush=True)
    if failures:
        print(f"tessel msrun: the distributed job exited with an error; see the logs in {launch.log_dir}/")
        return 1
    return 0
