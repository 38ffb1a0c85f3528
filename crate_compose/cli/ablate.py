"""``crate-compose ablate``: a grid of swapped primitives trained over seeds; a results table and probe plot."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import crate_compose as cc

from ..errors import SpecError, WorkbenchError
from ..files import ABLATIONS
from ..settings import MAX_RUNS, MAX_SEEDS
from .arguments import (
    Command,
    checkpoint_note,
    from_environment,
    launcher_arguments,
    launcher_of,
    memory_argument,
    number,
    rank_zero,
    recipe_argument,
    recipe_settings,
    run_arguments,
    run_settings,
    spec_arguments,
    start_arguments,
)


def add(command: Command) -> None:
    """Add the command ablate."""
    ablate = command("ablate", help="train a grid of swapped primitives over seeds; a results table and probe plot")
    spec_arguments(ablate)
    ablate._actions[[a.dest for a in ablate._actions].index("spec")].nargs = "?"  # not with --status
    ablate.add_argument(
        "--swap",
        action="append",
        default=[],
        metavar="PATH=a,b,c",
        help="a step to swap and the primitives to try, e.g. encoder.layer.sparsify.primitive="
        "ista,ista_soft,ista_mm (repeatable: the grid crosses them; replaces the grid file's "
        "values of that path; a value listed twice is trained once)",
    )
    ablate.add_argument(
        "--grid",
        type=Path,
        help="a YAML grid file: swaps, seeds, set, and any training setting but "
        f"seed; the command line wins over it; at most {MAX_RUNS} runs (variants x seeds)",
    )
    ablate.add_argument(
        "--seeds",
        type=number(int, 1, MAX_SEEDS, what="a whole number"),
        default=None,
        help=f"seeds per variant, 1 to {MAX_SEEDS} (default: the grid file's, else 1)",
    )
    run_arguments(ablate)
    recipe_argument(ablate)
    start_arguments(ablate, " every variant")
    ablate.add_argument("--out", type=Path, help="folder of the grid (default: ablations/<spec name>)")
    ablate.add_argument(
        "--resume",
        action="store_true",
        help="continue the ablation in --out (its ablation.json): "
        "finished runs are kept, unfinished ones continue; a grid that differs is refused",
    )
    memory_argument(ablate)
    launcher_arguments(ablate, "the grid's runs")
    ablate.add_argument(
        "--status",
        type=Path,
        default=None,
        metavar="DIR",
        help="show what every run of the ablation in DIR is doing (pending, running at step k, "
        "finished, failed and why), from any shell, and exit",
    )


def run_ablate(args: argparse.Namespace) -> int:
    from ..ablation.grids import combine, read_grid
    from ..data.set_registry import resolve as resolve_data
    from ..training.recipes import read_recipe

    if args.status is not None:
        return _status(args.status)
    if args.spec is None:
        raise WorkbenchError("ablate: give the spec (a file or a zoo preset), or --status DIR")
    launcher = launcher_of(args)

    found = read_grid(args.grid) if args.grid else None  # checked before torch loads
    recipe = read_recipe(args.config) if args.config else None
    from_grid = found.settings() if found else {}
    given = recipe_settings(
        recipe, args.steps is not None or "steps" in from_grid, args.warmup is not None or "warmup" in from_grid
    )
    settings = run_settings(args, {**from_environment(), **given, **from_grid})  # the command line wins over the
    # grid, the grid over the recipe, the recipe over the environment
    resolve_data(settings.data)  # a data set's typo, answered before torch loads (as a spec's is)
    grid = combine(
        found,
        args.swap,
        args.overrides,
        args.seeds,
        settings,
        recipe=(args.config, recipe.overrides) if recipe else None,
    )
    for note in grid.notes:
        print(f"note: {note}", file=sys.stderr)
    from ..spec_language.loader import read as read_spec
    from ..training.run_folder import preflight

    try:
        spec_ref = read_spec(args.spec)  # the spec file, opened once for the whole grid
    except SpecError:
        spec_ref = args.spec  # ablate says its problems, located
    out = args.out or _default_ablation(spec_ref, grid)
    if out is not None:  # a file, someone else's files: refused before torch loads (exit 1)
        preflight.ablation_folder(out)
    if launcher is not None:
        launcher.check()  # refused before the note below, and before anything is written
    checkpoint_note(launcher, settings)
    rows = cc.ablate(
        spec_ref,
        grid,
        out=out,
        progress=args.progress,
        device=args.device,
        memory_limit=args.memory_limit,
        resume=args.resume,
        init=args.init,
        freeze=args.freeze or "none",
        recipe=recipe.text if recipe else None,
        launcher=launcher,
        wait=args.wait,
        plugins=tuple(args.plugins),
    )
    if not rank_zero():
        return 0
    if rows is None:
        print(
            f"submitted; watch with: crate-compose ablate --status {out}; when every run is done, the same command "
            "with --resume writes the table",
            file=sys.stderr,
        )
        return 0
    print((out / "results.md").read_text())
    from ..ablation.study import verdict

    print(f"{verdict(rows)}; wrote {out}/results.md, results.csv, probes.png")
    missing = sum(len(row.missing) for row in rows)
    if missing:
        print(
            f"{missing} run{'s' if missing > 1 else ''} did not finish (listed in {out}/results.md); the same command "
            "with --resume starts them again",
            file=sys.stderr,
        )
        return 4
    return 0


def _status(out: Path) -> int:
    """``ablate --status DIR``: every run of the ablation, as its folder and scheduler say."""
    from ..ablation.study import folder_jobs
    from ..launch.status import Display, counts, survey
    from ..training.run_folder.preflight import ABLATION_FILE

    if not (out / ABLATION_FILE).is_file():
        raise WorkbenchError(f"--status: {out} holds no ablation (no {ABLATION_FILE})")
    jobs = folder_jobs(out)
    if not jobs:
        print(f"{out}: no run has started yet")
        return 0
    runs = survey(jobs)
    Display(stream=sys.stdout).show(runs)
    print(f"{len(runs)} runs: {counts(runs)}")
    return 0


def _default_ablation(spec_ref, grid) -> Path | None:
    """``ablations/<base spec name>``, torch-free; None when the spec does not load (its problems are then
    reported located at the grid's lines, by ablate)."""
    try:
        return ABLATIONS / cc.load_spec(spec_ref, grid.overrides).name
    except SpecError:
        return None
