"""`tessel run` as users drive it: against a cluster started by hand as the README shows, through a pipe that
closes early, and many jobs at once on one host."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ADDRESS, ROOT, first_line

pytestmark = pytest.mark.slow
HELLO = ROOT / "examples" / "hello_collectives.py"
SCRIPTS = ROOT / "tests" / "integration" / "scripts"


def _tessel(*args: str) -> list[str]:
    return [sys.executable, "-m", "tessel.cli", *args]


def _user_env(home: Path) -> dict[str, str]:
    """A user's shell: their own HOME (so ~/.tessel/token is this test's), no TESSEL_TOKEN exported."""
    env = {k: v for k, v in os.environ.items() if k not in ("TESSEL_TOKEN", "TESSEL_HOME", "TESSEL_COORDINATOR")}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1")
    return env


def test_cluster_started_by_hand_runs_a_job_without_exporting_the_token(tmp_path):
    env = _user_env(tmp_path / "home")
    servers: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        proc = subprocess.Popen(_tessel(*args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        servers.append(proc)
        return first_line(proc, " ".join(args[:1]))

    try:
        address = ADDRESS.search(start("coordinator", "--port", "0")).group(1)
        assert (tmp_path / "home" / ".tessel" / "token").is_file()  # made by the coordinator's first start
        for device in (0, 1):
            start("daemon", "--coordinator", address, "--plugin", "cpu", "--device", str(device), "--threads", "1")
        result = subprocess.run(
            _tessel("run", "-n", "2", "--coordinator", address, str(HELLO)),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for proc in servers:
            proc.terminate()
        for proc in servers:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "rank 0/2" in result.stdout
    (rank1,) = tmp_path.glob("log_output/*/rank.1/stdout")
    assert "rank 1/2: all_reduce=1" in rank1.read_text()


def test_run_without_a_token_names_where_to_get_it(tmp_path):
    # No token anywhere: a running cluster's token cannot be made up, so the error says where it comes from.
    result = subprocess.run(
        _tessel("run", "-n", "1", "--coordinator", "127.0.0.1:1", str(HELLO)),
        cwd=tmp_path,
        env=_user_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "TESSEL_TOKEN" in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize(
    "exit_code, stderr_too", [(0, False), (3, True)], ids=["succeeds | head -1", "rank 1 exits 3 2>&1 | head -1"]
)
def test_a_reader_that_goes_away_loses_no_log_line_and_the_exit_status_is_the_jobs(tmp_path, exit_code, stderr_too):
    lines = 20_000  # ~300 KB per rank: far more than a pipe holds, so a stalled copy would block the rank
    stderr = subprocess.STDOUT if stderr_too else open(tmp_path / "launcher.stderr", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        _tessel("run", "-n", "2", str(SCRIPTS / "chatty.py"), str(lines), str(exit_code)),
        cwd=tmp_path,
        env=dict(os.environ, TESSEL_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    try:
        assert proc.stdout.readline()  # what `head -1` does: read one line, then go away
        proc.stdout.close()
        assert proc.wait(120) == exit_code
    finally:
        proc.kill()  # a no-op once it exited; its children die with it
        proc.wait()
    for rank in (0, 1):
        (log,) = tmp_path.glob(f"log_output/*/rank.{rank}/stdout")
        expected = [f"rank {rank} line {i}" for i in range(lines)] + [f"rank {rank} done"]
        assert log.read_text().splitlines() == expected, f"rank {rank}'s log lost lines"
    (errors,) = tmp_path.glob("log_output/*/rank.0/stderr")
    deadlines, *printed = errors.read_text().splitlines()  # a rank states its deadlines first, in one line
    assert deadlines.startswith("tessel rank 0 of job") and "deadlines:" in deadlines, deadlines
    assert printed == [f"rank 0 error line {i}" for i in range(lines)]
    if not stderr_too:
        stderr.close()
        assert "Traceback" not in (tmp_path / "launcher.stderr").read_text()


TINY_JOB = """
import numpy as np
from tessel.communication import comm_func, get_group_size, get_rank, init
init()
rank, size = get_rank(), get_group_size()
total = comm_func.all_reduce(np.full(1024, rank + 1, np.float32))[0].asnumpy()
assert total[0] == size * (size + 1) / 2, total[:4]
print(f"rank {rank}/{size} ok", flush=True)
"""


def _run_together(script: Path, directories: list[Path], env: dict[str, str]) -> list[str]:
    """Start `tessel run -n 2 script` in each directory at once; the failures, as text."""
    runs = [
        subprocess.Popen(
            _tessel("run", "-n", "2", str(script)),
            cwd=directory,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for directory in directories
    ]
    failures = []
    for directory, run in zip(directories, runs):
        try:
            out, err = run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            out, err = run.communicate()
        if run.returncode != 0 or "rank 0/2 ok" not in out:
            failures.append(f"{directory.name}: exit {run.returncode}: {err[-1500:]}")
    return failures


PAIRS = 3  # each pair starts together, so its launches race on every repetition


def test_jobs_started_together_never_collide(tmp_path):
    # Each `tessel run` numbers its job 1 in its own directory; on one host their shared memory must not meet.
    script = tmp_path / "tiny.py"
    script.write_text(TINY_JOB)
    # A collision shows as a wrong sum or a wait that never ends: bound the wait well below the test's timeout.
    env = dict(os.environ, TESSEL_HOME=str(tmp_path / "home"), TESSEL_COLLECTIVE_TIMEOUT="20", PYTHONUNBUFFERED="1")
    failures = []
    for pair in range(PAIRS):
        directories = [tmp_path / f"pair{pair}{side}" for side in "ab"]
        for directory in directories:
            directory.mkdir()
        failures += _run_together(script, directories, env)
    # Two in one directory may both take the next free number there; each still gets its own job and logs.
    shared = tmp_path / "shared"
    shared.mkdir()
    failures += _run_together(script, [shared, shared], env)
    assert not failures, "\n".join(failures)
    assert len(list(shared.glob("log_output/*/rank.1/stdout"))) == 2


TRAIN_JOB = """
import numpy as np
import tessel as ms
from tessel import dataset as ds, nn
from tessel.communication import init

