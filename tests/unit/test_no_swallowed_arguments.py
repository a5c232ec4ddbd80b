"""No user-facing function swallows arguments: a *args or **kwargs catch-all in the SDK and the dataset part is
read by its body (checked, forwarded, or refused through tessel.core.options.keyword_options), or the body
raises, or it is one of the few MindSpore documents as taking and ignoring anything (listed below, with why).
A catch-all that nothing reads is how a MindSpore option was once accepted and silently ignored."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = [ROOT / "clients" / "python" / "tessel", ROOT / "dataset"]

# (file relative to ROOT, qualified name) -> why the catch-all is not read there
ALLOWED = {
    ("clients/python/tessel/common/parameter.py", "Parameter.__new__"): "Parameter.__init__ reads the arguments",
    ("clients/python/tessel/common/tensor.py", "Tensor.__new__"): "Tensor.__init__ checks the same keywords",
    ("clients/python/tessel/nn/layers.py", "Identity.__init__"): "MindSpore's nn.Identity ignores its arguments",
    ("clients/python/tessel/common/symbol.py", "Symbol.__init__"): "MindSpore's Symbol takes and ignores **kwargs too",
}


def _reads(function: ast.FunctionDef, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for statement in function.body for n in ast.walk(statement))


def _raises(function: ast.FunctionDef) -> bool:
    return any(isinstance(statement, ast.Raise) for statement in function.body)


def _functions(tree: ast.Module):
    """(qualified name, function) of every function and method, nested ones included."""
    stack = [("", node) for node in tree.body]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node
            stack.extend((f"{name}.", child) for child in node.body)


def test_every_catch_all_argument_is_read_or_refused():
    found, allowed = [], set()
    for part in PARTS:
        for path in sorted(part.rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            for name, node in _functions(ast.parse(path.read_text())):
                for catch_all in (node.args.vararg, node.args.kwarg):
                    if catch_all is None or _reads(node, catch_all.arg) or _raises(node):
                        continue
                    if (relative, name) in ALLOWED:
                        allowed.add((relative, name))
                    else:
                        found.append(f"{relative}:{node.lineno} {name}(..., {catch_all.arg}) never reads it")
    assert allowed == set(ALLOWED), f"ALLOWED names functions that read their arguments now: {set(ALLOWED) - allowed}"
    assert not found, "arguments accepted and never read (check them with keyword_options, or refuse):\n" + "\n".join(
        found
    )


def test_the_check_finds_a_swallowed_keyword():
    source = "def f(x, **options):\n    return x\n"
    function = ast.parse(source).body[0]
    assert not _reads(function, "options") and not _raises(function)
