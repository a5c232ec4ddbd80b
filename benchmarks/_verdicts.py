"""The end of a benchmark run: each target's verdict on its own line, and the figures as JSON when asked."""

from __future__ import annotations

import json
from pathlib import Path


def finish(verdicts: list[tuple[str, bool]], figures: dict, json_path: str | Path | None) -> int:
    """Print PASS/FAIL per target, write `figures` to `json_path` (if given); the exit status (0: the run completed)."""
    print()
    for line, passed in verdicts:
        print(f"{'PASS' if passed else 'FAIL'}  {line}")
    if json_path:
        Path(json_path).write_text(json.dumps(figures, indent=1))
    return 0