init()
data = np.random.default_rng(0).standard_normal((64, 6)).astype(np.float32)
labels = (data[:, 0] > 0).astype(np.int32)
net = nn.Dense(6, 2)
model = ms.Model(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1))
model.train(2, ds.NumpySlicesDataset({"data": data, "label": labels}, shuffle=False).batch(8))
print("trained", flush=True)
"""


def test_the_progress_bar_reaches_a_terminal_through_tessel_run_and_the_log_keeps_whole_lines(tmp_path):
    import pty

    script = tmp_path / "train.py"
    script.write_text(TRAIN_JOB)
    terminal, screen_side = pty.openpty()
    proc = subprocess.Popen(
        _tessel("run", "-n", "1", str(script)),
        cwd=tmp_path,
        env=dict(os.environ, TESSEL_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1"),
        stdout=screen_side,
        stderr=subprocess.PIPE,
    )
    os.close(screen_side)
    shown = b""
    try:
        while True:
            try:
                data = os.read(terminal, 1 << 16)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            shown += data
        assert proc.wait(120) == 0, proc.stderr.read().decode()[-3000:]
    finally:
        os.close(terminal)
        proc.kill()
        proc.wait()
    assert b"\r\x1b[2Kepoch 2/2 [####################]  8/8  loss " in shown, shown[-2000:]
    (log,) = tmp_path.glob("log_output/*/rank.0/stdout")
    lines = log.read_text().splitlines()
    assert [line.split(" [")[0] for line in lines] == ["epoch 1/2", "epoch 2/2", "trained"], lines
    assert all("8/8  loss" in line and "samples/s" in line for line in lines[:2]), lines


GRPC_LEFT_AT_EXIT = """
import atexit, gc
import grpc, grpc._channel
import numpy as np
from tessel.communication import comm_func, get_rank, init, runtime

