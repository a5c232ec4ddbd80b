"""The test tree has no packages (no __init__.py), so pytest imports each test file by its basename: two files with
one basename stop the whole run at collection ("import file mismatch"), even when each passes alone."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_has_a_basename_of_its_own():
    places = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        places[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: where for name, where in places.items() if len(where) > 1}
    assert not shared, f"test files sharing a basename (rename one of each): {shared}"
