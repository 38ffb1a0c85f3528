"""How fast the command line answers, against importing torch alone.

    .venv/bin/python benchmarks/startup.py [--rounds 9] [--out [PATH]]

Each command runs as a fresh process (``sys.executable -m crate_compose.cli ...``, the console
script's code path without its wrapper) from the repository root; a round runs every command once,
in turn, so the ratios come from one run on the same machine. The table gives the median wall time
over rounds and the peak RSS of the child. A round in which some task waited for a core more than
``--stall-max`` of the round's time (Linux PSI, ``/proc/pressure/cpu``) is set aside and retaken.
The goal checked: ``validate specs/crate.yaml`` at most 1.3x ``python -c "import torch"``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_stall_us, publish  # benchmarks/machine.py, beside this script (torch-free: a parent holding

# torch would lend its pages to each child's peak RSS before the exec)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GOAL = 1.3
BROKEN = "name: broken\ninput: {shape: [3, 32, 32]\n"  # a flow mapping never closed: a YAML syntax error


def commands(broken: Path) -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "crate_compose.cli"]
    return {
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        "crate-compose --help": [*cli, "--help"],
        "validate missing.yaml (wrong path)": [*cli, "validate", "missing.yaml"],
        "validate broken.yaml (YAML syntax error)": [*cli, "validate", str(broken)],
        "validate specs/crate.yaml": [*cli, "validate", "specs/crate.yaml"],
        "validate specs/tost.yaml": [*cli, "validate", "specs/tost.yaml"],
        "validate a shape error (image 100, patch 16)": [
            *cli,
            "validate",
            "specs/crate.yaml",
            "--set",
            "sizes.image_size=100",
        ],
        "inspect specs/crate.yaml": [*cli, "inspect", "specs/crate.yaml"],
        "a spec placed on the meta device (what one the footprints cannot settle costs)": [
            sys.executable,
            "-c",
            "import crate_compose as cc; cc.build('specs/crate.yaml', meta=True)",
        ],
        "list primitives": [*cli, "list", "primitives"],
        "schema": [*cli, "schema"],
    }


def run(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (MB) of one child process."""
    began = time.perf_counter()
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(child.pid, 0)
    return time.perf_counter() - began, usage.ru_maxrss // 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--stall-max", type=float, default=0.05, help="largest CPU stall share of a kept round")
    parser.add_argument("--out", nargs="?", const=str(HERE / "RESULTS.md"), help="append the results as a section")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        broken = Path(folder) / "broken.yaml"
        broken.write_text(BROKEN)
        table = commands(broken)
        times: dict[str, list[float]] = {label: [] for label in table}
        memory: dict[str, int] = {}
        kept, dropped = 0, 0
        while kept < args.rounds and dropped < 3 * args.rounds:
            stall, began = cpu_stall_us(), time.perf_counter()
            results = {label: run(command) for label, command in table.items()}
            waited = (cpu_stall_us() - stall) / 1e6 if stall is not None else 0.0
            if waited > args.stall_max * (time.perf_counter() - began):
                dropped += 1
                continue
            kept += 1
            for label, (seconds, peak) in results.items():
                times[label].append(seconds)
                memory[label] = max(memory.get(label, 0), peak)
            print(f"round {kept}: " + ", ".join(f"{s:.2f}" for s, _ in results.values()), file=sys.stderr, flush=True)
    text = report({k: statistics.median(v) for k, v in times.items()}, memory, kept, dropped)
    publish(text, args.out)
    return 0


def report(medians: dict[str, float], memory: dict[str, int], kept: int, dropped: int) -> str:
    import torch

    base = medians['python -c "import torch"']
    lines = [
        "## startup.py: how fast the command line answers (cpu)",
        "",
        f"{datetime.date.today()}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores. Each command a fresh process; median wall time over {kept} rounds "
        f"({dropped} contended rounds set aside), peak RSS of the child.",
        "",
        "| command | wall s | x import torch | peak RSS MB |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, seconds in medians.items():
        lines.append(f"| `{label}` | {seconds:.2f} | {seconds / base:.2f} | {memory[label]} |")
    ratio = medians["validate specs/crate.yaml"] / base
    verdict = "met" if ratio <= GOAL else "not met"
    lines += ["", f"Goal: `validate specs/crate.yaml` at most {GOAL}x importing torch: {ratio:.2f}x ({verdict}).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
