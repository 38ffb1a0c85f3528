"""Ablation grids: every variant of a grid trained for every seed, into a folder that knows its grid.

``ablate`` trains every variant of a grid of swaps (:class:`crate_compose.ablation.grids.Grid`, e.g.
``--swap encoder.layer.sparsify.primitive=ista,ista_soft,ista_mm``) for several seeds. Every variant
is a spec of its own (its own name), and since every step's initial weights depend only on the seed
and its place in the network, the variants of one seed start from the same weights in every step
they did not swap. The results are a table (markdown and CSV: variant, parameters, final metric
mean and spread over the seeds, wall time) and one probe figure of every variant.

What makes the table trustworthy:

* before anything trains, every variant is fitted to the data, walked through its shapes and its
  training's memory estimated; every value that cannot fit is reported together, at the line of the
  grid file (or the ``--swap``) that gave it;
* ``OUT/ablation.json`` records the grid's identity (the base spec's name and hash, the swaps, the
  settings but the seed and the cadence, the seeds, the overrides, the package version); a folder
  that holds another ablation, or another person's files, is refused; one that holds this ablation is
  continued only with ``resume``, and any difference is refused with both values. A folder whose
  ablation never started a run is simply started again;
* every run ``OUT/<variant>/seed-N`` is trained by :func:`crate_compose.training.run.train`, resumed when it
  holds a run record: train refuses a run whose identity differs, continues an unfinished one exactly
  and reads a finished one back without writing; the table is written only from the runs it accepted,
  and states the settings of the identity;
* the folder is locked (:func:`crate_compose.training.run_folder.locks.hold`) for the whole ablation.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..assessment.layer_probes import plot_probes, probe, save_probes
from ..assessment.run_probes import PROBE_SAMPLES
from ..assessment.timelines import spread_rows
from ..building.artifacts import load_build
from ..building.builder import compile_spec, spec_of
from ..building.inspection import validate
from ..errors import Location, Problem, SpecError, Stopped, WorkbenchError
from ..files import ABLATIONS, write_atomic
from ..launch.jobs import FOLDER as JOB_FOLDER
from ..launch.jobs import LAUNCH_FILE, Job, LaunchError, forget_job, read_job, write_job
from ..launch.status import LIVE, Display, survey
from ..spec_language import loader
from ..spec_language.naming import GENERIC_KEYS, safe_name
from ..spec_language.overrides import parse_key_path
from ..training import world
from ..training.description import RunDescription, describe
from ..training.finetune import Init, fit_init, read_init, start_identity
from ..training.preparation import Loaded, check_run_memory
from ..training.run import train_described
from ..training.run_folder import preflight
from ..training.run_folder.identity import RUN_FILE, differences, digest, learned
from ..training.run_folder.locks import hold
from ..training.run_folder.preflight import ABLATION_FILE
from .grids import Grid, GridError

FORMAT = 1
MAX_RECORD_BYTES = 1_000_000  # a record is a few kB
SHOWN_VARIANTS = 3  # a problem found in more variants names the first three


def variant_label(variant: dict[str, str]) -> str:
    """A short label: the last meaningful key of each swapped path and its value (``sparsify=ista_soft``)."""
    parts = []
    for path, value in variant.items():
        words = [w for w in parse_key_path(path) if w not in GENERIC_KEYS and not w.isdigit()]
        parts.append(f"{words[-1] if words else path}={value}")
    return ", ".join(parts)


@dataclass
class Row:
    """One variant's line of the table: the mean and spread of the seeds that finished (``values``); the
    seeds that did not, with the reason (``missing``), are never averaged in."""

    variant: str
    params: int
    metric: str
    mean: float
    spread: float
    seconds: float
    values: list[float]
    maximize: bool = True  # whether a larger metric is better (the task's)
    missing: dict[int, str] = field(default_factory=dict)  # seed -> why it has no result


def ablate(
    spec_ref,
    grid: Grid,
    *,
    out: str | Path | None = None,
    progress: bool = False,
    device: str = "cpu",
    memory_limit: str | float | None = None,
    resume: bool = False,
    init: str | Path | None = None,
    freeze: str = "none",
    recipe: str | None = None,
    launcher=None,
    wait: bool = True,
    plugins: tuple[str, ...] = (),
) -> list[Row] | None:
    """Train every variant of ``grid`` for every seed into ``out`` (default: ``ablations/<spec name>``), then write the table and the
    figure; ``resume`` continues the ablation ``out`` holds (see the module docstring). ``init`` (a
    build folder) fine-tunes every variant from the same weights, ``freeze`` as ``train``'s; every
    variant must take them (checked before anything trains). ``recipe`` (a recipe's text, whose
    settings are in ``grid.settings``) is saved in every run folder.

    ``launcher`` (:mod:`crate_compose.launch`: :class:`~crate_compose.launch.local.Local`,
    :class:`~crate_compose.launch.slurm.Slurm`; None: one run after another in this process) starts the runs
    that are not finished nor live, each exactly the run ``train`` makes; ``wait=False`` (SLURM) returns once
    they are submitted (None: the table is written by a later ``resume`` when they are done). ``plugins``:
    the plug-ins a launched run imports first, as this process did.

    The spec is read once, here (:func:`crate_compose.spec_language.loader.read`): every variant, check, run and probe
    is resolved from that reading, so a file edited during a long grid changes none of them; the data set
    is loaded once for every variant and seed that reads it alike (:class:`crate_compose.training.preparation.Loaded`)."""
    base, loaded = _described(spec_ref, grid, init, freeze, recipe), Loaded()
    out = Path(out) if out is not None else ABLATIONS / base.spec.name
    start = read_init(init) if init is not None else None
    identity = {**_identity(base, grid), **start_identity(start, freeze)}
    variants = _check_variants(base, grid, device, memory_limit, start, loaded)
    if launcher is not None:
        launcher.check()  # what cannot be started is refused before anything is written
    _check_folder(out, identity, resume)  # refused before the lock creates the folder
    start = None  # its tensors are given back: each run reads the folder again (and checks its SHA-256)
    with hold(out, "ablate into"):  # a folder it made is removed again when the ablation fails holding nothing
        fresh = False
        if _check_folder(out, identity, resume):  # again: another process may have written there meanwhile
            fresh = not (out / ABLATION_FILE).exists()
            _record(out, identity)
        try:
            if launcher is None:
                _train_grid(variants, grid, out, progress, device, memory_limit, loaded)
            else:
                _launch_grid(variants, grid, out, launcher, wait, device, memory_limit, plugins)
                if not wait:
                    return None
            rows, probes = _collect(variants, grid, out, memory_limit, loaded)
            _write_results(out, rows, probes, identity)
        except BaseException:
            if fresh and not _started(out) and not _launched(out):  # the record written here was all it wrote
                (out / ABLATION_FILE).unlink(missing_ok=True)
            raise
    return rows


def verdict(rows: list[Row]) -> str:
    """Which variant is ahead, said only when the data can say it: the best mean's lead over the next must
    exceed the spread (standard deviation over seeds) of both, each over at least two seeds; else that no
    variant is ahead, and why."""
    counted = sorted((row for row in rows if row.values), key=lambda r: r.mean, reverse=rows[0].maximize)
    if not counted:
        return "no variant finished a run"
    best = counted[0]
    said = f"{best.variant} ({best.metric} {best.mean:.4f}"
    if len(counted) == 1:
        return f"only {said}) finished"
    second = counted[1]
    gap = abs(best.mean - second.mean)
    if min(len(best.values), len(second.values)) < 2:
        return (
            f"no variant is ahead: {said}) leads {second.variant} by {gap:.4f}, but from one seed a gap cannot be "
            "told from the seeds' own spread; give --seeds 3 or more"
        )
    spread = max(best.spread, second.spread)
    if gap <= spread:
        return (
            f"no variant is ahead: {said}) leads {second.variant} by {gap:.4f}, within the seeds' spread ({spread:.4f})"
        )
    return f"best: {said} ± {best.spread:.4f}), ahead of {second.variant} by {gap:.4f}, more than the seeds' spread"


def grid_jobs(variants: dict[str, RunDescription], grid: Grid, out: Path) -> list[Job]:
    """Every run of the grid, as a launcher sees it."""
    return [
        Job(out / _folder(label) / f"seed-{seed}", f"{label}, seed {seed}")
        for label in variants
        for seed in range(grid.seeds)
    ]


def folder_jobs(out: Path) -> list[Job]:
    """Every run an ablation folder holds (``ablate --status``: the spec is not needed), by its job's label
    where a launcher wrote one, else by its folder's name."""
    found = []
    for run in sorted(out.glob("*/seed-*")):
        if not run.is_dir() or not run.name[5:].isdigit():
            continue
        try:
            label = read_job(run)["label"]
        except LaunchError:
            label = f"{run.parent.name}, seed {run.name[5:]}"
        found.append(Job(run, str(label)))
    return sorted(found, key=lambda job: (job.run.parent.name, int(job.run.name[5:])))


