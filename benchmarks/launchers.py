"""What the launchers cost (crate_compose.launch): submitting a 100-run grid to SLURM, the local launcher's
start-up per run beyond the run's own, and a 2 x 2 grid's wall time in-process against the local launcher with 2
jobs on this machine's cores.

    .venv/bin/python benchmarks/launchers.py [--rounds 3]      # SLURM_CONF set: a cluster up (scripts/slurm-cluster)

Every figure is the median of ``--rounds`` rounds; the in-process and local grids alternate within a round, so a
ratio is taken on one machine at one time. Prints a markdown section for RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "crate_compose.cli"]
STEPS = 6000  # a run of a few tens of seconds: long enough that a process of its own pays off
TINY = ["--set", "sizes.d=16", "--set", "sizes.heads=2", "--set", "sizes.head_dim=8", "--set", "sizes.depth=1"]
GRID = [
    *CLI,
    "ablate",
    str(ROOT / "specs" / "crate-digits.yaml"),
    "--data",
    "digits",
    "--batch-size",
    "16",
    "--no-progress",
    "--eval-every",
    "0",
]


def timed(command: list[str], **env: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - started


def grid(out: Path, swap: str, seeds: int, steps: int, *extra: str) -> list[str]:
    return [*GRID, *TINY, "--swap", swap, "--seeds", str(seeds), "--steps", str(steps), "--out", str(out), *extra]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="launchers-"))
    sparsify = "encoder.layer.sparsify.primitive=ista,ista_soft"
    rows, cores = {}, len(os.sched_getaffinity(0))
    try:
        here, local, per_run = [], [], []
        for r in range(args.rounds):
            # a 2 x 2 grid of runs long enough to be worth two processes (a few seconds each)
            here.append(timed(grid(work / f"here-{r}", sparsify, 2, STEPS)))
            local.append(timed(grid(work / f"local-{r}", sparsify, 2, STEPS, "--launcher", "local", "--jobs", "2")))
            # the start-up: 4 runs of one step, one at a time, in-process and as 4 processes
            one = timed(grid(work / f"one-here-{r}", "encoder.layer.sparsify.primitive=ista", 4, 1))
            many = timed(
                grid(
                    work / f"one-local-{r}",
                    "encoder.layer.sparsify.primitive=ista",
                    4,
                    1,
                    "--launcher",
                    "local",
                    "--jobs",
                    "1",
                )
            )
            per_run.append((many - one) / 4)
        rows["grid"] = (statistics.median(here), statistics.median(local))
        rows["per_run"] = statistics.median(per_run)
        if os.environ.get("SLURM_CONF") and shutil.which("sbatch"):
            submitted = []
            for r in range(args.rounds):  # 4 variants x 25 seeds, submitted and cancelled at once
                out = work / f"slurm-{r}"
                swap = "encoder.layer.sparsify.primitive=ista,ista_soft,ista_mm,ista_odl"
                submitted.append(timed(grid(out, swap, 25, 10_000, "--launcher", "slurm", "--time", "10", "--no-wait")))
                ids = {
                    p.read_text().split('"job": "')[1].split("_")[0] for p in out.glob("*/seed-*/launch/launch.json")
                }
                subprocess.run(["scancel", *ids], check=True)
                assert len(list(out.glob("*/seed-*/launch/launch.json"))) == 100
            rows["submit"] = statistics.median(submitted)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import torch

    print(
        f"## launchers.py: what the launchers cost (cpu)\n\n`.venv/bin/python benchmarks/launchers.py --rounds "
        f"{args.rounds}` ({time.strftime('%Y-%m-%d')}, {cpu_name()}, {cores} cores, torch {torch.__version__}, "
        f"median of {args.rounds} rounds; each command a fresh process, as a user runs it)\n"
    )
    print("| what | wall s |\n| --- | ---: |")
    if "submit" in rows:
        print(
            f"| `ablate --launcher slurm --no-wait`, a 100-run grid (4 variants x 25 seeds; checks, 100 run folders "
            f"described, one job array) on a one-node SLURM (scripts/slurm-cluster) | {rows['submit']:.2f} |"
        )
    print(
        f"| the local launcher's start-up per run beyond the run's own (a fresh process: Python, torch, the data) "
        f"| {rows['per_run']:.2f} |"
    )
    print(f"| a 2 x 2 grid of crate-digits (width 16, {STEPS:,} steps), in-process | {rows['grid'][0]:.2f} |")
    print(f"| the same grid, `--launcher local --jobs 2` | {rows['grid'][1]:.2f} |")
    print(
        f"\nlocal / in-process: {rows['grid'][1] / rows['grid'][0]:.2f}x (goal: under 1x on {cores} cores; "
        f"{'met' if rows['grid'][1] < rows['grid'][0] else 'not met'}). Submission goal: under 10 s"
        + (
            f" ({'met' if rows['submit'] < 10 else 'not met'})."
            if "submit" in rows
            else " (no SLURM here: not measured)."
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
