"""The seed scripts on one device, end to end: each runs unchanged (imports aside) as its own process.

The data is the MNIST-format digits set of `examples/make_digits.py` (10k train / 2k test, the test images drawn
from handwriting held out of the train split). The seed MLP must reach the issue's 95 % test accuracy in 8 epochs
(97-98 % measured); PyTorch trained the same way (same model, initialisation scheme, optimizer, batch size and
epochs) on the same files is reported beside it as the reference.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SEEDS = Path(__file__).parent / "seeds"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    from tessel.dataset.digits import write_mnist_digits

    folder = tmp_path_factory.mktemp("digits")
    write_mnist_digits(folder, train=10000, test=2000, seed=0)
    return folder


@pytest.fixture(scope="module")
def small_digits(tmp_path_factory) -> Path:
    """A fifth of `digits` (2,400 rows, 75 batches of 32 an epoch): enough for the loops whose losses are checked."""
    from tessel.dataset.digits import write_mnist_digits

    folder = tmp_path_factory.mktemp("small_digits")
    write_mnist_digits(folder, train=2000, test=400, seed=0)
    return folder


@pytest.fixture(scope="module")
def hundred_step_digits(tmp_path_factory) -> Path:
    """3,200 rows: 100 batches of 32 an epoch, so that a LossMonitor(100) prints once in every epoch."""
    from tessel.dataset.digits import write_mnist_digits

    folder = tmp_path_factory.mktemp("hundred_step_digits")
    write_mnist_digits(folder, train=2700, test=500, seed=0)
    return folder


def run_seed(script: str, digits: Path, tmp_path: Path, timeout_s: float = 240, **env: str) -> str:
    full_env = dict(os.environ, DATA_PATH=str(digits), TESSEL_CACHE=str(tmp_path / "cache"), **env)
    for launcher_var in ("TESSEL_COORDINATOR", "TESSEL_RANK", "TESSEL_WORLD_SIZE", "RANK_ID", "RANK_SIZE"):
        full_env.pop(launcher_var, None)  # a world of 1 in the script's own process
    done = subprocess.run([sys.executable, str(SEEDS / script)], env=full_env, capture_output=True, text=True,
                          timeout=timeout_s, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def read_idx(path: Path) -> np.ndarray:
    data = path.read_bytes()
    ndim = data[3]
    dims = np.frombuffer(data[4 : 4 + 4 * ndim], ">u4")
    return np.frombuffer(data[4 + 4 * ndim :], np.uint8).reshape(dims)


def pytorch_accuracy(digits: Path, epochs: int) -> float:
    """The seed MLP in PyTorch: Linear's default init is MindSpore Dense's (HeUniform(sqrt(5))), Momentum 0.01/0.9."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    torch.set_num_threads(1)

    def load(prefix):
        images = (read_idx(digits / f"{prefix}-images-idx3-ubyte").astype(np.float32) / 255 - 0.1307) / 0.3081
        return torch.from_numpy(images.reshape(len(images), -1)), torch.from_numpy(
            read_idx(digits / f"{prefix}-labels-idx1-ubyte").astype(np.int64)
        )

    (x, y), (test_x, test_y) = load("train"), load("t10k")
    net = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for start in range(0, len(x), 32):
            batch = order[start : start + 32]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x[batch]), y[batch]).backward()
            optimizer.step()
    with torch.no_grad():
        return float((net(test_x).argmax(1) == test_y).float().mean())


def test_model_train_mlp_learns_the_digits_like_pytorch(digits, tmp_path):
    epochs = 4
    out = run_seed("mnist_mlp_model_train.py", digits, tmp_path, EPOCHS=str(epochs))
    lines = out.splitlines()
    monitor = [re.fullmatch(r"epoch: (\d+) step: (\d+), loss is (\d+\.\d+(?:e-?\d+)?)", line) for line in lines[:-1]]
    assert all(monitor), lines[:3]
    assert [(int(m[1]), int(m[2])) for m in monitor[:4]] == [(1, 100), (1, 200), (1, 300), (2, 87)]
    losses = [float(m[3]) for m in monitor]
    assert losses[-1] < losses[0] / 2
    accuracy = float(lines[-1].removeprefix("accuracy: "))
    assert accuracy >= 0.95, accuracy
    if importlib.util.find_spec("torch") is not None:  # the peer, when installed (pip install '.[bench]')
        reference = pytorch_accuracy(digits, epochs)
        assert accuracy >= reference - 0.02, (accuracy, reference)