def _launch_grid(
    variants: dict[str, RunDescription],
    grid: Grid,
    out: Path,
    launcher,
    wait: bool,
    device: str,
    memory_limit,
    plugins: tuple[str, ...],
) -> None:
    """Start every run that is neither finished nor live (pending, running) on ``launcher``, each described in its
    folder (:func:`crate_compose.launch.jobs.write_job`); then, with ``wait``, show the grid until none is live."""
    jobs = grid_jobs(variants, grid, out)
    now = survey(jobs)
    todo = [job for job, seen in zip(jobs, now) if seen.state not in ("finished", *LIVE)]
    for job in todo:
        label, seed = job.label.rsplit(", seed ", 1)
        write_job(
            job.run,
            variants[label].seeded(int(seed)),
            label=job.label,
            device=device,
            memory_limit=memory_limit,
            plugins=plugins,
        )
    task = next(iter(variants.values())).task
    kept = len(jobs) - len(todo)
    print(
        f"{launcher.name}: starting {len(todo)} of {len(jobs)} runs" + (f" ({kept} finished or live)" if kept else ""),
        file=sys.stderr,
        flush=True,
    )
    try:
        launcher.run(todo, jobs, Display(task.metric), wait, folder=out / "slurm")
    except LaunchError:  # refused (SLURM's own words): nothing was submitted, nothing of it is left
        for job in todo:
            if not (job.folder / LAUNCH_FILE).exists():
                forget_job(job)
        raise


