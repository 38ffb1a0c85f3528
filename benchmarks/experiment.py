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


def grouped_bars(axis, title: str, names: list[str], models: list[dict], bars: list[tuple[str, str]],
                 ticks: list[str] | None = None) -> None:
    """One panel: for every model (``models``, named ``names``) a group of bars, one per ``(label, key)`` of
    ``bars``, each the model's value at ``key``."""
    width = 0.8 / len(bars)
    for i, (label, key) in enumerate(bars):
        axis.bar([x + (i - (len(bars) - 1) / 2) * width for x in range(len(names))], [m[key] for m in models],
                 width, label=label)
    axis.set_xticks(range(len(names)), ticks or names, fontsize=8)
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=7)


def save_figure(figure, title: str, path: Path) -> None:
    """``figure`` titled, laid out and written to ``path`` (PNG)."""
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
