"""What the experiment scripts (dino_segmentation.py, bert_comparison.py, self_supervision.py, shakespeare.py)
share: the project's own commands run as a user runs them, their training runs on the project's local launcher."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "crate_compose.cli"]


def launch(runs: list[tuple[str, list[str]]], out: Path, jobs: int, device: str = "cpu") -> list[str]:
    """Run ``crate-compose ARGV --out OUT/NAME`` for every ``(NAME, ARGV)`` on the project's local launcher
    (:mod:`crate_compose.launch.local`: ``jobs`` at a time, the cores or GPUs split between them, a line per run
    as it goes, Ctrl-C keeping the runs' steps); a run already finished is kept, an unfinished one's folder
    started again. Each run's output is in ``OUT/NAME/launch/log.txt`` (:func:`log_of`). The names that failed."""
    from crate_compose.launch.jobs import Job
    from crate_compose.launch.local import Local
    from crate_compose.launch.status import Display, survey

    every = [Job(out / name, name, (*argv, "--out", str(out / name))) for name, argv in runs]
    todo = [job for job in every if not (job.run / "result.json").is_file()]
    for job in todo:
        shutil.rmtree(job.run, ignore_errors=True)
    Local(jobs=jobs, device=device).run(todo, every, Display())
    return [seen.label for seen in survey(every) if seen.state != "finished"]


def log_of(out: Path, name: str) -> Path:
    """Where :func:`launch` keeps run ``NAME``'s output."""
    from crate_compose.launch.jobs import FOLDER, LOG_FILE

    return out / name / FOLDER / LOG_FILE


def train_and_report(
    doc: str, train, report, train_options, argv: list[str] | None = None, train_help: str = "train the runs"
) -> int:
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


def grouped_bars(
    axis, title: str, names: list[str], models: list[dict], bars: list[tuple[str, str]], ticks: list[str] | None = None
) -> None:
    """One panel: for every model (``models``, named ``names``) a group of bars, one per ``(label, key)`` of
    ``bars``, each the model's value at ``key``."""
    width = 0.8 / len(bars)
    for i, (label, key) in enumerate(bars):
        axis.bar(
            [x + (i - (len(bars) - 1) / 2) * width for x in range(len(names))],
            [m[key] for m in models],
            width,
            label=label,
        )
    axis.set_xticks(range(len(names)), ticks or names, fontsize=8)
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=7)


def save_figure(figure, title: str, path: Path) -> None:
    """``figure`` titled, laid out and written to ``path`` (PNG)."""
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
