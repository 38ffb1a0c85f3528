"""How long a build takes, and what planning once and placing once saved.

    .venv/bin/python benchmarks/build.py [--rounds 9] [--out [PATH]]

For each preset, in one process and alternating, the median wall time over ``--rounds`` of:

* ``build``: ``cc.build(spec)`` as it is: one plan, the memory check from the footprints' counts,
  one placement that builds and initializes every module;
* ``as before the march``: what a build did before (its memory check placed the whole network on
  the meta device, then the build placed it again): ``budget.estimate`` with a meta placement,
  then ``cc.build`` with no memory check.

The ratio of the two is taken in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import platform
import statistics
import time
from pathlib import Path

import torch

import crate_compose as cc
from crate_compose.building import budget

HERE = Path(__file__).resolve().parent
PRESETS = ("crate-tiny", "crate-base", "crate-mae-base")


def _seconds(action) -> float:
    gc.collect()  # the previous round's models (up to 44M parameters) freed before the clock starts
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def measure(rounds: int) -> list[tuple[str, float, float]]:
    rows = []
    for name in PRESETS:
        spec = cc.load_spec(name)
        cc.build(spec)  # warm: imports, kernels
        now, before = [], []
        for _ in range(rounds):
            now.append(_seconds(lambda spec=spec: cc.build(spec)))
            before.append(_seconds(lambda spec=spec: (budget.estimate(spec), cc.build(spec, memory_limit="none"))))
        rows.append((name, statistics.median(now), statistics.median(before)))
    return rows


def table(rows: list[tuple[str, float, float]], rounds: int) -> str:
    lines = [
        f"{datetime.date.today()}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{torch.get_num_threads()} threads; median of {rounds} rounds, alternating, one process.",
        "",
        "| preset | build s | as before the march s | before / now |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| `{name}` | {now:.3f} | {before:.3f} | {before / now:.2f}x |" for name, now, before in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--out",
        nargs="?",
        const=HERE / "RESULTS.md",
        type=Path,
        help="append the results as a section (default file: benchmarks/RESULTS.md)",
    )
    args = parser.parse_args()
    text = table(measure(args.rounds), args.rounds)
    print(text)
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(f"\n## build.py: one plan, one placement (cpu)\n\n{text}\n")


if __name__ == "__main__":
    main()
