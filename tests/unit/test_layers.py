"""The design's layers hold: each part imports only the parts below it (../shared/DESIGN.md, "Layers").

    SDK (tessel, launcher, CLI)
    coordinator  ·  daemon            (talk over gRPC only; the daemon finds plugins through entry points)
    plugins  ·  dataset  ·  compiler  (the compiler is a pure library)
    core                              (errors, wire tables, gRPC helpers, coordinator client, plugin contract)
    protos (tessel.v1)

Every import statement of every module counts, at any depth (a function-level import is still a dependency).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]

# What each part may import besides itself. The SDK may import everything.
ALLOWED = {
    "protos": set(),
    "core": {"protos"},
    "compiler": {"core", "protos"},
    "dataset": {"core", "protos"},
    "plugins": {"core", "protos"},
    "daemon": {"core", "protos", "dataset", "compiler"},
    "coordinator": {"core", "protos", "compiler"},
    "sdk": {"core", "protos", "dataset", "compiler", "plugins", "daemon", "coordinator"},
}
PARTS = {  # package prefix -> part; anything else under `tessel` is the SDK
    "tessel.v1": "protos",
    "tessel.core": "core",
    "tessel.compiler": "compiler",
    "tessel.dataset": "dataset",
    "tessel.plugins": "plugins",
    "tessel.daemon": "daemon",
    "tessel.coordinator": "coordinator",
}


def part_of(module: str) -> str | None:
    if module != "tessel" and not module.startswith("tessel."):
        return None
    for prefix, part in PARTS.items():
        if module == prefix or module.startswith(prefix + "."):
            return part
    return "sdk"


def modules() -> list[tuple[str, Path]]:
    """(module name, file) of every module installed under `tessel`, from pyproject's package-dir map."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for package, directory in sorted(package_dir.items(), key=lambda kv: len(kv[0])):  # deeper maps win
        for path in (ROOT / directory).rglob("*.py"):
            parts = path.relative_to(ROOT / directory).with_suffix("").parts
            name = ".".join([package, *parts]).removesuffix(".__init__")
            found[name] = path
    return sorted(found.items())


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every import in the file, relative imports resolved."""
    is_package = path.name == "__init__.py"
    result = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            result.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target in ("tessel",):  # `from tessel import x`: x is the module imported
                result.extend((node.lineno, f"tessel.{alias.name}") for alias in node.names)
            else:
                result.append((node.lineno, target))
    return result


def violations() -> list[str]:
    found = []
    for module, path in modules():
        source = part_of(module)
        for line, target in imports(module, path):
            to = part_of(target)
            if to is None or to == source or to in ALLOWED[source]:
                continue
            rule = f"{source} may import only {sorted(ALLOWED[source]) or 'nothing of tessel'}"
            found.append(f"{path.relative_to(ROOT)}:{line}: {source} imports {target} ({to}); rule: {rule}")
    return found


def test_every_part_imports_only_the_parts_below_it():
    found = violations()
    assert not found, "layer rules broken (../shared/DESIGN.md, Layers):\n" + "\n".join(found)


def test_the_scanner_sees_a_broken_rule():
    """The scanner itself: a compiler module importing the SDK, relatively or absolutely, is caught."""
    assert part_of("tessel.compiler.ir") == "compiler" and part_of("tessel.nn.cell") == "sdk"
    assert part_of("tessel") == "sdk" and part_of("numpy") is None
    fake = ROOT / "compiler" / "ops" / "math.py"
    tree_imports = imports("tessel.compiler.ops.math", fake)
    assert any(target.startswith("tessel.compiler") for _, target in tree_imports)
    assert "sdk" not in ALLOWED["compiler"] and "plugins" not in ALLOWED["daemon"]


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("tessel.core", ("tessel.compiler", "tessel.plugins", "tessel.daemon", "tessel.coordinator", "tessel.nn")),
        ("tessel.compiler", ("tessel.plugins", "tessel.daemon", "tessel.coordinator", "tessel.common", "tessel.nn")),
        ("tessel.daemon.main", ("tessel.plugins", "tessel.coordinator", "tessel.common", "tessel.nn")),
        ("tessel.coordinator", ("tessel.daemon", "tessel.plugins", "tessel.common", "tessel.nn")),
    ],
)
def test_importing_a_part_loads_nothing_above_it(module, forbidden):
    code = (
        f"import sys, {module}\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({forbidden!r}))\n"
        "print(' '.join(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "", f"import {module} loaded {result.stdout.strip()}"