def grpc_left():  # registered before init(): runs after tessel released the runtime, before the interpreter's end
    calls = sum(isinstance(o, grpc._channel._Rendezvous) for o in gc.get_objects())
    channels = sum(isinstance(o, grpc.Channel) for o in gc.get_objects())
    print(f"rank {RANK} leaves {calls} calls and {channels} channels", flush=True)

atexit.register(grpc_left)
init()
RANK = get_rank()
comm_func.all_reduce(np.ones(8, np.float32))
KEPT = runtime.current()  # as a Model's engine does: the released runtime lives until the interpreter's end
"""


def test_a_finished_rank_leaves_no_grpc_call_or_channel_for_the_interpreters_end(tmp_path):
    # What the interpreter's end frees runs after it stopped grpc's threads: a call's finalizer then waited forever
    # on a lock such a thread held (a CI run: a finished rank stuck in grpc's _Rendezvous.__del__). Released
    # runtimes free theirs while the threads still run, even when the program keeps the runtime.
    script = tmp_path / "left.py"
    script.write_text(GRPC_LEFT_AT_EXIT)
    env = dict(os.environ, TESSEL_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    run = subprocess.run(
        _tessel("run", "-n", "2", str(script)), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in range(2):
        (log,) = tmp_path.glob(f"log_output/*/rank.{rank}/stdout")
        assert f"rank {rank} leaves 0 calls and 0 channels" in log.read_text(), log.read_text()[-2000:]


STUCK_AT_EXIT = """
import time
import numpy as np
from tessel.communication import comm_func, get_rank, init, runtime
init()
comm_func.all_reduce(np.ones(8, np.float32))
if get_rank() == 1:  # its exit hangs where tessel closes its channels (as a stuck gRPC close would)
    type(runtime.current().daemon).close = lambda self: time.sleep(600)
print(f"rank {get_rank()} done", flush=True)
"""


def test_a_rank_stuck_in_its_exit_ends_with_its_stacks_and_the_job_says_so(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_AT_EXIT)
    env = dict(os.environ, TESSEL_HOME=str(tmp_path / "home"), TESSEL_EXIT_TIMEOUT="2", PYTHONUNBUFFERED="1")
    started = time.monotonic()
    run = subprocess.run(
        _tessel("run", "-n", "2", str(script)), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - started < 45  # not the rank's 600 s
    assert "rank 0 done" in run.stdout, run.stdout
    assert run.returncode == 1, (run.returncode, run.stderr[-3000:])
    assert "rank 1 failed with exit code 1 (after it had finished its part: a rank whose exit hangs" in run.stderr, (
        run.stderr[-3000:]
    )
    # its stacks, in its log and in what tessel run prints of it
    assert "most recent call first" in run.stderr and "<lambda>" in run.stderr, run.stderr[-3000:]
    (rank_dir,) = tmp_path.glob("log_output/*/rank.1")
    assert "most recent call first" in (rank_dir / "stderr").read_text()


LEAVES_WITHOUT_INIT = """
import os, sys
if os.environ["TESSEL_RANK"] == "1":
    print("rank 1 leaves without init", flush=True)
    sys.exit(0)
from tessel.communication import init
init()
"""


def test_a_rank_that_exits_0_without_joining_fails_the_job_at_once_naming_it(tmp_path):
    # the others would wait in init() for their join deadline (here 60 s) and name it among the missing ranks
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES_WITHOUT_INIT)
    env = dict(os.environ, TESSEL_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    started = time.monotonic()
    run = subprocess.run(
        _tessel("run", "-n", "2", "--join-timeout", "60", str(script)),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert time.monotonic() - started < 30, run.stderr[-3000:]
    assert run.returncode == 1, (run.returncode, run.stderr[-3000:])
    assert "rank 1 failed the job (it exited with 0)" in run.stderr, run.stderr[-3000:]
    assert "exited with status 0 before it joined the job (it never called init())" in run.stderr, run.stderr[-3000:]
