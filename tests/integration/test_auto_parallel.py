"""AUTO_PARALLEL on real daemons: each of MindSpore's three search modes plans every op of an MLP, a conv net and a
net whose weight is used by two ops (nothing configured by the user), and 2, 4 (and 8, for the MLP) ranks reproduce
the standalone losses over 20 steps to 1e-5 relative (scripts/auto_modes.py checks on every rank); the MLP and a net
of small weights and a large batch also with full_batch=True (every rank feeds the whole batch, the plan slices it:
the host sends each rank only the slices its plan reads, checked in bytes)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, rank_log, run_tessel

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "auto_modes.py"
MODES = ["recursive_programming", "sharding_propagation", "dynamic_programming"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    folder = tmp_path_factory.mktemp("auto")
    for net in ("mlp", "conv", "tied", "rows"):
        command = [sys.executable, str(SCRIPT), net, "none", str(folder / f"{net}.json")]
        alone = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=120)
        assert alone.returncode == 0, alone.stdout[-2000:] + alone.stderr[-3000:]
    return folder


# one job per (net, world) trains under every mode in turn (a job start per mode saved)
CASES = [(net, ",".join(MODES), n) for net in ("mlp", "conv", "tied") for n in (2, 4)]
CASES.append(("mlp", "recursive_programming", 8))
FULL_BATCH = ",".join(f"{mode}+full_batch" for mode in MODES)
CASES.append(("mlp", FULL_BATCH, 4))
CASES.append(("rows", FULL_BATCH, 4))  # every mode cuts the batch: each rank is sent only its rows


@pytest.mark.parametrize(("net", "modes", "n"), CASES)
def test_every_search_mode_trains_like_one_device(references, tmp_path, net, modes, n):
    reference = references / f"{net}.json"
    result = run_tessel(["run", "-n", str(n), str(SCRIPT), net, modes, str(reference)], tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(n):
        out = rank_log(tmp_path, rank).read_text()
        for mode in modes.split(","):
            found = re.search(rf"auto {net} {re.escape(mode)} ok on rank {rank} of {n}: loss error (\S+)", out)
            assert found and float(found.group(1)) <= 1e-5, (mode, out)
        if net == "rows":  # every plan reads some input in slices: less than the whole batch is sent
            fed = [(int(a), int(b)) for a, b in re.findall(r"fed (\d+) bytes of the whole batch's (\d+)", out)]
            assert len(fed) == len(MODES) and all(a < b for a, b in fed), (fed, out)
            # dynamic_programming's optimum is the data-parallel plan: each rank is sent its quarter of the rows
            assert fed[MODES.index("dynamic_programming")][0] <= fed[0][1] // n + 64, (fed, out)


def test_a_strategy_file_reproduces_the_plan(references, tmp_path):
    """dynamic_programming plans and saves; a run told to search with recursive_programming but given the file
    runs the saved strategies instead (its own file lists the same ones) and trains the same."""
    import json

    reference, first, second = references / "mlp.json", tmp_path / "dp.json", tmp_path / "again.json"
    script = [str(SCRIPT), "mlp"]
    saved = run_tessel(["run", "-n", "2", *script, "dynamic_programming", str(reference), str(first)], tmp_path, 300)
    assert saved.returncode == 0, saved.stdout[-3000:] + saved.stderr[-3000:]
    loaded = run_tessel(
        ["run", "-n", "2", *script, "recursive_programming", str(reference), str(second), str(first)], tmp_path, 300
    )
    assert loaded.returncode == 0, loaded.stdout[-3000:] + loaded.stderr[-3000:]
    a, b = (json.loads(path.read_text()) for path in (first, second))
    assert a["parameters"] == b["parameters"] and a["parameters"]
    ops = lambda doc: {name: [op["strategy"] for op in g["ops"]] for name, g in doc["graphs"].items()}  # noqa: E731
    assert ops(a) == ops(b)


def test_tessel_run_sim_level_plans_a_world_of_64_without_daemons(tmp_path):
    """`tessel run --sim-level 0 -n 64`: rank 5 of 64 is planned (AUTO_PARALLEL) and compiled, the strategy file and
    save_graphs are written, the process exits 0 before any run, and no daemon is started."""
    import json

    script = ROOT / "tests" / "integration" / "scripts" / "sim_plan.py"
    result = run_tessel(
        ["run", "--sim-level", "0", "--sim-rank-id", "5", "-n", "64", str(script), str(tmp_path)], tmp_path, 120
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rank 5 of a 64-rank world planned and compiled" in result.stdout
    assert "unreachable" not in result.stdout
    strategy = json.loads((tmp_path / "strategy.json").read_text())
    assert strategy["parameters"] and all(r["device_matrix"][0] <= 64 for r in strategy["parameters"].values())
    graphs = tmp_path / "graphs" / "rank_5"
    assert {p.name.split("_train")[0] for p in graphs.iterdir()} >= {"step_parallel_begin", "parallel_plan"}
    bad = run_tessel(
        ["run", "--sim-level", "0", "--sim-rank-id", "64", "-n", "64", str(script), str(tmp_path)], tmp_path, 60
    )
    assert bad.returncode == 2 and "not a rank of the 64-rank world" in bad.stderr
