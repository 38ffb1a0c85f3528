"""What the experiment scripts (dino_segmentation.py, bert_comparison.py) share: the project's own commands run
as a user runs them, in a process each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "crate_compose.cli"]


def start(arguments: list[str], log: Path) -> subprocess.Popen:
    """``crate-compose ARGUMENTS`` started, its output (both streams) into ``log``."""
    with log.open("w") as handle:
        return subprocess.Popen([*CLI, *arguments], stdout=handle, stderr=subprocess.STDOUT)


def finished(runs: list[tuple[str, subprocess.Popen]], logs: Path) -> int:
    """Wait for every ``(name, process)``; name each that failed and its log; 1 if any did."""
    failed = [name for name, process in runs if process.wait() != 0]
    for name in failed:
        print(f"error: {name} failed: see {logs / (name + '.log')}", file=sys.stderr)
    return 1 if failed else 0


def answer(arguments: list[str]) -> dict:
    """The JSON that ``crate-compose ARGUMENTS`` prints; its error output when it fails."""
    result = subprocess.run([*CLI, *arguments], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: crate-compose {' '.join(arguments)} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def quietly(arguments: list[str]) -> None:
    """``crate-compose ARGUMENTS``, its output kept back unless it fails."""
    result = subprocess.run([*CLI, *arguments], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: crate-compose {' '.join(arguments)} failed:\n{result.stderr[-2000:]}")
