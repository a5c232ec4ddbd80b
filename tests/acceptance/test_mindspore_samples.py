"""MindSpore's own parallel-training samples (docs/sample_code in mindspore-ai/docs; copies in mindspore_samples/ with
only their import lines changed, by mindspore_samples/convert.py), run as their launch scripts run them — `msrun`
(here `tessel msrun`) at the world size they were written for, or MindSpore's dynamic networking by hand — on the
digits data examples/make_digits.py writes in MNIST's format. Each is checked for what its tutorial says: it runs to
the end, its losses are finite and fall, parameters are sliced per rank as its strategy implies
(TESSEL_PARAMETER_REPORT), and its own printed results. Samples tessel cannot run yet check that they stop with a
clear "not supported yet" naming what is missing (README lists them with the reason)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT

SAMPLES = ROOT / "tests" / "acceptance" / "mindspore_samples"
LOSS = re.compile(r"loss is \[?(-?[\d.]+(?:e[-+]?\d+)?|nan|inf)")
pytestmark = pytest.mark.slow


@dataclass
class Sample:
    folder: str
    task: tuple[str, ...]  # what msrun runs: a script, or `pytest -s file[::test]`
    world: int = 8
    falls: bool = True  # the tutorial trains: losses fall from the first printed to the last
    slices: dict[str, tuple[int, ...]] = field(default_factory=dict)  # parameter -> rank 0's local shape
    held: dict[int, dict[str, bool]] = field(default_factory=dict)  # rank -> parameter -> held (pipeline stages)
    prints: tuple[str, ...] = ()  # lines the tutorial shows
    env: dict[str, str] = field(default_factory=dict)
    pending: str = ""  # not supported yet: the message it must stop with
    checkpoints: str = ""  # a folder (in the sample's) where each rank saves its checkpoint; removed after the run
    rows: int = 128  # training images in the digits data (a quarter as many test images): enough to see it learn


SAMPLE_TABLE = {
    "distributed_data_parallel": Sample("distributed_data_parallel", ("distributed_data_parallel.py",)),
    "manual_parallel": Sample("manual_parallel", ("train.py",)),
    "multiple_copy": Sample("multiple_copy", ("pytest", "-s", "train.py"), falls=False),
    "distributed_operator_parallel": Sample(
        "distributed_operator_parallel",
        ("pytest", "-s", "-v", "distributed_operator_parallel.py::test_distributed_operator_parallel"),
        slices={"fc1_weight": (196, 512), "fc2_weight": (64, 512), "fc3_weight": (512, 10)},
    ),
    "distributed_mint_operator_parallel": Sample(
        "distributed_operator_parallel",
        ("pytest", "-s", "-v", "distributed_mint_operator_parallel.py::test_distributed_mint_operator_parallel"),
        falls=False,
    ),
    "advanced_distributed_operator_parallel": Sample(
        "distributed_operator_parallel",
        (
            "pytest",
            "-s",
            "-v",
            "advanced_distributed_operator_parallel.py::test_advanced_distributed_operator_parallel",
        ),
    ),
    "advanced_distributed_mint_operator_parallel": Sample(
        "distributed_operator_parallel",
        (
            "pytest",
            "-s",
            "-v",
            "advanced_distributed_mint_operator_parallel.py::test_advanced_distributed_mint_operator_parallel",
        ),
        falls=False,
    ),
    "sharding_propagation": Sample("sharding_propagation", ("train.py",), slices={"dense1.weight": (784, 16)}),
    "sapp": Sample("sapp", ("train.py",)),
    # 2 stages of 4 data-parallel ranks; the sample's ops.Print prints on stage 0 only
    "distributed_pipeline_parallel": Sample(
        "distributed_pipeline_parallel",
        ("distributed_pipeline_parallel.py",),
        slices={"layer1.param": (784, 512), "layer2.weight": (512, 512)},
        held={
            0: {"layer1.param": True, "layer2.weight": True, "layer3.weight": False, "layer3.bias": False},
            7: {"layer1.param": False, "layer2.weight": False, "layer3.weight": True, "layer3.bias": True},
        },
        prints=("out is:", "epoch: 9, step: 0, loss is"),
    ),
    # 4 stages of 1 rank, forwards only; the embedding table is read on stage 0 and (through .value()) by the head on
    # stage 3: both hold it, and sync_pipeline_shared_parameters keeps them equal
    "distributed_pipeline_parallel_inference": Sample(
        "distributed_pipeline_parallel",
        ("distributed_pipeline_parallel_inference.py",),
        world=4,
        falls=False,
        held={
            0: {"network.word_embedding.embedding_table": True, "network.layer1.weight": False},
            1: {"network.word_embedding.embedding_table": False, "network.layer1.weight": True},
            3: {"network.word_embedding.embedding_table": True, "network.layer2.weight": False},
        },
        prints=("[[",),
    ),
    "distributed_optimizer_parallel": Sample("distributed_optimizer_parallel", ("distributed_optimizer_parallel.py",)),
    "dataset_slice": Sample("dataset_slice", ("pytest", "-s", "train.py")),
    "distributed_comm_fusion": Sample(
        "distributed_comm_fusion",
        ("pytest", "-s", "fusion_example_cell.py"),
        prints=(
            "The parameter head.weight's fusion id is 0",
            "The parameter layer1.input_mapping.weight's fusion id is 1",
            "The parameter layer3.output_mapping.bias's fusion id is 3",
        ),
        rows=256,  # its loss falls over the longer run only
    ),
    "comm_subgraph": Sample(
        "comm_subgraph",
        ("train.py",),
        env={"MS_COMM_COMPILER_OPT": "3"},
    ),
    # LossMonitor(100): one line on the test's small data set, the sum of the 4 micro-batches' losses
    "distributed_gradient_accumulation": Sample(
        "distributed_gradient_accumulation", ("pytest", "-s", "train.py"), falls=False
    ),
    "high_dimension_tensor_parallel": Sample(
        "high_dimension_tensor_parallel",
        ("high_dimension_tensor_parallel.py",),
        falls=False,
        prints=("The output is:",),
    ),
    # prints the loss every 100 steps: one line on the test's small data set
    "host_device": Sample("host_device", ("pytest", "-s", "train.py"), falls=False),
    "recompute": Sample("recompute", ("example.py",), world=1, falls=False),
    # prints step 0 of each epoch only: five noisy single-batch losses near ln(10) on the test's small data set
    "shard_function_parallel": Sample(
        "shard_function_parallel", ("shard_function_example.py",), prints=("=========Finish=========",), falls=False
    ),
    "parallel_support_dynamic_shape": Sample("parallel_support_dynamic_shape", ("main.py",)),
    "fault_recover": Sample("fault_recover", ("train.py",), checkpoints="checkpoints"),
    "startup_method": Sample("startup_method", ("net.py",)),
}


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Callable[[int], Path]:
    """The digits data with `rows` training images, written once per size."""
    folders: dict[int, Path] = {}

    def of(rows: int) -> Path:
        if rows not in folders:
            folder = tmp_path_factory.mktemp(f"digits{rows}")
            command = [sys.executable, str(ROOT / "examples" / "make_digits.py"), str(folder)]
            made = subprocess.run(
                [*command, "--train", str(rows), "--test", str(rows // 4)], capture_output=True, text=True, timeout=120
            )
            assert made.returncode == 0, made.stderr
            folders[rows] = folder
        return folders[rows]

    return of


def run(sample: Sample, digits: Path, tmp: Path) -> tuple[subprocess.CompletedProcess, Path]:
    logs = tmp / "logs"
    env = dict(os.environ, DATA_PATH=str(digits), TESSEL_PARAMETER_REPORT=str(tmp / "params"), **sample.env)
    env.pop("TESSEL_COORDINATOR", None)
    if sample.task[0] == "pytest":
        # Each of the 8 workers starts its own pytest: only the plugin this repository's pytest settings use
        # (pytest-timeout), not every installed one (hypothesis and others cost each worker about a CPU second).
        env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTEST_PLUGINS="pytest_timeout")
    if sample.world == 1:
        command = [sys.executable, *sample.task]
    else:
        n = str(sample.world)
        command = [sys.executable, "-m", "tessel.cli", "msrun", f"--worker_num={n}", f"--local_worker_num={n}"]
        command += ["--join=True", f"--log_dir={logs}", "--master_port=0", *sample.task]
    result = subprocess.run(command, cwd=SAMPLES / sample.folder, env=env, capture_output=True, text=True, timeout=600)
    return result, logs


def output_of(result: subprocess.CompletedProcess, logs: Path, sample: Sample) -> str:
    if sample.world == 1:
        return result.stdout + result.stderr
    return (logs / "worker_0.log").read_text() if (logs / "worker_0.log").is_file() else result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(SAMPLE_TABLE))
def test_mindspore_sample(name, digits, tmp_path):
    sample = SAMPLE_TABLE[name]
    saved = SAMPLES / sample.folder / sample.checkpoints if sample.checkpoints else None
    if saved is not None:
        shutil.rmtree(saved, ignore_errors=True)
    try:
        result, logs = run(sample, digits(sample.rows), tmp_path)
        written = sorted(p.parent.name for p in saved.glob("rank_*/*.ckpt")) if saved is not None else []
    finally:
        if saved is not None:
            shutil.rmtree(saved, ignore_errors=True)
    out = output_of(result, logs, sample)
    if sample.pending:
        assert result.returncode != 0 and sample.pending in out, out[-3000:]
        return
    assert result.returncode == 0, f"{name}: exit {result.returncode}\n{out[-4000:]}\n{result.stderr[-2000:]}"
    losses = [float(x) for x in LOSS.findall(out)]
    assert all(math.isfinite(v) for v in losses), losses
    if sample.falls:
        assert len(losses) >= 2, out[-3000:]
        assert losses[-1] < losses[0], losses
    if saved is not None:
        assert written == [f"rank_{r}" for r in range(sample.world)], written
    for line in sample.prints:
        assert line in out, f"{name}: the tutorial prints {line!r}\n{out[-3000:]}"
    if sample.slices:
        report = json.loads((tmp_path / "params" / "rank_0.json").read_text())
        for parameter, local in sample.slices.items():
            assert tuple(report[parameter]["local"]) == local, (parameter, report[parameter])
    for rank, held in sample.held.items():
        report = json.loads((tmp_path / "params" / f"rank_{rank}.json").read_text())
        assert {name: report[name]["held"] for name in held} == held, (rank, report)


def test_mindspore_sample_disaster_recover_dynamic_networking(digits, tmp_path):
    """disaster_recover/run.sh: 8 workers and a scheduler started by hand with MindSpore's dynamic networking
    variables form one job; every worker trains to the end and writes its checkpoints."""
    script = SAMPLES / "disaster_recover" / "train.py"
    base = dict(os.environ, DATA_PATH=str(digits(256)), MS_WORKER_NUM="8", MS_SCHED_HOST="127.0.0.1")
    base["MS_SCHED_PORT"] = str(_free_port())
    workers = []
    for i in range(8):
        env = dict(base, MS_ROLE="MS_WORKER", MS_NODE_ID=str(i))
        log = open(tmp_path / f"worker_{i}.log", "w")  # noqa: SIM115 - closed below
        workers.append((subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=log,
                                         stderr=subprocess.STDOUT), log))  # fmt: skip
    scheduler = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=dict(base, MS_ROLE="MS_SCHED"), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    codes = []
    for proc, log in workers:
        codes.append(proc.wait(timeout=120))
        log.close()
    assert scheduler.returncode == 0 and codes == [0] * 8, (codes, scheduler.stdout[-2000:], scheduler.stderr[-2000:])
    for i in range(8):
        out = (tmp_path / f"worker_{i}.log").read_text()
        losses = [float(x) for x in LOSS.findall(out)]
        assert losses and all(math.isfinite(v) for v in losses), out[-2000:]
        assert list((tmp_path / "ckpt_of_rank" / str(i)).glob("train-*.ckpt")), f"worker {i} wrote no checkpoint"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
