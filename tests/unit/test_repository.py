"""The repository's own contracts: stubs are fresh, lint is clean, packaging exposes every package and plugin."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_grpc_stubs_are_generated_from_the_protos():
    result = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')")
def test_ruff_is_clean():
    lint = subprocess.run(["ruff", "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout[-3000:]
    fmt = subprocess.run(["ruff", "format", "--check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert fmt.returncode == 0, fmt.stdout[-3000:]


def _mapped_packages() -> tuple[list[str], dict[str, str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return config["packages"], config["package-dir"]


def test_every_package_directory_is_listed_in_pyproject():
    packages, package_dir = _mapped_packages()
    found = set()
    for name, directory in package_dir.items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory)
            found.add(".".join([name, *relative.parts]))
    missing = sorted(found - set(packages))
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_plugins_are_found_through_entry_points():
    from tessel.plugins import available_plugins

    plugins = available_plugins()
    assert plugins["cpu"] == (True, "")
    for name in ("gpu", "ascend"):
        ok, why = plugins[name]
        assert ok or why, f"an unavailable plugin must say why: {name}"


def test_unknown_plugin_is_a_clear_error():
    from tessel.core.errors import ConfigurationError
    from tessel.plugins import load_plugin

    with pytest.raises(ConfigurationError, match="no tessel plugin named 'tpu'"):
        load_plugin("tpu")