def _launched(out: Path) -> bool:
    """Whether any run of the ablation in ``out`` was given to a launcher."""
    return any(out.glob(f"*/seed-*/{JOB_FOLDER}/{LAUNCH_FILE}"))


def _described(spec_ref, grid: Grid, init, freeze: str, recipe: str | None) -> RunDescription:
    """The run every variant swaps from (:func:`crate_compose.training.description.describe`), its spec's
    problems said where the grid's overrides were written."""
    try:
        return describe(spec_ref, grid.settings, overrides=grid.overrides, init=init, freeze=freeze, recipe=recipe)
    except SpecError as error:
        raise SpecError([_relocated(p, grid.origins) for p in error.problems]) from None


def _identity(base: RunDescription, grid: Grid) -> dict[str, Any]:
    from ..version import __version__

    spec = base.spec
    # the logger (OUTPUTS) is where metrics go, not what a run learns: an ablation resumes with another
    settings = {**learned(base.settings, ("seed",)), "steps": base.settings.steps}  # every run of a grid as long
    return {
        "spec": {"name": spec.name, "sha256": hashlib.sha256(loader.dump(spec).encode()).hexdigest()},
        "swaps": grid.swaps,
        "seeds": grid.seeds,
        "overrides": grid.overrides,
        "settings": settings,
        "version": __version__,
    }


# ---------------------------------------------------------------- every variant, before anything trains