def test_data_parallel_custom_loop_runs_unchanged_on_one_device(small_digits, tmp_path):
    out = run_seed("data_parallel_custom_loop.py", small_digits, tmp_path)
    found = [re.fullmatch(r"epoch: (\d+), step: (\d+), loss is (\S+)", line) for line in out.splitlines()]
    assert found and all(found), out[:500]
    by_epoch: dict[int, list[float]] = {}
    for m in found:
        by_epoch.setdefault(int(m[1]), []).append(float(m[3]))
    assert sorted(by_epoch) == list(range(10))
    assert len(by_epoch[0]) == 8  # MnistDataset reads train and test (2400 rows): 75 steps, printed every 10
    assert abs(by_epoch[0][0] - np.log(10)) < 0.05  # weight_init="normal" (sigma 0.01): near-uniform logits
    assert np.mean(by_epoch[9]) < 0.5 * np.mean(by_epoch[0])


def test_the_same_script_under_tessel_run_drives_a_daemon_process(digits, tmp_path):
    """`tessel run -n 1`: the script's daemon is a separate process reached over gRPC; the numbers must be those of
    the daemon embedded in the script's own process."""
    from tests.conftest import run_tessel

    env = {"DATA_PATH": str(digits), "TESSEL_CACHE": str(tmp_path / "cache"), "EPOCHS": "1"}
    remote = run_tessel(["run", "-n", "1", str(SEEDS / "mnist_mlp_model_train.py")], tmp_path, 240, env)
    assert remote.returncode == 0, remote.stderr[-3000:]
    log = next(tmp_path.glob("log_output/*/rank.0/stdout")).read_text().splitlines()
    local = run_seed("mnist_mlp_model_train.py", digits, tmp_path, EPOCHS="1").splitlines()
    assert len(log) == len(local) == 4  # three LossMonitor lines and the accuracy
    for remote_line, local_line in zip(log, local):
        prefix, _, value = remote_line.rpartition(" ")
        assert local_line.startswith(prefix)
        assert float(value) == pytest.approx(float(local_line.rpartition(" ")[2]), rel=1e-4)


def monitored_losses(out: str) -> dict[int, list[float]]:
    """LossMonitor's lines, checked for MindSpore's exact format, as {epoch: [losses]}."""
    by_epoch: dict[int, list[float]] = {}
    for line in out.splitlines():
        found = re.fullmatch(r"epoch: (\d+) step: (\d+), loss is (\d+\.\d+(?:e-?\d+)?)", line)
        assert found, line
        by_epoch.setdefault(int(found[1]), []).append(float(found[3]))
    return by_epoch


def test_multi_copy_seed_sums_the_copies_losses(hundred_step_digits, tmp_path):
    # LossMonitor(100) over 100 steps an epoch: the loss at the end of each
    losses = monitored_losses(run_seed("multi_copy_model_train.py", hundred_step_digits, tmp_path))
    assert sorted(losses) == list(range(1, 11))
    assert losses[1][0] == pytest.approx(2 * np.log(10), rel=0.1)  # two copies, each near ln 10 at first
    assert np.mean(losses[10]) < 0.5 * np.mean(losses[1])


def test_manual_parallel_seed_runs_on_one_device(small_digits, tmp_path):
    losses = monitored_losses(run_seed("manual_parallel_model_train.py", small_digits, tmp_path))
    assert sum(len(v) for v in losses.values()) == 10 * 75 // 20  # LossMonitor(20) over 75 steps per epoch
    assert losses[1][0] == pytest.approx(np.log(10), rel=0.1)
    assert np.mean(losses[10]) < 0.5 * np.mean(losses[1])
