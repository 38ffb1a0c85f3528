"""Probing trained networks and running ablation grids (``crate-compose probe`` and ``ablate``).

``probe_run`` measures every step's own objective layer by layer (:mod:`crate_compose.probes`) on
a trained build and on the same spec untrained (same seed), and draws both on one figure, as
paper 003 Figs. 3-4 do.

``ablate`` trains every variant of a grid of swaps (``--swap encoder.layer.sparsify.primitive=
ista,ista_soft,ista_mm``) for several seeds. Every variant is a spec of its own (its own name), and
since every step's initial weights depend only on the seed and its place in the network, the
variants of one seed start from the same weights in every step they did not swap. A finished run
(its ``final/`` build exists) is not trained again, so an interrupted grid resumes where it stopped.
The results are a table (markdown and CSV: variant, parameters, final metric mean and spread over
the seeds, wall time) and one probe figure of every variant.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import re
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

import torch

from . import loader
from .artifacts import SPEC_FILE, WEIGHTS_FILE, first_mismatch, read_weights
from .artifacts import load as load_build
from .files import writable, write_atomic
from .builder import compile_spec, spec_of
from .data import Data, load_data
from .errors import SpecError, WorkbenchError
from .locks import hold
from .probes import plot_probes, probe, save_probes, write_probes
from .footprints import tied
from .train import METRIC, Settings, prepare, train

PROBE_SAMPLES = 256


def _probe_inputs(data: Data, samples: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """The first ``samples`` test inputs, and the true subspaces and labels for synthetic tokens."""
    count = min(samples, len(data.test))
    items = [data.test[i] for i in range(count)]
    inputs = torch.stack([x for x, _ in items])
    extra: dict[str, Any] = {}
    if data.subspaces is not None:
        extra = {"subspaces": data.subspaces, "labels": torch.stack([torch.as_tensor(y) for _, y in items])}
    return inputs, extra


def probe_run(
    spec_ref,
    data_name: str,
    *,
    weights: str | Path | None = None,
    overrides: Iterable[str] = (),
    out: str | Path | None = None,
    seed: int = 0,
    samples: int = PROBE_SAMPLES,
    image_size: int | None = None,
) -> tuple[Path, Path, dict[str, list[dict]]]:
    """Probe ``spec_ref`` (its input size set from the data) untrained, and trained with ``weights``
    (a run's ``final/`` or a checkpoint) when given; write probes.json and probes.png into ``out``
    (default: :func:`probe_folder`), both new or neither (:func:`crate_compose.probes.write_probes`),
    holding the folder's lock (:func:`crate_compose.locks.hold`: another writer exits 3)."""
    spec, data = prepare(spec_ref, data_name, overrides, image_size, seed)
    folder = probe_folder(weights, spec.name, out)  # refused before anything is measured
    inputs, extra = _probe_inputs(data, samples)
    runs: dict[str, list[dict]] = {}
    if weights is not None:
        trained = compile_spec(spec, seed=seed)
        load_weights(trained, Path(weights))
        runs["trained"] = probe(trained, inputs, **extra)
    runs["untrained"] = probe(compile_spec(spec, seed=seed), inputs, **extra)
    title = f"{spec.name} on {data_name}: " + (" vs ".join(runs))
    with hold(folder, "write probes into"):
        table, figure = write_probes(runs, folder, title=title)
    return table, figure, runs


CHECKPOINT = re.compile(r"step-\d+")  # RUN/checkpoints/step-NNNNNN


def probe_folder(weights: str | Path | None, spec_name: str, out: str | Path | None = None) -> Path:
    """Where ``probe`` writes: ``out`` when given; for a run's weights, ``RUN/final`` or a checkpoint
    ``RUN/checkpoints/step-N``, the run's ``RUN/probes/final`` or ``RUN/probes/step-N`` (never inside
    the build: ``train --resume`` takes ``final/`` only when it holds a build and nothing else); for
    other weights, or none, ``probes/<spec name>``. Refused: a folder inside a build (a folder holding
    model.safetensors and spec.yaml), a file where the folder goes (:class:`WorkbenchError`), and a
    probes.json or probes.png that is not a regular file (``OSError``, as every output)."""
    named = Path(weights or "")
    named = named.resolve() if weights is not None and named.name in ("", "..") else named
    if out is not None:
        folder = Path(out)
    elif weights is not None and named.name == "final":
        folder = named.parent / "probes" / "final"
    elif weights is not None and named.parent.name == "checkpoints" and CHECKPOINT.fullmatch(named.name):
        folder = named.parent.parent / "probes" / named.name
    else:
        folder = Path("probes") / spec_name
    where = f"--out {folder}" if out is not None else str(folder)
    resolved = folder.resolve()
    for place in (resolved, *resolved.parents):
        if (place / WEIGHTS_FILE).is_file() and (place / SPEC_FILE).is_file():
            raise WorkbenchError(f"{where} is inside the build {place}: probes are never written into a build "
                                 "(train --resume would refuse its final/); choose a folder outside it")
    if folder.exists() and not folder.is_dir():
        raise WorkbenchError(f"{where} exists and is not a folder: give a folder for probes.json and probes.png")
    for name in ("probes.json", "probes.png"):
        writable(folder / name)
    return folder


def load_weights(model: torch.nn.Module, folder: Path) -> None:
    """Load ``folder/model.safetensors`` into ``model``; a mismatch names the first differing tensor."""
    path = folder / "model.safetensors"
    if not path.is_file():
        raise WorkbenchError(f"--weights {folder}: no model.safetensors there (give a run's final/ or a checkpoint)")
    try:
        tensors = read_weights(path, tied(spec_of(model)))
    except ValueError as error:
        raise WorkbenchError(f"--weights {folder}: {error}") from None
    mismatch = first_mismatch(model.state_dict(), tensors)
    if mismatch:
        raise WorkbenchError(f"--weights {folder} do not fit the spec: {mismatch}")
    broken = next((name for name, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if broken:  # a diverged run: every measure would be NaN, and the probes' logdet cannot be taken
        raise WorkbenchError(f"--weights {folder}: {broken} holds NaN or infinite values (a diverged run?)")
    model.load_state_dict(tensors)


def probe_table(runs: dict[str, list[dict]]) -> str:
    """The probe rows as aligned text: one line per step and measure, one column per run."""
    names = list(runs)
    keys: list[tuple] = []
    values: dict[tuple, dict[str, float]] = {}
    for name, rows in runs.items():
        for row in rows:
            key = (row["module"], row["measure"])
            if key not in values:
                keys.append(key)
                values[key] = {}
            values[key][name] = row["value"]
    width = max([len(m) for m, _ in keys] + [6])
    lines = [f"{'step':<{width}}  {'measure':<16}" + "".join(f"  {n:>12}" for n in names)]
    for key in keys:
        cells = "".join(f"  {values[key].get(n, float('nan')):>12.4f}" for n in names)
        lines.append(f"{key[0]:<{width}}  {key[1]:<16}{cells}")
    return "\n".join(lines)


# ---------------------------------------------------------------- ablation grids


@dataclass
class Grid:
    """An ablation: the swaps to cross, and how to train each variant."""

    swaps: dict[str, list[str]]
    settings: Settings = field(default_factory=Settings)
    seeds: int = 1
    overrides: list[str] = field(default_factory=list)

    def variants(self) -> list[dict[str, str]]:
        """Every combination of the swaps, in order (``{path: value}``)."""
        paths = list(self.swaps)
        return [dict(zip(paths, values)) for values in itertools.product(*(self.swaps[p] for p in paths))]


def variant_label(variant: dict[str, str]) -> str:
    """A short label: the last meaningful key of each swapped path and its value (``sparsify=ista_soft``)."""
    parts = []
    for path, value in variant.items():
        words = [w for w in loader.parse_key_path(path) if w not in loader.GENERIC_KEYS and not w.isdigit()]
        parts.append(f"{words[-1] if words else path}={value}")
    return ", ".join(parts)


@dataclass
class Row:
    variant: str
    params: int
    metric: str
    mean: float
    spread: float
    seconds: float
    values: list[float]


ABLATION_FILE = "ablation.json"


def ablate(spec_ref, grid: Grid, *, out: str | Path, progress: bool = False, device: str = "cpu",
           memory_limit: str | float | None = None, resume: bool = False) -> list[Row]:
    """Train every variant for every seed, then write the table and the figure.

    Before anything trains: every variant is built on the data's shapes (a swap value that cannot fit
    is reported with the others), and the folder is locked and checked: ``OUT/ablation.json`` records
    the grid's identity (the base spec's hash, the swaps, the settings, the seeds, the package
    version); a folder that holds another ablation, or one started with other settings, is refused
    with both values. With ``resume`` every finished run is kept (``train`` checks it is the same run)
    and every unfinished one continues from its checkpoint."""
    out = Path(out)
    variants = grid.variants()
    identity = _grid_identity(spec_ref, grid)
    _check_variants(spec_ref, grid, variants, memory_limit)
    with hold(out, "ablate into"):
        _open_ablation(out, identity, resume)
        return _train_grid(spec_ref, grid, variants, out, progress, device, memory_limit, resume)


def _grid_identity(spec_ref, grid: Grid) -> dict[str, Any]:
    from . import __version__

    text = loader.dump(loader.load(spec_ref, grid.overrides))
    settings = {k: v for k, v in asdict(grid.settings).items() if k != "seed"}
    return {"spec_sha256": hashlib.sha256(text.encode()).hexdigest(), "swaps": grid.swaps, "seeds": grid.seeds,
            "overrides": grid.overrides, "settings": settings, "version": __version__}


def _check_variants(spec_ref, grid: Grid, variants: list[dict[str, str]], memory_limit) -> None:
    """Every variant builds on the data's shapes; every value that cannot fit is reported together."""
    from .api import validate

    data = load_data(grid.settings.data, image_size=grid.settings.image_size, seed=0, spec=loader.load(spec_ref, grid.overrides), memory_limit=memory_limit)
    problems = []
    for variant in variants:
        overrides = [*grid.overrides, *(f"{k}={v}" for k, v in variant.items())]
        try:
            spec = loader.load(spec_ref, overrides)
            validate(loader.load(spec_ref, [*data.spec_overrides(spec), *overrides]))
        except SpecError as error:
            problems += [replace_problem(p, variant_label(variant)) for p in error.problems]
    if problems:
        raise SpecError(problems)


def replace_problem(problem, label: str):
    """``problem`` said of the variant ``label``."""
    from .errors import Problem

    return Problem(f"variant {label}: {problem.message}", problem.path, problem.location, problem.hint)


def _open_ablation(out: Path, identity: dict[str, Any], resume: bool) -> None:
    from .runs import differences, digest

    path = out / ABLATION_FILE
    if not path.is_file():
        foreign = sorted(e.name for e in out.iterdir() if e.name != ".lock")
        if foreign:
            raise WorkbenchError(f"{out} holds files that are not an ablation ({', '.join(foreign[:5])}); it is left "
                                 "alone: choose another --out")
        write_atomic(path, json.dumps({"identity": identity, "hash": digest(identity)}, indent=2) + "\n")
        return
    try:
        recorded = json.loads(path.read_text())["identity"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise WorkbenchError(f"{path} cannot be read ({error}); choose another --out") from None
    if not resume:
        raise WorkbenchError(f"{out} holds an ablation: pass --resume to continue it, or choose another --out")
    changes = differences(recorded, identity)
    if changes:
        said = "; ".join(f"{k}: {json.dumps(a)} in {path}, {json.dumps(b)} now" for k, a, b in changes)
        raise WorkbenchError(f"--resume: {out} is another ablation: {said}. Choose another --out for this one")


def _train_grid(spec_ref, grid, variants, out, progress, device, memory_limit, resume) -> list[Row]:
    rows: list[Row] = []
    probes: dict[str, list[dict]] = {}
    total, done = len(variants) * grid.seeds, 0
    metric = METRIC.get(grid.settings.task, "test_loss")
    for variant in variants:
        label = variant_label(variant)
        overrides = [*grid.overrides, *(f"{k}={v}" for k, v in variant.items())]
        values, seconds, params, final = [], [], 0, None
        for seed in range(grid.seeds):
            done += 1
            run = out / _slug(label) / f"seed-{seed}"
            settings = replace(grid.settings, seed=seed)
            result = train(spec_ref, settings, overrides=overrides, out=run, device=device, progress=progress,
                           memory_limit=memory_limit, resume=resume and (run / "run.json").is_file())
            print(f"[{done}/{total}] {label}, seed {seed}: {metric} {result.metrics.get(metric, float('nan')):.4f} "
                  f"({result.seconds:.0f} s)", flush=True)
            values.append(result.metrics.get(metric, float("nan")))
            seconds.append(result.seconds)
            params, final = result.params, run / "final"
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        rows.append(Row(label, params, metric, statistics.fmean(values), spread, statistics.fmean(seconds), values))
        spec, data = prepare(spec_ref, grid.settings.data, overrides, grid.settings.image_size, 0)
        inputs, extra = _probe_inputs(data, PROBE_SAMPLES)
        probes[label] = probe(load_build(final), inputs, **extra)
    _write_results(out, rows, probes, spec_ref, grid)
    return rows


def _slug(label: str) -> str:
    return loader._safe_name(label.replace(", ", "+").replace("=", "-"))


def _write_results(out: Path, rows: list[Row], probes: dict[str, list[dict]], spec_ref, grid: Grid) -> None:
    name = loader.load(spec_ref, grid.overrides).name
    header = ["variant", "parameters", f"{rows[0].metric} (mean)", "spread (std over seeds)", "seeds",
              "seconds per run"]
    lines = [
        f"# Ablation of {name}",
        "",
        f"Task `{grid.settings.task}` on `{grid.settings.data}`, {grid.settings.steps} steps, batch "
        f"{grid.settings.batch_size}, lr {grid.settings.lr}, seeds 0..{grid.seeds - 1}; every variant of one seed "
        "starts from the same weights in the steps it does not swap.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
    ]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["variant", "parameters", "metric", "mean", "std", "seeds", "seconds", "values"])
    for row in rows:
        lines.append(f"| {row.variant} | {row.params:,} | {row.mean:.4f} | {row.spread:.4f} | {len(row.values)} | "
                     f"{row.seconds:.0f} |")
        writer.writerow([row.variant, row.params, row.metric, f"{row.mean:.6f}", f"{row.spread:.6f}",
                         len(row.values), f"{row.seconds:.1f}", " ".join(f"{v:.6f}" for v in row.values)])
    write_atomic(out / "results.md", "\n".join(lines) + "\n\n![probes](probes.png)\n")
    write_atomic(out / "results.csv", buffer.getvalue())
    save_probes(probes, out / "probes.json")
    plot_probes(probes, out / "probes.png", title=f"{name}: each variant's probes after training (seed 0)")