def _check_variants(
    base: RunDescription, grid: Grid, device: str, memory_limit, start: Init | None = None, loaded: Loaded | None = None
) -> dict[str, RunDescription]:
    """Every variant described (:meth:`RunDescription.variant`), fitted to the data
    (:meth:`crate_compose.training.preparation.Loaded.prepare`), walked through its shapes
    (:func:`crate_compose.building.inspection.validate`), its training's memory estimated
    (:func:`crate_compose.training.preparation.check_run_memory`) and, fine-tuning, the weights of ``start``
    fitted to it (:func:`crate_compose.training.finetune.fit_init`); each problem once, with the variants
    it is found in, where its value was written. Returns every variant's description by its label."""
    variants = grid.variants()
    found: dict[str, tuple[Problem, list[str]]] = {}
    described: dict[str, RunDescription] = {}
    for variant in variants:
        label = variant_label(variant)
        problems, described[label] = _variant_problems(base, grid, variant, device, memory_limit, start, loaded)
        for problem in problems:
            found.setdefault(str(problem), (problem, []))[1].append(label)
    if found:
        raise GridError([_of_variants(p, labels, len(variants)) for p, labels in found.values()])
    return described


def _variant_problems(
    base: RunDescription,
    grid: Grid,
    variant: dict[str, str],
    device: str,
    memory_limit,
    start: Init | None,
    loaded: Loaded | None,
) -> tuple[list[Problem], RunDescription | None]:
    settings = base.settings
    per_process = max(1, settings.batch_size // world.world_size())  # as train shares a batch
    try:
        described = base.variant(grid.assignments(variant))
        spec, _ = (loaded or Loaded()).prepare(described, memory_limit)
        validate(spec)
        check_run_memory(spec, settings, per_process, device, memory_limit)
        if start is not None:  # the variant's tensors, on the meta device: their names and shapes only
            fit_init(compile_spec(spec, meta=True), start)
    except SpecError as error:
        return [_relocated(p, grid.origins) for p in error.problems], None
    except WorkbenchError as error:  # data that cannot follow the variant's sizes, weights that do not fit it
        return [Problem(str(error))], None
    return [], described


def _of_variants(problem: Problem, labels: list[str], total: int) -> Problem:
    """``problem`` said of the variants it was found in."""
    if len(labels) == total > 1:
        which = "every variant"
    else:
        more = f" and {len(labels) - SHOWN_VARIANTS} more" if len(labels) > SHOWN_VARIANTS else ""
        which = f"variant{'s' if len(labels) > 1 else ''} {'; '.join(labels[:SHOWN_VARIANTS])}{more}"
    return Problem(f"{which}: {problem.message}", problem.path, problem.location, problem.hint)


OVERRIDE_PLACE = re.compile(r"--set #\d+ '([^']*)'")  # how the loader names an override (overrides.apply_override)


def _relocated(problem: Problem, origins: dict[str, Location]) -> Problem:
    """``problem`` with each override it names said as where it was written (a grid file's line,
    ``--swap``, ``--set``): the loader numbers a variant's overrides, which the user did not write."""

    def place(match: re.Match) -> str:
        return str(origins.get(match.group(1), match.group(0)))

    location = problem.location
    named = OVERRIDE_PLACE.fullmatch(location.source) if location and not location.line else None
    if named and named.group(1) in origins:
        location = origins[named.group(1)]
    return Problem(
        OVERRIDE_PLACE.sub(place, problem.message), problem.path, location, OVERRIDE_PLACE.sub(place, problem.hint)
    )


# ---------------------------------------------------------------- the folder's identity


def _check_folder(out: Path, identity: dict[str, Any], resume: bool) -> bool:
    """Refuse ``out`` unless it can take this grid (see the module docstring); True when the grid's
    identity is to be recorded there (a new ablation, or one that never started a run)."""
    path = out / ABLATION_FILE
    recorded = _read_identity(path)
    if recorded is None:
        preflight.ablation_folder(out)  # a file, someone else's files: OutputError (exit 1), as the CLI checks first
        if resume:
            raise WorkbenchError(
                f"--resume: {out} holds no ablation to continue (no {ABLATION_FILE}); leave out --resume to start one"
            )
        return True
    if not _started(out):
        return True
    if not resume:
        raise WorkbenchError(f"{out} holds an ablation: pass --resume to continue it, or choose another --out")
    changes = differences(recorded, identity)
    if changes:
        said = "; ".join(
            f"{key.removeprefix('settings.')}: {json.dumps(old)} in {path}, {json.dumps(new)} now"
            for key, old, new in changes
        )
        raise WorkbenchError(f"--resume: {out} holds another ablation: {said}. Choose another --out for this one")
    return False


def _record(out: Path, identity: dict[str, Any]) -> None:
    record = {"format": FORMAT, "identity": identity, "hash": digest(identity)}
    write_atomic(out / ABLATION_FILE, json.dumps(record, indent=2) + "\n")


def _started(out: Path) -> bool:
    """Whether any run of the ablation in ``out`` has started (holds its run record)."""
    return any(out.glob(f"*/seed-*/{RUN_FILE}"))


def _read_identity(path: Path) -> dict[str, Any] | None:
    """The identity ``path`` records, None when there is no such file; refused when it cannot be trusted."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        if not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            raise ValueError(f"not a regular file of at most {MAX_RECORD_BYTES:,} bytes")
        record = json.loads(path.read_text(encoding="utf-8"))
        if not (
            isinstance(record, dict)
            and record.get("format") == FORMAT
            and isinstance(record.get("identity"), dict)
            and record.get("hash") == digest(record["identity"])
        ):
            raise ValueError(f"not an ablation record of format {FORMAT} whose identity matches its hash")
    except (OSError, UnicodeDecodeError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error).splitlines()[0]
        raise WorkbenchError(f"{path} cannot be trusted ({reason}); restore it, or choose another --out") from None
    return record["identity"]


# ---------------------------------------------------------------- training and the table


def _train_grid(
    variants: dict[str, RunDescription],
    grid: Grid,
    out: Path,
    progress: bool,
    device: str,
    memory_limit,
    loaded: Loaded,
) -> None:
    """Every run of the grid, one after another in this process."""
    total, done = len(variants) * grid.seeds, 0
    for label, described in variants.items():
        task = described.task
        for seed in range(grid.seeds):
            done += 1
            run = out / _folder(label) / f"seed-{seed}"
            try:
                result = train_described(
                    described.seeded(seed),
                    out=run,
                    device=device,
                    progress=progress,
                    memory_limit=memory_limit,
                    resume=(run / RUN_FILE).is_file(),
                    loaded=loaded,
                )
            except Stopped as stopped:  # SIGTERM: the ablation, not the one run, is what --resume continues
                raise Stopped(
                    f"{label}, seed {seed}: {stopped.state}",
                    f"crate-compose ablate ... --out {out} --resume continues the ablation from there",
                    signal=stopped.signal,
                ) from None
            value = result.metrics.get(task.metric, float("nan"))
            said = "finished before, kept" if result.already_finished else f"{result.seconds:.0f} s"
            print(f"[{done}/{total}] {label}, seed {seed}: {task.metric} {value:.4f} ({said})", flush=True)


def _collect(
    variants: dict[str, RunDescription], grid: Grid, out: Path, memory_limit, loaded: Loaded
) -> tuple[list[Row], dict[str, list[dict]]]:
    """The table's rows and the probes, from the run folders: a run that did not finish is a missing cell
    with its reason (:func:`crate_compose.launch.status.seen`), never averaged in."""
    rows: list[Row] = []
    probes: dict[str, list[dict]] = {}
    for label, described in variants.items():
        task, settings = described.task, described.settings
        values, seconds, params, missing, finished = [], [], 0, {}, []
        for seed in range(grid.seeds):
            run = out / _folder(label) / f"seed-{seed}"
            result = _result(run)
            if result is None or not isinstance(result.get("metrics", {}).get(task.metric), (int, float)):
                seen = survey([Job(run, f"{label}, seed {seed}")])[0]
                missing[seed] = seen.line().split(": ", 1)[1]
                continue
            values.append(float(result["metrics"][task.metric]))
            seconds.append(float(result.get("seconds", 0.0)))
            params = int(result.get("params", 0))
            finished.append(seed)
        mean = statistics.fmean(values) if values else float("nan")
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        rows.append(
            Row(
                label,
                params,
                task.metric,
                mean,
                spread,
                statistics.fmean(seconds) if seconds else 0.0,
                values,
                task.maximize,
                missing,
            )
        )
        if not finished:
            continue
        spec, data = loaded.prepare(described.seeded(0), memory_limit)
        inputs, extra = task.probe_inputs(data, PROBE_SAMPLES, settings.normalize)  # the same for every run
        finals = [load_build(out / _folder(label) / f"seed-{seed}" / "final") for seed in finished]
        probes[label] = spread_rows([probe(model, inputs, **extra) for model in finals])
        if len(rows) == 1 and described.init is None:  # the first variant untrained, as training started
            untrained = [compile_spec(spec_of(model), seed=seed) for seed, model in zip(finished, finals)]
            probes[f"{label}, untrained"] = spread_rows([probe(model, inputs, **extra) for model in untrained])
    return rows, dict(sorted(probes.items(), key=lambda item: item[0].endswith(", untrained")))


def _result(run: Path) -> dict[str, Any] | None:
    """A finished run's ``result.json``, None when it has none (or it cannot be read)."""
    try:
        found = json.loads((run / "result.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _folder(label: str) -> str:
    """A variant's folder: its label as a file name (``sparsify-ista_soft``); a label that does not
    stay as it is, or a long one, gets its hash appended, so two variants never share a folder."""
    plain = label.replace(", ", "_").replace("=", "-")
    name = safe_name(plain)
    if name == plain and len(name) <= 80:
        return name
    return f"{name[:60]}-{hashlib.sha256(label.encode()).hexdigest()[:10]}"


def _start_said(identity: dict[str, Any]) -> str:
    """Where every variant's weights start, as the table states it."""
    init, freeze = identity.get("init"), identity.get("freeze", "none")
    if init is None:
        return "every variant of one seed starts from the same weights in the steps it does not swap."
    frozen = ", its encoder frozen (the head alone trains)" if freeze == "encoder" else ""
    return (
        f"every variant is fine-tuned from the weights of `{init['path']}` (SHA-256 {init['sha256'][:12]}…)"
        f"{frozen}; a head that does not fit them starts new, from the seed."
    )


def _write_results(out: Path, rows: list[Row], probes: dict[str, list[dict]], identity: dict[str, Any]) -> None:
    """The table (results.md, results.csv) and the probes, stating the settings of the grid's identity."""
    settings, seeds, name = identity["settings"], identity["seeds"], identity["spec"]["name"]
    header = [
        "variant",
        "parameters",
        f"{rows[0].metric} (mean)",
        "spread (std over seeds)",
        "seeds",
        "seconds per run",
    ]
    lines = [
        f"# Ablation of {name}",
        "",
        f"Task `{settings['task']}` on `{settings['data']}`, {settings['steps']} steps, batch "
        f"{settings['batch_size']}, lr {settings['lr']}, seeds 0..{seeds - 1}; " + _start_said(identity),
        "",
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
    ]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["variant", "parameters", "metric", "mean", "std", "seeds", "seconds", "values"])
    for row in rows:
        spread = f"{row.spread:.4f}" if len(row.values) > 1 else ("— (one seed)" if row.values else "—")
        count = (
            f"{len(row.values)}" if not row.missing else f"{len(row.values)} of {len(row.values) + len(row.missing)}"
        )
        mean = f"{row.mean:.4f}" if row.values else "— (no run finished)"
        params = f"{row.params:,}" if row.values else "—"
        lines.append(f"| {row.variant} | {params} | {mean} | {spread} | {count} | {row.seconds:.0f} |")
        writer.writerow(
            [
                row.variant,
                row.params,
                row.metric,
                f"{row.mean:.6f}" if row.values else "",
                f"{row.spread:.6f}" if len(row.values) > 1 else "",
                len(row.values),
                f"{row.seconds:.1f}",
                " ".join(f"{v:.6f}" for v in row.values),
            ]
        )
    missing = [f"- {row.variant}, seed {seed}: {why}" for row in rows for seed, why in row.missing.items()]
    if missing:
        lines += ["", f"Missing runs ({len(missing)}; each mean above is over the seeds it counts):", "", *missing]
    write_atomic(out / "results.md", "\n".join(lines) + "\n\n![probes](probes.png)\n")
    write_atomic(out / "results.csv", buffer.getvalue())
    save_probes(probes, out / "probes.json")
    over = f"mean of seeds 0..{seeds - 1}, band: their range" if seeds > 1 else "seed 0"
    plot_probes(
        probes,
        out / "probes.png",
        title=f"{name}: each variant's probes after training, and the first untrained ({over})",
    )
