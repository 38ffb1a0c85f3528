"""What the experiment scripts (dino_segmentation.py, bert_comparison.py) share: the project's own commands run
as a user runs them, in a process each."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "crate_compose.cli"]


def start(arguments: list[str], log: Path) -> subprocess.Popen:
    """``crate-compose ARGUMENTS`` started, its output (both streams) into ``log``."""
    with log.open("w") as handle:
        return subprocess.Popen([*CLI, *arguments], stdout=handle, stderr=subprocess.STDOUT)


def queue(runs: list[tuple[str, list[str]]], out: Path, jobs: int, *, one_thread: bool = True) -> list[str]:
    """Run ``crate-compose ARGV --out OUT/NAME`` for every ``(NAME, ARGV)``, ``jobs`` at a time, each one's output
    in ``OUT/NAME.log``, an unfinished run's folder started again; the names that failed. With ``one_thread``
    and more than one job, each run gets one torch thread (two runs of two threads on 2 cores are slower)."""
    waiting, running, failed = list(runs), [], []
    environment = {**os.environ, "OMP_NUM_THREADS": "1"} if one_thread and jobs > 1 else None
    while waiting or running:
        while waiting and len(running) < jobs:
            name, command = waiting.pop(0)
            shutil.rmtree(out / name, ignore_errors=True)
            with (out / f"{name}.log").open("w") as log:
                running.append((name, subprocess.Popen([*CLI, *command, "--out", str(out / name)], stdout=log,
                                                       stderr=subprocess.STDOUT, env=environment)))
            print(f"started {name}", file=sys.stderr)
        time.sleep(2)
        for name, process in list(running):
            if process.poll() is not None:
                running.remove((name, process))
                print(f"{'finished' if process.returncode == 0 else 'FAILED'} {name}", file=sys.stderr)
                if process.returncode != 0:
                    failed.append(name)
    return failed


def train_and_report(doc: str, train, report, train_options, argv: list[str] | None = None,
                     train_help: str = "train the runs") -> int:
    """The command line of an experiment script: ``train OUT [train_options]`` and ``report OUT [--figure FILE]``
    (``train_options(parser)`` adds the former's options; ``doc``'s first line describes the script)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("train", help=train_help)
    run.add_argument("out", type=Path)
    train_options(run)
    measure = commands.add_parser("report", help="measure the runs")
    measure.add_argument("out", type=Path)
    measure.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args(argv)
    return train(args) if args.command == "train" else report(args)


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
