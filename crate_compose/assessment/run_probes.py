"""Probing trained networks (``crate-compose probe``); ablation grids are :mod:`crate_compose.ablation.study`.

``probe_run`` measures every step's own objective layer by layer (:mod:`crate_compose.assessment.layer_probes`) on
a trained build and on the same spec untrained (same seed), and draws both on one figure, as
paper 003 Figs. 3-4 do.

A run folder stands for its weights (:func:`run_weights`): ``probe_run(None, weights="runs/x")`` (or
``probe_run("runs/x")``) probes the run's ``final/`` (its latest checkpoint when there is no
``final/``, with a note) with the spec beside those weights, on the data, image size and seed the run
recorded, and writes beside the run (``runs/x/probes/final``), never into its builds.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from safetensors import SafetensorError, safe_open

from .. import tasks
from ..building import outputs
from ..building.artifacts import SPEC_FILE, WEIGHTS_FILE, first_mismatch, read_weights
from ..building.builder import compile_spec, spec_of
from ..building.derivation import explicit
from ..building.plan import tied
from ..data.batches import check_normalize, is_rgb
from ..data.sets import Data
from ..errors import WorkbenchError
from ..files import write_together
from ..interop.exchange import load_checkpoint
from ..interop.reading import InteropError, read_checkpoint
from ..settings import settings_of
from ..spec_language import loader
from ..spec_language.zoo import presets
from ..training.preparation import HEADLESS, prepare
from ..training.run_folder import identity as run_records
from ..training.run_folder.checkpoint import latest_checkpoint
from ..training.run_folder.eventlog import choose as choose_logger
from ..training.run_folder.eventlog import write_probe_curves
from ..training.run_folder.locks import hold
from .layer_probes import probe, probes_json, write_probes

PROBE_SAMPLES = 256


@dataclass
class RunWeights:
    """What a run folder says about probing it: the weights (``final/``, else the latest checkpoint),
    the spec beside them, and the data, image size and seed the run recorded."""

    run: Path
    weights: Path
    spec: Path
    data: str
    image_size: int | None
    seed: int
    note: str
    normalize: str
    task: "tasks.Task | None"  # what the run learned, looked up once (None: a task not registered in this process)
    task_name: str  # its name, as the run recorded it


def is_run(path: Any) -> bool:
    """Whether ``path`` names a run folder (one that holds a ``run.json``)."""
    return isinstance(path, (str, Path)) and Path(path).is_dir() and (Path(path) / run_records.RUN_FILE).exists()


def run_of(weights: str | Path) -> Path | None:
    """The run folder whose build ``weights`` is (``RUN/final``, ``RUN/final-ema``, ``RUN/checkpoints/step-N``); None
    for a folder of no run (a build of its own, an imported checkpoint)."""
    weights = Path(weights)
    run = weights.parent.parent if weights.parent.name == "checkpoints" else weights.parent
    return run if is_run(run) else None


def check_recorded_spec(run: Path, record: run_records.Record, weights: Path) -> None:
    """Refuse a run whose ``spec.yaml`` is not the spec its record hashed, or whose weights' ``spec.yaml`` is not
    that spec (its derived decoder written out, as a build saves it): either was edited after the run, and
    another network with the same shapes (a swapped primitive) would be scored silently under the run's name."""
    recorded, spec_file = record.identity["spec"]["sha256"], run / SPEC_FILE
    try:
        text = spec_file.read_text(encoding="utf-8")
        built = (weights / SPEC_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise WorkbenchError(
            f"{run}: its spec cannot be read ({getattr(error, 'strerror', None) or error}); it is "
            "not the run its record describes"
        ) from None
    if hashlib.sha256(text.encode()).hexdigest() != recorded:
        raise WorkbenchError(
            f"{spec_file} is not the spec {run / run_records.RUN_FILE} recorded (its SHA-256 "
            f"differs from {recorded[:12]}...): it was changed after the run trained; restore it"
        )
    if built != text and loader.dump(explicit(loader.load(spec_file))) != built:  # equal texts: nothing derived
        raise WorkbenchError(
            f"{weights / SPEC_FILE} is not the spec the run trained ({spec_file}, which its record "
            "hashed): the weights' spec was changed after the run; restore it"
        )


def run_weights(run: str | Path, verb: str = "probing") -> RunWeights:
    """The weights of the run folder ``run`` and what it was trained on (:class:`RunWeights`);
    :class:`WorkbenchError` when it holds no weights yet, :class:`~crate_compose.training.run_folder.identity.RunRecordError`
    when its record cannot be trusted."""
    run = Path(run)
    record = run_records.read(run)
    if record is None:
        raise WorkbenchError(
            f"{run} holds no {run_records.RUN_FILE}, so it is not a run whose data can be known: "
            "give the spec, --data and --weights RUN/final"
        )
    settings = settings_of(record.settings())  # what the record leaves out (a later setting) at its default
    task = tasks.get(settings.task) if settings.task in tasks.names() else None  # the one lookup of the run's task
    final = run / (task.weights if task is not None else "final")  # DINO: the teacher
    if (final / WEIGHTS_FILE).is_file() and (final / SPEC_FILE).is_file():
        weights, said = final, f"its {final.name}/"
    else:
        weights = latest_checkpoint(run)
        if weights is None:
            raise WorkbenchError(
                f"{run} holds no trained weights yet (no final/, no checkpoint): probe it once "
                "it has written a checkpoint"
            )
        said = f"its latest checkpoint, {weights.name} (it has no final/: the run is not finished)"
    check_recorded_spec(run, record, weights)
    data = record.identity["data"]["name"]
    image_size, seed, normalize = settings.image_size, settings.seed, settings.normalize
    size = f", image size {image_size}" if image_size else ""
    scaled = ", standardized with ImageNet's statistics" if normalize == "imagenet" else ""
    note = f"{run}: {verb} {said}, with its spec, on {data}{size}{scaled} (seed {seed}), as the run recorded"
    return RunWeights(run, weights, weights / SPEC_FILE, data, image_size, seed, note, normalize, task, settings.task)


AUTHORS = "the authors' checkpoints were trained on images standardized with ImageNet's mean and std"


def normalization_of(weights: str | Path | None, given: str | None = None) -> tuple[str, str | None]:
    """How the inputs of ``weights`` are standardized (``"data"`` or ``"imagenet"``), and a note saying
    why when it was not ``given``: a run's ``final/``, ``final-ema/`` or checkpoint takes the run's
    ``--normalize``; a checkpoint file of the authors' code, or a build imported from one
    (``crate-compose import``), ImageNet's statistics, as every vision family trained; anything
    else (other builds, no weights) the data's own."""
    if given is not None:
        return given, None
    if weights is None:
        return "data", None
    weights = Path(weights)
    if weights.is_file():
        return "imagenet", f"--normalize imagenet: {AUTHORS} (give --normalize data to use the data's own)"
    run = run_of(weights)
    if run is not None:
        record = run_records.read(run)
        chosen = record.settings().get("normalize", "data") if record is not None else "data"
        return chosen, (f"--normalize {chosen}: as the run {run} was trained" if chosen != "data" else None)
    if (weights / WEIGHTS_FILE).is_file():
        try:
            with safe_open(weights / WEIGHTS_FILE, "pt") as handle:
                imported = (handle.metadata() or {}).get("imported_from")
        except (OSError, ValueError, SafetensorError):
            imported = None  # an unreadable file is named by load_weights
        if imported:
            return "imagenet", (
                f"--normalize imagenet: {weights} was imported from {imported}, and {AUTHORS} "
                "(give --normalize data to use the data's own)"
            )
    return "data", None


def standardize(
    weights: str | Path | None, given: str | None, data: Data, say: Callable[[str], None] | None = None
) -> str:
    """:func:`normalization_of` ``weights``, checked against ``data`` (ImageNet's statistics need RGB
    images: asked for, others are refused; inferred, others keep their own, and the weights' misfit is
    what is reported), its note given to ``say`` (default: printed on stderr) when the data is images."""
    normalize, note = normalization_of(weights, given)
    if given is None and not is_rgb(data):
        return "data"
    check_normalize(normalize, data, WorkbenchError)
    if note and data.mean is not None:
        (say or (lambda text: print(f"note: {text}", file=sys.stderr)))(note)
    return normalize


VERBS = {
    "probe": "probing",
    "evaluate": "evaluating",
    "linear-probe": "probing linearly",
    "show": "showing",
    "segment": "segmenting",
}


@dataclass
class Subject:
    """What a command that runs weights on data is given, a run folder resolved (:func:`resolve_subject`)."""

    spec: Any
    weights: Path | None
    data: str
    image_size: int | None
    seed: int
    normalize: str | None
    task: "tasks.Task | None" = None  # a run's task, looked up once; None: the data's (crate_compose.tasks.of)


def resolve_subject(
    command: str,
    spec_ref,
    weights,
    data_name: str | None,
    image_size: int | None,
    seed: int | None,
    normalize: str | None = None,
    say: Callable[[str], None] | None = None,
) -> Subject:
    """``spec_ref`` and ``weights`` as ``command`` (probe, evaluate, linear-probe, show) takes them: a run
    folder given as either stands for its weights (:func:`run_weights`), its spec (unless a spec is
    given), and the data, image size, seed and standardization it recorded (unless given; ``say``
    hears the note); a ``data_name`` other than the run's is refused (the run's spec is fitted to its
    data). Without a run, the data defaults to digits and the seed to 0."""
    say = say or (lambda note: print(f"note: {note}", file=sys.stderr))
    if is_run(spec_ref):
        if weights is not None:
            raise WorkbenchError(
                f"{spec_ref} is a run folder, which names its own weights: give it alone "
                f"({command} {spec_ref}), or a spec with --weights {weights}"
            )
        spec_ref, weights = None, spec_ref
    if weights is not None and is_run(weights):
        found = run_weights(weights, VERBS.get(command, command))
        if data_name is not None and not _same_data(data_name, found.data):
            raise WorkbenchError(
                f"--data {data_name}: the run {found.run} was trained on {found.data}, and its spec "
                f"is fitted to that data; {command} it on {found.data} (leave out --data), or run "
                f"its weights on other data with: {command} SPEC --weights {found.weights} --data "
                f"{data_name}"
            )
        say(found.note)
        return Subject(
            spec_ref if spec_ref is not None else found.spec,
            found.weights,
            found.data,
            image_size if image_size is not None else found.image_size,
            seed if seed is not None else found.seed,
            normalize if normalize is not None else found.normalize,
            found.task,
        )
    if spec_ref is None:
        raise WorkbenchError(
            f"{command} needs a spec (a file or a zoo preset) or a run folder: crate-compose "
            f"{command} SPEC [--weights DIR] [--data NAME], or crate-compose {command} RUN"
        )
    if isinstance(spec_ref, (str, Path)) and Path(spec_ref).is_dir() and str(spec_ref) not in presets():
        raise WorkbenchError(
            f"{spec_ref} is a folder but not a run (no {run_records.RUN_FILE}): give a spec file or "
            f"a zoo preset (for a build folder: {command} {Path(spec_ref) / SPEC_FILE} --weights "
            f"{spec_ref} --data NAME), or a run folder"
        )
    return Subject(
        spec_ref,
        Path(weights) if weights is not None else None,
        data_name if data_name is not None else "digits",
        image_size,
        seed if seed is not None else 0,
        normalize,
    )


def _same_data(given: str, recorded: str) -> bool:
    if given == recorded:
        return True
    prefix = "folder:"
    return (
        given.startswith(prefix)
        and recorded.startswith(prefix)
        and Path(given[len(prefix) :]).resolve() == Path(recorded[len(prefix) :]).resolve()
    )


def probe_run(
    spec_ref=None,
    data_name: str | None = None,
    *,
    weights: str | Path | None = None,
    overrides: Iterable[str] = (),
    out: str | Path | None = None,
    seed: int | None = None,
    samples: int = PROBE_SAMPLES,
    image_size: int | None = None,
    notes: Callable[[str], None] | None = None,
    logger: str | None = None,
    normalize: str | None = None,
) -> tuple[Path, Path, dict[str, list[dict]]]:
    """Probe ``spec_ref`` (its input size set from the data) untrained, and trained with ``weights``
    (a run's ``final/`` or a checkpoint) when given; write probes.json and probes.png into ``out``
    (default: :func:`probe_folder`), both new or neither (:func:`crate_compose.assessment.layer_probes.write_probes`),
    holding the folder's lock (:func:`crate_compose.training.run_folder.locks.hold`: another writer exits 3).

    A run folder as ``weights`` or as ``spec_ref`` (:func:`run_weights`) gives the weights, the spec
    (unless ``spec_ref`` names one), the data, image size and seed (unless given); a ``data_name``
    other than the run's is refused (the run's spec is fitted to its data: give the spec and
    ``weights=RUN/final`` to measure it on other data). ``notes`` receives what was inferred
    (default: printed on stderr). Without a run: ``data_name`` defaults to digits, ``seed`` to 0.
    ``logger``: ``"tensorboard"`` also writes the curves as TensorBoard scalars beside the pair
    (:func:`crate_compose.training.run_folder.eventlog.write_probe_curves`), ``"none"`` not; default: tensorboard
    when the package imports. ``normalize`` (``"data"`` or ``"imagenet"``) standardizes the inputs;
    default: as the weights were trained (:func:`normalization_of`)."""
    say = notes or (lambda note: print(f"note: {note}", file=sys.stderr))
    logger = choose_logger(logger, say)
    subject = resolve_subject("probe", spec_ref, weights, data_name, image_size, seed, normalize, say)
    spec_ref, weights, data_name, image_size, normalize = (
        subject.spec,
        subject.weights,
        subject.data,
        subject.image_size,
        subject.normalize,
    )
    seed = subject.seed
    spec, data = prepare(
        spec_ref,
        data_name,
        overrides,
        image_size,
        seed,
        keep=HEADLESS,  # heads are not probed
        task=subject.task,
    )
    folder = probe_folder(weights, spec.name, out)  # refused before anything is measured
    normalize = standardize(weights, normalize, data, say)
    inputs, extra = tasks.probe_inputs(subject.task, data, samples, normalize)
    runs: dict[str, list[dict]] = {}
    if weights is not None:
        trained = compile_spec(spec, seed=seed)
        load_weights(trained, Path(weights))
        runs["trained"] = probe(trained, inputs, **extra)
    runs["untrained"] = probe(compile_spec(spec, seed=seed), inputs, **extra)
    if not any(runs.values()):
        used = sorted({step.primitive for _, _, _, step in spec.stages()})
        raise WorkbenchError(
            f"spec '{spec.name}' has no step with an objective of its own to measure (its steps: "
            f"{', '.join(used)}); probe measures white-box steps (mssa, ista, tssa, denoise, ...: "
            "crate-compose list primitives), so a black-box baseline has nothing to probe"
        )
    title = f"{spec.name} on {data_name}: " + (" vs ".join(runs))
    with hold(folder, "write probes into"):
        table, figure = write_probes(runs, folder, title=title)
        if logger == "tensorboard":
            write_probe_curves(folder, runs)
    return table, figure, runs


def probe_over_training(
    run: str | Path,
    *,
    out: str | Path | None = None,
    samples: int = PROBE_SAMPLES,
    notes: Callable[[str], None] | None = None,
) -> tuple[Path, Path, dict[int, list[dict]]]:
    """Probe every checkpoint of the run folder ``run`` (and the untrained network of its seed, as step 0, and
    its ``final/`` when no checkpoint holds its last step) on the same test inputs; write ``probes.json``
    (``{"step N": rows}``) and ``probes.png`` (:func:`crate_compose.assessment.timelines.timeline_png`: every
    measure by layer, a line per checkpoint, and by training step, a line per layer) into ``out`` (default
    ``RUN/probes/over-training``). Checkpoints without weights (cut short) are skipped with a note."""
    from ..training.run_folder.checkpoint import checkpoints
    from .timelines import timeline_png

    say = notes or (lambda note: print(f"note: {note}", file=sys.stderr))
    found = run_weights(run)
    say(
        f"{found.run}: probing every checkpoint and the untrained network of seed {found.seed}, with the run's "
        f"spec, on {found.data}, as the run recorded"
    )
    spec, data = prepare(found.spec, found.data, (), found.image_size, found.seed, keep=HEADLESS, task=found.task)
    folder = probe_folder(None, spec.name, out if out is not None else found.run / "probes" / "over-training")
    inputs, extra = tasks.probe_inputs(found.task, data, samples, found.normalize)
    weights = {step: path for step, path in checkpoints(found.run).items() if (path / WEIGHTS_FILE).is_file()}
    for step in sorted(set(checkpoints(found.run)) - set(weights)):
        say(f"checkpoint step-{step:06d} holds no weights (cut short): left out")
    last = run_records.read(found.run).settings().get("steps")
    final = found.run / "final"
    if (final / WEIGHTS_FILE).is_file() and isinstance(last, int) and last not in weights:
        weights[last] = final
    steps = {0: probe(compile_spec(spec, seed=found.seed), inputs, **extra)}
    for step, path in sorted(weights.items()):
        model = compile_spec(spec, seed=found.seed)
        load_weights(model, path)
        steps[step] = probe(model, inputs, **extra)
    title = f"{spec.name} on {found.data}: {len(steps) - 1} checkpoints and the untrained network (seed {found.seed})"
    table, figure = folder / "probes.json", folder / "probes.png"
    with hold(folder, "write probes into"):
        write_together(
            {
                table: probes_json({f"step {step}": rows for step, rows in steps.items()}),
                figure: timeline_png(steps, title=title),
            }
        )
    return table, figure, steps


CHECKPOINT = re.compile(r"step-\d+")  # RUN/checkpoints/step-NNNNNN


def probe_folder(weights: str | Path | None, spec_name: str, out: str | Path | None = None) -> Path:
    """Where ``probe`` writes: ``out`` when given; for a run's weights, ``RUN/final`` or a checkpoint
    ``RUN/checkpoints/step-N``, the run's ``RUN/probes/final`` or ``RUN/probes/step-N`` (never inside
    the build: ``train --resume`` takes ``final/`` only when it holds a build and nothing else); for
    other weights, or none, ``probes/<spec name>``. Refused: a folder inside a build (a folder holding
    model.safetensors and spec.yaml; :class:`WorkbenchError`), a file where the folder goes
    (:class:`~crate_compose.errors.OutputError`, status 1), and a probes.json or probes.png that is not a
    regular file (``OSError``, as every output): :func:`crate_compose.building.outputs.check_probe_folder`."""
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
    outputs.check_probe_folder(folder, f"--out {folder}" if out is not None else str(folder))
    return folder


def load_weights(model: torch.nn.Module, folder: Path) -> None:
    """Load ``folder/model.safetensors`` into ``model``; a mismatch names the first differing tensor.
    ``folder`` may also be a checkpoint file of the authors' code (:mod:`crate_compose.interop`): it is
    read safely, its family told by its tensors' names, and every misfit named on both sides."""
    if folder.is_file():
        try:
            checkpoint = read_checkpoint(folder)
            if set(checkpoint.tensors) & set(model.state_dict()):  # this package's names: a build's weights file
                raise WorkbenchError(
                    f"--weights {folder}: a crate-compose weights file; give the folder that holds "
                    f"it with its spec ({folder.parent}), a run's final/ or a checkpoint"
                )
            notes = load_checkpoint(model, checkpoint)
        except InteropError as error:
            raise WorkbenchError(f"--weights {error}") from None
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        return
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
